#!/usr/bin/env python3
"""Where the main kernel's local-memory spills are: counts STL/LDL in the SASS of each
build/libhopper_bwd*.so before the consumers' setmaxnreg increase ("pre"), between it and the
producer's decrease ("consumer": the warpgroups that run the GEMMs) and after ("producer": the
producer and dQ-writer warps). Needs cuobjdump and nvdisasm on PATH (the pip packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm ship them: pip install --target DIR ...)."""
import glob, os, re, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
for so in sorted(glob.glob(os.path.join(HERE, "build", "libhopper_bwd*.so"))):
    sass = subprocess.run(["cuobjdump", "-sass", so], capture_output=True, text=True).stdout
    func, cnt, region = None, None, None
    rows = []
    for line in sass.split("\n") + ["Function : end"]:
        if "Function :" in line:
            if func and "attn_bwd_kernel" in func:
                rows.append(("hd64" if "ILi64E" in func else "hd128", cnt))
            func, cnt, region = line.split("Function :")[1].strip(), {"pre": 0, "consumer": 0, "producer": 0}, "pre"
        elif "SETMAXREG.TRY_ALLOC" in line:
            region = "consumer"
        elif "SETMAXREG.DEALLOC" in line:
            region = "producer"
        elif cnt is not None and re.search(r"\b(STL|LDL)", line):
            cnt[region] += 1
    if not rows:
        sys.exit("no SASS: are cuobjdump and nvdisasm on PATH?")
    for d, c in rows:
        print(os.path.basename(so), d, "STL/LDL by region:", c)

#!/usr/bin/env python3
"""Correctness check and benchmark for the own Hopper attention forward kernel.

Loads build/libhopper_attention.so through ctypes (C ABI hopper_attention_fwd) and compares it
with PyTorch: an fp32 reference for correctness, SDPA's cuDNN and FLASH backends for speed.
Layout everywhere: Q/O [S, Hq, D], K/V [S, Hkv, D] bf16, LSE [Hq, S] f32 (natural log).

  python3 bench.py check                 # correctness at small S
  python3 bench.py bench --S 65536,...   # timings, JSON lines on stdout
  python3 bench.py one --impl ours --S 131072 --D 64   # a single launch (for ncu)

impl "ours" is the kernel's own cluster choice per shape; "ours_c1", "ours_c2", "ours_c4" force a
cluster size (K/V multicast to 2 or 4 CTAs); "base" is another build of the C ABI, loaded from
HOPPER_ATTN_BASE_LIB (e.g. the kernel before a change), timed in the same run; "@NAME" (or
"@NAME_c2") is build/libhopper_NAME.so, so several variants are timed in one process.
"""
import argparse, ctypes, json, math, os, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

HERE = os.path.dirname(os.path.abspath(__file__))
HQ, HKV = 32, 8


def load_lib(path=None):
    lib = ctypes.CDLL(path or os.environ.get("HOPPER_ATTN_LIB", os.path.join(HERE, "build", "libhopper_attention.so")))
    lib.hopper_attention_fwd.restype = ctypes.c_int
    lib.hopper_attention_fwd.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
    if hasattr(lib, "hopper_attention_fwd_cluster"):
        lib.hopper_attention_fwd_cluster.restype = ctypes.c_int
        lib.hopper_attention_fwd_cluster.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
        lib.hopper_attention_cluster_size.restype = ctypes.c_int
        lib.hopper_attention_cluster_size.argtypes = [ctypes.c_int] * 4
    return lib


_BASE = []


def base_lib():
    if not _BASE:
        _BASE.append(load_lib(os.environ["HOPPER_ATTN_BASE_LIB"]))
    return _BASE[0]


def ours(lib, q, k, v, o, lse, cluster=0):
    """cluster 0: the kernel's own choice (hopper_attention_fwd); 1, 2, 4: forced."""
    S, Hq, D = q.shape
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), S, Hq, k.shape[1], D)
    stream = torch.cuda.current_stream().cuda_stream
    if cluster:
        rc = lib.hopper_attention_fwd_cluster(*args, cluster, stream)
    else:
        rc = lib.hopper_attention_fwd(*args, stream)
    if rc != 0:
        raise RuntimeError(f"hopper_attention_fwd returned {rc} (cluster {cluster})")


_NAMED = {}


def named_lib(name):
    """build/libhopper_NAME.so, a variant built beside the others (impl "@NAME" or "@NAME_cN")."""
    if name not in _NAMED:
        _NAMED[name] = load_lib(os.path.join(HERE, "build", f"libhopper_{name}.so"))
    return _NAMED[name]


def run_impl(lib, impl, q, k, v, o, lse):
    """impl: ours | ours_c1 | ours_c2 | ours_c4 | base | base_c1 | base_c2 | base_c4 | @NAME[_cN]."""
    if impl.startswith("@"):
        name, _, c = impl[1:].partition("_c")
        return ours(named_lib(name), q, k, v, o, lse, int(c) if c else 0)
    if impl.startswith("base"):
        return ours(base_lib(), q, k, v, o, lse, int(impl[len("base_c"):]) if impl.startswith("base_c") else 0)
    return ours(lib, q, k, v, o, lse, int(impl[len("ours_c"):]) if impl.startswith("ours_c") else 0)


def sdpa(backend, q, k, v):
    # [S, H, D] -> [1, H, S, D] views (last dim contiguous, row stride H*D), no copies.
    qq, kk, vv = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(backend):
        try:
            return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True), "native"
        except RuntimeError:
            g = q.shape[1] // k.shape[1]
            kk = kk.repeat_interleave(g, dim=1)
            vv = vv.repeat_interleave(g, dim=1)
            return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True), "expanded-kv"


def reference(q, k, v):
    """fp32 causal GQA attention, chunked over query heads. Returns O [S,Hq,D] f32, LSE [Hq,S]."""
    S, Hq, D = q.shape
    g = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D)
    O = torch.empty(S, Hq, D, device=q.device, dtype=torch.float32)
    L = torch.empty(Hq, S, device=q.device, dtype=torch.float32)
    mask = torch.ones(S, S, device=q.device, dtype=torch.bool).triu(1)
    for h in range(Hq):
        qh = q[:, h].float()
        kh = k[:, h // g].float()
        vh = v[:, h // g].float()
        s = (qh @ kh.T) * scale
        s.masked_fill_(mask, float("-inf"))
        L[h] = torch.logsumexp(s, dim=-1)
        O[:, h] = torch.softmax(s, dim=-1) @ vh
    return O, L


def check(lib, sizes=(128, 1024, 4096, 4160, 1000), impls=("ours",)):
    ok_all = True
    torch.manual_seed(1234)
    for D in (64, 128):
        for S in sizes:
            q = torch.randn(S, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            o = torch.full((S, HQ, D), float("nan"), device="cuda", dtype=torch.bfloat16)
            lse = torch.full((HQ, S), float("nan"), device="cuda", dtype=torch.float32)
            O, L = reference(q, k, v)
            for impl in impls:
              o.fill_(float("nan")); lse.fill_(float("nan"))
              run_impl(lib, impl, q, k, v, o, lse)
              torch.cuda.synchronize()
              o2 = torch.full_like(o, float("nan"))
              lse2 = torch.full_like(lse, float("nan"))
              run_impl(lib, impl, q, k, v, o2, lse2)
              torch.cuda.synchronize()
              of = o.float()
              nan = int(torch.isnan(of).sum().item() + torch.isnan(lse).sum().item())
              err_o = (of - O).abs().max().item()
              rel_o = ((of - O).norm() / O.norm()).item()
              err_l = (lse - L).abs().max().item()
              det = bool(torch.equal(o, o2) and torch.equal(lse, lse2))
              # bf16 output rounding alone gives ~4e-3 relative; 1e-2 norm-relative is the bar.
              ok = nan == 0 and rel_o < 1e-2 and err_o < 5e-2 and err_l < 1e-3 and det
              ok_all &= ok
              print(json.dumps({"check": "fwd", "impl": impl, "lib": os.path.basename(os.environ.get("HOPPER_ATTN_LIB", "libhopper_attention.so")), "S": S, "D": D, "Hq": HQ, "Hkv": HKV, "nan_or_unwritten": nan,
                                "o_max_abs_err": err_o, "o_rel_l2_err": rel_o, "lse_max_abs_err": err_l,
                                "deterministic": det, "ok": ok}), flush=True)
            del q, k, v, o, lse, O, L, o2, lse2
            torch.cuda.empty_cache()
    return ok_all


def flops_fwd(S, D, Hq=None):
    return 4.0 * S * S * D * (Hq or HQ) / 2


def time_fn(fn, est_s, min_reps=2, max_reps=20):
    """Median of about 2 s of timed calls after one warm-up (at least MIN_REPS or min_reps, at most
    max_reps): (ms, sorted times, reps). backward/bench_bwd.py times with it too."""
    reps = max(int(os.environ.get("MIN_REPS", str(min_reps))), min(max_reps, int(2.0 / max(est_s, 1e-4))))
    fn()  # warmup
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], times, reps


def bench(lib, Ss, Ds, impls, out):
    for D in Ds:
        for S in Ss:
            torch.manual_seed(S + D)
            q = torch.randn(S, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            o = torch.empty(S, HQ, D, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(HQ, S, device="cuda", dtype=torch.float32)
            fl = flops_fwd(S, D)
            est = fl / 500e12
            for impl in impls:
                note = ""
                try:
                    if impl.startswith(("ours", "base", "@")):
                        fn = lambda impl=impl: run_impl(lib, impl, q, k, v, o, lse)
                    else:
                        be = SDPBackend.CUDNN_ATTENTION if impl == "cudnn_sdpa" else SDPBackend.FLASH_ATTENTION
                        with torch.no_grad():
                            _, note = sdpa(be, q, k, v)
                        def fn(be=be):
                            with torch.no_grad():
                                sdpa(be, q, k, v)
                    ms, times, reps = time_fn(fn, est)
                    name = impl if impl != "ours" else os.environ.get("OURS_NAME", "ours")
                    if impl == "ours" and hasattr(lib, "hopper_attention_cluster_size"):
                        name += f"(cluster {lib.hopper_attention_cluster_size(S, HQ, HKV, D)})"
                    rec = {"impl": name, "S": S, "D": D, "Hq": HQ, "Hkv": HKV, "dir": "fwd", "ms": round(ms, 4),
                           "tflops": round(fl / (ms * 1e-3) / 1e12, 1), "reps": reps,
                           "ms_min": round(times[0], 4), "ms_max": round(times[-1], 4), "gpu": torch.cuda.get_device_name()}
                    if note:
                        rec["gqa"] = note
                except Exception as e:  # keep going: one failing backend must not lose the others
                    name = impl if impl != "ours" else os.environ.get("OURS_NAME", "ours")
                    rec = {"impl": name, "S": S, "D": D, "dir": "fwd", "error": str(e)[:300]}
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    with open(out, "a") as f:
                        f.write(line + "\n")
            del q, k, v, o, lse
            torch.cuda.empty_cache()


def same(lib, Ss, Ds, impls):
    """Whether each impl writes bit for bit the O and LSE of "base" (multicast changes no arithmetic)."""
    ok_all = True
    for D in Ds:
        for S in Ss:
            torch.manual_seed(S + D)
            q = torch.randn(S, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
            o0 = torch.full((S, HQ, D), float("nan"), device="cuda", dtype=torch.bfloat16)
            l0 = torch.full((HQ, S), float("nan"), device="cuda", dtype=torch.float32)
            run_impl(lib, "base", q, k, v, o0, l0)
            for impl in impls:
                o = torch.full_like(o0, float("nan"))
                l = torch.full_like(l0, float("nan"))
                run_impl(lib, impl, q, k, v, o, l)
                torch.cuda.synchronize()
                nan = int(torch.isnan(o).sum().item() + torch.isnan(l).sum().item())
                eq = bool(torch.equal(o, o0) and torch.equal(l, l0))
                ok_all &= eq and nan == 0
                name = impl
                if impl == "ours" and hasattr(lib, "hopper_attention_cluster_size"):
                    name += f"(cluster {lib.hopper_attention_cluster_size(S, HQ, HKV, D)})"
                print(json.dumps({"same_as_base": eq, "impl": name, "S": S, "D": D, "nan_or_unwritten": nan}), flush=True)
                del o, l
            del q, k, v, o0, l0
            torch.cuda.empty_cache()
    return ok_all


def one(lib, impl, S, D, n):
    torch.manual_seed(7)
    q = torch.randn(S, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(S, HKV, D, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(S, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(HQ, S, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    for _ in range(n):
        if impl.startswith(("ours", "base", "@")):
            run_impl(lib, impl, q, k, v, o, lse)
        else:
            be = SDPBackend.CUDNN_ATTENTION if impl == "cudnn_sdpa" else SDPBackend.FLASH_ATTENTION
            with torch.no_grad():
                sdpa(be, q, k, v)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench", "one", "same"])
    ap.add_argument("--S", default="65536,131072,262144,524288")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--impls", default="ours,cudnn_sdpa,flash_sdpa")
    ap.add_argument("--impl", default="ours")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check-impls", default="ours", help="check these (ours, ours_c1, ours_c2, ours_c4, base)")
    ap.add_argument("--heads", default="32:8", help="query:KV heads (4:1 is a rank of Llama-3-8B under Ulysses 8)")
    a = ap.parse_args()
    global HQ, HKV
    HQ, HKV = (int(x) for x in a.heads.split(":"))
    lib = load_lib()
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    if a.mode == "check":
        impls = a.check_impls.split(",")
        sys.exit(0 if (check(lib, (1000, 4160), impls) if a.quick else check(lib, impls=impls)) else 1)
    if a.mode == "same":
        sys.exit(0 if same(lib, [int(s) for s in a.S.split(",")], [int(d) for d in a.D.split(",")], a.impls.split(",")) else 1)
    if a.mode == "bench":
        bench(lib, [int(s) for s in a.S.split(",")], [int(d) for d in a.D.split(",")], a.impls.split(","), a.out)
    else:
        one(lib, a.impl, int(a.S.split(",")[0]), int(a.D.split(",")[0]), a.n)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# STL/LDL counts of each forward kernel in the SASS of the given libraries, by region: before any
# setmaxnreg ("pre"), after the consumers' increase ("alloc"), after the producer's decrease
# ("dealloc"). Run where cuobjdump is (the GPU machine): lab/hopper_attention/sass_spills_fwd.sh LIB...
for so in "$@"; do
  cuobjdump -sass "$so" | python3 -c "
import sys, re
func = cnt = region = None
rows = []
for line in sys.stdin.read().split('\n') + ['Function : end']:
    if 'Function :' in line:
        if func and 'attn_fwd_kernel' in func:
            m = re.search(r'CfgILi(\d+)ELi\d+ELi(\d+)ELi\d+ELi(\d)ELb(\d)(?:ELb(\d))?', func)
            name = func[-40:]
            if m:
                d, n, c, pairs, masks = m.groups()
                name = 'hd%s N%s cluster %s %s%s' % (d, n, c, 'pairs' if pairs == '1' else 'longest-first',
                                                   '' if masks is None else ' masks' if masks == '1' else ' causal')
            rows.append((name, cnt))
        func, cnt, region = line, {'pre': 0, 'alloc': 0, 'dealloc': 0}, 'pre'
    elif 'SETMAXREG.TRY_ALLOC' in line or 'SETMAXREG.ALLOC' in line:
        region = 'alloc'
    elif 'SETMAXREG.DEALLOC' in line:
        region = 'dealloc'
    elif cnt is not None and re.search(r'\b(STL|LDL)', line):
        cnt[region] += 1
for name, c in rows:
    print('$(basename "$so")', name, c)
"
done

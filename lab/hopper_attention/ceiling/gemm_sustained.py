#!/usr/bin/env python3
"""A bf16 GEMM (cuBLAS through torch.matmul) run back to back for --seconds: what the tensor cores
sustain at the card's power cap, the ceiling no attention kernel (which adds the softmax, masks and
operand traffic to the same GEMMs) can pass. One JSON line per --window seconds, then a summary:
TFLOPS over the last half of the run, when the clock has settled under the cap."""
import argparse, json, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=8192, help="M = N = K")
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--window", type=float, default=2)
a = ap.parse_args()
n = a.n
x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
flop = 2.0 * n * n * n
for _ in range(3):
    torch.matmul(x, w, out=y)
torch.cuda.synchronize()
rates = []
t_end = time.time() + a.seconds
while time.time() < t_end:
    t0 = time.time()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    k = 0
    while time.time() - t0 < a.window:
        for _ in range(20):
            torch.matmul(x, w, out=y)
        k += 20
        torch.cuda.synchronize()
    e.record()
    e.synchronize()
    tf = flop * k / (s.elapsed_time(e) * 1e-3) / 1e12
    rates.append(tf)
    print(json.dumps({"bench": "gemm_sustained", "n": n, "t_s": round(time.time() - t_end + a.seconds, 1),
                      "tflops": round(tf, 1)}), flush=True)
half = rates[len(rates) // 2:]
print(json.dumps({"bench": "gemm_sustained", "n": n, "summary": True, "seconds": a.seconds,
                  "tflops_last_half": round(sum(half) / len(half), 1), "tflops_first": round(rates[0], 1),
                  "gpu": torch.cuda.get_device_name()}), flush=True)

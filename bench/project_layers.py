#!/usr/bin/env python3
"""Projects a rehearsed step of every layer from steps timed on fewer layers.

A step at a length too long to time whole (8B at 2M tokens per rank of 8: ~15 minutes) is
rehearsed on one decoder layer (parallel_bench --rehearse --layers=1). Every layer is the same
work, so the whole step is

    step(L) = head(S) + L * layer(S),     layer(S) = step_1(S) - head(S)

where head(S) is what does not repeat per layer (the embedding, the loss head, the optimizer
of those): it is linear in the tokens, and is measured at a short S0 from a one- and a two-layer
rehearsal: head(S0) = 2 * step_1(S0) - step_2(S0), head(S) = head(S0) * S / S0.

    bench/project_layers.py RESULTS.jsonl [--layers 32] [--model llama-3-8b]

prints one JSON line per projected S (projected_step_s, projected_tok_per_s_per_gpu, the
layer-1 step and head(S) it came from) and, where the same S was also rehearsed whole, the
projection's error against it.
"""
import argparse
import json
import sys


def key(d):
    return (d["model"], d["world"], d["sp"], d.get("ring", 1), d.get("nodes", 1),
            d.get("device_memory_bytes"))


def layers_of(d):
    """The layers a line's step ran: "layers" (since 2026-12-06), "layers_run" before."""
    return d.get("layers", d.get("layers_run"))


def partial(d):
    """Whether the line's step ran fewer layers than the model has."""
    if "model_layers" in d:
        return d["layers"] < d["model_layers"]
    return "layers_run" in d  # older lines: written only with --layers


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("results")
    p.add_argument("--layers", type=int, default=32, help="the model's decoder layers")
    p.add_argument("--model", default="llama-3-8b")
    a = p.parse_args()
    lines = []
    for text in open(a.results):
        d = json.loads(text)
        if d.get("mode") == "rehearsal" and d["model"] == a.model and "probe_window" not in d:
            lines.append(d)
    whole = {(key(d), d["S"]): d["step_s"] for d in lines if not partial(d)}
    by_layers = {}
    for d in lines:
        if partial(d):
            by_layers.setdefault((key(d), layers_of(d)), {})[d["S"]] = d["step_s"]
    out = 0
    for (k, n), steps in sorted(by_layers.items()):
        if n != 1:
            continue
        twos = by_layers.get((k, 2), {})
        calibrations = sorted(s for s in steps if s in twos)
        if not calibrations:
            print("no S rehearsed with both 1 and 2 layers for", k, file=sys.stderr)
            continue
        s0 = calibrations[0]
        head0 = 2 * steps[s0] - twos[s0]
        model, world, sp, ring, nodes, device = k
        for s, t1 in sorted(steps.items()):
            if s == s0:
                continue
            head = head0 * s / s0
            full = head + a.layers * (t1 - head)
            line = {"bench": "parallel", "mode": "rehearsal-projected", "model": model, "S": s,
                    "world": world, "sp": sp, "ring": ring, "nodes": nodes, "device_memory_bytes": device,
                    "layers": a.layers, "layer1_step_s": t1, "head_s": round(head, 4),
                    "calibrated_at_S": s0, "projected_step_s": round(full, 3),
                    "projected_tok_per_s_per_gpu": round(s / (sp * full), 1)}
            if (k, s) in whole:
                line["measured_step_s"] = whole[(k, s)]
                line["error"] = round(full / whole[(k, s)] - 1, 4)
            print(json.dumps(line))
            out += 1
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())

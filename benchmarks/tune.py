"""Kernel tuning sweep used during development: for each (spec, tuning) variant, check accuracy on
a few cases and time a few decode shapes (spin-hidden launch, CUDA events, median, rotated caches).
Usage: python benchmarks/tune.py SPEC 'json-tuning' ['json-tuning' ...]"""
import json
import os
import sys

import torch

import dsagen
from dsagen import verify as V
from dsagen.bench import paged_logits_bytes, store_bytes
from quick_time import build_all, copy_bw, decode_sets, store_sets, time_fn

SHAPES = [(32, 8192), (128, 8192), (128, 32768)]
if os.environ.get("TUNE_SHAPES"):   # e.g. "32x64,32x1024,32x8192"
    SHAPES = [tuple(map(int, x.split("x"))) for x in os.environ["TUNE_SHAPES"].split(",")]


def main(path, tunings):
    if not tunings:
        sys.exit("usage: python benchmarks/tune.py SPEC 'json-tuning' ['json-tuning' ...]")
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    spec = dsagen.load_spec(path)
    g = torch.Generator().manual_seed(1)
    build_all(path, tunings)
    for t in tunings:
        tuning = json.loads(t)
        try:
            ops = dsagen.load(spec, tuning=tuning)
        except Exception as e:
            print(f"{spec.name} {tuning}: load failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        acc = []
        for next_n in spec.next_n:
            for ctx in ([63, 65, 130], [1, 63, 4097] + torch.randint(1, 4097, (61,), generator=g).tolist(), [40000, 33000]):
                row = V.check_logits(ops, spec, ctx, next_n, g, "cuda", reruns=3)
                acc.append(f"{row.rel_l2:.2e}{'' if row.passed else '!'}")
        print(f"{spec.name} {tuning}: rel_l2 {' '.join(acc)}", flush=True)
        if os.environ.get("TUNE_STORE"):   # store: bitwise check, then N=128 and 65536 (random slots), 65536 (whole pages)
            rows = [V.check_store(ops, spec, n, g, "cuda") for n in (1, 77, 4096)]
            print(f"{spec.name} {tuning}: store {' '.join('ok' if r.passed else 'FAIL ' + r.note for r in rows)}", flush=True)
            for n, pattern in ((128, "random"), (65536, "random"), (65536, "pages")):
                sets = store_sets(ops, spec, n, pattern, g)
                us = time_fn([lambda a=a: ops.store(*a) for a in sets], iters=60)
                nbytes = store_bytes(spec, n)
                gbs = nbytes / us / 1e3
                print(f"  store N={n:6d} {pattern:6s} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / bw:5.1f}%", flush=True)
                del sets
        for B, ctx in SHAPES:
            for next_n in spec.next_n:
                sets = decode_sets(ops, spec, B, next_n, ctx, g)
                us = time_fn([lambda a=a: ops.paged_logits(*a, ctx, True) for a in sets], iters=60)
                nbytes = paged_logits_bytes(spec, B, next_n, B * ctx, ctx)
                gbs = nbytes / us / 1e3
                print(f"  B={B:4d} next_n={next_n} ctx={ctx:6d} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / bw:5.1f}%", flush=True)
                del sets
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

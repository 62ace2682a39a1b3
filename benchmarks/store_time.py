"""Store kernel timing across tunings, interleaved (development aid): every round times each
tuning once per case, so clock or co-tenant drift spreads over all of them; prints each round and
the median per tuning. Cases: N=128 random slots, N=65536 random distinct slots, N=65536 whole
pages in a random order (a prefill). Same timing as benchmarks/quick_time.py (spin-hidden launch,
CUDA events, median of `iters`, rotated input sets of >= 256 MB).
Usage: python benchmarks/store_time.py SPEC 'json-tuning' ['json-tuning' ...]"""
import json
import statistics
import sys

import torch

import dsagen
from quick_time import copy_bw, store_sets, time_fn

ROUNDS = 5


def cases(spec, ops, g):
    return [(f"N={n} {pattern}", n, store_sets(ops, spec, n, pattern, g))
            for n, pattern in ((128, "random"), (65536, "random"), (65536, "pages"))]


def main(path, tunings):
    bw = copy_bw()
    spec = dsagen.load_spec(path)
    print(f"copy bandwidth {bw:.0f} GB/s; {spec.name}", flush=True)
    ops = {t: dsagen.load(spec, tuning=json.loads(t)) for t in tunings}
    g = torch.Generator().manual_seed(5)
    cs = cases(spec, ops[tunings[0]], g)
    res = {(t, c[0]): [] for t in tunings for c in cs}
    for r in range(ROUNDS):
        for name, n, sets in cs:
            line = []
            for t in tunings:
                us = time_fn([lambda a=a: ops[t].store(*a) for a in sets], iters=100)
                res[(t, name)].append(us)
                line.append(f"{us:6.2f}")
            print(f"round {r} {name:14s} " + " ".join(line), flush=True)
    for name, n, _ in cs:
        nbytes = n * (spec.head_dim * 2 + spec.bytes_per_token + 8)
        for t in tunings:
            us = statistics.median(res[(t, name)])
            print(f"{spec.name} {name:14s} {t:40s} {us:6.2f} us {nbytes / us / 1e3:6.0f} GB/s "
                  f"{100 * nbytes / us / 1e3 / bw:5.1f} %", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""Store kernel timing across tunings, interleaved (development aid): every round times each
tuning once per case, so clock or co-tenant drift spreads over all of them; prints each round and
the median per tuning. Cases: N=128 random slots, N=65536 random distinct slots, N=65536 whole
pages in a random order (a prefill). Same timing as benchmarks/quick_time.py (spin-hidden launch,
CUDA events, median of `iters`, rotated input sets of >= 256 MB).
Usage: python benchmarks/store_time.py SPEC 'json-tuning' ['json-tuning' ...]"""
import json
import sys

import torch

import dsagen
from dsagen.bench import store_bytes
from quick_time import build_all, copy_bw, interleaved, store_sets, time_fn

ROUNDS = 5
CASES = ((128, "random"), (65536, "random"), (65536, "pages"))


def main(path, tunings):
    bw = copy_bw()
    spec = dsagen.load_spec(path)
    print(f"copy bandwidth {bw:.0f} GB/s; {spec.name}", flush=True)
    build_all(path, tunings)
    ops = {t: dsagen.load(spec, tuning=json.loads(t)) for t in tunings}
    g = torch.Generator().manual_seed(5)
    cases = [(f"N={n} {pattern}", store_sets(ops[tunings[0]], spec, n, pattern, g)) for n, pattern in CASES]
    med = interleaved(tunings, cases, lambda t, sets: time_fn([lambda a=a: ops[t].store(*a) for a in sets], iters=100),
                      ROUNDS)
    for n, pattern in CASES:
        nbytes = store_bytes(spec, n)
        for t in tunings:
            us = med[(t, f"N={n} {pattern}")]
            print(f"{spec.name} N={n} {pattern:6s} {t:40s} {us:6.2f} us {nbytes / us / 1e3:6.0f} GB/s "
                  f"{100 * nbytes / us / 1e3 / bw:5.1f} %", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

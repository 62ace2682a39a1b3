"""Fixed costs of the paged-logits and store kernels on the GPU (development aid): the event
time of an empty kernel and of a one-element op after the same spin, then paged_logits at tiny
shapes (one tile; one tile per SM) and at B=32 ctx 8192 with and without the math
(`math: false`), and store at N=1.
Usage: python benchmarks/overhead.py SPEC ['json-tuning' ...] (default tunings: {} and
{"math": false})"""
import json
import sys

import torch

import dsagen
from dsagen.verify import random_keys
from quick_time import decode_sets, time_fn


def main(path, tunings):
    x = torch.ones(1, device="cuda")
    print(f"empty kernel (_sleep 0): {time_fn([lambda: torch.cuda._sleep(0)], iters=200):6.2f} us", flush=True)
    print(f"one-element add:         {time_fn([lambda: x.add_(1)], iters=200):6.2f} us", flush=True)
    g = torch.Generator().manual_seed(3)
    for spec in (dsagen.load_spec(path),):
        for tuning in tunings:
            ops = dsagen.load(spec, tuning=tuning)
            for B, ctx in ((1, 64), (132, 64), (132, 192), (32, 1024), (32, 8192)):
                for nn in spec.next_n:
                    sets = decode_sets(ops, spec, B, nn, ctx, g)
                    us = time_fn([lambda a=a: ops.paged_logits(*a, ctx, True) for a in sets], iters=100)
                    print(f"{spec.name} {tuning} B={B:4d} ctx={ctx:5d} next_n={nn} {us:7.2f} us", flush=True)
                    del sets
            if not tuning:
                cache = ops.new_cache(64, "cuda")
                k = random_keys(1, spec.head_dim, g, "cuda")
                loc = torch.tensor([5], device="cuda")
                print(f"{spec.name} store N=1 {time_fn([lambda: ops.store(k, cache, loc)], iters=200):6.2f} us", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(t) for t in sys.argv[2:]] or [{}, {"math": False}])

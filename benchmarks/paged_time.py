"""Paged-logits timing across tunings, interleaved (development aid). Each tuning is first
checked on a few cases (uneven lengths, two schedule passes with B=600, 2-D context_lens,
max_context_len beyond every length); then every round times each tuning once per shape, so
clock or co-tenant drift spreads over all of them. Prints each round and the median per tuning.
Same timing as benchmarks/quick_time.py (spin-hidden launch, CUDA events, median of `iters`,
rotated input sets of >= 256 MB, every request ctx long, random page order).
Usage: python benchmarks/paged_time.py SPEC 'json-tuning' ['json-tuning' ...]
env: PAGED_SHAPES="32x8192,128x32768" (BxCTX), PAGED_ROUNDS=3"""
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys

import torch

import dsagen
from dsagen import verify as V
from quick_time import copy_bw, decode_sets, time_fn
from tune import _build

SHAPES = [tuple(map(int, x.split("x"))) for x in
          os.environ.get("PAGED_SHAPES", "32x8192,128x8192,32x32768,128x32768").split(",")]
ROUNDS = int(os.environ.get("PAGED_ROUNDS", "3"))


def check(ops, spec, g):
    out = []
    for nn in spec.next_n:
        cases = [dict(context_lens=[63, 65, 130]),
                 dict(context_lens=[1, 63, 4097] + torch.randint(1, 4097, (61,), generator=g).tolist()),
                 dict(context_lens=torch.randint(0, 300, (600,), generator=g).tolist()),
                 dict(context_lens=[[int(x) - nn + 1 + i for i in range(nn)] for x in
                                    torch.randint(nn, 3000, (40,), generator=g)], ctx_2d=True),
                 dict(context_lens=[5000, 70, 640], max_context_len=6000)]
        for c in cases:
            row = V.check_logits(ops, spec, next_n=nn, gen=g, device="cuda", reruns=3, **c)
            out.append(f"{row.rel_l2:.1e}{'' if row.passed else '!FAIL:' + row.note}")
    return " ".join(out)


def main(path, tunings):
    bw = copy_bw()
    spec = dsagen.load_spec(path)
    print(f"copy bandwidth {bw:.0f} GB/s; {spec.name}", flush=True)
    with cf.ProcessPoolExecutor(max_workers=min(8, len(tunings)), mp_context=mp.get_context("spawn")) as ex:
        for line in ex.map(_build, [path] * len(tunings), [json.loads(t) for t in tunings]):
            print("build", line, flush=True)
    ops = {t: dsagen.load(spec, tuning=json.loads(t)) for t in tunings}
    g = torch.Generator().manual_seed(7)
    for t in tunings:
        print(f"check {t}: {check(ops[t], spec, g)}", flush=True)
    res = {}
    for B, ctx in SHAPES:
        for nn in spec.next_n:
            sets = decode_sets(ops[tunings[0]], spec, B, nn, ctx, g)
            for r in range(ROUNDS):
                line = []
                for t in tunings:
                    us = time_fn([lambda a=a: ops[t].paged_logits(*a, ctx, True) for a in sets], iters=100)
                    res.setdefault((t, B, ctx, nn), []).append(us)
                    line.append(f"{us:7.2f}")
                print(f"round {r} B={B} ctx={ctx} next_n={nn} " + " ".join(line), flush=True)
            del sets
            torch.cuda.empty_cache()
    for (t, B, ctx, nn), v in res.items():
        nbytes = B * ctx * spec.bytes_per_token + B * nn * spec.num_heads * (spec.head_dim * spec.query.bits // 8 + 4) \
            + B * nn * ctx * 4
        us = statistics.median(v)
        print(f"{spec.name} B={B:4d} next_n={nn} ctx={ctx:6d} {t:45s} {us:7.2f} us {nbytes / us / 1e3:6.0f} GB/s "
              f"{100 * nbytes / us / 1e3 / bw:5.1f} %", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

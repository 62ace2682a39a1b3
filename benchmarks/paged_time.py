"""Paged-logits timing across tunings, interleaved (development aid). Each tuning is first
checked on a few cases (uneven lengths, two schedule passes with B=600, 2-D context_lens,
max_context_len beyond every length); then every round times each tuning once per shape, so
clock or co-tenant drift spreads over all of them. Prints each round and the median per tuning.
Same timing as benchmarks/quick_time.py (spin-hidden launch, CUDA events, median of `iters`,
rotated input sets of >= 256 MB, every request ctx long, random page order).
A tuning with "_schedule": true is the same build (the key is removed) called with a schedule
precomputed by paged_logits_schedule for each input set (outside the timed call, as a serving
step shares one among its layers); the schedule kernel's own time is printed per shape.
Usage: python benchmarks/paged_time.py SPEC 'json-tuning' ['json-tuning' ...]
env: PAGED_SHAPES="32x8192,128x32768" (BxCTX), PAGED_ROUNDS=3"""
import json
import os
import sys

import torch

import dsagen
from dsagen import verify as V
from dsagen.bench import paged_logits_bytes
from quick_time import build_all, copy_bw, decode_sets, interleaved, time_fn

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
    plain = {t: {k: v for k, v in json.loads(t).items() if k != "_schedule"} for t in tunings}
    scheduled = {t: bool(json.loads(t).get("_schedule")) for t in tunings}
    builds = sorted({json.dumps(p, sort_keys=True) for p in plain.values()})
    build_all(path, builds)
    ops = {t: dsagen.load(spec, tuning=plain[t]) for t in tunings}
    g = torch.Generator().manual_seed(7)
    checked = set()
    for t in tunings:   # once per build (dsagen.verify.check_logits also compares the scheduled call)
        key = json.dumps(plain[t], sort_keys=True)
        if key not in checked:
            checked.add(key)
            print(f"check {t}: {check(ops[t], spec, g)}", flush=True)
    shapes = [(B, ctx, nn) for B, ctx in SHAPES for nn in spec.next_n]

    def cases():   # one shape's input sets alive at a time
        for B, ctx, nn in shapes:
            sets = decode_sets(ops[tunings[0]], spec, B, nn, ctx, g)
            sched = {t: [ops[t].paged_logits_schedule(a[3], a[4], nn, ctx) for a in sets]
                     for t in tunings if scheduled[t]}
            for t in sched:
                sus = time_fn([lambda a=a: ops[t].paged_logits_schedule(a[3], a[4], nn, ctx) for a in sets], iters=100)
                print(f"schedule kernel B={B} ctx={ctx} next_n={nn} {t}: {sus:.2f} us", flush=True)
            yield f"B={B} ctx={ctx} next_n={nn}", (ctx, sets, sched)
            torch.cuda.empty_cache()

    def time_one(t, p):
        ctx, sets, sched = p
        if scheduled[t]:
            return time_fn([lambda a=a, s=s: ops[t].paged_logits(*a, ctx, True, schedule=s)
                            for a, s in zip(sets, sched[t])], iters=100)
        return time_fn([lambda a=a: ops[t].paged_logits(*a, ctx, True) for a in sets], iters=100)

    med = interleaved(tunings, cases(), time_one, ROUNDS)
    for B, ctx, nn in shapes:
        nbytes = paged_logits_bytes(spec, B, nn, B * ctx, ctx)
        for t in tunings:
            us = med[(t, f"B={B} ctx={ctx} next_n={nn}")]
            print(f"{spec.name} B={B:4d} next_n={nn} ctx={ctx:6d} {t:45s} {us:7.2f} us {nbytes / us / 1e3:6.0f} GB/s "
                  f"{100 * nbytes / us / 1e3 / bw:5.1f} %", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

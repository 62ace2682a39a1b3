"""The paged-logits kernels of this tree's templates against another tree's, in one process
(development aid): first bit for bit on seeded inputs (equal and uneven lengths, 2-D
context_lens, max_context_len past every length, with and without a precomputed schedule, the
main and the small-work kernel), then timed interleaved as benchmarks/paged_time.py does, from a
precomputed schedule. The other trees' extensions are built with `store_lanes` 8 (their store
kernels only; inputs are made with this tree's) and `small_tiles` 40 + i for the i-th further
tree (the same kernel choice at the timed shapes: B=32 ctx 8192 has 31 tiles per SM) so that
they load side by side; this tree's Python package builds them all. Every build is compared bit
for bit with OTHER_TREE's and timed against it.
Usage: python benchmarks/tree_ab.py SPEC OTHER_TREE [MORE_TREES...]   env: PAGED_SHAPES, PAGED_ROUNDS as paged_time;
TREE_TUNING: a JSON tuning for both trees; THIS_TUNINGS: a JSON list of further tunings of this tree
(on top of TREE_TUNING) timed alongside"""
import json
import os
import sys
from pathlib import Path

import torch

import dsagen
from dsagen import codegen
from dsagen.bench import paged_logits_bytes
from quick_time import copy_bw, decode_inputs, decode_sets, interleaved, time_fn

SHAPES = [tuple(map(int, x.split("x"))) for x in
          os.environ.get("PAGED_SHAPES", "32x8192,128x8192,32x32768,128x32768").split(",")]
ROUNDS = int(os.environ.get("PAGED_ROUNDS", "3"))


def bit_cases(ops, spec, g):
    for nn in spec.next_n:
        for B, ctx in ((32, 8192), (128, 4096), (7, 1024)):
            q, cache, w, cl, bt = decode_inputs(ops, spec, B, nn, ctx, g)
            yield f"B={B} ctx={ctx} nn={nn} equal", (q, cache, w, cl, bt, ctx)
            uneven = torch.randint(1, ctx + 1, (B,), generator=g).to(torch.int32).cuda()
            yield f"B={B} ctx={ctx} nn={nn} uneven", (q, cache, w, uneven, bt, ctx)
            wide = torch.cat([bt, bt[:, :5]], 1).contiguous()   # 5 more pages: max_context_len past every length
            yield f"B={B} ctx={ctx} nn={nn} uneven, max_context_len {ctx + 300}", (q, cache, w, uneven, wide, ctx + 300)
            if nn > 1:
                c2 = torch.stack([uneven - nn + 1 + i for i in range(nn)], 1).clamp(min=0).to(torch.int32).contiguous()
                yield f"B={B} ctx={ctx} nn={nn} 2-D", (q, cache, w, c2, bt, ctx)


def main(path, other, *more):
    spec = dsagen.load_spec(path)
    tuning = json.loads(os.environ.get("TREE_TUNING", "{}"))
    ops = {"this": dsagen.load(spec, tuning=tuning)}
    for t in json.loads(os.environ.get("THIS_TUNINGS", "[]")):
        ops[f"this {json.dumps(t)}"] = dsagen.load(spec, tuning={**tuning, **t})
    for i, tree in enumerate((other, *more)):
        codegen.TEMPLATE_DIR = Path(tree).resolve() / "templates"
        codegen._env = None
        ops["other" if i == 0 else f"tree {tree}"] = dsagen.load(
            spec, tuning={**tuning, "store_lanes": 8, **({"small_tiles": 40 + i} if i else {})})
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s; {spec.name} {json.dumps(tuning)}; this tree"
          f"{''.join(f' and {t}' for t in more)} vs {other}", flush=True)
    g = torch.Generator().manual_seed(11)
    same = differ = 0
    for name, (q, cache, w, cl, bt, mcl) in bit_cases(ops["this"], spec, g):
        nn = q.shape[1]
        for sched in (False, True):
            r = {}
            for t, o in ops.items():
                s = o.paged_logits_schedule(cl, bt, nn, mcl) if sched else None
                r[t] = o.paged_logits(q, cache, w, cl, bt, mcl, True, schedule=s).view(torch.int32)
            for t in ops:
                if t == "other":
                    continue
                if torch.equal(r[t], r["other"]):
                    same += 1
                else:
                    differ += 1
                    print(f"DIFFER {t} {name} sched={sched}: {int((r[t] != r['other']).sum())} of {r[t].numel()}")
    print(f"bitwise: {same} cases identical, {differ} differ", flush=True)

    def cases():
        for B, ctx in SHAPES:
            for nn in spec.next_n:
                sets = decode_sets(ops["this"], spec, B, nn, ctx, g)
                sched = {t: [o.paged_logits_schedule(a[3], a[4], nn, ctx) for a in sets] for t, o in ops.items()}
                yield f"B={B} ctx={ctx} next_n={nn}", (B, nn, ctx, sets, sched)
                torch.cuda.empty_cache()

    def time_one(t, p):
        B, nn, ctx, sets, sched = p
        return time_fn([lambda a=a, s=s: ops[t].paged_logits(*a, ctx, True, schedule=s)
                        for a, s in zip(sets, sched[t])], iters=100)

    med = interleaved(list(ops), cases(), time_one, ROUNDS)
    for B, ctx in SHAPES:
        for nn in spec.next_n:
            nbytes = paged_logits_bytes(spec, B, nn, B * ctx, ctx)
            b = med[("other", f"B={B} ctx={ctx} next_n={nn}")]
            for t in ops:
                if t == "other":
                    continue
                a = med[(t, f"B={B} ctx={ctx} next_n={nn}")]
                print(f"{spec.name} B={B:4d} next_n={nn} ctx={ctx:6d} {t:28s} {a:7.2f} us ({100 * nbytes / a / 1e3 / bw:5.1f} %) "
                      f"other {b:7.2f} us  this/other {a / b:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])

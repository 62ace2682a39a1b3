"""Quick paged-logits timing used while developing the kernel (the full harness is dsagen bench)."""
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys

import torch

import dsagen
from dsagen.bench import paged_logits_bytes, store_slots
from dsagen.verify import random_keys


def copy_bw():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); y.copy_(x); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    ts.sort()
    return 2 * x.numel() / ts[len(ts) // 2] / 1e9


SPIN_CYCLES = 200000   # torch.cuda._sleep before each timed call: about 100 us, longer than the host loop


def time_fn(fns, iters=50):
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    ts = []
    for i in range(iters):
        f = fns[i % len(fns)]
        torch.cuda._sleep(SPIN_CYCLES)
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); f(); e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    v = sorted(s.elapsed_time(e) * 1e3 for s, e in ts)
    return v[len(v) // 2]


def print_medians(label, res, nbytes, bw):
    """One line per entry of res ({name: [us per round]}): the median, GB/s and % of the copy
    bandwidth bw for nbytes moved, and the rounds."""
    for name, v in res.items():
        us = statistics.median(v)
        print(f"{label} {name:24s} {us:8.2f} us {nbytes / us / 1e3:6.0f} GB/s {100 * nbytes / us / 1e3 / bw:5.1f} %   "
              f"rounds {' '.join(f'{x:.2f}' for x in v)}", flush=True)


def _build(path, tuning):
    # in a fresh process: build (or find) the extension without loading it
    from dsagen import jit
    from dsagen.codegen import namespace, render
    from dsagen.ops import cuda_archs
    spec = dsagen.load_spec(path)
    try:
        built = jit.build_extension(namespace(spec, tuning), render(spec, tuning), cuda_archs(spec), True)
        return f"{tuning}: {'cached' if built.cached else 'built'} in {built.seconds:.0f} s"
    except Exception as e:  # reported; the caller's load then fails for this tuning
        return f"{tuning}: BUILD FAILED {type(e).__name__}: {str(e)[-2000:]}"


def build_all(path, tunings):
    """Build the extension of each JSON tuning of the spec at `path` in parallel processes (up to
    8), printing one line per tuning; the caller then loads them (cached)."""
    with cf.ProcessPoolExecutor(max_workers=min(8, len(tunings)), mp_context=mp.get_context("spawn")) as ex:
        for line in ex.map(_build, [path] * len(tunings), [json.loads(t) for t in tunings]):
            print("build", line, flush=True)


def interleaved(tunings, cases, time_one, rounds):
    """Time every tuning once per case in each of `rounds` rounds (so drift hits them alike),
    printing each round; `cases` is [(name, payload)], time_one(tuning, payload) -> us.
    Returns {(tuning, case name): median us}."""
    res = {}
    for name, payload in cases:
        for r in range(rounds):
            line = []
            for t in tunings:
                us = time_one(t, payload)
                res.setdefault((t, name), []).append(us)
                line.append(f"{us:7.2f}")
            print(f"round {r} {name} " + " ".join(line), flush=True)
    return {k: statistics.median(v) for k, v in res.items()}


def decode_inputs(ops, spec, B, next_n, ctx, g, device="cuda"):
    """One input set for paged_logits: every request `ctx` long, a random page permutation."""
    P = ctx // spec.page_size
    cache = ops.new_cache(B * P, device)
    ops.store(random_keys(B * P * spec.page_size, spec.head_dim, g, device), cache,
              torch.arange(B * P * spec.page_size, device=device))
    # DSAGEN_SEQ_PAGES=1 (a diagnosis aid): request b owns pages b*P .. b*P+P-1 in order
    perm = torch.arange(B * P, device=device) if os.environ.get("DSAGEN_SEQ_PAGES") else torch.randperm(B * P, device=device)
    bt = perm.to(torch.int32).view(B, P)
    q = (torch.randn(B, next_n, spec.num_heads, spec.head_dim, device=device) * 4).to(spec.query.torch_dtype)
    w = torch.randn(B * next_n, spec.num_heads, device=device)
    cl = torch.full((B,), ctx, dtype=torch.int32, device=device)
    return q, cache, w, cl, bt


def decode_sets(ops, spec, B, next_n, ctx, g):
    """Rotated decode_inputs sets: at least 4, and enough that their caches exceed 256 MB."""
    nsets = max(4, int(256e6 // (B * ctx * spec.bytes_per_token)) + 1)
    return [decode_inputs(ops, spec, B, next_n, ctx, g) for _ in range(nsets)]


def store_sets(ops, spec, n, pattern, g, device="cuda"):
    """Rotated input sets (>= 256 MB in all) for storing n random keys into a pool of 4n slots:
    distinct random slots (`random`, a decode-like scatter) or whole pages in a random order
    (`pages`, a prefill). Each set is (k, kv_cache, loc)."""
    pages = max(1, 4 * n // spec.page_size)
    nsets = max(4, int(256e6 // (pages * spec.layout.page_stride)) + 1)
    sets = []
    for _ in range(nsets):
        cache = ops.new_cache(pages, device)
        k = random_keys(n, spec.head_dim, g, device)
        loc = store_slots(n, pages, spec.page_size, pattern, g, device)
        sets.append((k, cache, loc))
    return sets


def main(specs):
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s ({torch.cuda.get_device_name()})")
    g = torch.Generator().manual_seed(0)
    for path in specs:
        spec = dsagen.load_spec(path)
        ops = dsagen.load(spec)
        for B, ctx in ((32, 8192), (128, 8192), (32, 32768), (128, 32768), (128, 65536)):
            for next_n in spec.next_n:
                sets = decode_sets(ops, spec, B, next_n, ctx, g)
                fns = [lambda a=a: ops.paged_logits(*a, ctx, True) for a in sets]
                us = time_fn(fns)
                nbytes = paged_logits_bytes(spec, B, next_n, B * ctx, ctx)
                gbs = nbytes / us / 1e3
                print(f"{spec.name:18s} B={B:4d} next_n={next_n} ctx={ctx:6d}  {us:8.1f} us  {gbs:6.0f} GB/s  {100*gbs/bw:5.1f}% copy", flush=True)
                del sets, fns
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])

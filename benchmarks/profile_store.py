"""Run the store kernel a few times for a profiler (ncu): N bf16 keys into a pool twice the size,
at random distinct slots (as `dsagen bench`) or, with `pages`, whole pages in a random page
order (as a prefill writes them).
Usage: profile_store.py SPEC N [random|pages]"""
import sys

import torch

import dsagen
from dsagen.bench import make_store_inputs

spec = dsagen.load_spec(sys.argv[1])
N = int(sys.argv[2])
ops = dsagen.load(spec)
inp = make_store_inputs(spec, N, 1, "cuda", sys.argv[3] if len(sys.argv) > 3 else "random")
for _ in range(3):
    ops.store(inp["k"], inp["kv_cache"], inp["loc"])
torch.cuda.synchronize()

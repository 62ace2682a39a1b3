"""Run one paged-logits launch per spec for a profiler (ncu).
Usage: profile_one.py SPEC B next_n ctx [json-tuning]"""
import json
import sys

import torch

import dsagen
from quick_time import decode_inputs

spec = dsagen.load_spec(sys.argv[1])
B, next_n, ctx = map(int, sys.argv[2:5])
ops = dsagen.load(spec, tuning=json.loads(sys.argv[5]) if len(sys.argv) > 5 else None)
g = torch.Generator().manual_seed(0)
q, cache, w, cl, bt = decode_inputs(ops, spec, B, next_n, ctx, g)
for _ in range(3):
    ops.paged_logits(q, cache, w, cl, bt, ctx, True)
torch.cuda.synchronize()

"""Run one paged-logits launch per spec for a profiler (ncu). Usage: profile_one.py SPEC B next_n ctx"""
import sys

import torch

import dsagen
from dsagen.verify import random_keys

spec = dsagen.load_spec(sys.argv[1])
B, next_n, ctx = map(int, sys.argv[2:5])
ops = dsagen.load(spec)
g = torch.Generator().manual_seed(0)
P = ctx // spec.page_size
cache = ops.new_cache(B * P, "cuda")
ops.store(random_keys(B * P * spec.page_size, spec.head_dim, g, "cuda"), cache,
          torch.arange(B * P * spec.page_size, device="cuda"))
bt = torch.randperm(B * P, device="cuda").to(torch.int32).view(B, P)
q = (torch.randn(B, next_n, spec.num_heads, spec.head_dim, device="cuda") * 4).to(spec.key.torch_dtype)
w = torch.randn(B * next_n, spec.num_heads, device="cuda")
cl = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
for _ in range(3):
    ops.paged_logits(q, cache, w, cl, bt, ctx, True)
torch.cuda.synchronize()

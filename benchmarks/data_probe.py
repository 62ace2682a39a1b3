"""Does the paged-logits time depend on the key and query values? (development aid, fp8 page-tail
layout only). Times the same kernel, interleaved over rounds, on five kinds of inputs of equal
shape: ``stored`` (random keys stored by the generated store, random q: what dsagen bench and
benchmarks/paged_time.py use), ``masked`` (every key, scale and q byte replaced by a random byte
AND 0x37, as benchmarks/timeline.cu fills them: small positive e4m3 values, few bits set) and
``bytes`` (uniform random key and q bytes, the two e4m3 NaN codes replaced, scales as stored)
and ``q1`` / ``q8`` (stored keys, q drawn from randn x 1 or x 8 instead of the x 4 of
quick_time.decode_inputs: x 1 as the DeepGEMM-derived tests in vLLM draw it before the cast to
e4m3, x 8 as dsagen bench does).
The logits of ``masked`` and ``bytes`` are not checked (the values are not meaningful keys); the
work and the bytes moved are the same. Same timing as benchmarks/quick_time.py (the kernel's
own schedule). Usage: python benchmarks/data_probe.py [BxCTX ...]   (default 128x32768 32x32768)
First run on the H200 in the eighteenth session (benchmarks/RESULTS.md)."""
import os
import sys

import torch

import dsagen
from dsagen.bench import paged_logits_bytes
from quick_time import copy_bw, decode_inputs, print_medians, time_fn

ROUNDS = 5


def recode(t: torch.Tensor, kind: str, g: torch.Generator, layout=None) -> None:
    """Overwrite the bytes of t (uint8 view) in place: ``masked`` or ``bytes`` (see the module).
    ``layout`` (a page-tail ``Spec.layout``): t is a kv_cache and only each page's key bytes (the
    ``scale_base`` bytes before its scales) change."""
    b = t.view(torch.uint8)
    if layout is not None:
        b = b.view(-1, layout.page_stride)[:, :layout.scale_base]
    r = torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8, device=b.device)
    if kind == "masked":
        r &= 0x37
    else:
        r[(r & 0x7f) == 0x7f] = 0x7e       # no e4m3 NaN
    b.copy_(r)


def main(shapes):
    spec = dsagen.load_spec(os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml"))
    ops = dsagen.load(spec, with_cuda=True)
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s; card {torch.cuda.get_device_name()}", flush=True)
    g = torch.Generator().manual_seed(3)             # decode_inputs' draws (on the host)
    gc = torch.Generator(device="cuda").manual_seed(4)   # the recoded bytes (on the device)
    for B, ctx in shapes:
        for nn in spec.next_n:
            nsets = max(4, int(256e6 // (B * ctx * spec.bytes_per_token)) + 1)
            kinds = {}
            for kind in ("stored", "masked", "bytes", "q1", "q8"):
                sets = []
                for _ in range(nsets):
                    q, cache, w, cl, bt = decode_inputs(ops, spec, B, nn, ctx, g)
                    if kind in ("q1", "q8"):
                        q = (torch.randn(q.shape, device=q.device) * float(kind[1:])).to(q.dtype)
                    elif kind != "stored":
                        if kind == "masked":
                            recode(cache, kind, gc)              # keys and scales, as timeline.cu
                        else:
                            recode(cache, kind, gc, spec.layout)
                        recode(q, kind, gc)
                    sets.append((q, cache, w, cl, bt))
                kinds[kind] = sets
            res = {}
            for r in range(ROUNDS):
                for kind, sets in kinds.items():
                    fns = [lambda a=a: ops.paged_logits(*a, ctx, True) for a in sets]
                    res.setdefault(kind, []).append(time_fn(fns, iters=100))
            print_medians(f"B={B} ctx={ctx} next_n={nn}", res, paged_logits_bytes(spec, B, nn, B * ctx, ctx), bw)
            del kinds
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(128, 32768), (32, 32768)])

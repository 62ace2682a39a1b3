"""How fast can a kernel with the fp8 store's memory traffic be, in the store benchmark's timing?
(development aid for issue 3's store target). Times, interleaved over rounds, at N tokens:

- ``dsagen``: the generated fp8_e4m3_page64 store (bf16 keys in, e4m3 + fp32 scale out);
- ``probe Lx``: a kernel with the same loads and stores and no arithmetic (each token's 256 bf16
  bytes read by L lanes, the high byte of each element written as its key byte, the first
  element's bits as its scale): the floor for any store of this layout in this timing;
- ``probe Lx noscale``: the same without the 4-byte scale writes;
- ``x8 in a stream``: 8 calls between the two events, divided by 8 (what a call costs in a
  stream of kernels, launch gaps included, with the events' own overhead spread out).

Inputs as benchmarks/store_time.py: N keys into a pool of 4N slots, distinct random slots
(``random``) or whole pages in a random order (``pages``, a prefill); >= 256 MB of rotated sets.
Usage: python benchmarks/store_probe.py [N ...]"""
import os
import statistics
import sys

import torch
from torch.utils.cpp_extension import load_inline

import dsagen
from dsagen.bench import store_bytes
from quick_time import copy_bw, store_sets, time_fn

ROUNDS = 5
SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

// page-tail layout of fp8_e4m3_page64: 64 keys of 128 B, then 64 fp32 scales
template <int L, bool SCALE>
__global__ void __launch_bounds__(256) probe(const uint4* __restrict__ k, uint8_t* __restrict__ cache,
                                             const int64_t* __restrict__ loc, int64_t n) {
  const int64_t t = int64_t(blockIdx.x) * (256 / L) + threadIdx.x / L;
  const int sub = threadIdx.x % L;
  if (t >= n) return;
  constexpr int V = 16 / L;              // 16-byte input vectors per lane (16 per token)
  uint4 v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = __ldcs(k + t * 16 + i * L + sub);
  const int64_t slot = __ldcs(loc + t);
  uint8_t* page = cache + (slot / 64) * 8448;
  uint2* dst = reinterpret_cast<uint2*>(page + (slot % 64) * 128);
#pragma unroll
  for (int i = 0; i < V; ++i)
    dst[i * L + sub] = make_uint2(__byte_perm(v[i].x, v[i].y, 0x7531), __byte_perm(v[i].z, v[i].w, 0x7531));
  if (SCALE && sub == 0) *reinterpret_cast<uint32_t*>(page + 8192 + (slot % 64) * 4) = v[0].x;
}

void run(torch::Tensor k, torch::Tensor cache, torch::Tensor loc, int64_t lanes, bool scale) {
  const int64_t n = k.size(0);
  auto s = c10::cuda::getCurrentCUDAStream();
  auto kp = reinterpret_cast<const uint4*>(k.data_ptr());
  auto cp = cache.data_ptr<uint8_t>();
  auto lp = loc.data_ptr<int64_t>();
#define P(LL) { const unsigned g = unsigned((n * LL + 255) / 256); \
    if (scale) probe<LL, true><<<g, 256, 0, s>>>(kp, cp, lp, n); else probe<LL, false><<<g, 256, 0, s>>>(kp, cp, lp, n); }
  if (lanes == 4) P(4) else if (lanes == 8) P(8) else P(16)
#undef P
}
"""
CPP = "void run(torch::Tensor k, torch::Tensor cache, torch::Tensor loc, int64_t lanes, bool scale);"


def main(ns):
    bw = copy_bw()
    spec = dsagen.load_spec(os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml"))
    ops = dsagen.load(spec, with_cuda=True)
    ext = load_inline("dsagen_store_probe", CPP, cuda_sources=SRC, functions=["run"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
    print(f"copy bandwidth {bw:.0f} GB/s; card {torch.cuda.get_device_name()}", flush=True)
    g = torch.Generator().manual_seed(11)
    # the probe writes what it should: the high bytes of the keys, the scale bits
    k, cache, loc = store_sets(ops, spec, 256, "random", g)[0]
    ext.run(k, cache, loc, 8, True)
    torch.cuda.synchronize()
    flat = cache.view(-1)
    start = (loc // 64) * 8448 + (loc % 64) * 128
    keys = flat[start[:, None] + torch.arange(128, device="cuda")]
    want = k.view(torch.uint8).view(256, 128, 2)[:, :, 1]
    assert torch.equal(keys, want), "probe wrote the wrong key bytes"
    sc = flat[((loc // 64) * 8448 + 8192 + (loc % 64) * 4)[:, None] + torch.arange(4, device="cuda")]
    assert torch.equal(sc, k.view(torch.uint8).view(256, 256)[:, :4]), "probe wrote the wrong scale bytes"
    variants = {
        "dsagen": lambda a: ops.store(*a),
        "probe 4x": lambda a: ext.run(*a, 4, True),
        "probe 8x": lambda a: ext.run(*a, 8, True),
        "probe 16x": lambda a: ext.run(*a, 16, True),
        "probe 8x noscale": lambda a: ext.run(*a, 8, False),
    }
    for n in ns:
        nbytes = store_bytes(spec, n)
        for pattern in ("random", "pages"):
            sets = store_sets(ops, spec, n, pattern, g)
            res = {}
            for r in range(ROUNDS):
                for name, f in variants.items():
                    res.setdefault(name, []).append(time_fn([lambda a=a, f=f: f(a) for a in sets], iters=100))
                # 8 calls in one timed window (each on its own input set), per call
                fs = [lambda j=j: [ops.store(*sets[(j + i) % len(sets)]) for i in range(8)] for j in range(len(sets))]
                res.setdefault("dsagen x8 in a stream", []).append(time_fn(fs, iters=50) / 8)
                fs = [lambda j=j: [ext.run(*sets[(j + i) % len(sets)], 8, True) for i in range(8)] for j in range(len(sets))]
                res.setdefault("probe 8x x8 in a stream", []).append(time_fn(fs, iters=50) / 8)
            for name, v in res.items():
                us = statistics.median(v)
                print(f"N={n:6d} {pattern:6s} {name:24s} {us:7.2f} us  {nbytes / us / 1e3:6.0f} GB/s "
                      f"{100 * nbytes / us / 1e3 / bw:5.1f} %   rounds {' '.join(f'{x:.2f}' for x in v)}", flush=True)
            del sets
            torch.cuda.empty_cache()
    print(f"empty kernel: {min(time_fn([lambda: torch.cuda._sleep(0)], iters=200) for _ in range(3)):6.2f} us", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [65536, 16384])

"""How fast can a kernel with the fp8 store's memory traffic be, in the store benchmark's timing?
(development aid for issue 3's store target). Times, interleaved over rounds, at N tokens:

- ``dsagen``: the generated fp8_e4m3_page64 store (bf16 keys in, e4m3 + fp32 scale out);
- ``probe Lx``: a kernel with the same loads and stores and no arithmetic (each token's 256 bf16
  bytes read by L lanes in 16-byte loads, the high byte of each element written as its key byte
  in 8-byte stores, the first 4 input bytes as its scale): the floor of this access pattern
  (one 16-byte load per 8 key bytes, one 4-byte scale store per token) in this timing;
- ``probe Lx noscale``: the same without the 4-byte scale writes;
- ``probe 8x prefetch``: the 8-lane probe with an L2 prefetch of each scale's sector as soon as
  its slot is loaded; ``probe 8x read only``: its loads alone (the read floor);
- ``dsagen prefetch``: the store with tuning ``store_prefetch`` (its dropped "load" form, after
  the step's loads, was timed here in the thirty-first session's call 1);
- ``x8 in a stream``: 8 calls between the two events, divided by 8 (what a call costs in a
  stream of kernels, launch gaps included, with the events' own overhead spread out).

Inputs from ``quick_time.store_sets`` (as benchmarks/store_time.py): N keys into a pool of 4N
slots (``dsagen bench`` uses about 2N, so the ``dsagen`` rows here are not its figures), distinct
random slots (``random``) or whole pages in a random order (``pages``, a prefill); >= 256 MB of
rotated sets.
Usage: python benchmarks/store_probe.py [N ...]"""
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

import dsagen
from dsagen.bench import store_bytes
from dsagen.codegen import namespace, render
from dsagen.reference import _offsets
from dsagen.verify import random_keys
from quick_time import build_all, copy_bw, print_medians, store_sets, time_fn

ROUNDS = 5
# the spec's rendered layout.h (key_offset, scale_offset, kPageStride) comes first; NS its namespace
SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

using namespace NS;
static_assert(kHeadDim == 128 && kKeyBytes == 128 && kScaleBytes == 4 && kKeyTokenStride % 8 == 0,
              "the probe writes one byte per element and one 4-byte scale per token");

// MODE 0: the loads and stores; 1: also an L2 prefetch of the scale's sector right after the
// slot is loaded; 2: the loads only (a store only where a key's first 16 bytes are all-ones
// bf16 NaNs, which random keys never are: the read floor)
template <int L, bool SCALE, int MODE>
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
  if (MODE == 1 && SCALE && sub == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(cache + scale_offset(slot)));
  if (MODE == 2) {
    uint32_t a = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < V; ++i) a &= v[i].x & v[i].y & v[i].z & v[i].w;
    if (a == 0xffffffffu) cache[key_offset(slot)] = 1;
    return;
  }
  uint2* dst = reinterpret_cast<uint2*>(cache + key_offset(slot));
#pragma unroll
  for (int i = 0; i < V; ++i)
    dst[i * L + sub] = make_uint2(__byte_perm(v[i].x, v[i].y, 0x7531), __byte_perm(v[i].z, v[i].w, 0x7531));
  if (SCALE && sub == 0) *reinterpret_cast<uint32_t*>(cache + scale_offset(slot)) = v[0].x;
}

void run(torch::Tensor k, torch::Tensor cache, torch::Tensor loc, int64_t lanes, bool scale, int64_t mode) {
  TORCH_CHECK(k.is_cuda() && k.is_contiguous() && k.scalar_type() == at::kBFloat16 && k.dim() == 2 &&
              k.size(1) == 128, "k: contiguous bf16 [n, 128] on CUDA");
  TORCH_CHECK(cache.is_cuda() && cache.is_contiguous() && cache.scalar_type() == at::kByte &&
              cache.numel() % kPageStride == 0, "cache: contiguous uint8 pages on CUDA");
  TORCH_CHECK(loc.is_cuda() && loc.is_contiguous() && loc.scalar_type() == at::kLong && loc.numel() == k.size(0),
              "loc: contiguous int64 [n] on CUDA");
  TORCH_CHECK(lanes == 4 || lanes == 8 || lanes == 16, "lanes: 4, 8 or 16");
  TORCH_CHECK(mode >= 0 && mode <= 2, "mode: 0, 1 or 2");
  const int64_t n = k.size(0);
  if (n == 0) return;
  auto s = c10::cuda::getCurrentCUDAStream();
  auto kp = reinterpret_cast<const uint4*>(k.data_ptr());
  auto cp = cache.data_ptr<uint8_t>();
  auto lp = loc.data_ptr<int64_t>();
#define M(LL, SC) { if (mode == 0) probe<LL, SC, 0><<<g, 256, 0, s>>>(kp, cp, lp, n); \
    else if (mode == 1) probe<LL, SC, 1><<<g, 256, 0, s>>>(kp, cp, lp, n); else probe<LL, SC, 2><<<g, 256, 0, s>>>(kp, cp, lp, n); }
#define P(LL) { const unsigned g = unsigned((n * LL + 255) / 256); if (scale) M(LL, true) else M(LL, false) }
  if (lanes == 4) P(4) else if (lanes == 8) P(8) else P(16)
#undef P
#undef M
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""
CPP = "void run(torch::Tensor k, torch::Tensor cache, torch::Tensor loc, int64_t lanes, bool scale, int64_t mode);"


def main(ns):
    bw = copy_bw()
    path = os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml")
    spec = dsagen.load_spec(path)
    build_all(path, ['{}', '{"store_prefetch": true}'])
    ops = dsagen.load(spec, with_cuda=True)
    ops_p = dsagen.load(spec, tuning={"store_prefetch": True}, with_cuda=True)
    src = render(spec)["layout.h"] + SRC.replace("NS", namespace(spec))
    ext = load_inline("dsagen_store_probe", CPP, cuda_sources=src, functions=["run"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
    print(f"copy bandwidth {bw:.0f} GB/s; card {torch.cuda.get_device_name()}", flush=True)
    g = torch.Generator().manual_seed(11)
    # every probe variant writes what it should (the high bytes of the keys, the scale bits) to
    # its slots, and nothing else
    n, pages = 256, 16
    k = random_keys(n, 128, g, "cuda")
    loc = torch.randperm(pages * spec.page_size, generator=g)[:n].cuda()
    key_off, scale_off = _offsets(spec, loc)
    key_at = key_off[:, None] + torch.arange(128, device="cuda")
    scale_at = scale_off[:, None] + torch.arange(4, device="cuda")
    for lanes, scale, mode in ((4, True, 0), (8, True, 0), (16, True, 0), (8, False, 0), (8, True, 1), (8, True, 2)):
        cache = ops.new_cache(pages, "cuda")
        ext.run(k, cache, loc, lanes, scale, mode)
        flat = cache.view(-1)
        if mode == 2:
            assert not flat.any(), (lanes, "the read-only probe wrote")
            continue
        assert torch.equal(flat[key_at], k.view(torch.uint8).view(n, 128, 2)[:, :, 1]), (lanes, "key bytes")
        if scale:
            assert torch.equal(flat[scale_at], k.view(torch.uint8).view(n, 256)[:, :4]), (lanes, "scale bytes")
        else:
            assert not flat[scale_at].any(), (lanes, "a scale written")
        rest = torch.ones_like(flat, dtype=torch.bool)
        rest[key_at.flatten()] = False
        rest[scale_at.flatten()] = False
        assert not flat[rest].any(), (lanes, "bytes outside the slots written")
    # the prefetching store writes the same bytes as the default one (random slots of many
    # pages, and a multi-step N)
    for nn in (256, 100000):
        kk = random_keys(nn, 128, g, "cuda")
        ll = torch.randperm(4 * nn, generator=g)[:nn].cuda()
        pg = (4 * nn + spec.page_size - 1) // spec.page_size
        outs = []
        for o in (ops, ops_p):
            c = ops.new_cache(pg, "cuda").fill_(0xA5)
            o.store(kk, c, ll)
            outs.append(c)
        assert torch.equal(outs[0], outs[1]), ("prefetch store bytes", nn)
    variants = {
        "dsagen": lambda a: ops.store(*a),
        "dsagen prefetch": lambda a: ops_p.store(*a),
        "probe 4x": lambda a: ext.run(*a, 4, True, 0),
        "probe 8x": lambda a: ext.run(*a, 8, True, 0),
        "probe 16x": lambda a: ext.run(*a, 16, True, 0),
        "probe 8x noscale": lambda a: ext.run(*a, 8, False, 0),
        "probe 8x prefetch": lambda a: ext.run(*a, 8, True, 1),
        "probe 8x read only": lambda a: ext.run(*a, 8, True, 2),
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
                fs = [lambda j=j: [ext.run(*sets[(j + i) % len(sets)], 8, True, 0) for i in range(8)] for j in range(len(sets))]
                res.setdefault("probe 8x x8 in a stream", []).append(time_fn(fs, iters=50) / 8)
            print_medians(f"N={n:6d} {pattern:6s}", res, nbytes, bw)
            del sets
            torch.cuda.empty_cache()
    print(f"empty kernel: {min(time_fn([lambda: torch.cuda._sleep(0)], iters=200) for _ in range(3)):6.2f} us", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [65536, 16384])

"""Fixed cost of a launch in the benchmarks' timing (spin-hidden launch, CUDA events, median):
an empty grid of 132 CTAs with the thread and dynamic shared-memory counts of the paged-logits
kernels; the same grid where one thread per CTA reads one int (the same lines every call: L2
hits after the first) and writes it; and a chain of 1, 2 or 4 dependent reads per CTA that
starts at a new place every call (lines not read recently, in a rotation of 4 x 64 MB; the probe
does not flush L2 and cannot tell address translation from DRAM latency), to see what the launch
shape and the first memory accesses cost before any key moves.
Usage: python benchmarks/launch_probe.py (needs a CUDA device and nvcc)."""
import itertools

import torch
from torch.utils.cpp_extension import load_inline

from quick_time import time_fn

SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAException.h>
__global__ void empty_kernel() {}
__global__ void read_kernel(const int* __restrict__ x, int* __restrict__ y) {
  if (threadIdx.x == 0) y[blockIdx.x] = __ldg(x + blockIdx.x * 32) + 1;
}
// chain of `hops` dependent reads (pointer chasing through x, n a power of two), one thread per
// CTA, from element (blockIdx.x * 4096 + start) mod n (32-bit index arithmetic in every row)
__global__ void chase_kernel(const int* __restrict__ x, int* __restrict__ y, int hops, unsigned mask, unsigned start) {
  if (threadIdx.x == 0) { int i = int((blockIdx.x * 4096u + start) & mask); for (int h = 0; h < hops; ++h) i = __ldcg(x + i); y[blockIdx.x] = i; }
}
void launch(int64_t mode, int64_t threads, int64_t smem, torch::Tensor x, torch::Tensor y, int64_t hops, int64_t start) {
  static bool set = false;
  if (!set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    C10_CUDA_CHECK(cudaFuncSetAttribute(read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    C10_CUDA_CHECK(cudaFuncSetAttribute(chase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    set = true;
  }
  TORCH_CHECK((x.numel() & (x.numel() - 1)) == 0 && x.numel() <= (int64_t(1) << 31), "x: a power-of-two length");
  auto st = at::cuda::getCurrentCUDAStream();
  if (mode == 0) empty_kernel<<<132, threads, smem, st>>>();
  else if (mode == 1) read_kernel<<<132, threads, smem, st>>>(x.data_ptr<int>(), y.data_ptr<int>());
  else chase_kernel<<<132, threads, smem, st>>>(x.data_ptr<int>(), y.data_ptr<int>(), int(hops), unsigned(x.numel() - 1),
                                                    unsigned(start & (x.numel() - 1)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""
m = load_inline("dsagen_launch_probe", cpp_sources="void launch(int64_t, int64_t, int64_t, torch::Tensor, torch::Tensor, int64_t, int64_t);",
                cuda_sources="#include <ATen/cuda/CUDAContext.h>\n" + SRC, functions=["launch"],
                extra_cuda_cflags=["-O3", "-arch=sm_90a"], verbose=False)
# rotated inputs (256 MB in all) as the benchmarks rotate theirs; chase buffers hold a random
# permutation, so every hop after the first goes to a random place in its 64 MB buffer (the
# first hops of one call lie within 132 x 16 KB)
n = 16 << 20
sets = []
g = torch.Generator().manual_seed(1)
for _ in range(4):
    perm = torch.randperm(n, generator=g).to(torch.int32)
    sets.append((perm.cuda(), torch.empty(132, dtype=torch.int32, device="cuda")))
print("sleep(0) (1 thread):", f"{min(time_fn([lambda: torch.cuda._sleep(0)], iters=200) for _ in range(3)):.2f} us")
calls = itertools.count()
for threads in (384, 512):
    for smem in (0, 200 << 10):
        row = []
        for mode, hops in ((0, 0), (1, 0), (2, 1), (2, 2), (2, 4)):
            # each call's chains start 1000003 elements past the previous call's
            fns = [lambda x=x, y=y, mode=mode, threads=threads, smem=smem, hops=hops:
                   m.launch(mode, threads, smem, x, y, hops, next(calls) * 1000003) for x, y in sets]
            row.append(min(time_fn(fns, iters=200) for _ in range(3)))
        print(f"132 CTAs x {threads} threads, {smem >> 10:3d} KB smem: empty {row[0]:.2f}  one read (L2) {row[1]:.2f}  "
              f"cold chain of 1 / 2 / 4 reads {row[2]:.2f} / {row[3]:.2f} / {row[4]:.2f} us", flush=True)

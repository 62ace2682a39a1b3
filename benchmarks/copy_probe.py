"""Device-to-device copies of store-sized buffers in the quick_time harness (spin-hidden launch,
CUDA events, median, rotated buffers): the floor a kernel moving that many bytes sees in this
timing, against the 2 GB copy bandwidth the benchmarks divide by. Usage: python benchmarks/copy_probe.py"""
import torch

from quick_time import copy_bw, time_fn

bw = max(copy_bw() for _ in range(5))     # also brings the clocks up (about 1 s of copies)
print(f"copy bandwidth (2 GB) {bw:.0f} GB/s", flush=True)
print(f"empty kernel: {min(time_fn([lambda: torch.cuda._sleep(0)], iters=200) for _ in range(3)):6.2f} us", flush=True)
for mb in (4, 8.6, 16.8, 25.9, 34, 64, 256):
    n = int(mb * 1e6) // 16 * 16
    nsets = max(4, int(512e6 // (2 * n)) + 1)
    xs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    ys = [torch.empty_like(x) for x in xs]
    fns = [lambda i=i: ys[i].copy_(xs[i]) for i in range(nsets)]
    us = min(time_fn(fns, iters=100) for _ in range(3))
    print(f"copy {mb:6.1f} MB: {us:7.2f} us  {2 * n / us / 1e3:6.0f} GB/s {100 * 2 * n / us / 1e3 / bw:5.1f} % "
          f"(bytes read + written)", flush=True)
    del xs, ys
    torch.cuda.empty_cache()

"""Benchmark harness (not part of dsagen): DeepGEMM's sm90 ``fp8_paged_mqa_logits`` kernel, launched
by this harness's own host code, under the ``deep_gemm`` names that ``dsagen bench`` calls.

Why: the only DeepGEMM build reachable from the lent H200 (the ``deep_gemm`` package inside the
sgl-kernel 0.3.21 wheel) is compiled against torch 2.9.1 and fails inside torch 2.11 there. Its
CUDA headers still compile, so ``launch.cu`` includes ``deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh``
from that wheel (``DG_INCLUDE``) and launches the kernel and its schedule kernel with DeepGEMM's
sm90 settings (3 q stages, 3 kv stages, 4 math warpgroups, split_kv 256, 132 CTAs) and tensor maps
of the same shapes and swizzles. ``clean_logits=True`` is not implemented (raises), so the bench
times the logits kernel alone; positions past a request's length are left unwritten.

Put ``benchmarks/dg_harness`` on PYTHONPATH with ``DG_INCLUDE`` set; the library is built on
import with nvcc into ``DGH_BUILD`` (default /tmp/dgh).
"""
import ctypes
import os
import subprocess
from pathlib import Path

import torch

__version__ = "dsagen dg_harness: sm90 kernel headers of deep_gemm (sgl-kernel 0.3.21)"

_HERE = Path(__file__).resolve().parent
_SPLIT_KV, _BLOCK_KV, _NUM_SMS = 256, 64, 132


def _build() -> ctypes.CDLL:
    inc = os.environ.get("DG_INCLUDE")
    if not inc or not (Path(inc) / "deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh").is_file():
        raise ImportError("dg_harness: set DG_INCLUDE to a DeepGEMM include tree holding "
                          "deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh (see the dgbench step of benchmarks/gpu_run.sh)")
    out = Path(os.environ.get("DGH_BUILD", "/tmp/dgh"))
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "libdgh.so"
    if not lib.exists():
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        cmd = [f"{cuda}/bin/nvcc", "-std=c++20", "-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda",
               "--diag-suppress=39,161,174,177,186,940", "--ptxas-options=--register-usage-level=10",
               "-gencode", "arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
               "-I", inc, str(_HERE / "launch.cu"), "-o", str(lib)]
        subprocess.run(cmd, check=True)
    so = ctypes.CDLL(str(lib))
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
    so.dgh_encode.argtypes = [vp, vp, vp, vp, u32, u32, u32, u32]
    so.dgh_logits.argtypes = [u32, u32, u64, u64, vp, vp, vp, vp, vp, vp]
    so.dgh_meta.argtypes = [u32, u32, vp, vp, vp]
    return so


_lib = _build()
_maps: dict = {}


def get_num_sms() -> int:
    return _NUM_SMS


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """Schedule ``[num_sms + 1, 2]`` int32 from DeepGEMM's own schedule kernel (1-D context_lens)."""
    if block_kv != _BLOCK_KV or num_sms != _NUM_SMS or context_lens.dim() != 1:
        raise ValueError("harness: block_kv 64, 132 SMs and 1-D context_lens only")
    meta = torch.empty(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)
    rc = _lib.dgh_meta(context_lens.numel(), 1, context_lens.data_ptr(), meta.data_ptr(),
                       torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"harness: schedule launch failed ({rc})")
    return meta


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=True):
    """``q [B, next_n, 64, 128]`` e4m3, ``kv_cache [pages, 64, 1, 132]`` uint8 (keys then fp32 scales per
    page), ``weights [B*next_n, 64]`` fp32, int32 ``context_lens [B]`` and ``block_table``; returns fp32
    logits ``[B*next_n, max_context_len]`` (a view of a row stride aligned to 256)."""
    if clean_logits:
        raise NotImplementedError("harness: clean_logits=True")
    B, nn, H, D = q.shape
    if (H, D) != (64, 128) or nn not in (1, 2) or kv_cache.shape[1] != _BLOCK_KV:
        raise ValueError("harness: 64 heads, head_dim 128, page 64, next_n 1 or 2 only")
    key = (q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), B, nn, kv_cache.shape[0])
    maps = _maps.get(key)
    if maps is None:
        maps = ctypes.create_string_buffer(128 * 4)
        rc = _lib.dgh_encode(maps, q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), B, nn,
                             kv_cache.shape[0], kv_cache.stride(0))
        if rc:
            raise RuntimeError(f"harness: tensor map encode failed ({rc})")
        _maps[key] = maps
    stride = -(-max_context_len // _SPLIT_KV) * _SPLIT_KV
    logits = torch.empty(B * nn, stride, dtype=torch.float32, device=q.device)
    rc = _lib.dgh_logits(nn, B, stride, block_table.stride(0), context_lens.data_ptr(), logits.data_ptr(),
                         block_table.data_ptr(), schedule_meta.data_ptr(), maps,
                         torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"harness: logits launch failed ({rc})")
    return logits[:, :max_context_len]

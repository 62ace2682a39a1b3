"""Shared fixtures of the dsagen test suite.

The spec parametrization (``dsagen_spec_path``, ``dsagen_spec``, ``dsagen_ops``) comes from the
dsagen pytest plugin (dsagen/pytest_plugin.py): every shipped spec, or only the ``--dsagen-spec``
files. Random inputs are fresh each session: the session seed is printed in the header and can
be pinned with ``DSAGEN_TEST_SEED=N`` to reproduce a failure.
"""
from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest
import torch

import dsagen
from dsagen.spec import Spec, shipped_spec_paths

REPO = Path(__file__).resolve().parent.parent
SPECS = {p.stem: p for p in shipped_spec_paths()}

_SEED = int(os.environ.get("DSAGEN_TEST_SEED") or random.SystemRandom().randrange(1, 2**31))


def pytest_report_header(config):
    return f"dsagen: random seed {_SEED} (reproduce with DSAGEN_TEST_SEED={_SEED})"


@pytest.fixture
def seed(request) -> int:
    """A per-test seed derived from the session seed and the test id."""
    return (_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**31


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def repro(seed) -> str:
    """How to rerun a failing test with the same random inputs (for assertion messages)."""
    return f"(random inputs: rerun with DSAGEN_TEST_SEED={_SEED}; test seed {seed})"


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request, dsagen_spec) -> str:
    """"cpu", then "cuda" (skipped without a device that one of the spec's targets matches)."""
    if request.param == "cuda":
        from dsagen.ops import cuda_archs
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        if not cuda_archs(dsagen_spec):
            pytest.skip(f"the device matches none of the targets {list(dsagen_spec.targets)}")
    return request.param


@pytest.fixture(scope="session")
def shipped() -> dict[str, Spec]:
    return {name: dsagen.load_spec(p) for name, p in SPECS.items()}


# Layouts that no shipped spec has: they check that the generated code follows every field of a
# spec (placement, rounding, page size, padded page stride, heads, next_n, key dtype, head_dim)
# instead of assuming the shipped layouts.
VARIANTS = {
    # DESIGN.md section 3 "fp8 token-interleaved" + DeepSeek V3.2 ue8m0 scales, 16-token pages
    # padded to a 16-byte multiple larger than needed, 32 heads, next_n 1 and 3
    "fp8_interleaved_pow2_page16": dict(
        name="t_fp8_interleaved_pow2_page16", head_dim=128, page_size=16, page_stride_bytes=2128,
        key={"dtype": "e4m3"},
        scale={"dtype": "fp32", "rounding": "pow2", "block": 128, "placement": "interleaved"},
        logits={"num_heads": 32, "next_n": [1, 3]}, targets=["sm_90a", "sm_100a"]),
    # FP4 keys at head_dim 32 (one element per store lane: nibbles packed across lanes),
    # ue8m0 per 16 elements interleaved with the keys (18 B/token: unaligned rows), page 8
    "fp4_d32_ue8m0_interleaved_page8": dict(
        name="t_fp4_d32_ue8m0_interleaved_page8", head_dim=32, page_size=8,
        key={"dtype": "e2m1"},
        scale={"dtype": "ue8m0", "block": 16, "placement": "interleaved"},
        logits={"num_heads": 8, "next_n": [1, 4]}, targets=["sm_90a", "sm_100a"]),
    # e4m3 with fp32 scales per 64 elements, head_dim 256, page-tail
    "fp8_d256_block64_page32": dict(
        name="t_fp8_d256_block64_page32", head_dim=256, page_size=32,
        key={"dtype": "e4m3"},
        scale={"dtype": "fp32", "block": 64, "placement": "page_tail"},
        logits={"num_heads": 16, "next_n": [2]}, targets=["sm_90a", "sm_100a"]),
    # scales in their own tensor (scale.placement separate): e4m3 keys alone in kv_cache, 32-token
    # pages padded from 4096 to 4160 bytes, fp32 per-token scales in kv_scales [pages, 128]; the
    # portable CUDA kernel (never WGMMA), 16 heads, next_n 1 and 2
    "fp8_separate_page32": dict(
        name="t_fp8_separate_page32", head_dim=128, page_size=32, page_stride_bytes=4160,
        key={"dtype": "e4m3"},
        scale={"dtype": "fp32", "block": 128, "placement": "separate"},
        logits={"num_heads": 16, "next_n": [1, 2]}, targets=["sm_90a", "sm_100a"]),
    # fp16 keys, head_dim 64, one token per page, 16 heads, next_n 2 and 4
    "fp16_d64_page1": dict(
        name="t_fp16_d64_page1", head_dim=64, page_size=1,
        key={"dtype": "fp16"}, scale={"dtype": "none"},
        logits={"num_heads": 16, "next_n": [2, 4]}, targets=["sm_90a", "sm_100a"]),
}


@pytest.fixture(params=sorted(VARIANTS), scope="session")
def variant_spec(request) -> Spec:
    return Spec.from_dict(VARIANTS[request.param], source=f"<variant {request.param}>")


@pytest.fixture(scope="session")
def nvcc() -> str:
    """Path of nvcc; missing nvcc fails the test under CI (CI=true) and skips it elsewhere."""
    from dsagen.jit import find_nvcc
    p = find_nvcc()
    if p is None:
        msg = "nvcc not found (PATH, CUDA_HOME, /usr/local/cuda)"
        if os.environ.get("CI"):
            pytest.fail(msg + ": CI must compile the CUDA sources")
        pytest.skip(msg)
    return p


"""The CUDA sources compile with nvcc for every target (compile only: no GPU is needed).

Missing nvcc skips these tests, except under CI (env CI set), where it fails them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dsagen.codegen import (CUDA_SOURCES, default_tuning, e2m1_q_slots, e2m1_smem_bytes, render, uses_e2m1_mma, uses_wgmma, uses_ws,
                            wgmma_kernel_applies, wgmma_smem_bytes, ws_smem_bytes, ws_stages)
from dsagen.jit import nvcc_compile_only

pytestmark = pytest.mark.nvcc

ARCHS = ["sm_90a", "sm_100a"]


def _compile(spec, tmp_path):
    results = nvcc_compile_only(render(spec), ARCHS, workdir=tmp_path)
    assert {(r.arch, r.source) for r in results} == {(a, s) for a in ARCHS
                                                    for s in CUDA_SOURCES}
    bad = [r for r in results if not r.ok]
    assert not bad, "\n\n".join(f"{r.source} for {r.arch} failed:\n{r.log[-6000:]}" for r in bad)
    for r in results:          # host + device for the first arch, device code alone for the next
        want = tmp_path / (f"{r.source}.{r.arch}.o" if r.arch == ARCHS[0] else f"{r.source}.{r.arch}.cubin")
        assert r.output == want and want.stat().st_size > 0, r


def test_nvcc_compiles(dsagen_spec, dsagen_spec_path, nvcc, tmp_path):
    from conftest import SPECS
    if dsagen_spec_path.resolve() == Path(SPECS["fp8_e4m3_page64"]).resolve():
        # the same render, archs and nvcc_compile_only call as `dsagen compile` in
        # tests/test_cli.py::test_compile_fp8, which asserts every source compiled (CI time)
        pytest.skip("compiled for sm_90a and sm_100a by tests/test_cli.py::test_compile_fp8")
    _compile(dsagen_spec, tmp_path)


def test_nvcc_compiles_variant(variant_spec, nvcc, tmp_path):
    # fp8 interleaved (4-byte aligned keys) takes the WGMMA kernel with 4-byte key copies, which
    # the shipped fp8_e4m3_interleaved_page64 spec compiles already (skipped here for CI time).
    # The others each have a path no shipped spec has: fp16 head_dim 64 a one-atom fp16 WGMMA
    # instantiation, FP4 head_dim 32 nibbles packed across store lanes with unaligned ue8m0
    # rows, e4m3 head_dim 256 fp32 block scales (the portable kernel).
    assert uses_wgmma(variant_spec) == (variant_spec.key_dtype == "fp16"
                                        or variant_spec.name == "t_fp8_interleaved_pow2_page16")
    if variant_spec.name == "t_fp8_interleaved_pow2_page16":
        pytest.skip("same kernel path as the shipped fp8_e4m3_interleaved_page64 spec")
    _compile(variant_spec, tmp_path)


def test_nvcc_compiles_small_ws_under_another_main_kernel(nvcc, tmp_path):
    # a small-work ws kernel under a main kernel that is not ws: the launch still chooses the L2
    # hint (tuning kv_evict_first) for the small kernel
    import dsagen
    from conftest import SPECS
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    tuning = {"kernel": "wgmma", "small": {"kernel": "ws"}}
    results = nvcc_compile_only(render(spec, tuning), ["sm_90a"], workdir=tmp_path)
    bad = [r for r in results if not r.ok]
    assert results and not bad, "\n\n".join(f"{r.source} for {r.arch} failed:\n{r.log[-6000:]}" for r in bad)


# paged_logits_mma (tuning ``portable`` "mma") for both targets: 16-byte key loads (page-tail
# fp8, bf16 and ue8m0), 4-byte loads (token-interleaved 132-byte rows, one token per page),
# separate scales, 8-byte lanes (fp8 head_dim 32), one 16-key tile per warp step (bf16 head_dim 256)
_MMA_SPECS = {
    "fp8_e4m3_page64": None, "bf16_page64": None, "fp8_e4m3_ue8m0_page64": None,
    "fp8_e4m3_interleaved_page64": None, "fp8_e4m3_page1": None, "fp16_page64": None,
    "t_fp8_separate_page32": "fp8_separate_page32",
    "t_fp8_d32_page64": dict(name="t_fp8_d32_page64", head_dim=32, page_size=64, key={"dtype": "e4m3"},
                             scale={"dtype": "fp32", "block": 32, "placement": "page_tail"},
                             logits={"num_heads": 8, "next_n": [1, 3]}, targets=["sm_90a", "sm_100a"]),
    # the heaviest e4m3 instantiations: 256-byte rows at next_n 4 (254-255 registers unwidened),
    # and 64-byte rows (the widened form's tile count unchanged)
    "t_fp8_d256_h8_interleaved_page1": dict(name="t_fp8_d256_h8_interleaved_page1", head_dim=256, page_size=1,
                                            key={"dtype": "e4m3"},
                                            scale={"dtype": "fp32", "block": 256, "placement": "interleaved"},
                                            logits={"num_heads": 8, "next_n": [1, 4]}, targets=["sm_90a", "sm_100a"]),
    "t_fp8_d64_h128_page64": dict(name="t_fp8_d64_h128_page64", head_dim=64, page_size=64, key={"dtype": "e4m3"},
                                  scale={"dtype": "fp32", "block": 64, "placement": "page_tail"},
                                  logits={"num_heads": 128, "next_n": [1, 2]}, targets=["sm_90a", "sm_100a"]),
    "t_bf16_d256_h128_page64": dict(name="t_bf16_d256_h128_page64", head_dim=256, page_size=64,
                                    key={"dtype": "bf16"}, scale={"dtype": "none"},
                                    logits={"num_heads": 128, "next_n": [1, 2]}, targets=["sm_90a", "sm_100a"]),
}


@pytest.mark.parametrize("form", ["mma", "mma_widen", "mma_prefetch"])
@pytest.mark.parametrize("name", sorted(_MMA_SPECS))
def test_nvcc_compiles_portable_mma(name, form, nvcc, tmp_path, monkeypatch):
    """The portable tensor-core kernel (the default portable kernel) compiles for sm_90a and
    sm_100a without spilling, in its e4m3 m16n8k32 form, its ``mma_widen`` form on e4m3 keys
    (f16 MMAs on keys and q widened once, the default) and that form with ``mma_prefetch`` (keys
    loaded a warp step ahead); tuning ``portable`` "simt" leaves it out. Only paged_logits.cu
    is compiled (for CI time: under tuning ``kernel`` "simt" paged_logits_small.cu is empty and
    store.cu differs from the default render only in its namespace), except that the "mma" form
    of a spec no shipped spec covers (the ``t_`` ones) compiles store.cu too."""
    import re
    import dsagen
    from conftest import SPECS, VARIANTS
    from dsagen.codegen import mma_applies, namespace
    from dsagen.spec import Spec
    v = _MMA_SPECS[name]
    spec = (dsagen.load_spec(SPECS[name]) if v is None else
            Spec.from_dict(VARIANTS[v] if isinstance(v, str) else v, source=f"<{name}>"))
    assert mma_applies(spec)
    widen = form != "mma"
    if widen and spec.key_dtype != "e4m3":
        pytest.skip(f"{form}: e4m3 keys only")
    assert "paged_logits_mma" not in render(spec, {"portable": "simt"})["paged_logits.cu"]
    monkeypatch.setenv("DSAGEN_NVCC_FLAGS", "-Xptxas -v")         # ptxas reports each kernel
    tuning = {"kernel": "simt", "mma_widen": widen, "mma_prefetch": form == "mma_prefetch"}
    src = render(spec, tuning)
    assert ("if (it + 1 < kMmaIters) {" in src["paged_logits.cu"]) == (form == "mma_prefetch")
    assert ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3" in src["paged_logits.cu"]) == (
        spec.key_dtype == "e4m3" and not widen)
    assert "__global__" not in src["paged_logits_small.cu"]
    assert (src["store.cu"].replace(namespace(spec, tuning), "NS")
            == render(spec)["store.cu"].replace(namespace(spec), "NS"))
    only = ["paged_logits.cu"] + (["store.cu"] if form == "mma" and name.startswith("t_") else [])
    results = nvcc_compile_only(src, ARCHS, workdir=tmp_path, only=only)
    assert sorted((r.arch, r.source) for r in results) == sorted((a, f) for a in ARCHS for f in only)
    for r in results:
        assert r.ok, f"{r.source} for {r.arch} failed:\n{r.log[-6000:]}"
        if r.source != "paged_logits.cu":
            continue
        entries = re.findall(r"entry function '(\w+)'[^\n]*\n[^\n]*\n\s*\d+ bytes stack frame, (\d+) bytes spill stores",
                             r.log)
        mma = [(fn, int(n)) for fn, n in entries if "paged_logits_mma" in fn]
        assert len(mma) == len(spec.next_n), (r.arch, entries)
        assert all(n == 0 for _, n in mma), (r.arch, mma)


# The CPU torch wheel ships ATen/c10 CUDA headers but not the CUDA libraries' headers they
# include; these stand-ins declare just the handle and status types the headers name, so the
# host side of the CUDA build (bindings.cpp with DSAGEN_WITH_CUDA) can be compiled here.
_STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n"
                  "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\n"
                   "typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t;\n",
    "cusolver_common.h": "typedef enum { CUSOLVER_STATUS_SUCCESS = 0 } cusolverStatus_t;\n",
    "c10/cuda/impl/cuda_cmake_macros.h": "",
}


_BINDINGS_SPECS = ["fp8_e4m3_page64", "bf16_page64", "fp4_e2m1_page64", "fp8_separate_page32"]


def test_cuda_bindings_compile(nvcc, tmp_path):
    """bindings.cpp as the CUDA build compiles it (DSAGEN_WITH_CUDA): the torch-op side of the
    CUDA kernels, which no CPU build touches (a type error here once reached the GPU build), for
    fp8, bf16, FP4 keys and fp8_separate_page32 (a conftest variant: the kv_scales checks and
    launch arguments). One translation unit includes the four specs' bindings.cpp, each from its
    own folder (each spec's code lives in its own namespace), so torch's headers are parsed once
    (CI time); an error names the spec's folder."""
    import os
    import shutil
    import subprocess

    import dsagen
    from torch.utils.cpp_extension import include_paths
    from conftest import SPECS, VARIANTS
    from dsagen.spec import Spec
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    for rel, text in _STUBS.items():
        p = tmp_path / "stubs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#pragma once\n" + text)
    lines = []
    for name in _BINDINGS_SPECS:
        spec = dsagen.load_spec(SPECS[name]) if name in SPECS else Spec.from_dict(VARIANTS[name])
        src = tmp_path / "src" / name
        src.mkdir(parents=True)
        for f, text in render(spec).items():
            (src / f).write_text(text)
        lines.append(f'#include "{name}/bindings.cpp"')
    (tmp_path / "src" / "all_bindings.cpp").write_text("\n".join(lines) + "\n")
    homes = [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")]
    if os.environ.get("CUDA_HOME"):
        homes.insert(0, Path(os.environ["CUDA_HOME"]))
    cuda_inc = next((h / "include" for h in homes if (h / "include" / "cuda_runtime_api.h").exists()), None)
    assert cuda_inc is not None, f"no CUDA include directory with cuda_runtime_api.h near {nvcc}"
    cmd = [cxx, "-std=c++20", "-fsyntax-only", "-DDSAGEN_WITH_CUDA", f"-I{tmp_path / 'src'}", f"-I{cuda_inc}",
           f"-I{tmp_path / 'stubs'}"] + [f"-I{p}" for p in include_paths()] + [str(tmp_path / "src" / "all_bindings.cpp")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-6000:]


def test_wgmma_kernel_applies(shipped):
    """Which paged kernel runs on an sm_90 device (the verification's fp8 bar depends on it)."""
    fp8 = shipped["fp8_e4m3_page64"]
    assert wgmma_kernel_applies(fp8, 2) and wgmma_kernel_applies(shipped["fp8_e4m3_page1"], 1)
    assert not wgmma_kernel_applies(fp8, 2, {"kernel": "simt"})
    # FP4 keys: paged_logits_e2m1 (bf16 WGMMA from dequantized registers) where the layout allows
    fp4 = shipped["fp4_e2m1_page64"]
    assert not uses_wgmma(fp4) and uses_e2m1_mma(fp4)
    assert wgmma_kernel_applies(fp4, 1) and wgmma_kernel_applies(fp4, 2)
    assert not wgmma_kernel_applies(fp4, 1, {"kernel": "simt"})
    assert not uses_e2m1_mma(fp4.with_(scale_placement="separate"))
    assert not uses_e2m1_mma(fp4.with_(head_dim=32, scale_block=32))
    # only the configurations run on the H200: 64 heads, next_n * num_heads <= 128
    assert not uses_e2m1_mma(fp4.with_(num_heads=32)) and not uses_e2m1_mma(fp4.with_(num_heads=128))
    fp4_n4 = fp4.with_(next_n=[1, 2, 3, 4])
    assert [wgmma_kernel_applies(fp4_n4, nn) for nn in (1, 2, 3, 4)] == [True, True, False, False]
    assert e2m1_smem_bytes(fp4, 2, 6, 2) == 1024 + 2 * 128 * 256 + 6 * (64 * 68) + 2 * 128 * 4
    # one q buffer where a second would pass 32 KB (next_n 2 at 64 heads): 4 CTAs per SM, not 2
    assert e2m1_q_slots(fp4, 1) == 2 and e2m1_q_slots(fp4, 2) == 1
    assert e2m1_smem_bytes(fp4, 2, 2) == e2m1_smem_bytes(fp4, 2, 2, 1) == 1024 + 128 * 256 + 128 * 4 + 2 * 64 * 68
    # scales in their own tensor: the WGMMA kernel reads them from kv_cache, so never it
    assert not uses_wgmma(fp8.with_(scale_placement="separate"))
    assert not wgmma_kernel_applies(fp8.with_(scale_placement="separate"), 1)
    big = fp8.with_(head_dim=256, scale_block=256, num_heads=128, next_n=[4])
    assert wgmma_smem_bytes(big, 4, 4) > 227 * 1024 and not wgmma_kernel_applies(big, 4)
    assert wgmma_kernel_applies(big, 1)


def test_ws_kernel_selection(shipped):
    """The warp-specialized TMA kernel is generated for the layouts TMA can address (page-tail,
    pages of 64+ tokens, one fp32 scale per token) with the stage count that fits shared memory,
    and the rendered source instantiates exactly those stage counts."""
    ws = {n for n, s in shipped.items() if uses_ws(s)}
    assert ws == {"fp8_e4m3_page64", "fp8_e4m3_ue8m0_page64", "bf16_page64", "fp16_page64"}
    for name, spec in shipped.items():
        src = render(spec)["paged_logits.cu"]
        for nn in spec.next_n:
            s = ws_stages(spec, nn)
            tune = default_tuning(spec)
            if name in ws:
                assert 2 <= s <= tune["ws_stages"]
                assert ws_smem_bytes(spec, nn, tune["math_wgs"], s) <= 227 * 1024
                assert f"constexpr int kWsStagesFor<{nn}> = {s};" in src
                assert f"constexpr int kMathWGs = {tune['math_wgs']};" in src
            else:
                assert s == 0 and "kWsStagesFor" not in src
    fp8 = shipped["fp8_e4m3_page64"]
    assert ws_stages(fp8, 1, {"kernel": "wgmma"}) == 0 and ws_stages(fp8, 1, {"kernel": "simt"}) == 0
    # bf16 at next_n 4 with 128 heads: q takes 2 x 128 KiB, nothing fits -> the cp.async or CUDA-core kernel
    big = shipped["bf16_page64"].with_(num_heads=128, next_n=[4])
    assert ws_stages(big, 4) == 0
    # a padded page stride (a multiple of 16) is fine; pages smaller than a 64-token tile are not
    assert uses_ws(fp8.with_(page_stride_bytes=8464)) and not uses_ws(fp8.with_(page_size=32))


@pytest.mark.parametrize("name, tuning", [("fp8_e4m3_page64", "{}"), ("bf16_page64", '{"loop": "unit"}')])
def test_timeline_probe_builds(name, tuning, nvcc, tmp_path):
    """benchmarks/timeline.py's probe (the kernels with -DDSAGEN_TIMELINE: the template's
    DSAGEN_MARK points record timestamps) still builds against the rendered sources: fp8 (the
    main and the small-work kernel, the request loop) and bf16 with the unit loop (no small
    kernel)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": f"{Path(nvcc).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"   # this tree's dsagen
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "timeline.py"), "--build-only",
                        str(root / "specs" / f"{name}.yaml"), tuning], capture_output=True, text=True, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    exe = r.stdout.strip().splitlines()[-1].removeprefix("built ")
    assert Path(exe).is_file() and Path(exe).stat().st_size > 0, r.stdout


def test_wgmma_probe_builds(nvcc, tmp_path):
    """benchmarks/wgmma_probe.cu (the tensor-core throughput probe of the twenty-second session)
    still compiles for sm_90a against the shipped CuTe headers."""
    import subprocess
    from pathlib import Path
    from dsagen.jit import cutlass_include_dir
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "wgmma_probe.cubin"
    r = subprocess.run([nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-gencode", "arch=compute_90a,code=sm_90a",
                        "-I", str(cutlass_include_dir()), "-cubin", "-o", str(out), str(root / "benchmarks" / "wgmma_probe.cu")],
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert out.stat().st_size > 0


def test_extra_gpu_targets_compile_every_arch_with_c(nvcc, tmp_path, monkeypatch):
    """nvcc refuses -cubin for several GPU targets: where DSAGEN_NVCC_FLAGS adds one, every arch
    is compiled with -c (store.cu only, for CI time)."""
    import dsagen
    from conftest import SPECS
    monkeypatch.setenv("DSAGEN_NVCC_FLAGS", "-gencode arch=compute_90a,code=sm_90a")
    results = nvcc_compile_only(render(dsagen.load_spec(SPECS["bf16_page64"])), ARCHS, workdir=tmp_path,
                                only=["store.cu"])
    assert [(r.arch, r.ok, r.output) for r in results] == [
        (a, True, tmp_path / f"store.cu.{a}.o") for a in ARCHS], [r.log[-3000:] for r in results]

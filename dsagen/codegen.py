"""Render a :class:`~dsagen.spec.Spec` into C++/CUDA sources with Jinja (StrictUndefined).

``render(spec)`` returns ``{file name: text}``; ``write_generated(spec, out_dir)`` writes them,
touching only files whose text changed. The sources are deterministic (no paths, no dates), so
``generated/<name>/`` can be compared with a fresh render.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jinja2

from .spec import Spec

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
GENERATED_DIR = Path(__file__).resolve().parent.parent / "generated"

CPU_SOURCES = ("bindings.cpp", "cpu_ops.cpp")
CUDA_SOURCES = ("store.cu", "paged_logits.cu")
HEADERS = ("layout.h",)

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def namespace(spec: Spec) -> str:
    """C++ namespace and torch.library namespace of a spec's ops (unique per spec content)."""
    return f"dsagen_{spec.name}_{spec.digest}"


def uses_wgmma(spec: Spec) -> bool:
    """Whether the sm_90a tensor-core (WGMMA) paged-logits kernel applies to this layout."""
    return (spec.key_dtype in ("e4m3", "bf16", "fp16")
            and spec.key_bytes_per_token % 128 == 0
            and spec.key_align == 16
            and any(n * spec.num_heads <= 256 for n in spec.next_n))


def default_tuning(spec: Spec) -> dict[str, Any]:
    """Pipeline depth of the sm_90a kernel (stages of 64-token tiles per CTA)."""
    return {"stages": 4 if spec.key.bits == 8 else 2}


def _mma_op(spec: Spec):
    def op(n: int) -> str:
        if spec.key_dtype == "e4m3":
            return f"MMA_64x{n}x32_F32E4M3E4M3_SS_TN<>"
        ab = "BF16BF16" if spec.key_dtype == "bf16" else "F16F16"
        major = "cute::SM90::GMMA::Major::K"
        return f"MMA_64x{n}x16_F32{ab}_SS<{major}, {major}>"
    return op


def render(spec: Spec, tuning: dict[str, Any] | None = None) -> dict[str, str]:
    """Render every source of ``spec``. Returns ``{file name: text}``."""
    tune = {**default_tuning(spec), **(tuning or {})}
    lane_bytes = spec.key_bytes_per_token // 32 or 1
    ctx = {
        "spec": spec,
        "ns": namespace(spec),
        "lay": spec.layout,
        "q_scalar": {"e4m3": "kFloat8_e4m3fn", "bf16": "kBFloat16", "fp16": "kHalf"}[spec.key_dtype],
        "store_vec": math.gcd(lane_bytes, spec.key_align),
        "wgmma": uses_wgmma(spec),
        "stages": int(tune["stages"]),
        "k_step_bytes": 32,
        "mma_op": _mma_op(spec),
    }
    out = {}
    for name in HEADERS + CPU_SOURCES + CUDA_SOURCES:
        out[name] = _env.get_template(name + ".jinja").render(**ctx)
    return out


def write_generated(spec: Spec, out_dir: Path | None = None,
                    tuning: dict[str, Any] | None = None) -> Path:
    """Write the rendered sources to ``out_dir`` (default ``generated/<name>/``); unchanged files
    are not touched. Returns the directory."""
    d = Path(out_dir) if out_dir else GENERATED_DIR / spec.name
    d.mkdir(parents=True, exist_ok=True)
    for name, text in render(spec, tuning).items():
        p = d / name
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    return d

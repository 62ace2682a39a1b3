"""One table of the element types a layout can use.

Each entry maps the spec's dtype name to its storage size, its torch dtype, the C++ type used by
the generated CPU backend and the CUDA type used by the generated kernels.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str            # name in the YAML spec
    bits: int            # storage bits per element
    torch_name: str      # attribute of the torch module (resolved lazily: importing torch is slow)
    cpp: str             # C++ storage type on the CPU backend (c10 type)
    cuda: str            # CUDA storage type in the generated kernels
    max_value: float     # largest finite magnitude (quantization target), 0 when not quantized
    short: str

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.torch_name)


KEY_DTYPES: dict[str, DType] = {
    "e4m3": DType("e4m3", 8, "float8_e4m3fn", "c10::Float8_e4m3fn", "__nv_fp8_e4m3", 448.0, "fp8"),
    "bf16": DType("bf16", 16, "bfloat16", "c10::BFloat16", "__nv_bfloat16", 0.0, "bf16"),
    "fp16": DType("fp16", 16, "float16", "c10::Half", "__half", 0.0, "fp16"),
}

SCALE_DTYPES: dict[str, int] = {
    # name -> bytes per scale
    "fp32": 4,
    "none": 0,
}


"""One table of the element types a layout can use.

Each entry maps the spec's dtype name to its storage size, its torch dtype, the C++ type used by
the generated CPU backend and the CUDA type used by the generated kernels.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """One element type of :data:`KEY_DTYPES` (``Spec.key``, ``Spec.query``): its names in the
    spec, torch, the C++ CPU backend and CUDA, its storage bits and the quantization
    target ``max_value``: the largest finite magnitude a scaled key is mapped to (448 for e4m3, 6 for
    e2m1), 0 for bf16 and fp16, which are stored unscaled."""

    name: str            # name in the YAML spec
    bits: int            # storage bits per element
    torch_name: str      # attribute of the torch module (resolved lazily: importing torch is slow)
    cpp: str             # C++ storage type on the CPU backend (c10 type)
    cuda: str            # CUDA storage type in the generated kernels
    max_value: float     # largest finite magnitude (quantization target), 0 when not quantized
    short: str
    aten: str            # at::ScalarType of a tensor holding these values (e2m1: packed bytes)

    @property
    def torch_dtype(self):
        """The ``torch.dtype`` of a tensor holding these values (``torch.uint8`` for e2m1: two
        packed codes per byte). Imports torch."""
        import torch
        return getattr(torch, self.torch_name)


KEY_DTYPES: dict[str, DType] = {
    "e4m3": DType("e4m3", 8, "float8_e4m3fn", "c10::Float8_e4m3fn", "__nv_fp8_e4m3", 448.0, "fp8", "kFloat8_e4m3fn"),
    "bf16": DType("bf16", 16, "bfloat16", "c10::BFloat16", "__nv_bfloat16", 0.0, "bf16", "kBFloat16"),
    "fp16": DType("fp16", 16, "float16", "c10::Half", "__half", 0.0, "fp16", "kHalf"),
    # OCP FP4 (E2M1): values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, two per byte
    # (element 2i in the low nibble, 2i+1 in the high nibble). No torch arithmetic dtype exists:
    # the reference decodes the nibbles itself and q stays bf16.
    "e2m1": DType("e2m1", 4, "uint8", "uint8_t", "uint8_t", 6.0, "fp4", "kByte"),
}

# the least amax a scale block is quantized with (max(|k|, AMAX_FLOOR), DESIGN.md section 2): an
# all-zero or tiny block gets a finite scale. The reference uses the number; the templates render
# the literal (layout.h's kAmaxFloor)
AMAX_FLOOR_LITERAL = "1e-4"
AMAX_FLOOR = float(AMAX_FLOOR_LITERAL)

# values of the 8 non-negative E2M1 codes (code | 8 is the negative)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

SCALE_DTYPES: dict[str, int] = {
    # name -> bytes per scale
    "fp32": 4,
    "ue8m0": 1,     # one biased exponent byte e: scale = 2**(e - 127)
    "none": 0,
}


def query_dtype(key: DType) -> DType:
    """The dtype of ``q`` that goes with keys of this dtype: e4m3 queries for e4m3 keys
    (DeepGEMM ``fp8_paged_mqa_logits``), bf16 for e2m1 keys, else the key dtype."""
    return KEY_DTYPES["bf16"] if key.name == "e2m1" else key


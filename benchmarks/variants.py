"""Write the verification variants of every shipped spec (issue 4) as YAML files.

For each shipped spec: head_dim 32 and 64 with 16 heads and next_n 1..4, the spec's own
head_dim and heads with next_n 3 and 4, and head_dim 256 with 16 heads and next_n 1; for
scaled specs also a scale block of 16 elements (16 heads, next_n 1 and 2: the store kernel's
lanes then hold several scale blocks each). Scale blocks larger than the head_dim shrink to it;
padding (``page_stride_bytes``) is dropped. ``dsagen compile DIR/*.yaml`` then verifies them
(on the H200 in ``benchmarks/gpu_run.sh variants``).

Usage: python benchmarks/variants.py OUT_DIR [SPEC.yaml ...]   (default: every shipped spec)
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from dsagen.spec import Spec, load_spec, shipped_spec_paths


def variants(spec: Spec) -> list[Spec]:
    out = []
    shapes = [(32, 16, [1, 2, 3, 4], "d32_h16"), (64, 16, [1, 2, 3, 4], "d64_h16"),
              (spec.head_dim, spec.num_heads, [3, 4], "n34"), (256, 16, [1], "d256_h16")]
    if spec.quantized:
        shapes.append((spec.head_dim, 16, [1, 2], "b16_h16"))
    for head_dim, heads, next_n, tag in shapes:
        d = spec.to_dict()
        d.pop("page_stride_bytes", None)
        d["name"] = f"{spec.name}_{tag}"
        d["description"] = f"{spec.name} at head_dim {head_dim}, {heads} heads, next_n {next_n}"
        d["head_dim"] = head_dim
        d["scale"]["block"] = 16 if tag.startswith("b16") else min(d["scale"]["block"], head_dim)
        d["logits"] = {"num_heads": heads, "next_n": next_n}
        out.append(Spec.from_dict(d, source=f"<variant {d['name']}>"))
    return out


def main(out_dir: str, specs: list[str]) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for p in specs or shipped_spec_paths():
        for v in variants(load_spec(p)):
            (out / f"{v.name}.yaml").write_text(yaml.safe_dump(v.to_dict(), sort_keys=False))
            print(f"{v.name}: {v.bytes_per_token} B/token, next_n {list(v.next_n)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "variants", sys.argv[2:])

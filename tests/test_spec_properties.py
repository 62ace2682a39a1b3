"""Property tests of the spec language (hypothesis): random valid specs render, build and verify
on the CPU backend; random invalid ones are rejected with an error naming the field."""
from __future__ import annotations

import copy

import pytest

hyp = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dsagen import codegen  # noqa: E402
from dsagen.spec import MAX_SMEM_BYTES, Spec, SpecError, simt_smem_bytes  # noqa: E402


@st.composite
def valid_specs(draw, max_heads: int = 128):
    key = draw(st.sampled_from(["e4m3", "bf16", "fp16", "e2m1"]))
    head_dim = draw(st.sampled_from([32, 64, 128, 256]))
    page_size = 2 ** draw(st.integers(0, 8))
    d = {
        "name": "p_" + draw(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)),
        "description": "property test",
        "head_dim": head_dim,
        "page_size": page_size,
        "key": {"dtype": key},
        "logits": {"num_heads": 8 * draw(st.integers(1, max_heads // 8))},
        "targets": draw(st.sampled_from([["sm_90a"], ["sm_100a"], ["sm_90a", "sm_100a"]])),
    }
    # next_n values whose queries fit in shared memory (e.g. not 4 x 104 heads x 256 bf16)
    heads = d["logits"]["num_heads"]
    fit = [n for n in range(1, 5) if simt_smem_bytes(key, head_dim, heads, n) <= MAX_SMEM_BYTES]
    d["logits"]["next_n"] = sorted(draw(st.sets(st.sampled_from(fit), min_size=1, max_size=2)))
    key_bytes = head_dim * {"e4m3": 1, "e2m1": 1, "bf16": 2, "fp16": 2}[key] // (2 if key == "e2m1" else 1)
    scale_bytes = 0
    if key in ("e4m3", "e2m1"):
        sdt = draw(st.sampled_from(["fp32", "ue8m0"]))
        block = 2 ** draw(st.integers(4, head_dim.bit_length() - 1))     # 16 .. head_dim
        d["scale"] = {"dtype": sdt,
                      "rounding": "pow2" if sdt == "ue8m0" else draw(st.sampled_from(["none", "pow2"])),
                      "block": block,
                      "placement": draw(st.sampled_from(["page_tail", "interleaved", "separate"]))}
        if d["scale"]["placement"] != "separate":   # separate: kv_cache pages hold only keys
            scale_bytes = (head_dim // block) * (4 if sdt == "fp32" else 1)
    else:
        d["scale"] = {"dtype": "none"}
    if draw(st.booleans()):
        base = page_size * (key_bytes + scale_bytes)
        d["page_stride_bytes"] = (base + 15) // 16 * 16 + 16 * draw(st.integers(0, 4))
    return d


@settings(max_examples=3, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(valid_specs(max_heads=32))
def test_random_valid_spec_builds_and_verifies_on_cpu(d):
    from dsagen import load
    from dsagen.verify import verify
    spec = Spec.from_dict(d)
    assert spec.bytes_per_token == spec.key_bytes_per_token + spec.scale_bytes_per_token
    srcs = codegen.render(spec)
    assert set(srcs) == {"layout.h", "bindings.cpp", "cpu_ops.cpp", "store.cu", "paged_logits.cu",
                         "paged_logits_small.cu"}
    ops = load(spec, with_cuda=False)
    rep = verify(spec, ops, "cpu", quick=True, seed=1)
    assert rep.passed, f"{d}\n{rep.table()}"


# (YAML path, invalid values) - each must be rejected with that path in the error
BAD = {
    "head_dim": [0, 100, 48, "128", 512],
    "page_size": [0, 3, 48, 512, -64, 1.5],
    "key.dtype": ["int8", "fp8", "e5m2", None],
    "scale.rounding": ["floor", "ue8m0x"],
    "scale.placement": ["separate_tensor", "tail", "Separate"],
    "scale.block": [0, 24, 8, 512],
    "logits.num_heads": [0, 7, 129, 136],
    "logits.next_n": [[0], [5], [], "two"],
    "targets": [["sm_90"], ["sm_80"], []],
    "name": ["1bad", "has space", "", 3],
    "page_stride_bytes": [1, 8449, 100000 + 1],
}


def _set(d: dict, path: str, value):
    parts = path.split(".")
    cur = d
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value


@settings(max_examples=150, deadline=None)
@given(valid_specs(), st.sampled_from(sorted(BAD)), st.data())
def test_random_invalid_spec_names_the_field(d, path, data):
    bad = data.draw(st.sampled_from(BAD[path]))
    if path.startswith("scale.") and d["key"]["dtype"] != "e4m3":
        d["key"]["dtype"] = "e4m3"
        d["scale"] = {"dtype": "fp32", "block": d["head_dim"]}
        d.pop("page_stride_bytes", None)     # drawn for the other key dtype's bytes
    d = copy.deepcopy(d)
    _set(d, path, bad)
    with pytest.raises(SpecError) as e:
        Spec.from_dict(d, source="prop.yaml")
    # the error names the field (a nested key error may name the parent mapping)
    assert e.value.path.split(".")[0] == path.split(".")[0], (path, bad, str(e.value))
    assert str(e.value).startswith("prop.yaml: ")


@settings(max_examples=60, deadline=None)
@given(valid_specs(), st.from_regex(r"[a-z]{3,8}", fullmatch=True))
def test_random_unknown_key_names_it(d, extra):
    where = d if extra not in d else d["logits"]
    if extra in where:
        return
    where[extra] = 1
    with pytest.raises(SpecError, match=extra):
        Spec.from_dict(d)


def test_smem_bound_is_what_the_validator_rejects():
    """The validator rejects a next_n (naming logits.next_n) exactly where simt_smem_bytes, the
    bound valid_specs draws by, exceeds MAX_SMEM_BYTES, for every key dtype, head_dim, head
    count and next_n the strategies draw."""
    for key in ("e4m3", "bf16", "fp16", "e2m1"):
        for head_dim in (32, 64, 128, 256):
            for heads in range(8, 129, 8):
                for n in range(1, 5):
                    d = {"name": "fit", "head_dim": head_dim, "page_size": 64, "key": {"dtype": key},
                         "logits": {"num_heads": heads, "next_n": [n]}, "targets": ["sm_90a"]}
                    if key in ("e4m3", "e2m1"):
                        d["scale"] = {"dtype": "fp32", "block": head_dim, "placement": "page_tail"}
                    try:
                        Spec.from_dict(d)
                        ok = True
                    except SpecError as e:
                        assert e.path == "logits.next_n", str(e)
                        ok = False
                    assert ok == (simt_smem_bytes(key, head_dim, heads, n) <= MAX_SMEM_BYTES), (key, head_dim, heads, n)

"""Spec parsing and validation: shipped specs, one test per kind of mistake, `dsagen validate`."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

import dsagen
from dsagen.spec import Spec, SpecError, shipped_spec_paths

from conftest import REPO, SPECS

FP8 = REPO / "specs" / "fp8_e4m3_page64.yaml"
BF16 = REPO / "specs" / "bf16_page64.yaml"


def test_shipped_specs_are_the_documented_ones():
    assert {p.name for p in shipped_spec_paths()} >= {FP8.name, BF16.name}
    assert all(p.parent == REPO / "specs" for p in shipped_spec_paths())


def test_every_shipped_spec_is_named_after_its_file():
    """specs/<name>.yaml renders into generated/<name>/, which render and compile keep other specs
    of that name out of (dsagen.cli._not_over_a_shipped_spec)."""
    for p in shipped_spec_paths():
        assert dsagen.load_spec(p).name == p.stem, p


@pytest.mark.parametrize("path, bpt, page, summary", [
    (FP8, 132, 8448, "fp8_e4m3_page64: 132 B/token, 8448 B/page"),
    (BF16, 256, 16384, "bf16_page64: 256 B/token, 16384 B/page"),
])
def test_shipped_spec_sizes(path, bpt, page, summary):
    s = dsagen.load_spec(path)
    assert s.name == path.stem
    assert (s.bytes_per_token, s.page_bytes, s.summary()) == (bpt, page, summary)
    assert s.targets == ("sm_90a", "sm_100a")
    assert s.head_dim == 128 and s.page_size == 64 and s.num_heads == 64 and s.next_n == (1, 2)


def test_fp8_page_tail_layout():
    # DeepGEMM / sglang / vLLM: 64 x 128 fp8 bytes, then 64 fp32 scales, per page
    lay = dsagen.load_spec(FP8).layout
    assert (lay.page_size, lay.page_stride, lay.key_token_stride, lay.scale_base,
            lay.scale_token_stride) == (64, 8448, 128, 8192, 4)


def test_separate_placement_layout():
    # scales in their own tensor: kv_cache holds 64 x 128 key bytes per page, kv_scales 64 fp32
    # scales per page, token-major
    s = dsagen.load_spec(FP8).with_(scale_placement="separate")
    assert s.separate_scales and not dsagen.load_spec(FP8).separate_scales
    assert (s.bytes_per_token, s.cache_bytes_per_token, s.page_bytes, s.scale_page_bytes) == (132, 128, 8192, 256)
    lay = s.layout
    assert (lay.page_size, lay.page_stride, lay.key_token_stride, lay.scale_base, lay.scale_token_stride,
            lay.scale_page_stride) == (64, 8192, 128, 0, 4, 256)
    assert s.summary() == ("fp8_e4m3_page64: 132 B/token, 8192 B/page of keys + 256 B/page of scales "
                           "(kv_scales)")
    assert s.key_align == 16
    # padding applies to kv_cache's pages (keys only); scale pages are never padded
    p = s.with_(page_stride_bytes=8208)
    assert (p.page_bytes, p.scale_page_bytes, p.layout.scale_page_stride) == (8208, 256, 256)
    with pytest.raises(SpecError) as ei:
        s.with_(page_stride_bytes=8176)
    assert ei.value.path == "page_stride_bytes" and "8192" in ei.value.message
    # ue8m0 block scales: 4 bytes per token
    u = s.with_(scale_dtype="ue8m0", scale_rounding="pow2", scale_block=32)
    assert (u.scale_page_bytes, u.layout.scale_token_stride, u.page_bytes) == (256, 4, 8192)
    # the other placements keep their scales in kv_cache
    assert dsagen.load_spec(FP8).scale_page_bytes == 0
    assert dsagen.load_spec(FP8).layout.scale_page_stride == 8448


def test_separate_needs_a_scale():
    d = yaml.safe_load(BF16.read_text())
    d["scale"]["placement"] = "separate"
    with pytest.raises(SpecError) as ei:
        Spec.from_dict(d, source="x.yaml")
    assert ei.value.path == "scale.placement" and "scale.dtype is none" in ei.value.message


def test_unscaled_key_has_no_scale_blocks():
    # scale.block of an unscaled key has no effect: any positive integer is recorded as head_dim
    # (the same digest as without it); 0 or a negative one is a SpecError naming it (not a
    # ZeroDivisionError)
    d = yaml.safe_load(BF16.read_text())
    base = Spec.from_dict(d, source="x.yaml")
    for ignored in (128, 7, 64, 256):
        d["scale"]["block"] = ignored
        s = Spec.from_dict(d, source="x.yaml")
        assert s.scale_block == 128 and s.digest == base.digest
    for bad in (0, -3):
        d["scale"]["block"] = bad
        with pytest.raises(SpecError) as ei:
            Spec.from_dict(d, source="x.yaml")
        assert ei.value.path == "scale.block" and "positive" in ei.value.message
    # with_ follows a new head_dim, a quantized key gets its default block, and a block-scaled
    # spec turns unscaled
    assert base.with_(head_dim=64).scale_block == 64
    assert base.with_(key_dtype="e4m3", scale_dtype="fp32").scale_block == 128
    fp4 = dsagen.load_spec(REPO / "specs" / "fp4_e2m1_page64.yaml")
    u = fp4.with_(key_dtype="bf16", scale_dtype="none", scale_rounding="none")
    assert u.scale_block == u.head_dim and u.bytes_per_token == 2 * u.head_dim


def test_with_next_n_takes_an_integer():
    s = dsagen.load_spec(BF16)
    assert s.with_(next_n=3).next_n == (3,) and s.with_(next_n=(2, 1)).next_n == (1, 2)
    assert s.with_(next_n=range(1, 3)).next_n == (1, 2) and s.with_(next_n={2}).next_n == (2,)
    with pytest.raises(SpecError) as ei:
        s.with_(next_n="12")          # not split into "1", "2"
    assert ei.value.path == "logits.next_n"


def test_spec_is_frozen_and_with_revalidates():
    s = dsagen.load_spec(FP8)
    with pytest.raises(Exception):
        s.page_size = 32
    t = s.with_(scale_placement="interleaved", page_size=16)
    assert (t.scale_placement, t.page_size, t.bytes_per_token, t.page_bytes) == ("interleaved", 16, 132, 2112)
    assert t.layout.key_token_stride == 132 and t.layout.scale_base == 128
    assert s.digest != t.digest
    with pytest.raises(SpecError) as ei:
        s.with_(page_size=48)
    assert ei.value.path == "page_size"


def test_roundtrip_to_dict():
    for p in SPECS.values():
        s = dsagen.load_spec(p)
        assert Spec.from_dict(s.to_dict()) == s


def _base() -> dict:
    return yaml.safe_load(FP8.read_text())


def _set(d: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    cur = d
    for k in parents:
        cur = cur.setdefault(k, {})
    cur[last] = value
    return d


# (id, YAML path that is changed, new value, expected SpecError.path, extra text in the message)
BAD = [
    ("unknown top-level key", "colour", "red", "colour", "unknown key"),
    ("unknown nested key", "scale.foo", 1, "scale.foo", "unknown key"),
    ("page_size 48", "page_size", 48, "page_size", "48"),
    ("page_size 0", "page_size", 0, "page_size", "0"),
    ("page_size string", "page_size", "64", "page_size", "integer"),
    ("head_dim 100", "head_dim", 100, "head_dim", "100"),
    ("key.dtype int8", "key.dtype", "int8", "key.dtype", "int8"),
    ("scale none with e4m3", "scale.dtype", "none", "scale.dtype", "e4m3"),
    ("scale.block 24", "scale.block", 24, "scale.block", "24"),
    ("scale.block 512", "scale.block", 512, "scale.block", "512"),
    ("placement", "scale.placement", "page_head", "scale.placement", "page_head"),
    ("targets sm_90", "targets", ["sm_90"], "targets", "sm_90a"),
    ("targets sm_100", "targets", ["sm_100a", "sm_100"], "targets", "sm_100a"),
    ("targets sm_80", "targets", ["sm_80"], "targets", "sm_80"),
    ("next_n 5", "logits.next_n", [1, 5], "logits.next_n", "5"),
    ("next_n empty", "logits.next_n", [], "logits.next_n", "list"),
    ("num_heads 7", "logits.num_heads", 7, "logits.num_heads", "7"),
    ("name 1bad", "name", "1bad", "name", "1bad"),
    ("page stride too small", "page_stride_bytes", 8432, "page_stride_bytes", "8448"),
    ("page stride unaligned", "page_stride_bytes", 8452, "page_stride_bytes", "16"),
    ("page stride huge", "page_stride_bytes", 2147483664, "page_stride_bytes", "1048576"),
    ("scale.dtype empty", "scale.dtype", "", "scale.dtype", "''"),
    ("scale.dtype false", "scale.dtype", False, "scale.dtype", "False"),
    ("placement 0", "scale.placement", 0, "scale.placement", "0"),
    ("description two lines", "description", "line one\nline two", "description", "one line"),
    ("description backslash", "description", "ends in \\", "description", "backslash"),
    ("description number", "description", 0, "description", "string"),
    ("name too long", "name", "n" * 101, "name", "at most 100"),
]


@pytest.mark.parametrize("field, value, path, text", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_field_is_named(tmp_path, field, value, path, text):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_set(_base(), field, value)))
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.path == path
    msg = str(e)
    assert msg.startswith(f"{f}: {path}: "), msg
    assert text in e.message, msg
    assert "\n" not in msg


def test_bf16_with_scale_is_rejected():
    d = yaml.safe_load(BF16.read_text())
    d["scale"]["dtype"] = "fp32"
    with pytest.raises(SpecError) as ei:
        Spec.from_dict(d, source="x.yaml")
    assert ei.value.path == "scale.dtype" and "none" in ei.value.message


def test_missing_required_field(tmp_path):
    d = _base()
    del d["logits"]["num_heads"]
    with pytest.raises(SpecError) as ei:
        Spec.from_dict(d, source="s.yaml")
    assert ei.value.path == "logits.num_heads"
    assert str(ei.value) == "s.yaml: logits.num_heads: required field is missing"


def test_not_a_mapping():
    with pytest.raises(SpecError) as ei:
        Spec.from_dict(["a", "b"], source="s.yaml")
    assert "mapping" in str(ei.value)
    with pytest.raises(SpecError) as ei:
        Spec.from_dict({**_base(), "scale": "fp32"}, source="s.yaml")
    assert ei.value.path == "scale"


def test_non_yaml(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("name: x\nscale: [unclosed\n  key: {\n")
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    assert ei.value.path == ""
    assert str(ei.value).startswith(f"{f}: ") and "YAML" in str(ei.value)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("text, says", [("", "the file is empty"), ("\n", "the file is empty"),
                                        ("# a comment only\n", "the file is empty"),
                                        ("---\n", "the file is empty"),
                                        ("null\n", "the document is null"),
                                        ("--- ~\n", "the document is null")])
def test_empty_or_null_file_says_so(tmp_path, text, says):
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    assert ei.value.path == ""
    assert str(ei.value).startswith(f"{f}: {says} (a spec is a YAML mapping")


def test_non_yaml_names_line_and_column(tmp_path):
    # a tab that starts line 3, column 1: PyYAML's mark is 0-based, the message 1-based
    f = tmp_path / "tab.yaml"
    f.write_text("name: x\nkey:\n\tdtype: e4m3\n")
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    msg = str(ei.value)
    assert msg.endswith("at line 3, column 1"), msg
    assert "\n" not in msg


def test_missing_file(tmp_path):
    f = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    assert ei.value.path == "" and str(ei.value).startswith(f"{f}: ")
    assert "cannot read" in str(ei.value)


# ---- the CLI ----------------------------------------------------------------------------------

def _dsagen(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsagen.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_cli_validate_shipped():
    p = _dsagen("validate", "specs/fp8_e4m3_page64.yaml", "specs/bf16_page64.yaml")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["fp8_e4m3_page64: 132 B/token, 8448 B/page",
                                     "bf16_page64: 256 B/token, 16384 B/page"]


@pytest.mark.parametrize("field, value, path", [
    ("page_size", 48, "page_size"), ("scale.foo", 1, "scale.foo"), ("targets", ["sm_90"], "targets")])
def test_cli_validate_bad_spec(tmp_path, field, value, path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_set(_base(), field, value)))
    p = _dsagen("validate", "specs/bf16_page64.yaml", f)
    assert p.returncode == 2
    assert "Traceback" not in p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"Error: {f}: {path}: "), lines[0]


def test_cli_validate_missing_and_non_yaml(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("a: [\n")
    for f in (tmp_path / "missing.yaml", bad):
        p = _dsagen("validate", f)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith(f"Error: {f}: ")


def test_cli_list():
    p = _dsagen("list")
    assert p.returncode == 0, p.stderr
    assert "fp8_e4m3_page64: 132 B/token, 8448 B/page" in p.stdout
    assert "bf16_page64: 256 B/token, 16384 B/page" in p.stdout


def test_ue8m0_needs_pow2_rounding_and_defaults_to_it():
    d = _set(_set(_base(), "scale.dtype", "ue8m0"), "scale.rounding", "none")
    with pytest.raises(SpecError) as e:
        Spec.from_dict(d, source="x.yaml")
    assert e.value.path == "scale.rounding" and "power of two" in str(e.value)
    del d["scale"]["rounding"]
    s = Spec.from_dict(d)
    assert s.scale_rounding == "pow2" and s.scale_bytes_per_token == 1 and s.bytes_per_token == 129


def test_fp4_spec_sizes():
    s = dsagen.load_spec(REPO / "specs" / "fp4_e2m1_page64.yaml")
    assert (s.key_bytes_per_token, s.scale_bytes_per_token, s.bytes_per_token, s.page_bytes) == (64, 4, 68, 4352)
    assert s.query.name == "bf16" and s.scales_per_token == 4


def test_key_align_of_one_token_pages(shipped):
    # the 4-byte cp.async path of the sm_90a kernel is taken only where rows are not 16-aligned
    assert shipped["fp8_e4m3_page1"].key_align == 4                     # 132-byte pages
    assert shipped["fp8_e4m3_interleaved_page64"].key_align == 4         # 132-byte token stride
    assert shipped["fp8_e4m3_page1"].with_(page_stride_bytes=144).key_align == 16   # padded
    assert shipped["fp8_e4m3_page64"].key_align == 16


def test_cli_validate_reports_every_file(tmp_path):
    bad1, bad2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bad1.write_text(yaml.safe_dump(_set(_base(), "page_size", 48)))
    bad2.write_text(yaml.safe_dump(_set(_base(), "scale.foo", 1)))
    p = _dsagen("validate", bad1, "specs/bf16_page64.yaml", bad2)
    assert p.returncode == 2
    assert p.stdout.splitlines() == ["bf16_page64: 256 B/token, 16384 B/page"]
    errs = p.stderr.strip().splitlines()
    assert [e.split(": ")[1:3] for e in errs] == [[str(bad1), "page_size"], [str(bad2), "scale.foo"]], errs


def test_duplicate_key_is_refused(tmp_path):
    """PyYAML keeps the last of two equal keys; a spec with one given twice is an error naming
    the key and its line."""
    f = tmp_path / "dup.yaml"
    f.write_text(FP8.read_text() + "page_size: 32\n")
    with pytest.raises(SpecError, match=r"duplicate key 'page_size' at line \d+"):
        dsagen.load_spec(f)


@pytest.mark.parametrize("old, new, says", [
    ("page_size: 64", "page_size: 1:04", "page_size: expected an integer, got '1:04'"),   # YAML 1.1: 64
    ("page_size: 64", "page_size: 0100", "page_size: 100 is not a power of two"),        # YAML 1.1: 64
    ("dtype: e4m3", "dtype: no", "key.dtype: 'no' is not one of"),                       # YAML 1.1: False
])
def test_plain_scalars_read_as_yaml_1_2(tmp_path, old, new, says):
    """Plain scalars resolve as YAML 1.2's core schema: PyYAML's YAML 1.1 reading would take
    `1:04` (base 60) and `0100` (octal) as page_size 64, and `no` as False."""
    f = tmp_path / "s.yaml"
    text = FP8.read_text()
    assert old in text
    f.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as ei:
        dsagen.load_spec(f)
    assert str(ei.value).startswith(f"{f}: {says}"), str(ei.value)
    # the forms YAML 1.2 gives page_size 64 in
    for ok in ("0x40", "0o100", "+64", "064"):
        f.write_text(text.replace("page_size: 64", f"page_size: {ok}", 1))
        assert dsagen.load_spec(f).page_size == 64, ok


def test_not_utf8_and_too_deep_are_spec_errors(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"# caf\xe9\n" + FP8.read_bytes())
    with pytest.raises(SpecError, match="not UTF-8"):
        dsagen.load_spec(bad)
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(SpecError, match="nested too deeply"):
        dsagen.load_spec(deep)


E = re.escape


@pytest.mark.parametrize("line, says", [
    # nested aliases: a 300-byte file whose value, printed whole, would be ~10^7 characters
    ("head_dim: [&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
     "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
     "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e], "
     "[*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]]", E("head_dim: expected an integer, got [[")),
    ("head_dim: 0x" + "f" * 5000, E("head_dim: an integer of 20000 bits: out of range")),
    ("page_size: " + str(2**70), E("page_size: an integer of 71 bits: out of range")),
    # (Python's 4300-digit limit on int(str) makes it a YAML error; without it the int is read)
    ("page_size: " + "9" * 5000, r"(not valid YAML: a value that does not load \(ValueError: Exceeds the limit"
                                 r"|page_size: an integer of \d+ bits: out of range)"),
    ("name: " + "x" * 5000 + "!", E("name: 'xxx")),
    ("key: {dtype: [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]}", r"key.dtype: \[\[1, 2\], \[3, 4\], \[5, 6\], \[7, 8\], \.\.\.\]"),
    ("logits: {num_heads: 64, next_n: [" + ", ".join(map(str, range(5, 400))) + "]}",
     r"logits.next_n: \[5, 6, 7, 8, \.\.\.\]: each must be in \[1, 4\]"),
    ("head_dim: *" + "a" * 3000, E("not valid YAML: found undefined alias 'aaa")),
    ("head_dim: !!float " + "z" * 5000, E("not valid YAML: a value that does not load (ValueError")),
    # PyYAML's constructors raise other errors on these
    ("head_dim: !!int ''", E("not valid YAML: a value that does not load (ValueError")),
    ("head_dim: !!bool maybe", E("not valid YAML: a value that does not load (KeyError")),
    ("head_dim: !!timestamp nope", E("not valid YAML: a value that does not load (AttributeError")),
    ('logits: {num_heads: 64, next_n: [1], "a\\nb": 1}', r"logits.a\\nb: unknown key"),
])
def test_an_error_shows_a_huge_value_briefly(tmp_path, line, says):
    """A value of any size or depth is shown in at most ~80 characters (the message was the
    whole value: minutes and gigabytes for a nested-alias file), and an integer too long for
    Python's str() is an error line, not a traceback. ``says`` is a regular expression."""
    field = line.split(":")[0]
    own = {"key": ("key:", "dtype: e4m3"), "logits": ("logits:", "num_heads: 64", "next_n: [1, 2]")}
    text = "\n".join(l for l in FP8.read_text().splitlines() if not l.startswith(field + ":")
                     and l.strip() not in own.get(field, ()))
    f = tmp_path / "huge.yaml"
    f.write_text(text + "\n" + line + "\n")
    with pytest.raises(SpecError) as e:
        dsagen.load_spec(f)
    msg = str(e.value)
    assert re.search(says, msg), msg[:400]
    assert len(msg) <= len(str(f)) + 2 + 100 + 2 + 300 and "\n" not in msg, msg[:400]


def test_yaml_merge_keys_still_load(tmp_path):
    """``<<:`` merges (whose keys an explicit key may override) are not duplicate keys."""
    f = tmp_path / "merge.yaml"
    text = FP8.read_text().replace("logits:\n  num_heads: 64\n", "logits:\n  <<: {num_heads: 32}\n  num_heads: 64\n")
    assert "<<:" in text
    f.write_text(text)
    assert dsagen.load_spec(f).num_heads == 64

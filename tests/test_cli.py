"""`dsagen compile / render / verify` end to end (in process, through click's CliRunner).

`dsagen compile` writes generated/<name>/; these tests point that folder at a temporary one so
that they never rewrite the committed golden copies (test_golden.py checks those).
"""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import dsagen
import dsagen.codegen
from dsagen.cli import main

from conftest import REPO

FP8 = "specs/fp8_e4m3_page64.yaml"


@pytest.fixture
def generated_tmp(tmp_path, monkeypatch):
    d = tmp_path / "generated"
    monkeypatch.setattr(dsagen.codegen, "GENERATED_DIR", d)
    monkeypatch.chdir(REPO)
    return d


def _run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


@pytest.mark.nvcc
def test_compile_fp8(generated_tmp, nvcc, tmp_path):
    js = tmp_path / "report.json"
    r = _run("compile", FP8, "--json", js)
    out = r.output
    assert r.exit_code == 0, out
    assert "[fp8_e4m3_page64] cpu: PASSED" in out
    assert "FAILED" not in out and "COMPILE FAILED" not in out
    for arch in ("sm_90a", "sm_100a"):
        for src in ("store.cu", "paged_logits.cu", "paged_logits_small.cu"):
            assert f"{src} {arch}: compiled" in out, out
    assert "compiled but NOT run" in out and "'sm_90a', 'sm_100a'" in out
    assert out.rstrip().endswith("dsagen compile: all verified (CUDA for sm_90a, sm_100a compiled only, not run: "
                                 "no such device here)")
    rows = json.loads(js.read_text())
    assert [(x["spec"], x["backend"], x["passed"]) for x in rows] == [("fp8_e4m3_page64", "cpu", True)]
    # the sources it rendered are the committed ones
    for f in (REPO / "generated" / "fp8_e4m3_page64").iterdir():
        assert (generated_tmp / "fp8_e4m3_page64" / f.name).read_text() == f.read_text(), f.name


def test_compile_bad_spec(generated_tmp, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / FP8).read_text().replace("page_size: 64", "page_size: 48"))
    r = _run("compile", "--no-nvcc", bad)
    assert r.exit_code == 2
    assert r.output.strip() == f"Error: {bad}: page_size: 48 is not a power of two in [1, 256]"
    assert not generated_tmp.exists(), "nothing may be rendered for a bad spec"


def test_compile_missing_spec(generated_tmp, tmp_path):
    r = _run("compile", tmp_path / "nope.yaml")
    assert r.exit_code == 2 and r.output.startswith(f"Error: {tmp_path / 'nope.yaml'}: ")


def test_compile_help_names_exit_status_and_arch_list():
    r = _run("compile", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "Exit status: 0 every spec verified" in text and "1 a kernel disagrees" in text
    assert "2 a bad spec or bad usage" in text and "DSAGEN_ARCH_LIST" in text


def test_render_out(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    r = _run("render", "specs/fp8_e4m3_page64.yaml", "specs/bf16_page64.yaml", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    for name in ("fp8_e4m3_page64", "bf16_page64"):
        golden = sorted((REPO / "generated" / name).iterdir())
        assert [p.name for p in golden] == sorted(p.name for p in (tmp_path / name).iterdir())
        for p in golden:
            assert (tmp_path / name / p.name).read_text() == p.read_text()


def test_render_and_compile_refuse_two_specs_of_one_name(tmp_path, monkeypatch):
    """Two different specs named alike would be written to one <name>/ folder (the second over
    the first): a usage error before anything is written. The same spec twice is fine."""
    import yaml
    monkeypatch.chdir(REPO)
    d = yaml.safe_load((REPO / "specs" / "bf16_page64.yaml").read_text())
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(d))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**d, "page_size": 32}))
    out = tmp_path / "out"
    for cmd in (["render", "--out", str(out)], ["compile", "--no-nvcc"]):
        r = _run(*cmd, str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"))
        assert r.exit_code == 2 and "are different specs named 'bf16_page64'" in r.output, r.output
    assert not out.exists()
    r = _run("render", "--out", str(out), str(tmp_path / "a.yaml"), "specs/bf16_page64.yaml")
    assert r.exit_code == 0 and (out / "bf16_page64" / "layout.h").is_file(), r.output


def test_render_and_compile_refuse_to_replace_a_shipped_specs_sources(tmp_path, generated_tmp):
    """A spec copied from specs/ and edited without a new name would be rendered over the
    shipped spec's committed generated/<name>/: a usage error naming both files, before anything
    is written. render --out elsewhere, and the shipped file itself, are fine."""
    import yaml
    d = yaml.safe_load((REPO / FP8).read_text())
    d["key"] = {"dtype": "bf16"}
    d.pop("scale", None)
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(d))
    for cmd in (["render"], ["compile", "--no-nvcc"]):
        r = _run(*cmd, str(mine))
        assert r.exit_code == 2, r.output
        assert "name 'fp8_e4m3_page64' is the shipped spec" in r.output and "rename it" in r.output, r.output
    assert not generated_tmp.exists()
    out = tmp_path / "out"
    r = _run("render", "--out", str(out), str(mine))
    assert r.exit_code == 0, r.output
    assert (out / "fp8_e4m3_page64" / "layout.h").read_text() != (REPO / "generated" / "fp8_e4m3_page64" / "layout.h").read_text()
    r = _run("render", FP8)
    assert r.exit_code == 0 and (generated_tmp / "fp8_e4m3_page64" / "layout.h").is_file(), r.output


def test_the_shipped_name_check_protects_specs_name_yaml_only(tmp_path, generated_tmp, monkeypatch):
    """generated/<name>/ belongs to specs/<name>.yaml: a second file in specs/ that reuses the
    name is refused and the owner is not; a broken file in specs/ blocks nothing else; --out
    naming the repository's generated/ is checked like the default."""
    import yaml
    import dsagen.cli
    specs = tmp_path / "specs"
    specs.mkdir()
    monkeypatch.setattr(dsagen.cli, "SPECS_DIR", specs)
    d = yaml.safe_load((REPO / FP8).read_text())
    (specs / "fp8_e4m3_page64.yaml").write_text(yaml.safe_dump(d))
    (specs / "fp8_e4m3_page64_v2.yaml").write_text(yaml.safe_dump({**d, "page_size": 32}))
    (specs / "wip.yaml").write_text("name: wip\nhead_dim: 100\n")
    r = _run("render", str(specs / "fp8_e4m3_page64_v2.yaml"))
    assert r.exit_code == 2 and "is the shipped spec" in r.output, r.output
    r = _run("render", "--out", str(generated_tmp), str(specs / "fp8_e4m3_page64_v2.yaml"))
    assert r.exit_code == 2 and "is the shipped spec" in r.output, r.output
    assert not generated_tmp.exists()
    for f in (specs / "fp8_e4m3_page64.yaml", REPO / "specs" / "bf16_page64.yaml"):
        r = _run("render", str(f))
        assert r.exit_code == 0, r.output
    assert sorted(p.name for p in generated_tmp.iterdir()) == ["bf16_page64", "fp8_e4m3_page64"]


def test_verify_cpu_cli(monkeypatch):
    monkeypatch.chdir(REPO)
    r = _run("verify", "--device", "cpu", "specs/bf16_page64.yaml")
    assert r.exit_code == 0, r.output
    assert "[bf16_page64] cpu: PASSED" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device message")
def test_verify_cuda_without_device(monkeypatch):
    monkeypatch.chdir(REPO)
    r = _run("verify", "--device", "cuda", "specs/bf16_page64.yaml")
    assert r.exit_code == 2 and "no CUDA device" in r.output


@pytest.mark.parametrize("tuning, msg", [("{mma_ahead", "not JSON"), ("[1]", "must be a JSON object")])
def test_bench_tuning_must_be_a_json_object(tuning, msg):
    r = CliRunner().invoke(main, ["bench", FP8, "--tuning", tuning])
    assert r.exit_code == 2 and msg in r.output


def test_bench_method_must_be_spin_or_graph():
    """`dsagen bench --method` takes spin or graph only (exit 2 naming the choices, before any
    build or device check)."""
    r = CliRunner().invoke(main, ["bench", FP8, "--method", "cuda"])
    assert r.exit_code == 2 and "'spin'" in r.output and "'graph'" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "--help"])
    assert r.exit_code == 0 and "--method [spin|graph]" in r.output, r.output


@pytest.mark.parametrize("tuning, msg", [('{"math_wgs": 9}', "math_wgs=9"), ('{"portable": "x"}', "portable='x'")])
def test_bench_bad_tuning_value_is_a_usage_error(tuning, msg, monkeypatch):
    """A tuning with a bad value fails before anything is built or timed (exit 2, one line
    naming the key), with or without a GPU."""
    monkeypatch.chdir(REPO)
    r = CliRunner().invoke(main, ["bench", FP8, "--tuning", tuning])
    assert r.exit_code == 2 and f"Error: --tuning for fp8_e4m3_page64: tuning {msg}" in r.output, r.output


@pytest.mark.parametrize("var, value, msg", [("DSAGEN_LOCK_TIMEOUT", "abc", "a number of seconds"),
                                             ("DSAGEN_LOCK_TIMEOUT", "nan", "a number of seconds"),
                                             ("DSAGEN_MAX_JOBS", "x", "an integer >= 1"),
                                             ("DSAGEN_MAX_JOBS", "0", "an integer >= 1"),
                                             ("DSAGEN_BENCH_METHOD", "cuda", "'spin' or 'graph'"),
                                             ("DSAGEN_BENCH_SETTLE", "abc", "a number of seconds"),
                                             ("DSAGEN_BENCH_SETTLE", "-1", "a number of seconds"),
                                             ("DSAGEN_BENCH_SETTLE", "nan", "a number of seconds"),
                                             ("DSAGEN_ARCH_LIST", "sm_75", "a comma list of sm_90a, sm_100a"),
                                             ("DSAGEN_ARCH_LIST", "sm_90", "a comma list of sm_90a, sm_100a"),
                                             ("DSAGEN_ARCH_LIST", " , ", "a comma list of sm_90a, sm_100a")])
def test_bad_environment_variable_is_a_usage_error(var, value, msg, monkeypatch, tmp_path):
    """A malformed DSAGEN_* variable stops every command before any work (exit 2, one line
    naming it), whether or not a build would read it; `dsagen doctor` lists it instead."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(var, value)
    r = CliRunner().invoke(main, ["verify", "specs/fp8_e4m3_page1.yaml"])
    assert r.exit_code == 2 and f"Error: {var}={value!r}: must be {msg}" in r.output, r.output
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0 and f"{var}={value!r}: must be {msg}" in r.output, r.output
    for help_args in (["validate", "--help"], ["cache", "ls", "-h"], ["--help"]):
        r = CliRunner().invoke(main, help_args)
        assert r.exit_code == 0 and "Usage:" in r.output, (help_args, r.output)
    # the library raises the same message where it reads the variable
    from dsagen import config
    with pytest.raises(ValueError, match=var):
        {"DSAGEN_LOCK_TIMEOUT": config.lock_timeout, "DSAGEN_MAX_JOBS": config.max_jobs,
         "DSAGEN_BENCH_METHOD": config.bench_method, "DSAGEN_BENCH_SETTLE": lambda: config.bench_settle_s(2.0),
         "DSAGEN_ARCH_LIST": config.arch_list}[var]()
    for good in {"DSAGEN_LOCK_TIMEOUT": ("2.5", "0", "-1", "inf"), "DSAGEN_MAX_JOBS": ("3", " 4 ", "+4"),
                 "DSAGEN_BENCH_METHOD": ("graph", "spin"), "DSAGEN_BENCH_SETTLE": ("0", "2", "0.5", ""),
                 "DSAGEN_ARCH_LIST": ("sm_90a", " sm_100a, sm_90a ", "")}[var]:
        monkeypatch.setenv(var, good)
        assert config.check() == [], good
    monkeypatch.setenv("DSAGEN_LOCK_TIMEOUT", "inf")
    assert config.lock_timeout() == -1.0          # filelock's "wait forever"


def test_compile_without_nvcc_says_not_compiled(generated_tmp, monkeypatch):
    """Without nvcc the last line says the CUDA targets were NOT compiled (never "compiled
    only"); the CPU verification still decides the exit status."""
    import dsagen.jit
    if torch.cuda.is_available():
        pytest.skip("checks the no-device message")
    monkeypatch.setattr(dsagen.jit, "find_nvcc", lambda: None)
    r = _run("compile", "specs/bf16_page64.yaml")
    assert r.exit_code == 0, r.output
    assert "nvcc not found: CUDA for ['sm_90a', 'sm_100a'] NOT compiled" in r.output
    assert r.output.rstrip().endswith("dsagen compile: all verified (CUDA for sm_90a, sm_100a NOT compiled: "
                                      "nvcc not found, not run: no such device here)"), r.output


def test_compile_arch_list_narrows_the_nvcc_check(generated_tmp, monkeypatch):
    """DSAGEN_ARCH_LIST narrows the compile-only nvcc check too (not only the targets built for a
    device): the targets it leaves out are neither compiled nor run, and the last line says so."""
    import dsagen.jit
    if torch.cuda.is_available():
        pytest.skip("checks the no-device messages")
    asked = []
    monkeypatch.setattr(dsagen.jit, "find_nvcc", lambda: "/nvcc")
    monkeypatch.setattr(dsagen.jit, "nvcc_version", lambda: "13.0")
    monkeypatch.setattr(dsagen.jit, "nvcc_compile_only", lambda srcs, archs, workdir: asked.append(list(archs)) or [])
    monkeypatch.setenv("DSAGEN_ARCH_LIST", "sm_90a")
    r = _run("compile", "specs/bf16_page64.yaml")
    assert r.exit_code == 0, r.output
    assert asked == [["sm_90a"]], asked
    assert "[bf16_page64] DSAGEN_ARCH_LIST leaves out ['sm_100a']: neither compiled nor run" in r.output
    assert r.output.rstrip().endswith("dsagen compile: all verified (CUDA for sm_90a compiled only, not run: "
                                      "no such device here; CUDA for sm_100a left out by DSAGEN_ARCH_LIST)"), r.output
    monkeypatch.setenv("DSAGEN_ARCH_LIST", "sm_100a")
    r = _run("compile", "--no-nvcc", "specs/bf16_page64.yaml")
    assert r.exit_code == 0 and asked == [["sm_90a"]], r.output
    assert r.output.rstrip().endswith("dsagen compile: all verified (CUDA for sm_100a not compiled (--no-nvcc), "
                                      "not run: no such device here; CUDA for sm_90a left out by "
                                      "DSAGEN_ARCH_LIST)"), r.output


def test_arch_split_follows_the_arch_list(monkeypatch):
    """dsagen.ops.arch_split (what compile, verify, load and the pytest plugin use): the spec's
    targets that a device runs, that are compiled only, and that DSAGEN_ARCH_LIST leaves out;
    a malformed list is a ConfigError (a ValueError) with or without a device."""
    from dsagen.config import ConfigError
    from dsagen.ops import arch_split
    spec = dsagen.load_spec(REPO / "specs" / "bf16_page64.yaml")
    run = [t for t in spec.targets if torch.cuda.is_available()
           and t == "sm_%d%da" % torch.cuda.get_device_capability()]
    for env, left_out in (("", []), ("sm_100a", ["sm_90a"]), ("sm_90a,sm_100a", []), ("sm_90a", ["sm_100a"])):
        monkeypatch.setenv("DSAGEN_ARCH_LIST", env)
        got = arch_split(spec)
        assert got == ([t for t in run if t not in left_out],
                       [t for t in spec.targets if t not in run and t not in left_out], left_out), (env, got)
    for bad in ("sm_89", "sm_90a,sm89,sm80", ","):
        monkeypatch.setenv("DSAGEN_ARCH_LIST", bad)
        with pytest.raises(ConfigError, match="DSAGEN_ARCH_LIST"):
            arch_split(spec)
    monkeypatch.setenv("DSAGEN_ARCH_LIST", "sm_90a,sm89,sm80")
    with pytest.raises(ValueError, match=r"\('sm89', 'sm80' are not\)"):
        dsagen.load(spec)


def test_unwritable_outputs_are_usage_errors(generated_tmp, tmp_path):
    """--json to a folder that does not exist, --out onto a file, a negative prune age: exit 2
    with one line, before any work."""
    r = _run("compile", "--no-nvcc", FP8, "--json", tmp_path / "nope" / "x.json")
    assert r.exit_code == 2 and "cannot write there" in r.output and not generated_tmp.exists()
    f = tmp_path / "file"
    f.write_text("")
    r = CliRunner().invoke(main, ["render", FP8, "--out", str(f)])
    assert r.exit_code == 2 and "cannot write fp8_e4m3_page64's sources" in r.output
    r = CliRunner().invoke(main, ["cache", "prune", "--older-than", "-1"])
    assert r.exit_code == 2


def test_render_memo_is_counted_bounded_and_pruned(tmp_path, monkeypatch):
    """The render memo and template bytecode (not build entries) show in `cache du`, stay
    bounded (least recently used go first), and go with `cache prune --all`."""
    import os
    import time
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(REPO)
    spec = dsagen.load_spec(FP8)
    dsagen.codegen.render(spec)
    memo = tmp_path / "cache" / dsagen.codegen.RENDER_MEMO
    assert len(list(memo.glob("*.json"))) == 1
    r = _run("cache", "du")
    assert r.exit_code == 0 and "0 entries" in r.output and "render memo 1 files" in r.output, r.output

    # trimming: 9 renders against a bound of 8 keeps the 6 most recently used
    files = []
    for i in range(9):
        f = memo / f"{i:02d}.json"
        f.write_text("{}")
        os.utime(f, (time.time() - 1000 + i, time.time() - 1000 + i))
        files.append(f)
    os.utime(files[0])                       # used just now: kept though written first
    dsagen.codegen._trim_render_memo(memo, keep=8)
    left = {f.name for f in memo.glob("*.json")}
    assert len(left) == 6 and "00.json" in left and "01.json" not in left, left

    r = _run("cache", "prune")                # unusable entries only: the memo stays
    assert r.exit_code == 0 and len(list(memo.glob("*.json"))) == 6
    r = _run("cache", "prune", "--all")
    assert r.exit_code == 0 and "render memo / template bytecode files" in r.output, r.output
    assert not list(memo.glob("*.json"))
    assert not [f for f in (tmp_path / "cache" / dsagen.codegen.JINJA_CACHE).rglob("*") if f.is_file()]
    assert dsagen.codegen.render(spec)["layout.h"]   # renders again after the prune


def test_cache_du_and_prune_survive_files_vanishing(tmp_path, monkeypatch):
    """A render memo file removed by another process between listing and stat (a trim, a
    rename into place) is skipped by `cache du` and `cache prune --all`, not a crash."""
    import pathlib
    from dsagen import aot
    root = tmp_path / "cache"
    memo = root / dsagen.codegen.RENDER_MEMO
    memo.mkdir(parents=True)
    for name in ("a.json", "gone.json"):
        (memo / name).write_text("{}")
    real_stat = pathlib.Path.stat
    calls = {}

    def racy_stat(self, *a, **k):
        if self.name == "gone.json":            # is_file() sees it, the next stat() does not
            calls[self] = calls.get(self, 0) + 1
            if calls[self] > 1:
                raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_stat(self, *a, **k)
    monkeypatch.setattr(pathlib.Path, "stat", racy_stat)
    (what, _d, files, size), _bytecode = aot.aux_dirs(root)
    assert what == "render memo" and files == 1 and size == 2
    calls.clear()
    assert aot.prune_aux(root, everything=True) == (1, 2)
    assert not (memo / "a.json").exists()


def test_cache_commands_touch_only_dsagen_folders(tmp_path, monkeypatch):
    """`cache ls / du / prune` see only the folders dsagen.jit makes in the cache root (entries
    `<namespace>-<16 hex>`, temporary `.<namespace>-*` / `.probe-*` build folders): another
    tool's folders, dot-folders and a lock dir placed inside the root are never listed or
    removed, even by `prune --all`."""
    import os
    import time
    root = tmp_path / "cache"
    keep = [root / "my project" / "src", root / ".config", root / "notes", root / "build-locks"]
    ours = [root / ".probe-k2x9_a", root / ".dsagen_t_abc-q8w_3z", root / "dsagen_t_abc-0123456789abcdef"]
    for d in keep + ours:
        d.mkdir(parents=True)
    (root / "my project" / "src" / "main.c").write_text("int main;")
    old = time.time() - 2 * 86400
    for d in (root / ".config", root / ".probe-k2x9_a", root / ".dsagen_t_abc-q8w_3z"):
        os.utime(d, (old, old))
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(root))
    monkeypatch.setenv("DSAGEN_LOCK_DIR", str(root / "build-locks"))
    r = _run("cache", "ls")
    assert r.exit_code == 0 and all(d.name in r.output for d in ours), r.output
    assert not any(name in r.output for name in ("my project", ".config", "notes", "build-locks")), r.output
    r = _run("cache", "prune", "--all")
    assert r.exit_code == 0 and "3 removed" in r.output, r.output
    assert all(d.exists() for d in keep) and not any(d.exists() for d in ours)
    assert (root / "my project" / "src" / "main.c").read_text() == "int main;"


def test_cache_root_that_is_a_file_is_reported(tmp_path, monkeypatch):
    """A DSAGEN_CACHE_DIR that names a file: the cache commands say so (exit 2) instead of
    reporting an empty cache, `doctor` flags it, and `--help` still prints."""
    f = tmp_path / "cachefile"
    f.write_text("x")
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(f))
    for args in (["cache", "ls"], ["cache", "du"], ["cache", "verify"], ["cache", "prune"]):
        r = _run(*args)
        assert r.exit_code == 2 and f"cache root {f} is not a folder" in r.output, (args, r.output)
    r = _run("cache", "ls", "--help")
    assert r.exit_code == 0 and "Usage:" in r.output
    r = _run("doctor")
    assert r.exit_code == 0 and "NOT A FOLDER" in r.output, r.output
    assert f.read_text() == "x"


def test_concurrent_prunes_skip_what_the_other_removed(tmp_path, monkeypatch):
    """An entry removed by another `cache prune` between the listing and its stat is skipped."""
    import pathlib
    from dsagen import aot
    root = tmp_path / "cache"
    for name in ("dsagen_t_a-0123456789abcdef", "dsagen_t_b-0123456789abcdef"):
        (root / name).mkdir(parents=True)
        (root / name / "lib.so").write_bytes(b"x")
    gone = root / "dsagen_t_a-0123456789abcdef"
    real_stat = pathlib.Path.stat

    def racy_stat(self, *a, **k):
        if self == gone:
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_stat(self, *a, **k)
    listed = aot.entries(root)
    assert [e.path.name for e in listed] == ["dsagen_t_a-0123456789abcdef", "dsagen_t_b-0123456789abcdef"]
    monkeypatch.setattr(aot, "entries", lambda r=None: listed)
    monkeypatch.setattr(pathlib.Path, "stat", racy_stat)
    removed = aot.prune(root, everything=True)
    assert [e.path.name for e in removed] == ["dsagen_t_b-0123456789abcdef"]


@pytest.mark.parametrize("args", [("cache", "prune", "--older-than", "nan"), ("cache", "prune", "--older-than", "inf"),
                                  ("precompile", "specs/bf16_page64.yaml", "-j", "0"),
                                  ("render", "specs/bf16_page64.yaml", "--out", "")])
def test_meaningless_option_values_are_usage_errors(args, tmp_path, monkeypatch):
    """NaN / infinite ages, zero build jobs and an empty --out are refused (exit 2), not taken as
    'remove nothing', 'no parallelism' or 'the default folder'."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 2, r.output

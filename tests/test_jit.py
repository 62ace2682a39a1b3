"""The JIT cache: content-addressed keys, concurrent builds, crashed builders, corrupted
artifacts, no-JIT mode and relocated read-only caches (CPU builds of a tiny spec)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsagen import codegen, jit
from dsagen.spec import Spec

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "name": "t_jit_tiny", "description": "jit tests", "head_dim": 32, "page_size": 16,
    "key": {"dtype": "bf16"}, "scale": {"dtype": "none"},
    "logits": {"num_heads": 8, "next_n": [1]}, "targets": ["sm_90a"],
}

# A child process: load the tiny spec, run paged_logits against the reference, print status.
CHILD = textwrap.dedent("""
    import json, sys, torch, dsagen
    from dsagen import reference as R
    from dsagen.verify import check_logits
    spec = dsagen.Spec.from_dict(json.loads(sys.argv[1]))
    ops = dsagen.load(spec, with_cuda=False)
    row = check_logits(ops, spec, [5, 40], 1, torch.Generator().manual_seed(3), "cpu")
    print("RESULT", row.passed, ops.library)
""")


def _env(cache: Path, **extra) -> dict:
    env = dict(os.environ)
    env["DSAGEN_CACHE_DIR"] = str(cache)
    env.pop("DSAGEN_DISABLE_JIT", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _child(cache: Path, new_session: bool = False, **extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(TINY)], env=_env(cache, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def _key(spec: Spec, with_cuda=False, archs=()) -> str:
    return jit.cache_key(jit.key_inputs(codegen.render(spec), list(archs), with_cuda))


@pytest.fixture(scope="module")
def tiny() -> Spec:
    return Spec.from_dict(TINY)


# ---- keys -------------------------------------------------------------------------------------

def test_key_changes_with_template_edit(tiny, tmp_path, monkeypatch):
    base = _key(tiny)
    tdir = tmp_path / "templates"
    shutil.copytree(codegen.TEMPLATE_DIR, tdir)
    p = tdir / "cpu_ops.cpp.jinja"
    p.write_text(p.read_text().replace("plain loops", "plain loops (edited)"))
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tdir)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    monkeypatch.setattr(codegen, "_env", env)
    monkeypatch.setattr(codegen, "TEMPLATE_DIR", tdir)     # the render memo hashes the templates
    assert _key(tiny) != base


@pytest.mark.parametrize("var,value", [("DSAGEN_NVCC_FLAGS", "-DFOO=1"), ("DSAGEN_JIT_LINEINFO", "1"),
                                       ("DSAGEN_JIT_DEBUG", "1")])
def test_key_changes_with_flags(tiny, monkeypatch, var, value):
    monkeypatch.delenv(var, raising=False)
    base = _key(tiny, with_cuda=True, archs=["sm_90a"])
    monkeypatch.setenv(var, value)
    assert _key(tiny, with_cuda=True, archs=["sm_90a"]) != base


def test_key_changes_with_versions_and_arch(tiny, monkeypatch):
    import torch
    base = _key(tiny, with_cuda=True, archs=["sm_90a"])
    assert _key(tiny, with_cuda=True, archs=["sm_100a"]) != base
    monkeypatch.setattr(jit, "__version__", "99.0")
    assert _key(tiny, with_cuda=True, archs=["sm_90a"]) != base
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert _key(tiny, with_cuda=True, archs=["sm_90a"]) != base
    monkeypatch.undo()
    monkeypatch.setattr(jit, "nvcc_version", lambda *a: "1.2.3")
    assert _key(tiny, with_cuda=True, archs=["sm_90a"]) != base


def test_key_same_from_another_checkout_path(tiny, tmp_path):
    copy = tmp_path / "elsewhere" / "checkout"
    for d in ("dsagen", "templates", "specs"):
        shutil.copytree(ROOT / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import json, sys; from dsagen import jit, codegen; from dsagen.spec import Spec; "
            "s = Spec.from_dict(json.loads(sys.argv[1])); "
            "print(jit.cache_key(jit.key_inputs(codegen.render(s), ['sm_90a'], True)), codegen.__file__)")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(TINY)], cwd=copy, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(copy)}, check=True).stdout.split()
    assert out[1].startswith(str(copy)), out      # really the copy
    assert out[0] == _key(tiny, with_cuda=True, archs=["sm_90a"])


# ---- concurrency, crashes, corruption --------------------------------------------------------

_OUTS: dict = {}


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory) -> Path:
    """A cache filled by 8 processes loading the same uncached spec at once."""
    cache = tmp_path_factory.mktemp("cache8")
    procs = [_child(cache) for _ in range(8)]
    outs = [p.communicate(timeout=900) for p in procs]
    _OUTS[cache] = [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]
    return cache


def test_eight_processes_one_build(built_cache):
    outs = _OUTS[built_cache]
    for rc, out, err in outs:
        assert rc == 0, err[-3000:]
        assert "RESULT True" in out, out + err[-2000:]
    builds = sum(err.count("[dsagen] building ") for _, _, err in outs)
    assert builds == 1, [e for _, _, e in outs]
    libs = {out.split()[-1] for _, out, _ in outs}
    assert len(libs) == 1
    ents = [d for d in built_cache.iterdir() if d.is_dir() and d.name not in ("locks", codegen.JINJA_CACHE, codegen.RENDER_MEMO)]
    assert len(ents) == 1 and jit.check_entry(ents[0]) is None


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (Linux /proc; ninja starts each compiler in a
    process group of its own, so killing the child's group would leave them running), scanning
    again until a scan finds none alive (one forked during a scan is caught by the next)."""
    for _ in range(50):
        alive = 0
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[3]) == sid:   # state, then ppid, pgrp, session
                    os.kill(int(d.name), signal.SIGKILL)
                    alive += 1
            except (OSError, ValueError, IndexError):
                pass                                   # gone already, or not ours to read
        if not alive:
            return
        time.sleep(0.1)


def test_sigkill_during_build_leaves_nothing_blocking(tmp_path):
    """A builder killed mid-build (SIGKILL to its whole session: python, ninja and the
    compilers, as when its job is killed; orphaned compilers would only slow the rebuild below)
    leaves a lock and a partial build behind; the next loader rebuilds instead of blocking."""
    cache = tmp_path / "cache"
    p = _child(cache, new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:                      # wait until the build is under way
        if cache.exists() and any(d.name.startswith(".t_jit") or d.name.startswith(".dsagen")
                                  for d in cache.iterdir()):
            break
        time.sleep(0.2)
    else:
        _kill_session(p.pid)
        pytest.fail("the build never started")
    time.sleep(1.0)
    _kill_session(p.pid)
    p.wait()
    # a lock left by the killed builder would make this child give up after the lock timeout
    # (an error, so a non-zero exit), not hang: no wall-clock bound is needed
    q = _child(cache, DSAGEN_LOCK_TIMEOUT=120)
    out, err = q.communicate(timeout=600)
    assert q.returncode == 0 and "RESULT True" in out, err[-3000:]
    assert "[dsagen] building " in err                 # rebuilt, not blocked


def test_corrupted_artifact_is_rebuilt(built_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built_cache, cache)
    (entry,) = [d for d in cache.iterdir() if d.is_dir() and d.name not in ("locks", codegen.JINJA_CACHE, codegen.RENDER_MEMO)]
    lib = next(entry.glob("*.so"))
    with open(lib, "ab") as f:
        f.write(b"\0garbage")
    assert "SHA-256" in jit.check_entry(entry)
    p = _child(cache)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0 and "RESULT True" in out, err[-3000:]
    assert "[dsagen] building " in err
    assert jit.check_entry(entry) is None


def test_disable_jit_fails_fast_listing_missing(tmp_path):
    p = _child(tmp_path / "empty", DSAGEN_DISABLE_JIT=1)
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert "JitDisabledError" in err and "t_jit_tiny" in err and "not in the cache" in err
    assert "[dsagen] building " not in err


def test_relocated_readonly_precompiled_cache_loads_without_building(built_cache, tmp_path):
    moved = tmp_path / "image" / "dsagen-cache"
    shutil.copytree(built_cache, moved)
    for d, _, files in os.walk(moved):
        for f in files:
            os.chmod(os.path.join(d, f), 0o444)
        os.chmod(d, 0o555)
    before = sorted(str(p) for p in moved.rglob("*"))
    try:
        for extra in ({"DSAGEN_DISABLE_JIT": 1}, {}):
            p = _child(moved, DSAGEN_LOCK_DIR=tmp_path / "locks", **extra)
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and "RESULT True" in out, err[-3000:]
            assert "[dsagen] building " not in err
        assert sorted(str(p) for p in moved.rglob("*")) == before
    finally:
        for d, _, _ in os.walk(moved):
            os.chmod(d, 0o755)


def test_unwritable_cache_error_says_how_to_fix(tmp_path, monkeypatch, tiny):
    # a regular file where the cache root should be: nothing can be created under it
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("DSAGEN_DISABLE_JIT", raising=False)
    with pytest.raises(jit.BuildError, match="not writable.*DSAGEN_CACHE_DIR") as e:
        jit.build_extension(codegen.namespace(tiny) + "_unwritable", codegen.render(tiny), [], False)
    # precompiling into a root that cannot be a folder would fail the same way: not suggested
    assert "precompile" not in str(e.value)


def test_cache_folder_error_suggests_precompile(tmp_path, monkeypatch, tiny):
    # the root is a folder that cannot be written (a read-only folder; root writes those, so
    # here mkdtemp is made to fail): precompiling into this root elsewhere is suggested
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(root))
    monkeypatch.delenv("DSAGEN_DISABLE_JIT", raising=False)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(root))
    monkeypatch.setattr(jit.tempfile, "mkdtemp", denied)
    with pytest.raises(jit.BuildError, match=f"not writable.*precompile --out {root}"):
        jit.build_extension(codegen.namespace(tiny) + "_ro", codegen.render(tiny), [], False)
    # a root whose parent cannot be searched: is_dir raises; still the BuildError
    is_dir = jit.Path.is_dir
    monkeypatch.setattr(jit.Path, "is_dir", lambda self: denied() if self == root else is_dir(self))
    with pytest.raises(jit.BuildError, match="not writable") as e:
        jit.build_extension(codegen.namespace(tiny) + "_ro", codegen.render(tiny), [], False)
    assert "precompile" not in str(e.value)


def test_precompile_out_dir_errors(tmp_path, monkeypatch):
    from dsagen import aot
    (tmp_path / "f").write_text("x")
    assert aot.out_folder(tmp_path / "new" / "sub") == (tmp_path / "new" / "sub").resolve()
    for bad, msg in ((tmp_path / "f", "a file, not a folder"), (tmp_path / "f" / "sub", "cannot create"),
                     (Path("~no_such_user_dsagen/x"), "no_such_user_dsagen")):
        with pytest.raises(ValueError, match=msg):
            aot.out_folder(bad)

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(aot.Path, "exists", denied)       # a parent that cannot be searched
    with pytest.raises(ValueError, match="cannot create the folder.*Permission denied"):
        aot.out_folder(tmp_path / "other")


def test_lock_folder_error_names_it(tmp_path, monkeypatch, tiny):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSAGEN_LOCK_DIR", str(tmp_path / "file"))
    monkeypatch.delenv("DSAGEN_DISABLE_JIT", raising=False)
    with pytest.raises(jit.BuildError, match="lock folder .*file cannot be made.*set DSAGEN_LOCK_DIR") as e:
        jit.build_extension(codegen.namespace(tiny) + "_nolock", codegen.render(tiny), [], False)
    assert "precompile" not in str(e.value)


# ---- precompile, cache commands, doctor ------------------------------------------------------

def test_precompile_labels_specs_that_share_a_name():
    from dsagen.aot import spec_labels
    a = Spec.from_dict(TINY, source="a.yaml")
    b = Spec.from_dict({**TINY, "page_size": 32}, source="b.yaml")      # an edited copy, same name
    c = Spec.from_dict({**TINY, "name": "t_other"}, source="c.yaml")
    assert spec_labels([a, b, c]) == ["t_jit_tiny (a.yaml)", "t_jit_tiny (b.yaml)", "t_other"]
    assert spec_labels([a, c]) == ["t_jit_tiny", "t_other"]


def _cli(*args, cache: Path, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsagen.cli", *args], env=_env(cache, **extra),
                          capture_output=True, text=True, timeout=900)


def test_precompile_and_cache_commands(built_cache, tmp_path, nvcc):
    import yaml
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "aot"
    shutil.copytree(built_cache, out)       # the CPU variant is there already; sm_90a is compiled
    same = tmp_path / "same.yaml"
    same.write_text(spec_file.read_text())
    r = _cli("precompile", str(spec_file), str(same), str(spec_file), "--arch", "sm_90a,sm_100a",
             "--out", str(out), cache=tmp_path / "x")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "t_jit_tiny cpu: ok" in r.stdout and "already in the cache" in r.stdout
    assert "t_jit_tiny sm_90a: ok" in r.stdout
    # the same spec given three times (two files) is built once
    assert r.stdout.count("t_jit_tiny cpu:") == 1 and r.stdout.count("t_jit_tiny sm_90a:") == 1, r.stdout
    assert f"{same}: the same spec as {spec_file}: built once" in r.stdout
    assert f"{spec_file}: listed twice: built once" in r.stdout
    # the compile-only render (memo, template bytecode) went to --out, not the default cache
    assert not (tmp_path / "x").exists(), list((tmp_path / "x").rglob("*"))
    assert any((out / codegen.RENDER_MEMO).glob("*.json"))
    # --out that cannot be a folder is a usage error, before any build
    for bad in (spec_file, spec_file / "sub"):
        r = _cli("precompile", str(spec_file), "--out", str(bad), cache=tmp_path / "x")
        assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _cli("cache", "verify", cache=out)
    assert r.returncode == 0 and r.stdout.count(" ok") == 1, r.stdout
    r = _cli("cache", "ls", cache=out)
    assert "t_jit_tiny" in r.stdout and "cpu" in r.stdout
    (entry,) = [d for d in out.iterdir() if d.is_dir() and d.name not in ("locks", codegen.JINJA_CACHE, codegen.RENDER_MEMO)]
    lib = next(entry.glob("*.so"))
    lib.write_bytes(lib.read_bytes()[:-10])
    r = _cli("cache", "verify", cache=out)
    assert r.returncode == 1 and "SHA-256" in r.stdout
    r = _cli("cache", "prune", cache=out)
    assert "1 removed" in r.stdout and not entry.exists()
    r = _cli("precompile", str(spec_file), "--arch", "sm_90", "--out", str(out), cache=out)
    assert r.returncode == 2 and "sm_90" in r.stderr


def test_doctor_reports(tmp_path):
    r = _cli("doctor", cache=tmp_path, DSAGEN_JIT_VERBOSE=1)
    assert r.returncode == 0, r.stderr
    for item in ("dsagen:", "torch:", "nvcc:", "gpu", "ninja:", "cutlass headers:", "cache root:",
                 "lock dir:", "DSAGEN_* set:"):
        assert item in r.stdout, (item, r.stdout)
    assert "DSAGEN_JIT_VERBOSE=1" in r.stdout


def test_render_memo(tiny, tmp_path, monkeypatch):
    """Renders are memoized under the cache root by content; a damaged memo is re-rendered and
    a template edit misses the memo."""
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path / "cache"))
    first = codegen.render(tiny)
    memos = list((tmp_path / "cache" / codegen.RENDER_MEMO).glob("*.json"))
    assert len(memos) == 1 and json.loads(memos[0].read_text()) == first
    assert codegen.render(tiny) == first
    memos[0].write_text("{not json")
    assert codegen.render(tiny) == first
    assert json.loads(memos[0].read_text()) == first          # rewritten
    tdir = tmp_path / "templates"
    shutil.copytree(codegen.TEMPLATE_DIR, tdir)
    p = tdir / "layout.h.jinja"
    p.write_text(p.read_text().replace("do not edit", "do not edit (changed)"))
    monkeypatch.setattr(codegen, "TEMPLATE_DIR", tdir)
    monkeypatch.setattr(codegen, "_env", None)
    assert "(changed)" in codegen.render(tiny)["layout.h"]


def test_warm_load_does_not_import_jinja(built_cache, tmp_path):
    """A load served from the cache reads the memoized render: Jinja is never imported (a copy
    of the cache the eight processes filled, so nothing is built here)."""
    cache = tmp_path / "cache"
    shutil.copytree(built_cache, cache)
    assert (cache / codegen.RENDER_MEMO).is_dir()
    code = ("import json, sys, dsagen; spec = dsagen.Spec.from_dict(json.loads(sys.argv[1])); "
            "dsagen.load(spec, with_cuda=False); print('JINJA', 'jinja2' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(TINY)], env=_env(cache),
                       capture_output=True, text=True, timeout=300)
    assert "JINJA False" in r.stdout, r.stdout + r.stderr
    assert "[dsagen] building " not in r.stderr, r.stderr[-3000:]

"""The pytest plugin (dsagen/pytest_plugin.py): --dsagen-spec parametrization and built-in checks."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def _pytest(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def test_default_parametrization_is_every_shipped_spec():
    p = _pytest("--collect-only", "-q", "tests/test_cpu_backend.py::test_verify_cpu", cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    got = sorted(line for line in p.stdout.splitlines() if "::test_verify_cpu[" in line)
    assert got == sorted(f"tests/test_cpu_backend.py::test_verify_cpu[{s.stem}]"
                         for s in (REPO / "specs").glob("*.yaml"))


def test_given_specs_replace_the_shipped_ones(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text((REPO / "specs" / "bf16_page64.yaml").read_text().replace(
        "name: bf16_page64", "name: mine"))
    p = _pytest("--collect-only", "-q", "--dsagen-spec", mine, "tests/test_cpu_backend.py::test_verify_cpu",
                cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [line for line in p.stdout.splitlines() if "::test_verify_cpu[" in line] == \
        ["tests/test_cpu_backend.py::test_verify_cpu[mine]"]


def test_builtin_checks_in_an_empty_directory(tmp_path):
    """`pytest --dsagen-spec my.yaml` where there are no tests: the plugin's own items run."""
    (tmp_path / "my.yaml").write_text((REPO / "specs" / "bf16_page64.yaml").read_text())
    (tmp_path / "bad.yaml").write_text((REPO / "specs" / "bf16_page64.yaml").read_text().replace(
        "page_size: 64", "page_size: 48"))
    p = _pytest("-v", "-rA", "--dsagen-spec", "my.yaml", "--dsagen-spec", "bad.yaml", "-k", "not nvcc",
                cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "my.yaml::dsagen[cpu] PASSED" in out
    assert ("my.yaml::dsagen[cuda] SKIPPED" in out) or ("my.yaml::dsagen[cuda] PASSED" in out)
    assert "bad.yaml::dsagen[cpu] FAILED" in out
    assert "bad.yaml: page_size: 48 is not a power of two" in out
    assert "Traceback" not in out
    assert "2 deselected" in out
    # the header counts the plugin's items as collected, before -k deselects two of them
    assert "collected 6 items / 2 deselected / 4 selected" in out


def test_missing_spec_is_a_usage_error(tmp_path):
    p = _pytest("--dsagen-spec", "nope.yaml", cwd=tmp_path)
    assert p.returncode == 4
    assert "--dsagen-spec: no such file" in p.stderr


def test_builtin_checks_report_a_malformed_arch_list(tmp_path):
    """A malformed DSAGEN_ARCH_LIST fails the built-in items with its one-line message (no
    traceback), as `dsagen compile` refuses it."""
    (tmp_path / "my.yaml").write_text((REPO / "specs" / "bf16_page64.yaml").read_text())
    p = _pytest("-v", "-rA", "--dsagen-spec", "my.yaml", "-k", "nvcc", cwd=tmp_path,
                env={"DSAGEN_ARCH_LIST": "sm_89"})
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "my.yaml::dsagen[nvcc] FAILED" in out, out
    assert "DSAGEN_ARCH_LIST='sm_89': must be a comma list of sm_90a, sm_100a ('sm_89' is not one)" in out
    assert "Traceback" not in out

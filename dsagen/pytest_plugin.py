"""pytest plugin of dsagen: check your own layout spec with ``pytest --dsagen-spec my.yaml``.

It is registered through the ``pytest11`` entry point, so it is active wherever dsagen is
installed; it imports nothing heavy (no torch) until a test asks for a spec.

Option ``--dsagen-spec PATH`` (repeatable): the spec files to test, relative to the directory
pytest was started in.

Parametrization: every test that takes the argument ``dsagen_spec_path`` (directly or through
the fixtures ``dsagen_spec`` / ``dsagen_ops``) runs once per spec: each spec in dsagen's
``specs/`` folder, or, when ``--dsagen-spec`` is given, only those. The ids are the file stems.

* ``dsagen_spec_path``: the :class:`pathlib.Path` of the spec file.
* ``dsagen_spec``: the loaded :class:`dsagen.Spec`.
* ``dsagen_ops``: ``dsagen.load(spec)``: the built ops (JIT, cached), with the CUDA kernels when
  a device matching one of the spec's targets is present; the CPU kernels are always there.

Built-in checks: when ``--dsagen-spec`` is given and no collected test takes
``dsagen_spec_path`` (for example ``pytest --dsagen-spec my.yaml`` in an empty directory), the
plugin adds three test items per spec, named ``PATH::dsagen[cpu]``, ``PATH::dsagen[cuda]`` and
``PATH::dsagen[nvcc]``:

* ``cpu``: build the ops and run :func:`dsagen.verify.verify` on the CPU (the full sweep);
* ``cuda``: the same on the CUDA device; skipped when no device matches a target of the spec;
* ``nvcc``: compile (``nvcc -c``, nothing run) the CUDA sources for each target that no local
  device runs and ``DSAGEN_ARCH_LIST`` keeps; skipped when nvcc is not found.

A failing item shows the spec error (``FILE: FIELD: message``), the malformed ``DSAGEN_*``
variable, or the verification table.
"""
from __future__ import annotations

from pathlib import Path

import pytest

_FIXTURE = "dsagen_spec_path"


def pytest_addoption(parser):
    group = parser.getgroup("dsagen", "dsagen layout specs")
    group.addoption("--dsagen-spec", action="append", default=[], metavar="PATH",
                    help="a dsagen layout spec (YAML) to test; repeatable. Tests taking "
                         "'dsagen_spec_path' run on these instead of the shipped specs; with no "
                         "such test collected, built-in CPU/CUDA/nvcc checks of each spec run.")


def _given_specs(config) -> list[Path]:
    base = Path(config.invocation_params.dir)
    return [(base / p).resolve() for p in config.getoption("dsagen_spec") or []]


def pytest_configure(config):
    missing = [str(p) for p in _given_specs(config) if not p.is_file()]
    if missing:
        raise pytest.UsageError(f"--dsagen-spec: no such file: {', '.join(missing)}")


def spec_paths(config) -> list[Path]:
    """The specs that tests run on: the ``--dsagen-spec`` files, else the shipped ``specs/``."""
    given = _given_specs(config)
    if given:
        return given
    from .spec import shipped_spec_paths
    return shipped_spec_paths()


def pytest_generate_tests(metafunc):
    if _FIXTURE in metafunc.fixturenames:
        paths = spec_paths(metafunc.config)
        metafunc.parametrize(_FIXTURE, paths, ids=[p.stem for p in paths])


@pytest.fixture
def dsagen_spec(dsagen_spec_path):
    """The loaded :class:`dsagen.Spec` of ``dsagen_spec_path`` (a :class:`dsagen.SpecError`
    for a bad file errors the test)."""
    from .spec import load_spec
    return load_spec(dsagen_spec_path)


@pytest.fixture
def dsagen_ops(dsagen_spec):
    """``dsagen.load(spec)`` (built once per process; see :func:`dsagen.ops.load`, whose errors,
    e.g. :class:`dsagen.jit.BuildError`, error the test)."""
    from . import load
    return load(dsagen_spec)


class SpecCheckFailed(AssertionError):
    """A built-in check failed: the kernels disagree with the reference (the message holds the
    seed and the verification table) or an nvcc compile failed (its log)."""


class SpecCheckItem(pytest.Item):
    """One built-in check (``cpu``, ``cuda`` or ``nvcc``) of one ``--dsagen-spec`` file."""

    def __init__(self, *, spec_path: Path, check: str, **kw):
        super().__init__(**kw)
        self.spec_path = spec_path
        self.check = check

    def runtest(self):
        from . import load
        from .ops import arch_split
        from .spec import load_spec

        spec = load_spec(self.spec_path)
        archs, compile_only, _ = arch_split(spec)
        if self.check == "nvcc":
            self._nvcc(spec, compile_only)
            return
        if self.check == "cuda" and not archs:
            pytest.skip(f"no CUDA device matching targets {list(spec.targets)}")
        import random

        from .verify import verify
        seed = random.SystemRandom().randrange(2**31)      # fresh inputs every run
        rep = verify(spec, load(spec), self.check, seed=seed)
        if not rep.passed:
            raise SpecCheckFailed(f"{spec.name}: {self.check} kernels disagree with the reference "
                                  f"(seed {seed}: `dsagen verify --device {self.check} --seed {seed} "
                                  f"{self.spec_path}` repeats the inputs)\n" + rep.table())

    def _nvcc(self, spec, archs):
        import tempfile

        from .codegen import render
        from .jit import find_nvcc, nvcc_compile_only
        if not archs:
            pytest.skip("every target runs on a local device (checked by the cuda item) or is "
                        "left out by DSAGEN_ARCH_LIST")
        if find_nvcc() is None:
            pytest.skip("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda)")
        with tempfile.TemporaryDirectory(prefix="dsagen-nvcc-") as wd:
            bad = [r for r in nvcc_compile_only(render(spec), archs, workdir=Path(wd)) if not r.ok]
        if bad:
            raise SpecCheckFailed("\n\n".join(f"{r.source} for {r.arch} failed:\n{r.log}" for r in bad))

    def repr_failure(self, excinfo, style=None):
        from .config import ConfigError
        from .spec import SpecError
        if isinstance(excinfo.value, (SpecCheckFailed, SpecError, ConfigError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"dsagen {self.check} check of {self.spec_path}"


@pytest.hookimpl(tryfirst=True)   # before -k / -m deselection, so they apply to these items too
def pytest_collection_modifyitems(session, config, items):
    given = _given_specs(config)
    if not given or any(_FIXTURE in getattr(it, "fixturenames", ()) for it in items):
        return
    added = []
    for p in given:
        try:
            rel = p.relative_to(config.rootpath).as_posix()
        except ValueError:
            rel = p.as_posix()
        for check in ("cpu", "cuda", "nvcc"):
            name = f"dsagen[{check}]"
            added.append(SpecCheckItem.from_parent(session, name=name, path=p, nodeid=f"{rel}::{name}",
                                                   spec_path=p, check=check))
    items.extend(added)
    # reported as collected (the terminal's "collected N items" counts collect reports), so
    # that -k / -m deselection is counted against them
    config.hook.pytest_collectreport(report=pytest.CollectReport(session.nodeid, "passed", None, added))

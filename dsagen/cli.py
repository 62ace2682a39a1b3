"""``dsagen`` command line (click).

Exit codes: 0 success; 1 a kernel disagrees with the reference (or a build failed);
2 a bad spec or bad usage (one line naming the file and the field, no traceback).
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import click

from .spec import SPECS_DIR, Spec, SpecError, load_spec, shipped_spec_paths


class UsageFailure(click.ClickException):
    """A bad spec, option or environment: click prints ``Error: <message>`` (one line, no
    traceback) and the command exits with status 2."""
    exit_code = 2


def _writable(path, what: str = "--json") -> None:
    """UsageFailure unless ``path`` can be written (its folder exists and is writable, and it
    is not a folder), checked before the work whose results go there."""
    import os
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageFailure(f"{what} {path}: cannot write there (the folder must exist and be writable)")


def _folder(path, what: str = "--out") -> Path:
    """The output folder ``path`` made and checked writable (:func:`dsagen.aot.out_folder`)
    before the work whose results go there; UsageFailure where it cannot be."""
    from .aot import OutDirError, out_folder
    if not str(path).strip():
        raise UsageFailure(f"{what}: an empty path")
    try:
        return out_folder(path)
    except OutDirError as e:
        raise UsageFailure(f"{what} {e}") from None


def _specs(paths) -> list[Spec]:
    try:
        return [load_spec(p) for p in paths]
    except SpecError as e:
        raise UsageFailure(str(e)) from None


def _one_folder_per_name(specs: list[Spec]) -> list[Spec]:
    """``specs``, or a UsageFailure where two different specs share a name (they would be
    rendered into the same ``<name>/`` folder, the second over the first)."""
    first: dict[str, Spec] = {}
    for s in specs:
        f = first.setdefault(s.name, s)
        if f != s:                   # (Spec equality: the content, not the file)
            raise UsageFailure(f"{s.source} and {f.source} are different specs named {s.name!r}: "
                               f"both would be written to {s.name}/; rename one")
    return specs


def _not_over_a_shipped_spec(specs: list[Spec], remedy: str, out: str | None = None) -> list[Spec]:
    """``specs``, or a UsageFailure where one would be rendered into the repository's
    ``generated/<name>/`` (the default folder, or ``out`` resolving to it) while ``specs/<name>.yaml``
    is a different spec: that folder holds the shipped spec's committed sources, which a spec copied
    from ``specs/`` and edited without a new name would otherwise replace silently. A shipped file
    that does not load (being edited) protects nothing."""
    from . import codegen
    if out is not None and Path(out).resolve() != codegen.GENERATED_DIR.resolve():
        return specs
    for s in specs:
        owner = SPECS_DIR / f"{s.name}.yaml"
        if not owner.is_file():
            continue
        try:
            f = load_spec(owner)
        except SpecError:
            continue
        if f != s:
            raise UsageFailure(f"{s.source}: name {s.name!r} is the shipped spec {owner}'s, and the "
                               f"specs differ: generated/{s.name}/ holds that spec's committed "
                               f"sources; {remedy}")
    return specs


class _Group(click.Group):
    """click.Group that notes whether the command line asks for help anywhere (so the group's
    environment check does not stop a subcommand's --help)."""

    def parse_args(self, ctx, args):
        ctx.meta["dsagen.asks_help"] = any(a in ("-h", "--help") for a in args)
        return super().parse_args(ctx, args)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dsagen")
@click.pass_context
def main(ctx):
    """dsagen: generate, build and verify DSA indexer key-cache kernels from a YAML layout spec."""
    from . import config
    problems = config.check()
    # doctor lists them instead; a subcommand's --help still prints
    asks_help = ctx.meta.get("dsagen.asks_help", False)
    if problems and ctx.invoked_subcommand != "doctor" and not asks_help and not ctx.resilient_parsing:
        raise UsageFailure("; ".join(problems))


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
def validate(specs):
    """Check spec files; print bytes/token and page bytes of each (every file is checked; exit
    status 2 when any is bad, one error line per bad file)."""
    bad = 0
    for p in specs:
        try:
            click.echo(load_spec(p).summary())
        except SpecError as e:
            bad += 1
            click.echo(f"Error: {e}", err=True)
    if bad:
        raise SystemExit(2)


@main.command("list")
def list_cmd():
    """Every shipped spec (specs/) with its bytes/token and page bytes.

    \b
    Exit status: 0, or 2 when a shipped spec does not load.
    """
    for s in _specs(shipped_spec_paths()):
        click.echo(f"{s.summary()}  ({s.description})")


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(), default=None, help="Output folder (default generated/<name>/).")
def render(specs, out):
    """Render the sources of each spec into generated/<name>/.

    \b
    Exit status: 0 rendered, 2 a bad spec or bad usage (two different specs
    of one name, the name of a different shipped spec into generated/, a
    folder that cannot be written).
    """
    from .codegen import write_generated
    if out is not None and not out.strip():
        raise UsageFailure("--out: an empty path (leave --out out for generated/<name>/)")
    chosen = _one_folder_per_name(_specs(specs))
    for s in _not_over_a_shipped_spec(chosen, "rename it, or give --out another folder", out):
        try:
            d = write_generated(s, Path(out) / s.name if out else None)
        except OSError as e:
            raise UsageFailure(f"--out {out or 'generated/'}: cannot write {s.name}'s sources "
                               f"({e.strerror or e})") from None
        click.echo(f"{s.name}: rendered into {d}")


def _fresh_seed(seed: int | None) -> int:
    """``seed``, or a fresh one (the sweep draws new random inputs on every run; the report
    prints the seed, and ``--seed`` repeats a run's inputs)."""
    import random
    return seed if seed is not None else random.SystemRandom().randrange(2**31)


def _run_verify(spec: Spec, ops, device: str, json_rows: list, seed: int | None = None) -> bool:
    from .verify import verify
    t0 = time.time()
    seed = _fresh_seed(seed)
    click.echo(f"[{spec.name}] verifying {device} kernels against the PyTorch reference (float64), "
               f"seed {seed} ...")
    rep = verify(spec, ops, device, seed=seed)
    click.echo(rep.table())
    click.echo(f"[{spec.name}] {device}: {'PASSED' if rep.passed else 'FAILED'} "
               f"({len(rep.rows)} cases, {time.time() - t0:.1f} s)")
    json_rows.append({**rep.to_dict(), "seed": seed})
    return rep.passed


def _compile_one(spec: Spec, json_rows: list, nvcc_check: bool = True, unrun: set | None = None,
                 uncompiled: set | None = None, seed: int | None = None,
                 excluded: set | None = None) -> bool:
    import torch

    from . import jit
    from .codegen import render as render_sources, write_generated
    from .ops import arch_split, load

    d = write_generated(spec)
    click.echo(f"[{spec.name}] {spec.summary().split(': ', 1)[1]}; sources rendered into {d}")
    ok = True
    archs, not_run, left_out = arch_split(spec)
    if archs:
        click.echo(f"[{spec.name}] CUDA device {torch.cuda.get_device_name()} -> building for {archs}")
    try:
        ops = load(spec, with_cuda=bool(archs))
    except jit.BuildError as e:
        click.echo(f"[{spec.name}] BUILD FAILED:\n{e}", err=True)
        return False
    ok &= _run_verify(spec, ops, "cpu", json_rows, seed)
    if archs:
        ok &= _run_verify(spec, ops, "cuda", json_rows, seed)
    if left_out:
        click.echo(f"[{spec.name}] DSAGEN_ARCH_LIST leaves out {left_out}: neither compiled nor run")
        if excluded is not None:
            excluded.update(left_out)
    if unrun is not None:
        unrun.update(not_run)
    if not_run and not nvcc_check:
        click.echo(f"[{spec.name}] --no-nvcc: CUDA for {not_run} neither compiled nor run")
    if not_run and nvcc_check:
        if jit.find_nvcc() is None:
            click.echo(f"[{spec.name}] nvcc not found: CUDA for {not_run} NOT compiled")
            if uncompiled is not None:
                uncompiled.update(not_run)
        else:
            click.echo(f"[{spec.name}] compiling CUDA sources with nvcc {jit.nvcc_version()} for {not_run} ...")
            import tempfile
            with tempfile.TemporaryDirectory(prefix="dsagen-nvcc-") as wd:
                results = jit.nvcc_compile_only(render_sources(spec), not_run, workdir=Path(wd))
            for r in results:
                status = "compiled" if r.ok else "COMPILE FAILED"
                click.echo(f"[{spec.name}]   {r.source} {r.arch}: {status} ({r.seconds:.1f} s)")
                if not r.ok:
                    click.echo(r.log, err=True)
                    ok = False
            click.echo(f"[{spec.name}] CUDA kernels for {not_run} were compiled but NOT run "
                       f"(no such device here)")
    return ok


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "json_out", type=click.Path(), default=None, help="Write the reports as JSON.")
@click.option("--no-nvcc", is_flag=True, help="Skip the compile-only check of targets without a device.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=None,
              help="Seed of the verification's random inputs (default: a fresh one, printed).")
def compile(specs, json_out, no_nvcc, seed):  # noqa: A001 - the command is called compile
    """Render, build, verify each spec; compile (not run) CUDA for targets with no local device.

    \b
    SPECS are YAML files (see specs/). The CUDA targets are the spec's
    `targets`, narrowed by DSAGEN_ARCH_LIST (e.g. sm_90a); the build cache is
    DSAGEN_CACHE_DIR (`dsagen doctor` shows the settings; the README lists
    every variable).
    \b
    Exit status: 0 every spec verified (and compiled for targets with no
    device, where nvcc is found; the last line says which were not), 1 a
    kernel disagrees with the reference or a build failed, 2 a bad spec or
    bad usage.
    """
    _writable(json_out)
    rows: list = []
    ok = True
    unrun: set = set()
    uncompiled: set = set()
    excluded: set = set()
    for s in _not_over_a_shipped_spec(_one_folder_per_name(_specs(specs)),
                                      "rename it (compile renders into generated/<name>/)"):
        ok &= _compile_one(s, rows, nvcc_check=not no_nvcc, unrun=unrun, uncompiled=uncompiled, seed=seed,
                           excluded=excluded)
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1))
    def archs(a: set) -> str:   # sm_90a before sm_100a: by the number, as specs list them
        return ", ".join(sorted(a, key=lambda x: (int("".join(filter(str.isdigit, x)) or 0), x)))
    if no_nvcc:
        what = "CUDA for " + archs(unrun) + " not compiled (--no-nvcc)"
    elif uncompiled:
        what = "CUDA for " + archs(uncompiled) + " NOT compiled: nvcc not found"
        if unrun - uncompiled:
            what = "CUDA for " + archs(unrun - uncompiled) + " compiled only; " + what
    else:
        what = "CUDA for " + archs(unrun) + " compiled only"
    notes = [f"{what}, not run: no such device here"] if unrun else []
    if excluded:
        notes.append("CUDA for " + archs(excluded) + " left out by DSAGEN_ARCH_LIST")
    click.echo("dsagen compile: " + ("all verified" if ok else "FAILED")
               + (f" ({'; '.join(notes)})" if notes else ""))
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=None,
              help="Seed of the random inputs (default: a fresh one, printed).")
def verify(specs, device, seed):
    """Verify built ops against the reference (builds them first if needed).

    \b
    Exit status: 0 verified, 1 a kernel disagrees with the reference or a
    build failed, 2 a bad spec or bad usage (e.g. --device cuda without a
    matching device).
    """
    import torch

    from . import jit
    from .ops import cuda_archs, load
    ok = True
    rows: list = []
    for s in _specs(specs):
        use_cuda = device == "cuda" or (device == "auto" and bool(cuda_archs(s)))
        if use_cuda and not torch.cuda.is_available():
            raise UsageFailure("--device cuda: no CUDA device")
        if use_cuda and not cuda_archs(s):
            cap = "sm_%d%d" % torch.cuda.get_device_capability()
            raise UsageFailure(f"--device cuda: the device ({cap}) matches none of {s.name}'s targets "
                               f"{list(s.targets)} (or DSAGEN_ARCH_LIST excludes them)")
        try:
            ops = load(s, with_cuda=use_cuda)
        except jit.BuildError as e:
            click.echo(f"[{s.name}] BUILD FAILED:\n{e}", err=True)
            ok = False
            continue
        ok &= _run_verify(s, ops, "cuda" if use_cuda else "cpu", rows, seed)
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "json_out", type=click.Path(), default=None, help="Write one object per row.")
@click.option("--quick", is_flag=True, help="A short shape list (smoke test).")
@click.option("--tuning", default=None, metavar="JSON",
              help="Kernel tuning overrides for every spec, e.g. '{\"mma_ahead\": false}' "
                   "(see dsagen.codegen.default_tuning).")
@click.option("--method", type=click.Choice(["spin", "graph"]), default=None,
              help="Timing: spin (launch hidden behind a GPU spin) or graph (CUDA-graph replay of "
                   "each call); default DSAGEN_BENCH_METHOD, else spin.")
def bench(specs, json_out, quick, tuning, method):
    """Time the generated kernels against copy bandwidth, the PyTorch fallback and DeepGEMM.

    \b
    Environment:
      DSAGEN_BENCH_METHOD   spin (default: launch hidden behind a GPU spin) or graph (CUDA-graph replay); --method wins
      DSAGEN_BENCH_SETTLE   seconds the GPU idles before each row (default 2; 0: none)
      DSAGEN_BENCH_PARTIAL  a JSON file rewritten with the rows so far after each row
      DSAGEN_BENCH_GIT      the rows' `git` field, for a tree copied without its .git
    \b
    Exit status: 0 every row timed, 1 a row (or a spec's build) has an error,
    2 a bad spec or bad usage (bad --tuning, no CUDA device).
    """
    from . import bench as B
    tune = None
    if tuning:
        try:
            tune = json.loads(tuning)
        except ValueError as e:
            raise UsageFailure(f"--tuning: not JSON ({e})") from None
        if not isinstance(tune, dict):
            raise UsageFailure("--tuning: must be a JSON object")
    _writable(json_out)
    loaded = _specs(specs)
    if tune is not None:
        from .codegen import render as render_sources
        for s in loaded:
            try:
                render_sources(s, tune)           # validates every key (memoized)
            except (ValueError, TypeError, KeyError) as e:
                raise UsageFailure(f"--tuning for {s.name}: {e}") from None
    try:
        rows = B.run(loaded, quick=quick, tuning=tune, method=method)
    except RuntimeError as e:
        if "CUDA" not in str(e):
            raise
        raise UsageFailure(str(e).splitlines()[0]) from None
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1))
        click.echo(f"wrote {len(rows)} rows to {json_out}")
    failed = [r for r in rows if r.get("error")]
    if failed:
        click.echo(f"dsagen bench: {len(failed)} row(s) with an error", err=True)
        sys.exit(1)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--spec", "spec_name", default=None, help="Only this spec's rows (its name).")
@click.option("--op", type=click.Choice(["paged_logits", "store", "ragged_logits"]), default=None,
              help="Only this op's rows.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None,
              help="Also draw % of copy bandwidth per shape (PNG, SVG or PDF by the suffix).")
def report(files, spec_name, op, plot_out):
    """Summarize `dsagen bench --json` FILES: per spec, op and shape, each figure's median and
    range over the files, as Markdown (no GPU needed).

    \b
    Exit status: 0 printed, 2 a file that is not a bench JSON file, no rows
    matching --spec/--op, or a --plot that cannot be drawn or written.
    """
    from .report import PLOT_SUFFIXES, load_runs, markdown, plot, summarize
    _writable(plot_out, "--plot")
    if plot_out and Path(plot_out).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageFailure(f"--plot {plot_out}: the file name must end in {', '.join(PLOT_SUFFIXES)}")
    try:
        runs = load_runs(files)
    except ValueError as e:
        raise UsageFailure(str(e)) from None
    from .report import cards
    sums = summarize(runs, spec=spec_name, op=op)
    mixed = cards(runs)
    if len(mixed) > 1:
        click.echo(f"warning: these files come from {len(mixed)} cards ({', '.join(mixed)}): "
                   "each range below mixes them; give the files of one card to compare runs", err=True)
    if not sums:
        raise UsageFailure("no bench rows" + (f" of spec {spec_name}" if spec_name else "")
                           + (f" of op {op}" if op else "") + " in these files")
    click.echo(markdown(runs, sums), nl=False)
    if plot_out:
        try:
            click.echo(f"wrote {plot(sums, plot_out)}")
        except (ValueError, OSError) as e:
            raise UsageFailure(f"--plot: {e}") from None


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--arch", default="sm_90a,sm_100a", show_default=True,
              help="Comma list of CUDA targets to build (each intersected with the spec's targets).")
@click.option("--out", type=click.Path(), default=None,
              help="Cache directory to fill (default: the cache root); point DSAGEN_CACHE_DIR at it.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="Builds at a time.")
def precompile(specs, arch, out, jobs):
    """Build every variant of the specs ahead of time (CPU, and CUDA per arch).

    \b
    Exit status: 0 every variant built (or compiled with nvcc only where this
    torch has no CUDA), 1 a variant failed, 2 a bad spec or bad usage (an
    unknown --arch, an --out that cannot be made writable).
    """
    from .aot import precompile as run_pre
    from .spec import ARCHS
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    for a in archs:
        if a not in ARCHS:
            raise UsageFailure(f"--arch: {a!r} is not one of {', '.join(ARCHS)}")
    t0 = time.time()
    loaded = _specs(specs)       # before --out is made, so a bad spec leaves no folder
    res = run_pre(loaded, archs, _folder(out) if out is not None else None, jobs, log=click.echo)
    bad = [r for r in res if not r.ok]
    click.echo(f"precompile: {len(res) - len(bad)} ok, {len(bad)} failed, {time.time() - t0:.1f} s")
    for r in bad:
        click.echo(f"  {r.spec} {r.variant}: {r.note}", err=True)
    sys.exit(1 if bad else 0)


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--context", "contexts", default=None, metavar="N,N,...",
              help="Comma list of context lengths in tokens [default: 4096,8192,16384,32768,65536,131072; "
                   "with --dump: the dump's whole length].")
@click.option("--index-topk", type=int, default=512, show_default=True,
              help="Keys the indexer keeps per query.")
@click.option("--compress-ratio", type=int, default=4, show_default=True,
              help="Tokens per indexer key: the indexer scores context // compress_ratio keys "
                   "(DeepSeek V4-style compressed indexer keys; 1 = one key per token as in V3.2). "
                   "DESIGN.md does not define it; this is dsagen's interpretation.")
@click.option("--queries", type=int, default=64, show_default=True,
              help="Synthetic queries per context (each with one planted needle; ignored with --dump).")
@click.option("--out", type=click.Path(file_okay=False), default="recall_out", show_default=True,
              help="Folder for recall.json and recall.png.")
@click.option("--dump", type=click.Path(dir_okay=False), default=None,
              help="safetensors file of real inputs: q [T, H, D], k [N, D], weights [T, H], "
                   "optional lengths [T] (see dsagen.recall.load_dump).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic inputs.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the layout kernels run (auto: CUDA when a device matches the spec targets).")
@click.option("--hadamard/--no-hadamard", default=True, show_default=True,
              help="Rotate the synthetic q and k with a Hadamard matrix before quantization (DeepSeek V3.2).")
def recall(specs, contexts, index_topk, compress_ratio, queries, out, dump, seed, device, hadamard):
    """Top-k recall of each layout's indexer against the exact float64 ranking.

    For each layout and context length: model-like queries and keys (heavy-tailed, outlier
    channels, Hadamard-rotated as in DeepSeek V3.2, one planted needle per query at a margin
    swept from 1 to 0.0003 standard deviations above the top-k threshold), or real ones from
    --dump, are stored through the layout's store op and scored by its paged_logits op; the
    top-k is compared with the top-k of exact float64 logits of the unquantized q and k.
    Prints a table and writes recall.json and recall.png into --out.

    \b
    Exit status: 0 measured, 1 a layout failed to build, 2 a bad spec or bad
    usage (bad sizes or contexts, an unusable --dump or --out).
    """
    import torch

    from . import jit
    from .ops import cuda_archs
    from .recall import format_table, run_recall, write_outputs

    t0 = time.time()
    ss = _specs(specs)
    ctx = None
    if contexts is not None:
        try:
            ctx = [int(c) for c in contexts.split(",") if c.strip()]
        except ValueError:
            raise UsageFailure(f"--context: {contexts!r} is not a comma list of integers") from None
        if not ctx or min(ctx) < 1:
            raise UsageFailure(f"--context: {contexts!r} must list positive integers")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageFailure("--device cuda: no CUDA device")
    made = not Path(out).exists()
    _folder(out)    # made and checked before the run, not after its minutes of work
    _writable(Path(out) / "recall.json", "--out")
    use_cuda = device == "cuda" or (device == "auto" and all(cuda_archs(s) for s in ss))
    dev = "cuda" if use_cuda else "cpu"
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    bar = None

    def progress(done, total, label):
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=total, label="dsagen recall", file=sys.stderr,
                                    item_show_func=lambda x: x)
            bar.__enter__()
        else:
            bar.update(1, label)
    try:
        res = run_recall(ss, contexts=ctx, index_topk=index_topk, compress_ratio=compress_ratio,
                         num_queries=queries, seed=seed, device=dev, dump=dump, log=log,
                         rotate=hadamard, progress=progress)
    except (ValueError, FileNotFoundError) as e:
        if made and Path(out).is_dir() and not any(Path(out).iterdir()):
            Path(out).rmdir()        # a usage error leaves no empty folder behind
        raise UsageFailure(str(e)) from None
    except jit.BuildError as e:
        click.echo(f"BUILD FAILED:\n{e}", err=True)
        sys.exit(1)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    click.echo(format_table(res))
    js, png = write_outputs(res, out)
    click.echo(f"wrote {js} and {png} ({time.time() - t0:.1f} s)")


@main.command()
def doctor():
    """Versions, paths, GPU, cache and settings: one report to paste in a bug."""
    from .aot import doctor as run_doctor
    for k, v in run_doctor():
        click.echo(f"{k + ':':<18}{v}")


@main.group()
def cache():
    """Inspect and clean the build cache (DSAGEN_CACHE_DIR)."""


def _cache_root_is_a_folder() -> None:
    """UsageFailure where the cache root exists but is not a folder (the cache commands would
    otherwise report an empty cache)."""
    from . import config
    from .aot import root_is_a_file
    if root_is_a_file():
        raise UsageFailure(f"cache root {config.cache_root()} is not a folder: set DSAGEN_CACHE_DIR to a folder")


@cache.command("ls")
def cache_ls():
    """One line per cache entry."""
    from .aot import entries
    _cache_root_is_a_folder()
    for e in entries():
        click.echo(f"{e.name:<48} {e.key:<16} {e.variant:<12} {e.size / 2**20:8.1f} MiB  {e.built:<19}  {e.status}")


@cache.command("du")
def cache_du():
    """Total size and entry count."""
    from . import config
    from .aot import aux_dirs, entries
    _cache_root_is_a_folder()
    es = entries()
    aux = aux_dirs()
    total = sum(e.size for e in es) + sum(a[3] for a in aux)
    click.echo(f"{config.cache_root()}: {len(es)} {'entry' if len(es) == 1 else 'entries'}, "
               f"{sum(e.size for e in es) / 2**20:.1f} MiB; "
               + "; ".join(f"{what} {files} files, {size / 2**20:.1f} MiB" for what, _d, files, size in aux)
               + f"; total {total / 2**20:.1f} MiB")


@cache.command("verify")
def cache_verify():
    """Check each entry's manifest and library checksum; exit 1 if any is unusable (2 where
    the cache root is not a folder)."""
    from .aot import entries
    _cache_root_is_a_folder()
    bad = 0
    for e in entries():
        click.echo(f"{e.name:<48} {e.key:<16} {e.status}")
        bad += e.status != "ok"
    sys.exit(1 if bad else 0)


@cache.command("prune")
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@click.option("--older-than", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Also remove entries older than DAYS (> 0).")
def cache_prune(everything, older_than):
    """Remove unusable entries (corrupt, unfinished), or more with the options (which also
    clear the render memo and template bytecode: all of it, or the files older than DAYS; a
    memo's age counts from its last use, a bytecode file's from when it was written)."""
    from .aot import prune, prune_aux
    _cache_root_is_a_folder()
    if older_than is not None and not math.isfinite(older_than):
        raise UsageFailure(f"--older-than {older_than}: must be a finite number of days > 0")
    gone = prune(everything=everything, older_than_days=older_than)
    for e in gone:
        click.echo(f"removed {e.path} ({e.status})")
    n, size = prune_aux(everything=everything, older_than_days=older_than)
    click.echo(f"{len(gone)} removed" + (f"; {n} render memo / template bytecode files ({size / 2**20:.1f} MiB)"
                                         if n else ""))


if __name__ == "__main__":
    main()

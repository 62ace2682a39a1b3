"""Summaries of ``dsagen bench --json`` files: one row per (spec, op, shape) with the median and
the range of each figure over the files, as a Markdown table, and an optional chart.

Bench runs on a lent GPU vary between leases by a few percent, so a figure is best quoted as a
range over independent runs; this module computes those ranges from the JSON the bench writes
(:func:`dsagen.bench.run`'s rows) instead of by hand. It needs neither torch nor a GPU.

    dsagen report benchmarks/h200.json benchmarks/logs/h200_s3*_dg.json
    dsagen report FILES... --op paged_logits --plot pct_copy.png
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Run", "load_runs", "summarize", "markdown", "plot", "cards"]

# (column header, row field, format) of the summary, in table order; a column is printed when
# any of its rows has the field
COLUMNS = (
    ("us", "us", ".2f"),
    ("% copy", "pct_copy_bw", ".1f"),
    ("us sched", "us_scheduled", ".2f"),
    ("% copy sched", "pct_copy_bw_scheduled", ".1f"),
    ("TFLOP/s", "tflops", ".2f"),
    ("x fallback", "speedup_vs_fallback", ".1f"),
    ("DeepGEMM us", "deepgemm_us", ".2f"),
    ("x DG seq", "speedup_vs_deepgemm_scheduled", ".3f"),
    ("x DG paired", "speedup_vs_deepgemm_paired", ".3f"),
)
OPS = ("paged_logits", "store", "ragged_logits")
EXTRA = ("deepgemm_pct_copy_bw",)   # collected for the chart, not a table column
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


@dataclass
class Run:
    """One bench file: its path, its ``op="meta"`` row (card, date, git, ``copy_GBps``...; empty
    when the file has none) and its result rows (every row but the meta row)."""
    path: str
    meta: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)


def load_runs(paths) -> list[Run]:
    """Read bench JSON files (lists of row objects, as ``dsagen bench --json`` writes them). A
    file given twice (the same resolved path) is read once, so it is not counted twice.

    Raises:
        ValueError: a file that cannot be read, is not UTF-8 JSON or not a list of objects (the
            message names it).
    """
    runs = []
    seen = set()
    for p in paths:
        try:
            real = Path(p).resolve()
        except (OSError, RuntimeError):
            real = Path(p)
        if real in seen:
            continue
        seen.add(real)
        try:
            text = Path(p).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: cannot read it as text ({e})") from None
        try:
            rows = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{p}: not JSON ({str(e)[:200]})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{p}: not a dsagen bench file (expected a JSON list of row objects)")
        meta = next((r for r in rows if r.get("op") == "meta"), {})
        runs.append(Run(str(p), meta, [r for r in rows if r.get("op") != "meta"]))
    return runs


def _atom(v: Any) -> Any:
    """A row's identity field as a hashable scalar (lists and objects by their JSON text)."""
    return v if v is None or isinstance(v, (str, int, float, bool)) else json.dumps(v, sort_keys=True)


def shape_key(row: dict[str, Any]) -> tuple:
    """(spec, op, shape) identity of a row: paged_logits ``B, next_n, ctx``; store ``N, slots``;
    ragged_logits ``S, N`` (the bench's ``B`` and ``ctx``)."""
    def g(f: str) -> Any:
        return _atom(row.get(f))
    op = g("op")
    if op == "store":
        shape = ("N", g("N"), g("slots") or "random")
    elif op == "ragged_logits":
        shape = ("S", g("B"), g("ctx"))
    else:
        shape = ("B", g("B"), g("next_n"), g("ctx"))
    return (g("spec"), op, shape)


def shape_label(key: tuple) -> str:
    """The shape of a :func:`shape_key` in words (``B=32 next_n=1 ctx=8192``)."""
    _spec, op, s = key
    if op == "store":
        return f"N={s[1]} {s[2]}"
    if op == "ragged_logits":
        return f"S={s[1]} N={s[2]}"
    return f"B={s[1]} next_n={s[2]} ctx={s[3]}"


def cards(runs: list[Run]) -> list[str]:
    """The distinct cards (the meta rows' ``card``, ``"?"`` where a file has none) of ``runs``,
    in file order: more than one means each summary range mixes cards."""
    return list(dict.fromkeys(str(r.meta.get("card") or "?") for r in runs))


@dataclass
class Summary:
    """One (spec, op, shape) over the runs: ``runs`` rows had it without an error (one per file
    for bench outputs; a file that times a shape twice gives two), ``errors``
    had it with one; ``values[field]`` the field's values over those runs, in file order;
    ``bitwise`` False when any run's ``bitwise_20_reruns`` was False (None when none said)."""
    key: tuple
    runs: int = 0
    errors: int = 0
    values: dict[str, list[float]] = field(default_factory=dict)
    bitwise: bool | None = None


def summarize(runs: list[Run], spec: str | None = None, op: str | None = None) -> list[Summary]:
    """One :class:`Summary` per (spec, op, shape) found in ``runs`` (load rows skipped), in
    first-seen order, optionally only ``spec`` / ``op``."""
    out: dict[tuple, Summary] = {}
    for run in runs:
        for r in run.rows:
            if r.get("op") not in OPS or (spec and r.get("spec") != spec) or (op and r.get("op") != op):
                continue
            k = shape_key(r)
            s = out.setdefault(k, Summary(k))
            if r.get("error"):
                s.errors += 1
                continue
            s.runs += 1
            for f in [c[1] for c in COLUMNS] + list(EXTRA):
                v = r.get(f)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    try:
                        v = float(v)
                    except OverflowError:
                        continue
                    if math.isfinite(v):             # NaN / inf figures are left out
                        s.values.setdefault(f, []).append(v)
            b = r.get("bitwise_20_reruns")
            if isinstance(b, bool):
                s.bitwise = b if s.bitwise is None else (s.bitwise and b)
    return list(out.values())


def _cell(vals: list[float], fmt: str, runs: int = 0) -> str:
    """``median (min-max)``, or the one value, or ``-``; `` [n]`` after it where only ``n`` of
    the row's ``runs`` files had the figure."""
    if not vals:
        return "-"
    lo, hi, med = (format(v, fmt) for v in (min(vals), max(vals), statistics.median(vals)))
    sep = " to " if lo.startswith("-") or hi.startswith("-") else "-"
    out = lo if lo == hi else f"{med} ({lo}{sep}{hi})"
    return out + (f" [{len(vals)}]" if len(vals) < runs else "")


def markdown(runs: list[Run], summaries: list[Summary]) -> str:
    """The runs (file, card, date, git, copy GB/s) and one Markdown table per (spec, op) with a
    row per shape: run count, each figure as ``median (min-max)`` over the runs (`` [n]``
    where only ``n`` of them had it), and whether
    every run was bitwise identical over its reruns. Units: us = microseconds; % copy = of the
    device-to-device copy bandwidth measured in the same run; x = speed-up (DeepGEMM's time
    over dsagen's for the DeepGEMM columns)."""
    lines = ["| file | card | date | git | copy GB/s |", "|---|---|---|---|---|"]
    for r in runs:
        m = r.meta
        cells = [r.path, m.get("card"), str(m.get("date") or "?")[:10], m.get("git"), m.get("copy_GBps")]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    groups: dict[tuple, list[Summary]] = {}
    for s in summaries:
        groups.setdefault(s.key[:2], []).append(s)
    for (spec, op), rows in groups.items():
        cols = [(h, f, fmt) for h, f, fmt in COLUMNS if any(s.values.get(f) for s in rows)]
        head = ["shape", "runs"] + [h for h, _f, _fmt in cols] + ["bitwise"]
        lines += ["", f"**{_md(spec)} {_md(op)}**", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for s in rows:
            runs_cell = str(s.runs) + (f" (+{s.errors} failed)" if s.errors else "")
            bit = "-" if s.bitwise is None else ("yes" if s.bitwise else "**NO**")
            cells = ([_md(shape_label(s.key)), runs_cell]
                     + [_cell(s.values.get(f, []), fmt, s.runs) for _h, f, fmt in cols] + [bit])
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md(v: Any) -> str:
    """A table cell: ``?`` for a missing value, one line, pipes escaped."""
    return "?" if v is None else " ".join(str(v).split()).replace("|", "\\|")


def plot(summaries: list[Summary], path: str | Path, field_name: str = "pct_copy_bw") -> Path:
    """A bar chart of ``field_name`` (default % of copy bandwidth) per shape, one bar per spec
    (height: the median over the runs; whiskers: min-max), DeepGEMM's % of copy as markers
    where the rows have it. Written with matplotlib's Agg backend to ``path`` (PNG, SVG or PDF
    by its suffix). Returns the path.

    Raises:
        ValueError: no summary has ``field_name``, or ``path``'s suffix is not one of
            ``PLOT_SUFFIXES``.
        OSError: the file cannot be written.
    """
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"{path}: the chart's file name must end in {', '.join(PLOT_SUFFIXES)}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summaries if s.values.get(field_name)]
    if not rows:
        raise ValueError(f"no row has {field_name!r} to plot")
    specs = list(dict.fromkeys(s.key[0] for s in rows))
    shapes = list(dict.fromkeys((s.key[1], s.key[2]) for s in rows))
    by = {(s.key[0], s.key[1], s.key[2]): s for s in rows}
    width = 0.8 / len(specs)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(shapes) + 2), 4.5))
    dg_labelled = False
    for i, spec in enumerate(specs):
        xs, ys, lo, hi, dgx, dgy = [], [], [], [], [], []
        for j, (op, shape) in enumerate(shapes):
            s = by.get((spec, op, shape))
            if s is None:
                continue
            v = s.values[field_name]
            med = statistics.median(v)
            x = j + (i - (len(specs) - 1) / 2) * width
            xs.append(x)
            ys.append(med)
            lo.append(med - min(v))
            hi.append(max(v) - med)
            if field_name == "pct_copy_bw" and s.values.get("deepgemm_pct_copy_bw"):
                dgx.append(x)
                dgy.append(statistics.median(s.values["deepgemm_pct_copy_bw"]))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=spec)
        if dgx:
            ax.scatter(dgx, dgy, marker="_", s=300, linewidths=2, color="black", zorder=3,
                       label=None if dg_labelled else "DeepGEMM, same inputs (median)")
            dg_labelled = True
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([shape_label((None, op, sh)) for op, sh in shapes], rotation=45, ha="right",
                       fontsize=7)
    ax.set_ylabel("% of copy bandwidth" if field_name == "pct_copy_bw" else field_name)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

"""`dsagen report`: ranges over bench JSON files (dsagen.report), on the CPU."""
from __future__ import annotations

import json
import random
import statistics

import pytest
from click.testing import CliRunner

from dsagen import report as R
from dsagen.cli import main

from conftest import REPO


def _bench_file(path, rng, *, drop_dg=False, error_at=None):
    """A bench file of random figures in the bench's row format; returns its rows."""
    rows = [{"op": "meta", "card": "Test GPU", "date": "2026-12-05T00:00:00+00:00", "git": "abc1234",
             "copy_GBps": round(rng.uniform(3000, 4300), 1)}]
    for B in (32, 128):
        for nn in (1, 2):
            r = {"spec": "fp8_e4m3_page64", "op": "paged_logits", "B": B, "next_n": nn, "ctx": 8192,
                 "us": rng.uniform(10, 50), "pct_copy_bw": rng.uniform(40, 95),
                 "us_scheduled": rng.uniform(10, 50), "speedup_vs_fallback": rng.uniform(20, 80),
                 "bitwise_20_reruns": True}
            if not drop_dg:
                r.update(deepgemm_us=rng.uniform(10, 50), deepgemm_pct_copy_bw=rng.uniform(40, 95),
                         speedup_vs_deepgemm_scheduled=rng.uniform(0.9, 1.2))
            if error_at == (B, nn):
                r = {"spec": r["spec"], "op": r["op"], "B": B, "next_n": nn, "ctx": 8192, "error": "boom"}
            rows.append(r)
    rows.append({"spec": "bf16_page64", "op": "store", "N": 65536, "slots": "pages",
                 "us": rng.uniform(10, 14), "pct_copy_bw": rng.uniform(55, 66)})
    rows.append({"spec": "bf16_page64", "op": "load", "error": "not this one"})
    path.write_text(json.dumps(rows))
    return rows


def test_ranges_are_median_min_max_over_files(tmp_path):
    rng = random.Random()
    files, all_rows = [], []
    for i in range(5):
        f = tmp_path / f"run{i}.json"
        all_rows.append(_bench_file(f, rng, drop_dg=(i == 3), error_at=(128, 2) if i == 1 else None))
        files.append(f)
    runs = R.load_runs(files)
    assert [r.meta["git"] for r in runs] == ["abc1234"] * 5
    sums = {R.shape_label(s.key) + " " + s.key[1]: s for s in R.summarize(runs)}
    assert len(sums) == 5                            # 4 paged shapes + 1 store; the load rows skipped

    def col(B, nn, field):
        return [r[field] for rows in all_rows for r in rows
                if r.get("op") == "paged_logits" and r["B"] == B and r["next_n"] == nn and field in r]
    s = sums["B=128 next_n=2 ctx=8192 paged_logits"]
    assert s.runs == 4 and s.errors == 1 and s.bitwise is True
    for field in ("us", "pct_copy_bw", "speedup_vs_deepgemm_scheduled"):
        assert s.values[field] == pytest.approx(col(128, 2, field))
    s = sums["B=32 next_n=1 ctx=8192 paged_logits"]
    assert len(s.values["deepgemm_us"]) == 4 and len(s.values["us"]) == 5

    md = R.markdown(runs, list(sums.values()))
    v = col(32, 1, "us")
    cell = f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
    assert f"| B=32 next_n=1 ctx=8192 | 5 | {cell} |" in md, md
    assert "| B=128 next_n=2 ctx=8192 | 4 (+1 failed) |" in md
    assert "**bf16_page64 store**" in md and "| N=65536 pages | 5 |" in md
    # a column no row of the table has is left out (the store has no DeepGEMM figures)
    store_table = md.split("**bf16_page64 store**")[1]
    assert "DeepGEMM" not in store_table


def test_a_file_given_twice_counts_once_and_mixed_cards_are_flagged(tmp_path):
    rng = random.Random()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _bench_file(a, rng)
    rows = _bench_file(b, rng)
    assert len(R.load_runs([a, a, tmp_path / "." / "a.json"])) == 1
    assert [s.runs for s in R.summarize(R.load_runs([a, a]))] == [1] * 5
    r = CliRunner().invoke(main, ["report", str(a), str(a), str(b)])
    assert r.exit_code == 0 and "| B=32 next_n=1 ctx=8192 | 2 |" in r.output and "warning" not in r.output
    rows[0]["card"] = "Other GPU"
    b.write_text(json.dumps(rows))
    assert R.cards(R.load_runs([a, b])) == ["Test GPU", "Other GPU"]
    r = CliRunner().invoke(main, ["report", str(a), str(b)])
    assert r.exit_code == 0 and "warning: these files come from 2 cards (Test GPU, Other GPU)" in r.output, r.output


def test_filters_and_bitwise_failure(tmp_path):
    rng = random.Random()
    f = tmp_path / "a.json"
    rows = _bench_file(f, rng)
    rows[1]["bitwise_20_reruns"] = False
    f.write_text(json.dumps(rows))
    sums = R.summarize(R.load_runs([f]), spec="fp8_e4m3_page64", op="paged_logits")
    assert len(sums) == 4 and {s.key[0] for s in sums} == {"fp8_e4m3_page64"}
    assert "**NO**" in R.markdown(R.load_runs([f]), sums)
    assert R.summarize(R.load_runs([f]), op="ragged_logits") == []


def test_cli_on_the_shipped_bench_file_with_a_plot(tmp_path):
    png = tmp_path / "pct.png"
    r = CliRunner().invoke(main, ["report", str(REPO / "benchmarks" / "h200.json"), "--op", "paged_logits",
                                  "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "**fp8_e4m3_page64 paged_logits**" in r.output and "**bf16_page64 paged_logits**" in r.output
    assert "| B=128 next_n=2 ctx=32768 | 1 |" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(main, ["report", str(bad)])
    assert r.exit_code == 2 and "bad.json: not JSON" in r.output
    obj = tmp_path / "obj.json"
    obj.write_text('{"op": "meta"}')
    r = CliRunner().invoke(main, ["report", str(obj)])
    assert r.exit_code == 2 and "not a dsagen bench file" in r.output
    ok = tmp_path / "ok.json"
    _bench_file(ok, random.Random())
    r = CliRunner().invoke(main, ["report", str(ok), "--spec", "nope"])
    assert r.exit_code == 2 and "no bench rows of spec nope" in r.output
    r = CliRunner().invoke(main, ["report", str(ok), "--op", "store", "--plot", str(tmp_path / "no" / "x.png")])
    assert r.exit_code == 2 and "cannot write there" in r.output


def _table_ok(md: str) -> None:
    """Every Markdown table row has as many cells as its header."""
    n = None
    for line in md.splitlines():
        if not line.startswith("|"):
            n = None
            continue
        cells = len(line.replace("\\|", "").split("|")) - 2
        n = cells if n is None else n
        assert cells == n, (line, n)


def test_odd_rows_stay_well_formed(tmp_path):
    """A spec whose rows all failed, NaN / inf / huge / non-numeric figures, list-valued shape
    fields and pipes in names: a well-formed table, those figures left out, no crash."""
    rows = [{"op": "meta", "git": None, "card": "a|b"},
            {"spec": "s", "op": "paged_logits", "B": 1, "next_n": 1, "ctx": 8, "error": "OOM"},
            {"spec": "t", "op": "paged_logits", "B": [1], "next_n": 1, "ctx": 8, "us": 2.0},
            {"spec": "u", "op": "store", "N": 4, "us": float("nan")},
            {"spec": "u", "op": "store", "N": 4, "us": 1.0},
            {"spec": "u", "op": "store", "N": 4, "us": float("inf")},
            {"spec": "u", "op": "store", "N": 4, "us": "fast"},
            {"spec": "u", "op": "store", "N": 4, "us": "HUGE"},
            {"spec": "u", "op": "store", "N": 4, "us": 3.0}]
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(rows).replace('"HUGE"', "1" + "0" * 400))     # past float range
    md = R.markdown(R.load_runs([f]), R.summarize(R.load_runs([f])))
    _table_ok(md)
    assert "| 0 (+1 failed) |" in md and "a\\|b" in md and "| ? |" in md
    assert "| N=4 random | 6 | 2.00 (1.00-3.00) [2] |" in md, md   # NaN / inf / huge / strings left out
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="deep.json: not JSON"):
        R.load_runs([deep])


def test_plot_suffix_is_checked_first(tmp_path):
    ok = tmp_path / "ok.json"
    _bench_file(ok, random.Random())
    for name in ("out", "out.", "x.pgf", "x.txt"):
        r = CliRunner().invoke(main, ["report", str(ok), "--plot", str(tmp_path / name)])
        assert r.exit_code == 2 and "must end in .png, .svg, .pdf" in r.output, r.output
        assert "**fp8_e4m3_page64" not in r.output                # before any table
    r = CliRunner().invoke(main, ["report", str(ok), "--plot", str(tmp_path / "c.svg")])
    assert r.exit_code == 0 and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_partial_columns_say_how_many_runs_had_them(tmp_path):
    rng = random.Random()
    files = []
    for i in range(3):
        f = tmp_path / f"r{i}.json"
        _bench_file(f, rng, drop_dg=(i > 0))         # DeepGEMM figures in one file of three
        files.append(f)
    md = R.markdown(R.load_runs(files), R.summarize(R.load_runs(files), op="paged_logits"))
    _table_ok(md)
    row = next(l for l in md.splitlines() if l.startswith("| B=32 next_n=1 ctx=8192 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3" and not cells[2].endswith("]")           # us: all three runs
    assert sum(c.endswith(" [1]") for c in cells) == 2               # DeepGEMM us and its ratio

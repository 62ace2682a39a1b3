"""Ranges over several `dsagen bench --json` files (development aid for README / RESULTS).

For each fp8 paged-logits shape with a DeepGEMM figure: dsagen's time from a schedule, DeepGEMM's,
the sequential and (where present) paired ratios, per file and as min-max; then the bf16 % of
copy and the store rows. Usage: python benchmarks/dg_ranges.py FILE.json...

Kept for the RESULTS.md sections that cite it; `dsagen report FILE.json...` (dsagen/report.py)
gives every figure's median and range per spec, op and shape, as Markdown, for any bench file.
"""
import json
import sys


def key(r):
    return (r["spec"], r["op"], r.get("B"), r.get("next_n"), r.get("ctx"), r.get("N"), r.get("slots"))


def rng(vals, fmt):
    v = [x for x in vals if x is not None]
    if not v:
        return "-"
    return format(min(v), fmt) if min(v) == max(v) else f"{format(min(v), fmt)}-{format(max(v), fmt)}"


def main(paths):
    runs = []
    for p in paths:
        rows = json.load(open(p))
        meta = rows[0]
        runs.append((p, meta, {key(r): r for r in rows[1:]}))
        print(f"{p}: git {meta.get('git')} copy {meta.get('copy_GBps')} GB/s {meta.get('date')}")
    keys = []
    for _p, _m, d in runs:
        keys += [k for k in d if k not in keys]
    fields = [("us_scheduled", ".2f"), ("deepgemm_us", ".2f"), ("speedup_vs_deepgemm_scheduled", ".3f"),
              ("speedup_vs_deepgemm_unclean", ".3f"), ("speedup_vs_deepgemm_paired", ".3f"),
              ("speedup_vs_deepgemm_unclean_paired", ".3f"), ("speedup_vs_fallback", ".1f")]
    print("\nfp8 paged_logits (per file, then the range)")
    for k in keys:
        if k[0] != "fp8_e4m3_page64" or k[1] != "paged_logits":
            continue
        print(f"B={k[2]} next_n={k[3]} ctx={k[4]}")
        for f, fmt in fields:
            vals = [d[k].get(f) if k in d else None for _p, _m, d in runs]
            cells = " / ".join("-" if v is None else format(v, fmt) for v in vals)
            print(f"  {f:38s} {cells}   [{rng(vals, fmt)}]")
    print("\nbf16 paged_logits pct_copy_bw_scheduled, pct_copy_bw, speedup_vs_fallback; stores us, pct")
    for k in keys:
        if k[1] == "paged_logits" and k[0] == "bf16_page64":
            a = [d[k].get("pct_copy_bw_scheduled") for _p, _m, d in runs if k in d]
            b = [d[k].get("pct_copy_bw") for _p, _m, d in runs if k in d]
            c = [d[k].get("speedup_vs_fallback") for _p, _m, d in runs if k in d]
            print(f"  bf16 B={k[2]} nn={k[3]} ctx={k[4]}: sched {rng(a, '.1f')} own {rng(b, '.1f')} x_fb {rng(c, '.1f')}")
        elif k[1] == "store" and k[0] in ("fp8_e4m3_page64", "bf16_page64"):
            u = [d[k].get("us") for _p, _m, d in runs if k in d]
            pc = [d[k].get("pct_copy_bw") for _p, _m, d in runs if k in d]
            print(f"  {k[0]} store N={k[5]} {k[6]}: {rng(u, '.2f')} us, {rng(pc, '.1f')} %")


if __name__ == "__main__":
    main(sys.argv[1:])

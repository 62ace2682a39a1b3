"""Is the SM clock under the paged-logits kernel limited by power? (development aid, fp8 page-tail
layout.) Runs one shape's kernel for a few seconds per phase (next_n 1 and 2 on stored random
keys, next_n 2 on the masked bytes of benchmarks/data_probe.py), each input kind twice: back to
back, and spin-hidden as benchmarks/quick_time.py times it (a ~100 us `torch.cuda._sleep`
before each call, CUDA events around the call), while `nvidia-smi` samples the SM clock, the
board power, the power limit and the clock-event reasons every 100 ms. Prints per phase the
kernel time (back to back: CUDA events over the whole phase, per call, launch included;
spin-hidden: the median call) and the samples' medians, and the reasons seen.
Limits (found in review after its eighteenth-session runs): the spin is a fixed ~100 us, where
dsagen bench calibrates a shorter one, and a phase is one loop rather than bursts of 100 calls;
board power is a running average in the driver, so the first samples after the 0.3 s skip still
include the idle second before the phase; nvidia-smi samples every GPU of the host (run it
with one visible GPU, as the lent machine has). Since those runs: the raw samples are copied
next to the output (OUT or /tmp) and the temperature is printed; rows with [N/A] values are
skipped (not run on a GPU since).
Usage: python benchmarks/power_probe.py [BxCTX] [seconds per phase]   (default 128x32768 3)"""
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

import dsagen
from data_probe import recode
from quick_time import SPIN_CYCLES, decode_inputs

FIELDS = ["timestamp", "clocks.sm", "power.draw", "power.limit", "temperature.gpu"]


def sampler(path):
    """Start nvidia-smi sampling into `path`; the clock-event reasons' field name depends on the
    driver (clocks_event_reasons, formerly clocks_throttle_reasons)."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        q = ",".join(FIELDS + [reasons])
        if subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                          capture_output=True).returncode == 0:
            break
    else:
        q = ",".join(FIELDS)
    f = open(path, "w")
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=f, stderr=subprocess.STDOUT), q


def main(B, ctx, secs):
    spec = dsagen.load_spec(os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml"))
    ops = dsagen.load(spec, with_cuda=True)
    g = torch.Generator().manual_seed(5)
    gc = torch.Generator(device="cuda").manual_seed(6)
    nsets = max(4, int(256e6 // (B * ctx * spec.bytes_per_token)) + 1)
    phases = []
    for nn, kind in ((1, "stored"), (2, "stored"), (2, "masked")):
        sets = [decode_inputs(ops, spec, B, nn, ctx, g) for _ in range(nsets)]
        if kind == "masked":
            for q, cache, *_ in sets:
                recode(cache, kind, gc)
                recode(q, kind, gc)
        phases.append((f"next_n={nn} {kind}", sets))
    path = "/tmp/power_probe_smi.csv"
    proc, query = sampler(path)
    time.sleep(1.0)
    spans = []
    try:
        for (name, sets), spin in [(p, spin) for p in phases for spin in (False, True)]:
            for a in sets[:2]:
                ops.paged_logits(*a, ctx, True)
            torch.cuda.synchronize()
            t0, calls, per_call = time.time(), 0, []
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            while time.time() - t0 < secs:
                evs = []
                for _ in range(20):
                    if spin:
                        torch.cuda._sleep(SPIN_CYCLES)   # as quick_time.time_fn
                        evs.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                        evs[-1][0].record()
                    ops.paged_logits(*sets[calls % len(sets)], ctx, True)
                    if spin:
                        evs[-1][1].record()
                    calls += 1
                torch.cuda.synchronize()     # (keeps the host's clock and the GPU's work together)
                per_call += [a.elapsed_time(b) * 1e3 for a, b in evs]
            e1.record()
            torch.cuda.synchronize()
            us = (statistics.median(per_call) if per_call else float("nan")) if spin else \
                e0.elapsed_time(e1) * 1e3 / max(calls, 1)
            spans.append((f"{name} {'spin-hidden' if spin else 'back to back'}", t0, time.time(), us, calls))
            time.sleep(1.0)
    finally:
        proc.terminate()
        proc.wait()
    names = query.split(",")
    rows = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(names):
            continue
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        try:
            vals = [float(x) for x in parts[1:len(FIELDS)]]
        except ValueError:               # a [N/A] or [Not Supported] value
            continue
        rows.append((ts, vals + parts[len(FIELDS):]))
    out = os.environ.get("OUT", "/tmp")
    shutil.copy(path, os.path.join(out, f"power_probe_smi_{B}x{ctx}.csv"))
    print(f"{torch.cuda.get_device_name()} B={B} ctx={ctx}; samples {len(rows)} ({query})", flush=True)
    for name, t0, t1, us, calls in spans:
        # samples in the phase, skipping its first 0.3 s (the clocks settle)
        inside = [p for ts, p in rows if t0 + 0.3 <= ts <= t1]
        how = "median call" if "spin" in name else "per call, launch included"
        line = f"{name:31s} {us:8.2f} us ({how}; {calls} calls, a host sync every 20)"
        if inside:
            med = [statistics.median(p[i] for p in inside) for i in range(4)]
            line += (f"  SM {med[0]:.0f} MHz  power {med[1]:.0f} W of {med[2]:.0f} W  {med[3]:.0f} C"
                     f"  ({len(inside)} samples)")
            if len(names) > len(FIELDS):
                line += "  reasons " + ",".join(sorted({p[-1] for p in inside}))
        print(line, flush=True)


if __name__ == "__main__":
    shape = tuple(map(int, sys.argv[1].split("x"))) if len(sys.argv) > 1 else (128, 32768)
    main(*shape, float(sys.argv[2]) if len(sys.argv) > 2 else 3.0)

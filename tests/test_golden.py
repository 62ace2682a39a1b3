"""generated/<name>/ must be exactly what the templates render for each shipped spec."""
from __future__ import annotations

import difflib
import os

import pytest

import dsagen
from dsagen.codegen import (CPU_SOURCES, CUDA_SOURCES, GENERATED_DIR, HEADERS, default_tuning, effective_tuning, namespace,
                            paged_logits_kernel, portable_kernel, render, small_tuning, small_work_max_len, write_generated, ws_stages)
from dsagen.spec import Spec

from conftest import REPO, SPECS

FIX = "run `dsagen render specs/*.yaml` and commit generated/"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_matches_render(name):
    spec = dsagen.load_spec(SPECS[name])
    fresh = render(spec)
    d = REPO / "generated" / spec.name
    assert d.is_dir(), f"generated/{spec.name}/ is missing: {FIX}"
    on_disk = {p.name for p in d.iterdir() if p.is_file()}
    assert on_disk == set(fresh), (
        f"generated/{spec.name}/ has extra {sorted(on_disk - set(fresh))} and lacks "
        f"{sorted(set(fresh) - on_disk)}: {FIX}")
    for fname, text in fresh.items():
        old = (d / fname).read_text()
        if old != text:
            diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                f"generated/{spec.name}/{fname}", "render", n=1))
            pytest.fail(f"generated/{spec.name}/{fname} differs from a fresh render: {FIX}\n"
                        + diff[:4000])


def _committed_generated() -> set[str] | None:
    """Names of the folders under generated/ that git tracks; None outside a git checkout."""
    import subprocess
    try:
        r = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "generated"],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return {f.split("/")[1] for f in r.stdout.split("\0") if f.count("/") >= 2}


def test_no_stale_generated_folders():
    # committed folders only: `dsagen compile my.yaml` renders a user's own spec into
    # generated/my_name/ too, and that untracked folder is not the project's to judge
    committed = _committed_generated()
    names = committed if committed is not None else \
        {p.name for p in (REPO / "generated").iterdir() if p.is_dir()}
    stale = sorted(names - set(SPECS))
    assert not stale, f"generated/ has folders of no shipped spec: {stale}"


def test_render_is_deterministic_and_complete(shipped, variant_spec):
    for spec in [*shipped.values(), variant_spec]:
        a, b = render(spec), render(spec)
        assert a == b
        assert set(a) == set(HEADERS + CPU_SOURCES + CUDA_SOURCES)
        for fname, text in a.items():
            assert text.strip() and text.endswith("\n")
            assert str(REPO) not in text, f"{fname} holds an absolute path"
            assert spec.name in text


def test_generated_dir_is_the_repo_one():
    assert GENERATED_DIR == REPO / "generated"


def test_write_generated_only_touches_changed_files(tmp_path, shipped):
    spec = shipped["fp8_e4m3_page64"]
    fresh = render(spec)
    d = write_generated(spec, tmp_path)
    files = sorted(d.iterdir())
    assert [p.name for p in files] == sorted(fresh)
    (d / "store.cu").write_text("stale")
    for p in files:
        os.utime(p, ns=(1, 1))
    write_generated(spec, tmp_path)
    for p in files:
        assert p.read_text() == fresh[p.name]
        assert (p.stat().st_mtime_ns != 1) == (p.name == "store.cu"), f"{p.name} rewritten needlessly"


def test_tunings_the_registers_cannot_hold_are_capped_or_refused():
    """`fuse` never asks for more WGMMA accumulators than the math warpgroups' registers hold
    (N=256 at 3 math warpgroups does not compile: ptxas C7602), and `maxnreg` beyond the
    register file is an error naming the tuning."""
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    src = render(spec, {"fuse": 256, "promote": 2})       # 3 math WGs with promotion: 88 at most
    assert "MmaN<128>" not in src["paged_logits.cu"] and "NEXT_N * kNumHeads <= 88" in src["paged_logits.cu"]
    src = render(spec)                                    # 64 accumulators fit in 128 registers
    assert "NEXT_N * kNumHeads <= 128" in src["paged_logits.cu"]
    assert "struct MmaN<128>" in src["paged_logits.cu"]   # the default: one N=128 chain
    src = render(spec, {"chains": 1})                     # one N=64 chain per position
    assert "struct MmaN<128>" not in src["paged_logits.cu"] and "struct MmaN<64>" in src["paged_logits.cu"]
    src = render(spec, {"fuse": 256, "math_wgs": 4})      # 640 threads: 96 registers
    assert "NEXT_N * kNumHeads <= 128" in src["paged_logits.cu"]
    bf16 = dsagen.load_spec(SPECS["bf16_page64"])
    assert "NEXT_N * kNumHeads <= 128" in render(bf16)["paged_logits.cu"]   # the default for 16-bit keys
    with pytest.raises(ValueError, match="maxnreg"):
        render(spec, {"maxnreg": 200})                    # 24 + 3*200 > 4*128: the launch's registers
    with pytest.raises(ValueError, match="maxnreg"):
        render(spec, {"maxnreg": 112})                    # below the 128 the launch gives: .inc undefined
    # weights in registers only where the registers also hold them (ptxas spilled otherwise)
    assert "kWRegsFor = NEXT_N * kNumHeads <= 128;" in render(spec)["paged_logits.cu"]
    assert "kWRegsFor = NEXT_N * kNumHeads <= 64;" in render(spec, {"math_wgs": 4})["paged_logits.cu"]
    assert "kWRegsFor = NEXT_N * kNumHeads <= 0;" in render(spec, {"promote": 1})["paged_logits.cu"]
    # setmaxnreg moves registers within the launch's (640 threads x 96): warpgroup 0 gives the
    # math warpgroups what they take, 4 x (112 - 96) = 96 - 32
    src = render(spec, {"math_wgs": 4, "maxnreg": 112})["paged_logits.cu"]
    assert "setmaxnreg.dec.sync.aligned.u32 32;" in src and "setmaxnreg.inc.sync.aligned.u32 112;" in src
    with pytest.raises(ValueError, match="maxnreg"):
        render(spec, {"math_wgs": 4, "maxnreg": 120})     # 4 x 24 > 96 - 24
    src = render(bf16)["paged_logits.cu"]                 # 16-bit keys: 2 math warpgroups, 232 registers
    assert "constexpr int kMathWGs = 2;" in src and "setmaxnreg.inc.sync.aligned.u32 232;" in src
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in src   # 3 x 168 = 40 + 2 x 232
    assert "kWRegsFor = NEXT_N * kNumHeads <= 128;" in src and "kAheadFor = NEXT_N * kNumHeads <= 256;" in src
    src = render(bf16, {"math_wgs": 3})["paged_logits.cu"]   # the 2-warpgroup register split goes with it
    assert "setmaxnreg" not in src and "kWRegsFor = NEXT_N * kNumHeads <= 128;" in src
    assert "kAheadFor = NEXT_N * kNumHeads <= 0;" in src
    src = render(bf16, {"maxnreg": 0})["paged_logits.cu"]    # 168 registers, one accumulator set
    assert "setmaxnreg" not in src and "kWRegsFor = NEXT_N * kNumHeads <= 128;" in src
    # the previous default: 4 math warpgroups given 112 registers, the per-unit loop
    src = render(bf16, {"math_wgs": 4, "maxnreg": 112, "wregs": 128, "loop": "unit"})["paged_logits.cu"]
    assert "constexpr int kMathWGs = 4;" in src and "setmaxnreg.inc.sync.aligned.u32 112;" in src
    assert "kWRegsFor = NEXT_N * kNumHeads <= 128;" in src and "Tuning loop=unit" in src
    wide = bf16.with_(num_heads=128, next_n=[1])          # 128 heads: 2 math warpgroups, as before
    assert default_tuning(wide)["math_wgs"] == 2 and default_tuning(wide)["maxnreg"] == 0
    for bad in ({"math_wgs": 5}, {"math_wgs": 0}, {"store_passes": 0}, {"store_passes": 2.5}, {"store_lanes": 3},
                {"store_lanes": 64}, {"chains": 3}, {"loop": "tile"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            render(spec, bad)


def test_scalar_tunings_checked_before_a_namespace():
    # a wrong type or an out-of-range count is a ValueError naming the key, from namespace()
    # (so from dsagen.load) as from render(): never a TypeError, nor a namespace of its own
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    for bad in ({"stages": 0}, {"stages": -1}, {"fuse": None}, {"fuse": "x"}, {"promote": [1]},
                {"promote": -1}, {"wregs": "x"}, {"wregs": -5}, {"mma_ahead": -1}, {"maxnreg": "x"},
                {"chains": None}, {"sched": "yes"}, {"math": 1}):
        key = next(iter(bad))
        for fn in (namespace, render):
            with pytest.raises(ValueError, match=rf"tuning {key}="):
                fn(spec, bad)
    # the accepted forms still build their namespaces
    for good in ({"stages": 2}, {"promote": True}, {"promote": 2}, {"wregs": 128}, {"mma_ahead": 64},
                 {"sched": False}, {"math": False}):
        assert namespace(spec, good).startswith("dsagen_fp8_e4m3_page64_")


def test_kv_evict_first_tuning():
    # default: the key / scale copies carry an L2 policy chosen per call from the logits' size
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    for name in ("paged_logits.cu", "paged_logits_small.cu"):
        src = render(spec)[name]
        assert "if constexpr (HINT) kv_policy = l2_policy_evict_first();" in src
        assert "page, kv_policy);" in src and "kScaleTileBytes, full + t, kv_policy);" in src
    assert "return double(logits_bytes) <= 0.5 * double(l2[dev]);" in render(spec)["paged_logits.cu"]
    assert "(void)logits_bytes;\n  return true;" in render(spec, {"kv_evict_first": True})["paged_logits.cu"]
    # off: the copies without a cache hint, and no HINT instantiation
    src = render(spec, {"kv_evict_first": False})["paged_logits.cu"]
    assert "kv_policy" not in src and "bool HINT" not in src and "(void)logits_bytes;\n  return false;" in src
    assert render(spec, {"kv_evict_first": 0})["paged_logits.cu"] == src.replace(
        namespace(spec, {"kv_evict_first": False}), namespace(spec, {"kv_evict_first": 0}))
    for bad in (-0.5, 17, "yes", float("nan"), None):
        with pytest.raises(ValueError, match="kv_evict_first"):
            render(spec, {"kv_evict_first": bad})
    # the launch's rule, as dsagen bench reports it: logits of at most half the L2 by default
    from dsagen.codegen import kv_evict_first_applies
    l2 = 60 << 20
    assert kv_evict_first_applies(spec, 1, 128, 32768, l2)            # 16.8 MB of logits
    assert not kv_evict_first_applies(spec, 2, 128, 32768, l2)        # 33.6 MB
    assert kv_evict_first_applies(spec, 2, 128, 32768, l2, {"kv_evict_first": True})
    assert not kv_evict_first_applies(spec, 1, 1, 64, l2, {"kv_evict_first": False})


def test_lean_loop_tuning():
    # default: the lane-0 broadcasts and the stage-ring counters only in the instantiations
    # without the evict-first hint; true / false: in all / none; no instantiation is added
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    for name in ("paged_logits.cu", "paged_logits_small.cu"):
        assert "constexpr bool kLean = !HINT;" in render(spec)[name]
        assert "constexpr bool kLean = true;" in render(spec, {"lean_loop": True})[name]
        assert "constexpr bool kLean = false;" in render(spec, {"lean_loop": False})[name]
    # without the hint there is no HINT instantiation: every one takes the lean form
    assert "constexpr bool kLean = true;" in render(spec, {"kv_evict_first": False})["paged_logits.cu"]
    src = render(spec)["paged_logits.cu"]
    assert "StageRing ring = StageRing::at(count, STAGES);" in src and "lane0_if<kLean>(warp / 4 - 1)" in src
    for bad in ("all", 1, None, "hinted"):
        with pytest.raises(ValueError, match="lean_loop"):
            render(spec, {"lean_loop": bad})


@pytest.mark.parametrize("name, lanes", [("fp8_e4m3_page64", 4), ("bf16_page64", 4), ("fp8_e4m3_ue8m0_page64", 4),
                                         ("fp8_e4m3_interleaved_page64", 16), ("fp8_e4m3_page1", 16),
                                         ("fp4_e2m1_page64", 16)])
def test_store_lanes_default_follows_the_key_vector(name, lanes):
    # 4 lanes per token where a lane's chunk is stored in 8- or 16-byte vectors; 16 where only
    # 4-byte vectors are aligned (keys at a 132-byte token stride, e2m1 chunks)
    spec = dsagen.load_spec(SPECS[name])
    assert default_tuning(spec)["store_lanes"] == lanes
    src = render(spec)["store.cu"]
    assert f"constexpr int kThreadsPerToken = {lanes} < kChunksPerToken ? {lanes} : kChunksPerToken;" in src
    # an explicit value wins, capped at head_dim / 8 lanes
    assert "kThreadsPerToken = 8 < kChunksPerToken" in render(spec, {"store_lanes": 8})["store.cu"]
    narrow = dsagen.load_spec(SPECS["bf16_page64"]).with_(head_dim=32)
    assert "kThreadsPerToken = 4 < kChunksPerToken" in render(narrow, {"store_lanes": 32})["store.cu"]


@pytest.mark.parametrize("name", ["fp8_e4m3_page64", "fp8_e4m3_ue8m0_page64", "fp4_e2m1_page64",
                                  "fp8_e4m3_interleaved_page64", "fp8_e4m3_page1", "bf16_page64"])
def test_store_prefetch_tuning(name):
    # off by default (it slowed whole pages on the H200); on: the scale sectors prefetched when a
    # step is converted, in calls of >= 4096 tokens
    spec = dsagen.load_spec(SPECS[name])
    assert default_tuning(spec)["store_prefetch"] is False
    assert "prefetch" not in render(spec)["store.cu"]
    src = render(spec, {"store_prefetch": True})["store.cu"]
    assert ("if (n >= 4096) prefetch_scales(t, slot);" in src) == spec.quantized
    if not spec.quantized:    # nothing to prefetch: the tuning renders nothing
        assert "prefetch" not in src
        return
    src = render(spec, {"store_prefetch": True, "store_prefetch_min_n": 0})["store.cu"]
    assert "if (n >= 0) prefetch_scales(t, slot);" in src and src.count("prefetch_scales(") == 1
    assert "prefetch" not in render(spec, {"store_prefetch": False})["store.cu"]
    sep = spec.with_(scale_placement="separate")       # the scales' own tensor
    assert "prefetch.global.L2 [%0];\" ::\"l\"(kv_scales + scale_offset" in render(sep, {"store_prefetch": True})["store.cu"]
    for bad in ({"store_prefetch": "use"}, {"store_prefetch": 1}, {"store_prefetch_min_n": -1},
                {"store_prefetch_min_n": 2.5}, {"store_prefetch_min_n": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            render(spec, bad)


@pytest.mark.parametrize("name", ["fp8_e4m3_page64", "fp8_e4m3_ue8m0_page64", "bf16_page64", "fp16_page64"])
def test_math_loop_default(name):
    # the per-request math loop by default; the per-unit loop stays a tuning (it spilled less in
    # the 4-warpgroup 16-bit configuration of 112 registers)
    spec = dsagen.load_spec(SPECS[name])
    assert default_tuning(spec)["loop"] == "request"
    for chosen in ("request", "unit"):
        src = render(spec, {"loop": chosen})["paged_logits.cu"]
        assert ("Tuning loop=request" in src) == (chosen == "request")
        assert ("Tuning loop=unit" in src) == (chosen == "unit")
    # a 16-bit spec with next_n * num_heads above 128 runs 3 math warpgroups: the request loop
    assert default_tuning(spec.with_(next_n=[3]))["loop"] == "request"


@pytest.mark.parametrize("name, ahead, bound", [("fp8_e4m3_page64", 64, 64), ("fp8_e4m3_ue8m0_page64", 64, 64),
                                                ("bf16_page64", True, 256), ("fp16_page64", True, 256)])
def test_mma_ahead_default_and_refusals(name, ahead, bound):
    # 8-bit keys with <= 64 heads: next_n 1's next tile goes to the tensor core before the
    # epilogue; 16-bit keys (2 math warpgroups of 232 registers): every next_n's
    spec = dsagen.load_spec(SPECS[name])
    assert default_tuning(spec)["mma_ahead"] == ahead
    src = render(spec)["paged_logits.cu"]
    assert f"constexpr bool kAheadFor = NEXT_N * kNumHeads <= {bound};" in src
    assert ("if constexpr (kAheadFor<NEXT_N>)" in src) == bool(ahead)
    # a tuning that changes the tile shape or the registers without mma_ahead turns the default
    # off; one that spells out their default values does not, and shares the defaults' namespace
    base = default_tuning(spec)
    for k, v in (("promote", 1), ("chains", 1), ("math_wgs", 4), ("loop", "unit"), ("maxnreg", 200)):
        assert effective_tuning(spec, {k: v})["mma_ahead"] is False
    for k in ("loop", "math_wgs", "maxnreg", "wregs"):
        assert effective_tuning(spec, {k: base[k]}) == base
        assert namespace(spec, {k: base[k]}) == namespace(spec)
    assert effective_tuning(spec, {"store_lanes": 8})["mma_ahead"] == ahead


def test_namespace_follows_the_effective_tuning():
    bf16 = dsagen.load_spec(SPECS["bf16_page64"])
    # 1 is a bound on N (next_n 1 needs 64), not True: other code, another namespace
    assert "kAheadFor = NEXT_N * kNumHeads <= 1;" in render(bf16, {"mma_ahead": 1})["paged_logits.cu"]
    assert namespace(bf16, {"mma_ahead": 1}) != namespace(bf16) == namespace(bf16, {"mma_ahead": True})
    # math_wgs 3 alone also turns the 2-warpgroup registers (maxnreg) and mma_ahead off
    assert namespace(bf16, {"math_wgs": 3}) == namespace(bf16, {"math_wgs": 3, "maxnreg": 0, "mma_ahead": False})


def test_mma_ahead_needs_one_chain_and_the_registers():
    spec = dsagen.load_spec(SPECS["fp8_e4m3_page64"])
    # next_n 2 (N=128) with two accumulator sets: 128 + 32 registers are more than 3 math warpgroups have
    with pytest.raises(ValueError, match="mma_ahead: a tile at next_n=2"):
        render(spec, {"mma_ahead": True})
    with pytest.raises(ValueError, match="mma_ahead: a tile at next_n=1"):
        render(spec, {"mma_ahead": 64, "chains": 2})
    with pytest.raises(ValueError, match="loop='request'"):
        render(spec, {"mma_ahead": 64, "loop": "unit"})
    with pytest.raises(ValueError, match="mma_ahead: a tile at next_n=1"):
        render(spec, {"mma_ahead": 64, "promote": 1})
    # 2 math warpgroups with 232 registers hold both positions' two sets, weights in registers
    src = render(spec, {"mma_ahead": True, "math_wgs": 2, "maxnreg": 232})["paged_logits.cu"]
    assert "kAheadFor = NEXT_N * kNumHeads <= 256;" in src and "kWRegsFor = NEXT_N * kNumHeads <= 128;" in src


def test_small_work_kernel(shipped):
    """fp8 keys: a 2-warpgroup paged_logits_ws for little work, in its own source and namespace,
    launched by the main launch up to small_tiles tiles per SM; none for bf16 or where a tuning
    changes a paged-kernel key without setting `small`."""
    fp8, bf16 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"]
    sub = small_tuning(fp8)
    assert sub["math_wgs"] == 2 and sub["maxnreg"] == 232 and not sub["mma_ahead"] and sub["small"] == {}
    src = render(fp8)
    small, main = src["paged_logits_small.cu"], src["paged_logits.cu"]
    assert f"namespace {namespace(fp8)}::small {{" in small and "constexpr int kMathWGs = 2;" in small
    assert "bool launch_ws_small(" in small and "launch_ws<2, 4>(" in small
    assert "ragged_logits_simt(" not in small and "launch_paged_logits(" not in small
    assert "constexpr int kMathWGs = 3;" in main and "small::launch_ws_small(NEXT_N," in main
    assert "<= int64_t(40) * sms" in main
    assert "int64_t(64) * sms" in render(fp8, {"small_tiles": 64})["paged_logits.cu"]
    for off in ({"small": {}}, {"small_tiles": 0}, {"math_wgs": 4}, {"math_wgs": 2, "maxnreg": 232}):
        assert small_tuning(fp8, off) is None, off
        assert "No small-work" in render(fp8, off)["paged_logits_small.cu"]
        assert "launch_ws_small" not in render(fp8, off)["paged_logits.cu"]
    assert namespace(fp8, {"small": {}}) != namespace(fp8)
    assert small_tuning(bf16) is None and "No small-work" in render(bf16)["paged_logits_small.cu"]
    # keys of the tuning reach both kernels; `small` overrides them for the small one
    assert small_tuning(fp8, {"math": False})["math"] is False
    assert small_tuning(fp8, {"math_wgs": 4, "small": {"math_wgs": 1}})["math_wgs"] == 1
    assert small_tuning(bf16, {"small": {"math_wgs": 3}})["math_wgs"] == 3
    for bad, key in (({"small": {"store_lanes": 8}}, "small"), ({"small": 2}, "small"),
                     ({"small_tiles": -1}, "small_tiles"), ({"small_tiles": 1.5}, "small_tiles"),
                     ({"small_tiles": 10**30}, "small_tiles"), ({"small": {"math_wgs": 7}}, "small=.*math_wgs"),
                     ({"small": {"kernel": "simt"}}, "small=.*paged_logits_ws"),
                     ({"small": {"ws_stages": 1}}, "small=.*paged_logits_ws"),
                     ({"small": {"ws_stages": "x"}}, "small="),
                     ({"small": {"math_wgs": 3}, "mma_ahead": True}, "small=.*mma_ahead")):
        with pytest.raises(ValueError, match=key):
            render(bf16 if "mma_ahead" in bad else fp8, bad)


def test_small_work_kernel_namespace_and_render_memo(shipped, tmp_path, monkeypatch):
    """A tuning whose small-work kernel differs gets its own namespace and render, even where
    the main kernel's effective tuning equals another's (a given default reaches the small
    kernel's rules); key order does not matter."""
    monkeypatch.setenv("DSAGEN_CACHE_DIR", str(tmp_path))      # an empty render memo
    fp8, bf16 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"]
    given = {"mma_ahead": 64}                                  # the default, spelled out
    assert effective_tuning(fp8, given) == effective_tuning(fp8)
    assert small_tuning(fp8, given)["mma_ahead"] == 64 and not small_tuning(fp8)["mma_ahead"]
    assert namespace(fp8, given) != namespace(fp8)
    spelled = render(fp8, given)["paged_logits_small.cu"]
    assert render(fp8)["paged_logits_small.cu"] == (REPO / "generated" / fp8.name / "paged_logits_small.cu").read_text()
    assert "kAheadFor = NEXT_N * kNumHeads <= 64;" in spelled
    # a valid render under one namespace does not let an invalid tuning through the memo
    ok, bad = {"small": {"math_wgs": 3}}, {"small": {"math_wgs": 3}, "mma_ahead": True}
    render(bf16, ok)
    with pytest.raises(ValueError, match="mma_ahead"):
        render(bf16, bad)
    with pytest.raises(ValueError, match="mma_ahead"):
        namespace(bf16, bad)
    assert namespace(fp8, {"small": {"maxnreg": 232, "math_wgs": 2, "ws_stages": 4}}) == namespace(fp8)
    # without its ws_stages the small kernel follows the main kernel's 3 stages: another kernel
    assert namespace(fp8, {"small": {"maxnreg": 232, "math_wgs": 2}}) != namespace(fp8)


def test_ws_stage_defaults(shipped):
    """8-bit keys: 3 key tiles in flight per math warpgroup in the main ws kernel, 4 in the
    small-work kernel (as measured on the H200); 16-bit keys keep 4."""
    fp8, bf16 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"]
    assert [ws_stages(fp8, nn) for nn in fp8.next_n] == [3, 3]
    assert [ws_stages(fp8, nn, small_tuning(fp8)) for nn in fp8.next_n] == [4, 4]
    assert [ws_stages(bf16, nn) for nn in bf16.next_n] == [4, 4]
    # a tuning's ws_stages reaches the main kernel, not the small one given with it (its override
    # wins); without `small` such a tuning has no small kernel (effective_tuning)
    small = {"maxnreg": 232, "math_wgs": 2, "ws_stages": 4}
    assert ws_stages(fp8, 1, {"ws_stages": 5}) == 5 and small_tuning(fp8, {"ws_stages": 5}) is None
    assert ws_stages(fp8, 1, small_tuning(fp8, {"ws_stages": 5, "small": small})) == 4


def test_ws_stages_per_next_n(shipped):
    """Tuning ws_stages as a dict from next_n (an int or its JSON digits) to a stage count: each
    next_n's kernel gets its own, in the rendered source too; a missing next_n or a bad key is a
    ValueError naming the tuning."""
    fp8 = shipped["fp8_e4m3_page64"]
    for per_nn in ({1: 3, 2: 4}, {"1": 3, "2": 4}):
        assert [ws_stages(fp8, nn, {"ws_stages": per_nn}) for nn in fp8.next_n] == [3, 4]
        small = {"maxnreg": 232, "math_wgs": 2, "ws_stages": per_nn}
        assert [ws_stages(fp8, nn, small_tuning(fp8, {"small": small})) for nn in fp8.next_n] == [3, 4]
        src = render(fp8, {"small": small})["paged_logits_small.cu"]
        assert "kWsStagesFor<1> = 3;" in src and "kWsStagesFor<2> = 4;" in src
    # the same kernels from int or string keys: one namespace
    assert namespace(fp8, {"ws_stages": {1: 3, 2: 4}}) == namespace(fp8, {"ws_stages": {"1": 3, "2": 4}})
    # mixed int / string keys are one form too
    assert namespace(fp8, {"ws_stages": {1: 3, "2": 4}}) == namespace(fp8, {"ws_stages": {1: 3, 2: 4}})
    # a dict that spells out one count is that count: the defaults' namespace and small kernel
    assert namespace(fp8, {"ws_stages": {"1": 3, "2": 3}}) == namespace(fp8)
    assert small_tuning(fp8, {"ws_stages": {"1": 3, "2": 3}}) == small_tuning(fp8) is not None
    with pytest.raises(ValueError, match=r"ws_stages=.*no entry for next_n=2"):
        ws_stages(fp8, 1, {"ws_stages": {"1": 3}})
    for bad_key in ("one", " 1 ", "0_2", 1.7, True, 3):
        with pytest.raises(ValueError, match=r"ws_stages=.*keys must be next_n values of the spec"):
            ws_stages(fp8, 1, {"ws_stages": {bad_key: 3, 1: 3, 2: 4}})
    with pytest.raises(ValueError, match=r"ws_stages=.*next_n=1 given twice"):
        ws_stages(fp8, 1, {"ws_stages": {1: 3, "1": 4, 2: 4}})
    for bad in ("3", 3.0, True, -1, 65, {"1": "3", "2": 4}, {"1": False, "2": 4}):
        with pytest.raises(ValueError, match=r"ws_stages=.*integer from 0 to 64"):
            ws_stages(fp8, 1, {"ws_stages": bad})
    with pytest.raises(ValueError, match=r"small=.*no entry for next_n=2"):
        small_tuning(fp8, {"small": {"maxnreg": 232, "math_wgs": 2, "ws_stages": {"1": 3}}})


def test_fp8_mma_kernel_gets_the_tensor_core_bars(shipped, monkeypatch):
    """fp8 mma.sync accumulates like WGMMA (no fp32 promotion between K steps): the portable
    tensor-core kernel on e4m3 keys is held to the fp8 tensor-core bars, on sm_90 and sm_100;
    bf16 keys and the CUDA-core kernel keep the exact-fp32 ones. (On the H200 the fp8 mma kernel
    measured 6.6e-8..9.1e-8, like the CUDA-core kernel; Blackwell's is unmeasured.)"""
    import torch
    from dsagen.verify import COND_TOL, FP8_MMA_COND_TOL, FP8_MMA_REL_L2_TOL, REL_L2_TOL, logits_tolerance
    fp8, bf16 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"]
    mma = {"kernel": "simt", "portable": "mma"}
    for major in (9, 10):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None, m=major: (m, 0))
        assert logits_tolerance(fp8, "cuda", 2, mma) == (FP8_MMA_REL_L2_TOL, FP8_MMA_COND_TOL)
        assert logits_tolerance(bf16, "cuda", 2, mma) == (REL_L2_TOL, COND_TOL)
    assert logits_tolerance(fp8, "cuda", 2, {"kernel": "simt"}) == (FP8_MMA_REL_L2_TOL, FP8_MMA_COND_TOL)
    simt = {"kernel": "simt", "portable": "simt"}
    assert logits_tolerance(fp8, "cuda", 2, simt) == (REL_L2_TOL, COND_TOL)   # sm_100 here
    assert logits_tolerance(fp8, "cpu", 2, mma) == (REL_L2_TOL, COND_TOL)


def test_unknown_tuning_keys_and_kernels_are_refused(shipped):
    """A misspelt key would otherwise build the default kernels under a new namespace."""
    fp8 = shipped["fp8_e4m3_page64"]
    with pytest.raises(ValueError, match="unknown key ws_stage "):
        render(fp8, {"ws_stage": 3})
    with pytest.raises(ValueError, match="kernel='nope'"):
        render(fp8, {"kernel": "nope"})


def test_portable_tuning(shipped):
    """Tuning ``portable``: "mma" (the default) or "simt"; the mma kernel is rendered only under
    "mma" and only where :func:`mma_applies` (every shipped layout but FP4)."""
    from dsagen.codegen import mma_applies, mma_prefetches, mma_smem_bytes, mma_widens
    assert {n for n, s in shipped.items() if not mma_applies(s)} == {"fp4_e2m1_page64"}
    for bad in ("wgmma", "", None, True):
        with pytest.raises(ValueError, match="tuning portable=.*'simt' or 'mma'"):
            render(shipped["fp8_e4m3_page64"], {"portable": bad})
    for name, spec in shipped.items():
        plain = render(spec)["paged_logits.cu"]
        simt = render(spec, {"portable": "simt"})["paged_logits.cu"]
        assert plain == render(spec, {"portable": "mma"})["paged_logits.cu"], name
        assert "paged_logits_mma" not in simt
        assert ("paged_logits_mma<NEXT_N><<<" in plain) == mma_applies(spec), name
    # q rows in B-fragment order (widened to f16 under mma_widen) plus fp32 weights
    fp8, bf16 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"]
    assert mma_smem_bytes(fp8, 2, {"mma_widen": True}) == 2 * 64 * (2 * 128 + 4)
    assert mma_smem_bytes(bf16, 2, {"mma_widen": True}) == 2 * 64 * (256 + 4)
    # mma_widen: on by default, a bool, only e4m3 keys change, and only where the widened q of
    # the largest next_n fits in shared memory (else the unwidened form keeps the mma kernel)
    assert mma_smem_bytes(fp8, 2) == 2 * 64 * (2 * 128 + 4)
    assert mma_smem_bytes(fp8, 2, {"mma_widen": False}) == 2 * 64 * (128 + 4)
    assert render(bf16, {"mma_widen": True})["paged_logits.cu"].count("mma_widen(") == 0
    def code(spec, tuning=None):   # paged_logits.cu less its namespace (named by the tuning)
        src = render(spec, tuning)["paged_logits.cu"]
        return src.replace(namespace(spec, tuning), "NS")
    assert code(bf16) == code(bf16, {"mma_widen": False})
    assert render(fp8)["paged_logits.cu"] == render(fp8, {"mma_widen": True})["paged_logits.cu"]
    assert render(fp8, {"mma_widen": False})["paged_logits.cu"].count("mma_widen(") == 0
    assert render(fp8)["paged_logits.cu"].count("mma_widen(") > 0
    # 128 heads of head_dim 256 at next_n 4: the widened q (264,192 B) would not fit in 227 KB,
    # the stored one (133,120 B) does, so the e4m3 form renders (m16n8k32, no widening)
    big = Spec.from_dict({"name": "fp8_d256_h128", "description": "widening refused",
                          "head_dim": 256, "page_size": 64, "key": {"dtype": "e4m3"},
                          "scale": {"dtype": "fp32", "rounding": "none", "block": 256,
                                    "placement": "page_tail"},
                          "logits": {"num_heads": 128, "next_n": [1, 4]},
                          "targets": ["sm_90a", "sm_100a"]})
    assert mma_widens(fp8) and not mma_widens(big) and not mma_widens(bf16)
    assert mma_smem_bytes(big, 4) == 4 * 128 * (256 + 4)
    assert all(portable_kernel(big, nn) == "mma" for nn in (1, 4))
    src = code(big)
    assert src == code(big, {"mma_widen": False}) == code(big, {"mma_widen": True})
    assert "mma_widen(" not in src and "m16n8k32" in src
    with pytest.raises(ValueError, match="tuning mma_widen=1: must be true or false"):
        render(fp8, {"mma_widen": 1})
    with pytest.raises(ValueError, match="tuning mma_widen=1: must be true or false"):
        portable_kernel(fp8, 1, {"portable": "simt", "mma_widen": 1})
    # mma_prefetch: off by default, a bool, and only in the widened form
    assert not mma_prefetches(fp8) and mma_prefetches(fp8, {"mma_prefetch": True})
    assert not mma_prefetches(fp8, {"mma_prefetch": True, "mma_widen": False})
    assert not mma_prefetches(bf16, {"mma_prefetch": True}) and not mma_prefetches(big, {"mma_prefetch": True})
    assert code(bf16, {"mma_prefetch": True}) == code(bf16)
    assert code(fp8, {"mma_prefetch": True, "mma_widen": False}) == code(fp8, {"mma_widen": False})
    ahead = render(fp8, {"mma_prefetch": True})["paged_logits.cu"]
    assert "load_keys" not in ahead and ahead.count("if (it + 1 < kMmaIters) {") == 1
    assert ahead.count("__ldg(bt + j / kPageSize)") == render(fp8)["paged_logits.cu"].count("__ldg(bt + j / kPageSize)") + 1
    with pytest.raises(ValueError, match="tuning mma_prefetch='yes': must be true or false"):
        render(fp8, {"mma_prefetch": "yes"})
    with pytest.raises(ValueError, match="tuning mma_prefetch='yes': must be true or false"):
        portable_kernel(bf16, 1, {"portable": "simt", "mma_prefetch": "yes"})


def test_paged_logits_kernel_choice(shipped):
    """The kernel a call runs, as the launch picks it (small-work bound: batch * ceil(max/64)
    <= small_tiles * SMs, on sm_90 only)."""
    fp8, bf16, page1 = shipped["fp8_e4m3_page64"], shipped["bf16_page64"], shipped["fp8_e4m3_page1"]
    assert paged_logits_kernel(fp8, 1, 32, 8192, 132, 9) == "ws (small)"      # 4096 <= 40 * 132
    assert paged_logits_kernel(fp8, 2, 40, 8448, 132, 9) == "ws (small)"      # 5280 tiles: the bound
    assert paged_logits_kernel(fp8, 2, 40, 8449, 132, 9) == "ws"
    assert paged_logits_kernel(fp8, 1, 128, 8192, 132, 9) == "ws"
    assert paged_logits_kernel(fp8, 1, 32, 8192, 132, 9, {"small": {}}) == "ws"
    assert paged_logits_kernel(fp8, 1, 32, 8192, 148, 10) == "mma"           # sm_100: the portable default
    assert paged_logits_kernel(fp8, 1, 32, 8192, 148, 10, {"portable": "simt"}) == "simt"
    assert paged_logits_kernel(bf16, 1, 32, 8192, 132, 9) == "ws"
    assert paged_logits_kernel(page1, 1, 32, 8192, 132, 9) == "wgmma"
    # tuning portable "mma" (the default): the portable tensor-core kernel wherever the portable
    # path runs; "simt" the CUDA-core kernel
    mma = {"portable": "mma"}
    assert paged_logits_kernel(fp8, 1, 32, 8192, 148, 10, mma) == "mma"
    assert paged_logits_kernel(fp8, 1, 32, 8192, 132, 9, mma) == "ws (small)"
    assert paged_logits_kernel(page1, 2, 32, 8192, 132, 9, {"kernel": "simt", **mma}) == "mma"
    assert paged_logits_kernel(page1, 2, 32, 8192, 132, 9, {"kernel": "simt"}) == "mma"
    assert paged_logits_kernel(page1, 2, 32, 8192, 132, 9, {"kernel": "simt", "portable": "simt"}) == "simt"
    fp4 = shipped["fp4_e2m1_page64"]
    assert paged_logits_kernel(fp4, 1, 32, 8192, 148, 10, mma) == "simt"      # e2m1: not mma_applies
    assert small_work_max_len(fp8, 2, 40, 132) == 8448 and small_work_max_len(fp8, 1, 5281, 132) == 0
    assert small_work_max_len(bf16, 1, 40, 132) is None and small_work_max_len(fp8, 1, 40, 132, {"small": {}}) is None

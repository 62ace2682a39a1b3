// Where the time of one paged_logits_ws launch goes (built and run by benchmarks/timeline.py).
// Includes the rendered paged_logits.cu (and paged_logits_small.cu) of one spec, built with
// -DDSAGEN_TIMELINE so that every CTA records %globaltimer at the template's DSAGEN_MARK points:
//   0 CTA start, 1 schedule known, 2 first TMA issued (producer warp 0), 3 first keys arrived
//   (math warpgroup 0), 4 its first tile done, 5 its last tile done, 6 the last math
//   warpgroup's last tile done, 7 producer warp 0's last TMA issued; slot 8: the CTA's SM (%smid);
//   9 every warp's context_lens read back (after the schedule's first block barrier), 10 the
//   CTA's share of the units known; 11 producer warp 0 past its setmaxnreg, 12 its q TMA issued,
//   13 its first page known (the block-table entry of its first tile), 14 math warpgroup 0 past
//   its setmaxnreg, 15 its first q arrived; 16 producer warp 1's first page known, 17 its first
//   TMA issued, 18 the last producer warp's first TMA issued (the same warp as 17 with 2 math
//   warpgroups); slot 19: the CTA's units, hi - lo (not a time), by which the finish (mark 6,
//   else 5) is also printed; 20 producer warp 1's first expect_tx done, 21 its first key copy
//   issued (before its scales' copy; 17 is after both).
//   (Mark 4 is only recorded by the plain tile loop: not with tuning `mma_ahead`, the default of
//   the 3-warpgroup fp8 kernel at next_n 1 and of the 16-bit keys' kernel.)
// Usage: timeline B CTX NEXT_N [REPS] (env TIMELINE_SCHED=1: from precomputed schedules; marks 9
// and 10 are then not recorded). Random fp8-safe bytes, equal lengths CTX, a random
// block_table per input set, 8 rotated input sets (more than the L2); each timed launch follows a
// GPU spin so the launch is hidden, as in dsagen bench. Prints the CUDA-event time and, per mark,
// the min / median / max over CTAs of (mark - earliest CTA start) in us, medians over the runs;
// then whether an SM's finish time (its CTA's last math warpgroup done, over the run's median)
// repeats from run to run: the correlation over SMs between even and odd runs, the slowest and
// fastest SMs. The marks also record %clock64: each CTA's SM clock from its start to its finish
// (median over CTAs, then over runs). Last, the same launches back to back without a host sync
// between runs (as dsagen bench times them): their event time and the last run's SM clock.
#include "paged_logits.cu"
#ifdef DSAGEN_HAS_SMALL
#include "paged_logits_small.cu"
#endif
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = uint8_t(h) & 0x37;   // finite as e4m3 and as the bytes of an fp32 scale
  }
}
__global__ void fill_floats(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = 0.5f + float(h & 0xffff) / 65536.f;
  }
}
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

struct Set { uint8_t* q; uint8_t* kv; float* w; int* lens; int* bt; float* logits; int* sched; };

int main(int argc, char** argv) {
  namespace ns = DSAGEN_NS;
  if (argc < 4) { fprintf(stderr, "usage: timeline B CTX NEXT_N [REPS]\n"); return 2; }
  const int B = atoi(argv[1]), ctx = atoi(argv[2]), next_n = atoi(argv[3]);
  const int reps = argc > 4 ? atoi(argv[4]) : 30;
  if (B < 1 || ctx < 1 || next_n < 1 || reps < 2) {
    fprintf(stderr, "timeline: B, CTX, NEXT_N must be positive and REPS at least 2\n");
    return 2;
  }
  const int pages = (ctx + ns::kPageSize - 1) / ns::kPageSize;
  const int64_t num_pages = int64_t(B) * pages;
  const size_t q_bytes = size_t(B) * next_n * ns::kNumHeads * ns::kRowBytes;
  const size_t kv_bytes = size_t(num_pages) * ns::kPageStride;
  const int kSets = 8;
  const bool use_sched = getenv("TIMELINE_SCHED") != nullptr && atoi(getenv("TIMELINE_SCHED")) != 0;
  if (use_sched) printf("from a precomputed schedule (TIMELINE_SCHED)\n");
  std::mt19937 rng(1234);
  std::vector<Set> sets(kSets);
  for (int s = 0; s < kSets; ++s) {
    Set& x = sets[s];
    CHECK(cudaMalloc(&x.q, q_bytes));
    CHECK(cudaMalloc(&x.kv, kv_bytes));
    CHECK(cudaMalloc(&x.w, sizeof(float) * B * next_n * ns::kNumHeads));
    CHECK(cudaMalloc(&x.lens, sizeof(int) * B));
    CHECK(cudaMalloc(&x.bt, sizeof(int) * num_pages));
    CHECK(cudaMalloc(&x.logits, sizeof(float) * size_t(B) * next_n * ctx));
    fill_bytes<<<1024, 256>>>(x.q, q_bytes, 17 + s);
    fill_bytes<<<4096, 256>>>(x.kv, kv_bytes, 91 + s);
    fill_floats<<<64, 256>>>(x.w, size_t(B) * next_n * ns::kNumHeads, 7 + s);
    std::vector<int> lens(B, ctx), bt(num_pages);
    std::iota(bt.begin(), bt.end(), 0);
    std::shuffle(bt.begin(), bt.end(), rng);
    CHECK(cudaMemcpy(x.lens, lens.data(), sizeof(int) * B, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(x.bt, bt.data(), sizeof(int) * num_pages, cudaMemcpyHostToDevice));
    x.sched = nullptr;
    if (use_sched) {   // TIMELINE_SCHED=1: each set's schedule precomputed (paged_logits_schedule)
      int sms = 0;
      CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      CHECK(cudaMalloc(&x.sched, sizeof(int) * sms * ns::kSchedRow));
      CHECK(ns::launch_paged_logits_schedule(next_n, x.lens, false, x.bt, pages, ctx, B, x.sched, 0));
    }
  }
  CHECK(cudaDeviceSynchronize());
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto launch = [&](const Set& x) {
    CHECK(ns::launch_paged_logits(next_n, x.q, x.kv, num_pages, x.w, x.lens, false, x.bt, pages, x.logits, ctx, B,
                                  true, x.sched, st));
  };
  for (int i = 0; i < 3 * kSets; ++i) launch(sets[i % kSets]);
  CHECK(cudaStreamSynchronize(st));

  constexpr int kMarks = 22, kStride = ns::kTimelineSlots, kUnits = 19, kMaxCtas = 1024, kMaxSms = 1024;
  std::vector<unsigned long long> zero(kMaxCtas * kStride, 0ull), tl(kMaxCtas * kStride);
  static_assert(sizeof(ns::dsagen_timeline) == kMaxCtas * kStride * 8, "the template's timeline array changed");
  std::vector<double> sm_sum[2], sm_n[2];          // per SM: normalized finish, even / odd runs
  for (int h = 0; h < 2; ++h) { sm_sum[h].assign(kMaxSms, 0.0); sm_n[h].assign(kMaxSms, 0.0); }
  std::vector<float> times;
  std::vector<double> mhz;                         // per run: median over CTAs of the SM clock
  std::vector<unsigned long long> clk(kMaxCtas * kStride);
  std::vector<std::vector<double>> mn(kMarks), md(kMarks), mx(kMarks);
  std::map<unsigned long long, std::vector<double>> unit_md, unit_mx;   // by the CTA's units
  std::map<unsigned long long, size_t> unit_n;
  std::vector<double> res;
  const char* which = "main";
  // this run's marks and clocks of the main kernel, or of the small-work kernel
  auto read_marks = [&](bool small) {
#ifdef DSAGEN_HAS_SMALL
    if (small) {
      CHECK(cudaMemcpyFromSymbol(tl.data(), ns::small::dsagen_timeline, sizeof(ns::small::dsagen_timeline)));
      CHECK(cudaMemcpyFromSymbol(clk.data(), ns::small::dsagen_timeline_clk, sizeof(ns::small::dsagen_timeline_clk)));
      return;
    }
#endif
    (void)small;
    CHECK(cudaMemcpyFromSymbol(tl.data(), ns::dsagen_timeline, sizeof(ns::dsagen_timeline)));
    CHECK(cudaMemcpyFromSymbol(clk.data(), ns::dsagen_timeline_clk, sizeof(ns::dsagen_timeline_clk)));
  };
  // the median over CTAs of the SM clock (MHz) from a CTA's start (mark 0) to its finish (mark 6,
  // else 5): %clock64 cycles over %globaltimer ns (the timer ticks in steps of about 32 ns: CTAs
  // shorter than 10 us are skipped); -1 when none
  auto sm_clock_mhz = [&]() {
    std::vector<double> f;
    for (int c = 0; c < kMaxCtas && tl[c * kStride] != 0; ++c) {
      const int e = tl[c * kStride + 6] ? 6 : 5;
      const unsigned long long dt = tl[c * kStride + e] - tl[c * kStride];
      if (tl[c * kStride + e] > tl[c * kStride] && clk[c * kStride + e] > clk[c * kStride] && dt > 10000)
        f.push_back(double(clk[c * kStride + e] - clk[c * kStride]) / double(dt) * 1000.0);
    }
    if (f.empty()) return -1.0;
    std::sort(f.begin(), f.end());
    return f[f.size() / 2];
  };
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaMemcpyToSymbol(ns::dsagen_timeline, zero.data(), sizeof(ns::dsagen_timeline)));
#ifdef DSAGEN_HAS_SMALL
    CHECK(cudaMemcpyToSymbol(ns::small::dsagen_timeline, zero.data(), sizeof(ns::small::dsagen_timeline)));
#endif
    CHECK(cudaDeviceSynchronize());
    spin<<<1, 1, 0, st>>>(100000);   // ~50 us: the launch below is queued behind it
    CHECK(cudaEventRecord(e0, st));
    launch(sets[r % kSets]);
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaStreamSynchronize(st));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1000.f);
    read_marks(false);
#ifdef DSAGEN_HAS_SMALL
    if (tl[0] == 0) {
      read_marks(true);
      which = "small";
    }
#endif
    int ctas = 0;
    while (ctas < kMaxCtas && tl[ctas * kStride] != 0) ++ctas;
    if (ctas == 0) { fprintf(stderr, "no timeline recorded (not the ws kernel?)\n"); return 1; }
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < ctas; ++c) t0 = std::min(t0, tl[c * kStride]);
    if (r == 0) {
      std::vector<unsigned long long> s0;
      for (int c = 0; c < ctas; ++c) s0.push_back(tl[c * kStride]);
      std::sort(s0.begin(), s0.end());
      unsigned long long step = ~0ull;
      for (int c = 1; c < ctas; ++c) if (s0[c] != s0[c - 1]) step = std::min(step, s0[c] - s0[c - 1]);
      if (step == ~0ull)
        printf("kernel %s, %d CTAs; every CTA started at the same timer value\n", which, ctas);
      else
        printf("kernel %s, %d CTAs; smallest step between CTA starts %llu ns (timer resolution bound)\n", which,
               ctas, step);
    }
    for (int m = 0; m < kMarks; ++m) {
      if (m == 8 || m == kUnits) continue;         // slot 8: the SM id; kUnits: the CTA's units
      std::vector<double> v;
      for (int c = 0; c < ctas; ++c)
        if (tl[c * kStride + m] != 0) v.push_back(double(tl[c * kStride + m] - t0) / 1000.0);
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      mn[m].push_back(v.front());
      md[m].push_back(v[v.size() / 2]);
      mx[m].push_back(v.back());
    }
    if (const double f = sm_clock_mhz(); f > 0) mhz.push_back(f);
    // each SM's finish (mark 6, else 5) over this run's median finish
    std::vector<std::pair<int, double>> fin;
    std::map<unsigned long long, std::vector<double>> by_units;
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long f = tl[c * kStride + 6] ? tl[c * kStride + 6] : tl[c * kStride + 5];
      const int sm = int(tl[c * kStride + 8]);
      if (f != 0 && sm < kMaxSms) fin.push_back({sm, double(f - t0)});
      // the same finish (us) by the CTA's number of units (CTAs without units record no finish
      // and are left out; the CTA count printed is the last run's)
      if (f != 0) by_units[tl[c * kStride + kUnits]].push_back(double(f - t0) / 1000.0);
    }
    for (auto& [u, v] : by_units) {
      std::sort(v.begin(), v.end());
      unit_n[u] = v.size();
      unit_md[u].push_back(v[v.size() / 2]);
      unit_mx[u].push_back(v.back());
    }
    if (!fin.empty()) {
      std::vector<double> f;
      for (auto& p : fin) f.push_back(p.second);
      std::sort(f.begin(), f.end());
      const double mid = f[f.size() / 2];
      for (auto& p : fin) { sm_sum[r & 1][p.first] += p.second / mid; sm_n[r & 1][p.first] += 1; }
    }
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? -1.0 : v[v.size() / 2]; };
  std::vector<double> tv(times.begin(), times.end());
  const double bytes = double(B) * ctx * (ns::kPageStride / double(ns::kPageSize)) + double(q_bytes) +
                       4.0 * B * next_n * ns::kNumHeads + 4.0 * B * next_n * ctx;
  printf("B=%d ctx=%d next_n=%d: event time median %.2f us (min %.2f) over %d runs, %.1f MB, %.0f GB/s\n", B, ctx,
         next_n, med(tv), *std::min_element(tv.begin(), tv.end()), reps, bytes / 1e6, bytes / med(tv) / 1e3);
  if (!mhz.empty())
    printf("SM clock from CTA start to finish: median over CTAs %.0f MHz (median over runs; %.0f..%.0f)\n",
           med(mhz), *std::min_element(mhz.begin(), mhz.end()), *std::max_element(mhz.begin(), mhz.end()));
  const char* names[kMarks] = {"CTA start", "schedule known", "first TMA issued", "first keys arrived",
                               "first tile done", "WG0 last tile done", "last WG done", "last TMA issued",
                               "(SM id)", "context_lens back", "CTA's share known", "producer regs set",
                               "q TMA issued", "first page known", "math regs set", "q arrived",
                               "w1 first page known", "w1 first TMA", "last producer's TMA", "(units)",
                               "w1 expect_tx done", "w1 key TMA issued"};
  printf("%-20s %8s %8s %8s   (us after the earliest CTA start; medians over runs)\n", "mark", "min", "median",
         "max");
  for (int m : {0, 9, 10, 1, 11, 14, 12, 13, 2, 16, 20, 21, 17, 18, 15, 3, 4, 5, 6, 7})        // in the order they happen
    if (!md[m].empty()) printf("%-20s %8.2f %8.2f %8.2f\n", names[m], med(mn[m]), med(md[m]), med(mx[m]));
  for (auto& [u, v] : unit_md)
    printf("CTAs with %llu units: %zu (last run), last WG done median %.2f max %.2f us (medians over runs)\n",
           u, unit_n[u], med(v), med(unit_mx[u]));
  // does an SM's finish repeat? (correlation over SMs seen in both halves)
  std::vector<std::pair<double, int>> both;
  std::vector<double> a, b;
  for (int sm = 0; sm < kMaxSms; ++sm)
    if (sm_n[0][sm] > 0 && sm_n[1][sm] > 0) {
      a.push_back(sm_sum[0][sm] / sm_n[0][sm]);
      b.push_back(sm_sum[1][sm] / sm_n[1][sm]);
      both.push_back({(sm_sum[0][sm] + sm_sum[1][sm]) / (sm_n[0][sm] + sm_n[1][sm]), sm});
    }
  if (a.size() > 2) {
    const double ma = std::accumulate(a.begin(), a.end(), 0.0) / a.size();
    const double mb = std::accumulate(b.begin(), b.end(), 0.0) / b.size();
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      sab += (a[i] - ma) * (b[i] - mb); saa += (a[i] - ma) * (a[i] - ma); sbb += (b[i] - mb) * (b[i] - mb);
    }
    std::sort(both.begin(), both.end());
    printf("per-SM finish / run median: correlation even vs odd runs %.2f over %zu SMs; range %.3f..%.3f\n",
           sab / std::sqrt(saa * sbb + 1e-30), a.size(), both.front().first, both.back().first);
    printf("  fastest SMs:");
    for (size_t i = 0; i < 8 && i < both.size(); ++i) printf(" %d(%.3f)", both[i].second, both[i].first);
    printf("\n  slowest SMs:");
    for (size_t i = both.size() > 8 ? both.size() - 8 : 0; i < both.size(); ++i)
      printf(" %d(%.3f)", both[i].second, both[i].first);
    printf("\n");
  }
  // The same launches back to back, as dsagen bench times them (a spin before each, no host sync
  // in between, so the GPU stays busy): event times of every run, the SM clock of the last one.
  {
    std::vector<cudaEvent_t> b0(reps), b1(reps);
    for (int r = 0; r < reps; ++r) { CHECK(cudaEventCreate(&b0[r])); CHECK(cudaEventCreate(&b1[r])); }
    CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; ++r) {
      spin<<<1, 1, 0, st>>>(60000);   // ~30 us, as dsagen bench's shortest spin
      CHECK(cudaEventRecord(b0[r], st));
      launch(sets[r % kSets]);
      CHECK(cudaEventRecord(b1[r], st));
    }
    CHECK(cudaStreamSynchronize(st));
    std::vector<double> bt_us;
    for (int r = 0; r < reps; ++r) {
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, b0[r], b1[r]));
      bt_us.push_back(ms * 1000.0);
    }
    read_marks(std::string(which) == "small");
    printf("back to back (%d runs, no host sync): event time median %.2f us (min %.2f); SM clock of the last "
           "run %.0f MHz\n", reps, med(bt_us), *std::min_element(bt_us.begin(), bt_us.end()),
           sm_clock_mhz());
    for (int r = 0; r < reps; ++r) { CHECK(cudaEventDestroy(b0[r])); CHECK(cudaEventDestroy(b1[r])); }
  }
  return 0;
}

// Standalone correctness + timing harness of the sm_90a row-gather GEMM (not part of
// the library; needs no jax/XLA/FFI). Build on an H100:
//   nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
//     -DPIT_RG_EXPERIMENTS cuda/kernels/sm90/row_gather_bench.cu cuda/kernels/sm90/row_gather_gemm.cu -o rg_bench
// (-DPIT_RG_EXPERIMENTS compiles the experiment variants too; without it only "default" runs.)
// cuBLAS (the oracle: the same product on the already-compacted live rows) is loaded at
// run time with dlopen, so the binary links without libcublas (-lcublas is harmless).
// Flags: --small (correctness cases only, small shapes: for compute-sanitizer),
//        --no-time (skip timing), --only=v1,v2 (just these kernel variants, see kVariants),
//        --case=TEXT (just the cases whose name contains TEXT),
//        --time-epi=bias|dead|both (timing only: an epilogue bias and/or dead-row value),
//        --launches=N (timing: N back-to-back launches per event pair, the median per launch:
//        small kernels without the launch latency, as in a CUDA graph; default 1),
//        --graph (timing: those N launches captured once in a CUDA graph and the graph
//        replayed, so the host's launch cost is out of the time, as in XLA's command buffers),
//        --rounds=R (timing: the variants in turn R times, alternating their order; medians).
// Environment: PIT_BENCH_COARSE=1 fills A and B with {+-1/4, +-1/2, +-3/4, +-1} instead of
// uniform values (bench_util.cuh): the tensor pipe's data-dependent power, seen as time.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include "cuda/kernels/sm90/bench_util.cuh"
#include "cuda/kernels/sm90/row_gather_gemm.h"

using pit::DType;

struct Stats {
  double d2, r2;
  unsigned long long bad_live, bad_dead;  // non-finite live values; dead values not exactly 0
  unsigned int max_abs_bits;
};

template <typename T>
__global__ void CompareLive(const T* C, const int* rows, int R, int N, const float* Cref, Stats* st) {
  const int j = blockIdx.x;
  if (j >= R) return;
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  float mx = 0.f;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const float c = ToF(C[int64_t{rows[j]} * N + n]), r = Cref[int64_t{j} * N + n];
    if (!isfinite(c)) {
      ++bad;
      continue;
    }
    d2 += double(c - r) * (c - r);
    r2 += double(r) * r;
    mx = fmaxf(mx, fabsf(c - r));
  }
  atomicAdd(&st->d2, d2);
  atomicAdd(&st->r2, r2);
  if (bad) atomicAdd(&st->bad_live, bad);
  atomicMax(&st->max_abs_bits, __float_as_uint(mx));
}

template <typename T>
__global__ void CheckDead(const T* C, const int* rows, int R, int N, Stats* st) {
  const int j = blockIdx.x;
  if (j >= R) return;
  unsigned long long bad = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const float c = ToF(C[int64_t{rows[j]} * N + n]);
    if (!(c == 0.0f)) ++bad;  // NaN poison or garbage
  }
  if (bad) atomicAdd(&st->bad_dead, bad);
}

template <typename T>
__global__ void GatherRows(const T* A, const int* rows, int R, int K, T* out) {
  const int j = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x) out[int64_t{j} * K + k] = A[int64_t{rows[j]} * K + k];
}

// ------------------------------- cases -------------------------------
struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  int64_t M = 0, N = 0, K = 0;
  int batch = 1, a_batch = 1, b_batch = 1, idx_batch = 1;
  int tile_h = 1;
  bool trans_b = false;
  double frac = 0.3;  // live row-block fraction (per index entry i: frac * (idx_batch - i) / idx_batch)
  bool time = false;
  int parts = 1;  // > 1: C written as that many column parts (MatmulParams::c_parts), default variant only
};

static int g_fail = 0;
static int g_rounds = 1;  // --rounds=R
static uint64_t g_seed = 12345;

// Kernel variants (pit::sm90_rg_testing::LaunchVariant). diag != 0: timing only, except
// the bits of kRightDiag: 4 (no proxy fence), 128 (stamps), 256 (warm start) still
// compute the right results.
constexpr int kRightDiag = 4 | 128 | 256;
struct Variant {
  const char* name;
  int cluster, stages_a, stages_b, gather_warps;
  bool carve;
  int diag;
  bool epi_in_a;
  bool split_k = false;
  int bn = 256;  // columns per tile
  bool dual = false;  // both widths, chosen on the device (kDualWidth)
  bool narrow = false;  // 2-CTA clusters with the narrow 208-column tiles compiled in (kNarrowWidth)
};
static const Variant kVariants[] = {
    {"default", 0, 0, 0, 0, false, 0, false},  // LaunchRowGatherGemmSm90 itself (a3b5g0e.c2, or split4 when small)
    {"split4", 4, 3, 5, 0, false, 0, true, true},  // clusters of 4 splitting K (S from the live count)
    // aXbYgZ: X A-stages, Y B-stages, Z producer gather warps (0: consumer warps gather);
    // e: epilogue staged in the freed A stage; .cN: N-CTA cluster, B multicast.
    {"a4b4g2", 1, 4, 4, 2, false, 0, false},      {"a6b3g3", 1, 6, 3, 3, false, 0, false},
    {"a4b4g3", 1, 4, 4, 3, false, 0, false},      {"a4b4g0", 1, 4, 4, 0, false, 0, false},
    {"a3b4g0", 1, 3, 4, 0, false, 0, false},      {"a4b4g0e", 1, 4, 4, 0, false, 0, true},
    {"a3b5g0e", 1, 3, 5, 0, false, 0, true},      {"a4b4g0.c2", 2, 4, 4, 0, false, 0, false},
    {"a3b5g0e.c2", 2, 3, 5, 0, false, 0, true},   {"a3b5g0e.c4", 4, 3, 5, 0, false, 0, true},
    {"a4b4g0e.c4", 4, 4, 4, 0, false, 0, true},
    // diagnostics (timed only; wrong results): no zero-fill, no epilogue stores, no A / B loads
    {"c2.noZero", 2, 3, 5, 0, false, 16, true},   {"c2.noStore", 2, 3, 5, 0, false, 8, true},
    {"c2.noAB", 2, 3, 5, 0, false, 3, true},      {"c2.noA", 2, 3, 5, 0, false, 1, true},
    {"c2.empty", 2, 3, 5, 0, false, 32, true},    {"c1.empty", 1, 3, 5, 0, false, 32, true},
    {"c1.noZero", 1, 3, 5, 0, false, 16, true},
    // phase timestamps of each CTA (right results; printed after the variant's timing)
    {"c1.stamp", 1, 3, 5, 0, false, 128, true},
    // 128-column tiles (.n128): single CTAs, more B stages, split-K
    {"a3b5g0e.n128", 1, 3, 5, 0, false, 0, true, false, 128}, {"a3b8g0e.n128", 1, 3, 8, 0, false, 0, true, false, 128},
    {"a4b8g0e.n128", 1, 4, 8, 0, false, 0, true, false, 128}, {"split4.n128", 4, 3, 5, 0, false, 0, true, true, 128},
    {"split4b8.n128", 4, 3, 8, 0, false, 0, true, true, 128}, {"c1.stamp.n128", 1, 3, 5, 0, false, 128, true, false, 128},
    {"split4.stamp", 4, 3, 5, 0, false, 128, true, true}, {"split4.stamp.n128", 4, 3, 5, 0, false, 128, true, true, 128},
    {"a3b5g0e.c2.n128", 2, 3, 5, 0, false, 0, true, false, 128}, {"a3b8g0e.c2.n128", 2, 3, 8, 0, false, 0, true, false, 128},
    // deeper A pipelines for 128-column tiles (the consumer gather's lead is kStagesA - 1 k-blocks)
    {"a6b6g0e.n128", 1, 6, 6, 0, false, 0, true, false, 128}, {"a8b5g0e.n128", 1, 8, 5, 0, false, 0, true, false, 128},
    {"a5b7g0e.n128", 1, 5, 7, 0, false, 0, true, false, 128}, {"a5b4g0e", 1, 5, 4, 0, false, 0, true},
    {"c1.stamp.a6b6.n128", 1, 6, 6, 0, false, 128, true, false, 128},
    // without the per-stage fence.proxy.async (diag 4; right results, checked)
    {"a3b5g0e.nf", 1, 3, 5, 0, false, 4, true}, {"a3b5g0e.n128.nf", 1, 3, 5, 0, false, 4, true, false, 128},
    {"a6b6g0e.n128.nf", 1, 6, 6, 0, false, 4, true, false, 128}, {"c1.dual.nf", 1, 3, 5, 0, false, 4, true, false, 256, true},
    {"split4.nf", 4, 3, 5, 0, false, 4, true, true}, {"c1.stamp.n128.nf", 1, 3, 5, 0, false, 128 | 4, true, false, 128},
    // what paces a 128-column tile's k-loop: without A's copies, B's loads, or both (timing only)
    {"c1.stamp.n128.noA", 1, 3, 5, 0, false, 128 | 1, true, false, 128},
    {"c1.stamp.n128.noB", 1, 3, 5, 0, false, 128 | 2, true, false, 128},
    {"c1.stamp.n128.noAB", 1, 3, 5, 0, false, 128 | 3, true, false, 128},
    {"c1.stamp.noAB", 1, 3, 5, 0, false, 128 | 3, true},
    // the count and first list entries prefetched into L1 at entry (kDiagWarm), single CTAs
    {"c1.warm", 1, 3, 5, 0, false, 256, true}, {"c1.warm.stamp", 1, 3, 5, 0, false, 256 | 128, true},
    // both tile widths in one kernel, 128 columns when the live tiles fit one wave (what the
    // default takes for small single-CTA problems at batch 1)
    {"c1.dual", 1, 3, 5, 0, false, 0, true, false, 256, true},
    // the default's clusters without / with the narrow tiles (what the default takes for a
    // plain 16-bit product with N-major B at batch 1)
    {"c2.wide", 2, 3, 5, 0, false, 0, true}, {"c2.narrow", 2, 3, 5, 0, false, 0, true, false, 256, false, true},
};

// Phase timestamps (kDiagStamp, row_gather_gemm.cuh Stamp) of the last launch: per slot,
// min / median / max over the CTAs that wrote it, in us from the earliest CTA's entry.
static const char* kStampNames[24] = {
    "entry", "set-up done", "B: first TMA issued", "B: loads done", "WG0: A gathers issued", "WG0: first A stage",
    "WG0: first B stage", "WG0: tile 1 math done", "WG0: tile 1 stored (split: reduced)", "WG0: done", "(tiles)", "WG1: done",
    "zero warp 0 done", "zero warp 1 done", "zero warp 3 done", "(smid)", "CTA end", "B: first tile decoded",
    "split: partials stored", "split: cluster synced", "WG0: start (after setmaxnreg)", "WG0: first tile's rows read",
    "", ""};
void ClearStamps() {
#ifdef PIT_RG_EXPERIMENTS
  CK(pit::sm90_rg_testing::Stamps(nullptr, 0, true));
#endif
}
void PrintStamps(const char* what) {
#ifndef PIT_RG_EXPERIMENTS
  (void)what;
#else
  std::vector<unsigned long long> st(1024 * 24);
  CK(pit::sm90_rg_testing::Stamps(st.data(), 1024, false));
  unsigned long long t0 = ~0ull;
  int ctas = 0, busy = 0;
  for (int c = 0; c < 1024; ++c)
    if (st[c * 24 + 0]) t0 = std::min(t0, st[c * 24 + 0]), ++ctas, busy += st[c * 24 + 10] > 0;
  if (!ctas) return;
  printf("       stamps %s: %d CTAs, %d with tiles (us from the first entry; min / median / max)\n", what, ctas, busy);
  for (int slot = 0; slot < 22; ++slot) {
    if (slot == 10 || slot == 15) continue;
    for (int want_busy = 1; want_busy >= 0; --want_busy) {
      std::vector<double> v;
      for (int c = 0; c < 1024; ++c) {
        if (!st[c * 24 + 0] || (st[c * 24 + 10] > 0) != (want_busy == 1)) continue;
        if (st[c * 24 + slot]) v.push_back((st[c * 24 + slot] - t0) * 1e-3);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      printf("         %-24s %-7s %7.2f %7.2f %7.2f\n", kStampNames[slot], want_busy ? "busy" : "idle", v.front(),
             v[v.size() / 2], v.back());
    }
  }
#endif
}



static std::vector<std::string> g_only;  // --only=a,b,c: run just these variants
static std::string g_case;               // --case=TEXT: run just the cases whose name contains TEXT
static int g_time_epi = 0;               // --time-epi: 1 bias, 2 dead-row value, 3 both (timing only)
static int g_launches = 1;               // --launches=N: launches per timed event pair
static bool g_graph = false;             // --graph: time replays of a captured graph of the launches

// Median ms per launch of `launch` (returns true on success): 30 timed repeats of
// g_launches launches after 5 warm-up repeats; with g_graph, replays of one captured graph.
template <typename F>
double TimeLaunches(F launch, cudaStream_t stream, float* lo = nullptr, float* hi = nullptr) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaGraphExec_t exec = nullptr;
  bool ok = true;
  if (g_graph) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < g_launches && ok; ++l) ok = launch();
    CK(cudaStreamEndCapture(stream, &graph));
    if (ok) CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
  }
  std::vector<float> v;
  for (int it = 0; it < 35 && ok; ++it) {
    CK(cudaEventRecord(e0, stream));
    if (exec) {
      CK(cudaGraphLaunch(exec, stream));
    } else {
      for (int l = 0; l < g_launches && ok; ++l) ok = launch();
    }
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 5) v.push_back(ms / g_launches);
  }
  if (exec) CK(cudaGraphExecDestroy(exec));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  if (!ok || v.empty()) return -1;
  std::sort(v.begin(), v.end());
  if (lo) *lo = v.front();
  if (hi) *hi = v.back();
  return v[v.size() / 2];
}
bool Selected(const Variant& v) {
  if (g_only.empty()) return true;
  for (auto& n : g_only)
    if (n == v.name) return true;
  return false;
}

cudaError_t LaunchV(const Variant& v, const pit::MatmulParams& p, const pit::TileList& t, cudaStream_t s) {
  if (v.cluster == 0) return pit::LaunchRowGatherGemmSm90(p, t, s);
  return pit::sm90_rg_testing::LaunchVariant(p, t, s, v.cluster, v.stages_a, v.stages_b, v.gather_warps, v.carve,
                                             v.diag, v.epi_in_a, v.split_k, v.bn, v.dual, v.narrow);
}

struct TimingRow {
  std::string name;
  double live_pct, oracle_ms, flops;
  std::vector<std::pair<std::string, double>> ours;  // variant -> median ms
};
static std::vector<TimingRow> g_rows;

cudaDataType BlasType(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

template <typename T>
void RunCase(const Case& cs, cudaStream_t stream, bool do_time) {
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  const int es = sizeof(T);
  std::mt19937_64 rng(g_seed++);
  const int64_t tile_rows = (M + cs.tile_h - 1) / cs.tile_h;
  const int64_t cap = tile_rows;

  // Index: per index entry, live ids shuffled, then dead ids as -1 - id (shuffled).
  std::vector<int32_t> lists(cs.idx_batch * cap), counts(cs.idx_batch);
  for (int i = 0; i < cs.idx_batch; ++i) {
    const double f = cs.frac * double(cs.idx_batch - i) / cs.idx_batch;
    const int64_t L = std::min<int64_t>(tile_rows, std::llround(f * tile_rows));
    std::vector<int32_t> ids(tile_rows);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::shuffle(ids.begin() + L, ids.end(), rng);
    for (int64_t s = 0; s < tile_rows; ++s) lists[i * cap + s] = s < L ? ids[s] : -1 - ids[s];
    counts[i] = static_cast<int32_t>(L);
  }

  T *dA, *dB, *dC;
  int32_t *dLists, *dCounts;
  CK(cudaMalloc(&dA, cs.a_batch * M * K * es));
  CK(cudaMalloc(&dB, cs.b_batch * K * N * es));
  CK(cudaMalloc(&dC, cs.batch * M * N * es));
  CK(cudaMalloc(&dLists, lists.size() * 4));
  CK(cudaMalloc(&dCounts, counts.size() * 4));
  CK(cudaMemcpy(dLists, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dCounts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  FillRandom<<<1024, 256, 0, stream>>>(dA, cs.a_batch * M * K, g_seed++);
  FillRandom<<<1024, 256, 0, stream>>>(dB, cs.b_batch * K * N, g_seed++);
  CK(cudaGetLastError());

  pit::MatmulParams p;
  p.dtype = cs.dtype;
  p.allow_tf32 = true;
  p.M = M, p.N = N, p.K = K, p.batch = cs.batch;
  p.a = {dA, cs.a_batch, M, K};
  p.b = {dB, cs.b_batch, cs.trans_b ? N : K, cs.trans_b ? K : N};
  p.c = dC;
  p.c_batch = cs.batch;
  // Column parts: the kernel writes separate [batch, M, N / parts] buffers, which the check
  // copies back into C's columns (C poisoned first, so an unwritten element still shows).
  const int64_t part_n = N / cs.parts;
  std::vector<T*> dParts(cs.parts, nullptr);
  if (cs.parts > 1) {
    p.c = nullptr;
    p.c_parts = cs.parts;
    for (int i = 0; i < cs.parts; ++i) {
      CK(cudaMalloc(&dParts[i], cs.batch * M * part_n * es));
      p.c_part[i] = dParts[i];
    }
  }
  auto gather_parts = [&] {
    for (int i = 0; i < cs.parts && cs.parts > 1; ++i)
      CK(cudaMemcpy2DAsync(dC + i * part_n, N * es, dParts[i], part_n * es, part_n * es, cs.batch * M,
                           cudaMemcpyDeviceToDevice, stream));
  };
  p.trans_b = cs.trans_b;
  pit::TileList tl;
  tl.lists = dLists, tl.counts = dCounts, tl.batch = cs.idx_batch, tl.groups = 1, tl.capacity = cap;
  tl.tile_h = cs.tile_h, tl.tile_w = K;

  // ---- reference (once per case): live / dead rows per batch entry, fp32 product rows ----
  std::vector<int*> dLive(cs.batch), dDead(cs.batch);
  std::vector<int> nLive(cs.batch), nDead(cs.batch);
  std::vector<float*> dRef(cs.batch, nullptr);
  std::vector<int> live_rows_b0_vec;
  for (int b = 0; b < cs.batch; ++b) {
    const int ib = b / (cs.batch / cs.idx_batch);
    std::vector<int> live, dead;
    for (int64_t s = 0; s < cap; ++s) {
      const int32_t v = lists[ib * cap + s];
      const bool is_live = s < counts[ib];
      const int64_t id = is_live ? v : -1 - v;
      for (int w = 0; w < cs.tile_h; ++w) {
        const int64_t r = id * cs.tile_h + w;
        if (r < M) (is_live ? live : dead).push_back(static_cast<int>(r));
      }
    }
    if (b == 0) live_rows_b0_vec = live;
    nLive[b] = live.size(), nDead[b] = dead.size();
    CK(cudaMalloc(&dLive[b], std::max<size_t>(1, live.size()) * 4));
    CK(cudaMalloc(&dDead[b], std::max<size_t>(1, dead.size()) * 4));
    if (!live.empty()) CK(cudaMemcpy(dLive[b], live.data(), live.size() * 4, cudaMemcpyHostToDevice));
    if (!dead.empty()) CK(cudaMemcpy(dDead[b], dead.data(), dead.size() * 4, cudaMemcpyHostToDevice));
    if (!live.empty()) {
      CK(cudaMalloc(&dRef[b], live.size() * N * 4));
      const T* A_b = dA + (b / (cs.batch / cs.a_batch)) * M * K;
      const T* B_b = dB + (b / (cs.batch / cs.b_batch)) * K * N;
      dim3 grid((N + 31) / 32, (live.size() + 31) / 32);
      RefGatheredGemm<T><<<grid, 256, 0, stream>>>(A_b, B_b, dLive[b], 1, nullptr, (int)live.size(), (int)N, (int)K,
                                                   cs.trans_b, dRef[b]);
      CK(cudaGetLastError());
    }
  }
  CK(cudaStreamSynchronize(stream));
  const int64_t live_rows_b0 = nLive[0];
  Stats* dSt;
  CK(cudaMalloc(&dSt, sizeof(Stats)));

  // ---- correctness of every real variant: poison, run, compare every row ----
  const double tol = cs.dtype == DType::kBF16 ? 8e-3 : cs.dtype == DType::kF16 ? 2e-3 : 3e-3;
  std::vector<const Variant*> runnable;
  for (const Variant& v : kVariants) {
    if ((v.diag & ~kRightDiag) || !Selected(v)) continue;  // checked: right-results variants only
    if (cs.parts > 1 && v.cluster != 0) continue;  // column parts: LaunchRowGatherGemmSm90 only
    CK(cudaMemsetAsync(dC, 0xFF, cs.batch * M * N * es, stream));
    for (int i = 0; i < cs.parts && cs.parts > 1; ++i)
      CK(cudaMemsetAsync(dParts[i], 0xFF, cs.batch * M * part_n * es, stream));
    cudaError_t e = LaunchV(v, p, tl, stream);
    if (e == cudaErrorNotSupported && v.cluster != 0) continue;  // variant not compiled for this dtype
    if (e != cudaSuccess) {
      printf("[FAIL] %-30s %-8s launch returned %s\n", cs.name.c_str(), v.name, cudaGetErrorName(e));
      ++g_fail;
      continue;
    }
    gather_parts();
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemset(dSt, 0, sizeof(Stats)));
    for (int b = 0; b < cs.batch; ++b) {
      const T* C_b = dC + b * M * N;
      if (nLive[b]) CompareLive<T><<<nLive[b], 256, 0, stream>>>(C_b, dLive[b], nLive[b], (int)N, dRef[b], dSt);
      if (nDead[b]) CheckDead<T><<<nDead[b], 256, 0, stream>>>(C_b, dDead[b], nDead[b], (int)N, dSt);
      CK(cudaGetLastError());
    }
    Stats st;
    CK(cudaMemcpy(&st, dSt, sizeof(Stats), cudaMemcpyDeviceToHost));
    const double rel = st.r2 > 0 ? std::sqrt(st.d2 / st.r2) : std::sqrt(st.d2);
    float max_abs;
    memcpy(&max_abs, &st.max_abs_bits, 4);
    const bool ok = st.bad_live == 0 && st.bad_dead == 0 && rel <= tol;
    if (!ok) ++g_fail;
    runnable.push_back(&v);
    printf("[%s] %-30s %-8s M=%lld N=%lld K=%lld b=%d(a%d,b%d,i%d) th=%d tb=%d live_b0=%lld rel=%.2e maxabs=%.3g "
           "nonfinite_live=%llu nonzero_dead=%llu\n",
           ok ? " OK " : "FAIL", cs.name.c_str(), v.name, (long long)M, (long long)N, (long long)K, cs.batch,
           cs.a_batch, cs.b_batch, cs.idx_batch, cs.tile_h, (int)cs.trans_b, (long long)live_rows_b0, rel, max_abs,
           st.bad_live, st.bad_dead);
  }

  // ---- determinism: a second run of the default must give the same bits (16-bit types) ----
  if (es == 2 && cs.time && cs.parts == 1) {
    T* dC2;
    CK(cudaMalloc(&dC2, cs.batch * M * N * es));
    CK(cudaMemsetAsync(dC, 0xFF, cs.batch * M * N * es, stream));
    CK(pit::LaunchRowGatherGemmSm90(p, tl, stream));
    CK(cudaMemcpyAsync(dC2, dC, cs.batch * M * N * es, cudaMemcpyDeviceToDevice, stream));
    CK(cudaMemsetAsync(dC, 0xFF, cs.batch * M * N * es, stream));
    CK(pit::LaunchRowGatherGemmSm90(p, tl, stream));
    unsigned long long* dDiff;
    CK(cudaMalloc(&dDiff, 8));
    CK(cudaMemsetAsync(dDiff, 0, 8, stream));
    CountDiff<<<1024, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(dC), reinterpret_cast<uint16_t*>(dC2),
                                        cs.batch * M * N, dDiff);
    unsigned long long diff = 0;
    CK(cudaMemcpyAsync(&diff, dDiff, 8, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    printf("[%s] %-30s rerun bitwise diff = %llu\n", diff == 0 ? " OK " : "FAIL", cs.name.c_str(), diff);
    if (diff) ++g_fail;
    CK(cudaFree(dC2));
    CK(cudaFree(dDiff));
  }

  // ---- timing: each variant vs cuBLAS on the compacted live rows ----
  if (do_time && cs.time) {
    // The epilogue's cost (timing only: the check above ran without it).
    void* dEpi = nullptr;
    if (g_time_epi) {
      CK(cudaMalloc(&dEpi, N * es));
      CK(cudaMemsetAsync(dEpi, 0x3c, N * es, stream));
      if (g_time_epi & 1) p.epi.bias = dEpi;
      if (g_time_epi & 2) p.epi.dead = dEpi;
    }
    TimingRow row;
    row.name = cs.name + (g_time_epi == 1 ? " +bias" : g_time_epi == 2 ? " +dead" : g_time_epi == 3 ? " +bias+dead" : "");
    row.live_pct = 100.0 * live_rows_b0 / M;
    row.flops = 2.0 * live_rows_b0 * N * K;
    // --rounds=R: the variants timed in turn R times (each round's order reversed from the
    // last, so that none always runs first on a cooler GPU); the median of a variant's rounds.
    std::vector<std::vector<double>> by_variant(std::size(kVariants));
    for (int round = 0; round < g_rounds; ++round) {
      for (size_t i = 0; i < std::size(kVariants); ++i) {
        const size_t vi = round % 2 ? std::size(kVariants) - 1 - i : i;
        const Variant& v = kVariants[vi];
        bool ok_to_time = false;
        for (auto* r : runnable) ok_to_time |= r == &v;
        if (v.diag & ~kRightDiag) ok_to_time = cs.dtype == DType::kBF16 && !cs.trans_b;
        if (!ok_to_time || !Selected(v)) continue;
        float lo = 0, hi = 0;
        if (v.diag & 128) ClearStamps();
        const double med = TimeLaunches([&] { return LaunchV(v, p, tl, stream) == cudaSuccess; }, stream, &lo, &hi);
        if (med < 0) continue;
        printf("       %-30s %-16s median %.4f ms (min %.4f, max %.4f)%s\n", cs.name.c_str(), v.name, med, lo, hi,
               g_rounds > 1 ? (" round " + std::to_string(round)).c_str() : "");
        if (v.diag & 128) PrintStamps(cs.name.c_str());
        by_variant[vi].push_back(med);
      }
    }
    for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
      auto& m = by_variant[vi];
      if (m.empty()) continue;
      std::sort(m.begin(), m.end());
      row.ours.push_back({kVariants[vi].name, m[m.size() / 2]});
    }
    double oracle_ms = -1;
    const int R = static_cast<int>(live_rows_b0);
    if (blas::handle && cs.batch == 1 && R > 0) {
      T *dAc, *dCc;
      CK(cudaMalloc(&dAc, int64_t{R} * K * es));
      CK(cudaMalloc(&dCc, int64_t{R} * N * es));
      GatherRows<T><<<R, 256, 0, stream>>>(dA, dLive[0], R, (int)K, dAc);
      CK(cudaGetLastError());
      const float alpha = 1.f, beta = 0.f;
      const cudaDataType dt = BlasType(cs.dtype);
      const int compute = cs.dtype == DType::kF32 ? blas::kCompute32FFastTf32 : blas::kCompute32F;
      // Row-major C[R,N] = A[R,K] @ op(B): column-major C^T[N,R] = op(B)^T[N,K] @ A^T[K,R].
      auto call = [&] {
        return blas::gemm(blas::handle, cs.trans_b ? blas::kOpT : blas::kOpN, blas::kOpN, (int)N, R, (int)K, &alpha,
                          dB, dt, cs.trans_b ? (int)K : (int)N, dAc, dt, (int)K, &beta, dCc, dt, (int)N, compute,
                          blas::kAlgoDefault);
      };
      oracle_ms = TimeLaunches([&] { return call() == 0; }, stream);
      printf("       %-30s %-16s median %.4f ms\n", cs.name.c_str(), "cuBLAS oracle", oracle_ms);
      CK(cudaFree(dAc));
      CK(cudaFree(dCc));
    }
    row.oracle_ms = oracle_ms;
    g_rows.push_back(row);
    if (dEpi) CK(cudaFree(dEpi));
  }
  for (int b = 0; b < cs.batch; ++b) {
    CK(cudaFree(dLive[b]));
    CK(cudaFree(dDead[b]));
    if (dRef[b]) CK(cudaFree(dRef[b]));
  }
  CK(cudaFree(dA));
  CK(cudaFree(dB));
  CK(cudaFree(dC));
  for (T* d : dParts)
    if (d) CK(cudaFree(d));
  CK(cudaFree(dLists));
  CK(cudaFree(dCounts));
  CK(cudaFree(dSt));
}

void Run(const Case& cs, cudaStream_t s, bool do_time) {
  if (cs.dtype == DType::kBF16) RunCase<__nv_bfloat16>(cs, s, do_time);
  if (cs.dtype == DType::kF16) RunCase<__half>(cs, s, do_time);
  if (cs.dtype == DType::kF32) RunCase<float>(cs, s, do_time);
}

// Configurations the kernel must refuse (launching nothing).
void CheckNotSupported(cudaStream_t s) {
  void* buf;
  int32_t* idx;
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaMalloc(&idx, 4096));
  CK(cudaMemset(idx, 0, 4096));
  auto base = [&] {
    pit::MatmulParams p;
    p.dtype = DType::kBF16;
    p.M = 64, p.N = 64, p.K = 64;
    p.a = {buf, 1, 64, 64};
    p.b = {buf, 1, 64, 64};
    p.c = buf;
    return p;
  };
  pit::TileList tl;
  tl.lists = idx, tl.counts = idx, tl.capacity = 64;
  struct T {
    const char* what;
    pit::MatmulParams p;
    pit::TileList t;
  };
  std::vector<T> tests;
  {
    auto p = base();
    p.N = 60;
    tests.push_back({"N % 8 != 0", p, tl});
  }
  {
    auto p = base();  // parts of 32 columns: a 256-column tile would straddle them
    p.c_parts = 2, p.c_part[0] = p.c_part[1] = buf;
    tests.push_back({"c_parts, N / parts % 256 != 0", p, tl});
  }
  {
    auto p = base();
    p.N = 512, p.c_parts = 2, p.c_part[0] = buf, p.c_part[1] = nullptr;
    tests.push_back({"c_parts, a null part", p, tl});
  }
  {
    auto p = base();
    p.K = 36;
    tests.push_back({"K % 8 != 0", p, tl});
  }
  {
    auto p = base();
    auto t = tl;
    t.capacity = 32;
    tests.push_back({"capacity < row blocks", p, t});
  }
  {
    auto p = base();
    p.dtype = DType::kF32;
    p.allow_tf32 = true;
    tests.push_back({"f32 tf32 without trans_b", p, tl});
  }
  {
    auto p = base();
    p.dtype = DType::kF32;
    p.trans_b = true;
    tests.push_back({"f32 without allow_tf32", p, tl});
  }
  {
    auto p = base();
    p.batch = 2, p.c_batch = 1;
    p.a.batch = 2;
    tests.push_back({"batch reduction", p, tl});
  }
  {
    auto p = base();
    p.trans_a = true;
    tests.push_back({"trans_a", p, tl});
  }
  for (auto& t : tests) {
    const cudaError_t e = pit::LaunchRowGatherGemmSm90(t.p, t.t, s);
    const bool ok = e == cudaErrorNotSupported;
    if (!ok) ++g_fail;
    printf("[%s] NotSupported: %-28s -> %s\n", ok ? " OK " : "FAIL", t.what, cudaGetErrorName(e));
  }
  CK(cudaGetLastError());
  CK(cudaFree(buf));
  CK(cudaFree(idx));
}

int main(int argc, char** argv) {
  bool small = false, do_time = true;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--small")) small = true;
    if (!strcmp(argv[i], "--no-time")) do_time = false;
    if (!strncmp(argv[i], "--case=", 7)) g_case = argv[i] + 7;
    if (!strncmp(argv[i], "--time-epi=", 11)) {
      const std::string e = argv[i] + 11;
      g_time_epi = e == "bias" ? 1 : e == "dead" ? 2 : e == "both" ? 3 : 0;
    }
    if (!strncmp(argv[i], "--only=", 7)) SplitCommaList(argv[i] + 7, g_only);
    if (!strncmp(argv[i], "--launches=", 11)) g_launches = std::max(1, atoi(argv[i] + 11));
    if (!strcmp(argv[i], "--graph")) g_graph = true;
    if (!strncmp(argv[i], "--rounds=", 9)) g_rounds = std::max(1, atoi(argv[i] + 9));
  }
  bool have_blas = false;
  cudaStream_t s = StartBench(small, &have_blas);

  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  // Small / odd shapes (correctness).
  add({"odd bf16", DType::kBF16, 1000, 264, 136, 1, 1, 1, 1, 1, false, 0.4});
  add({"odd bf16 trans_b", DType::kBF16, 1000, 264, 136, 1, 1, 1, 1, 1, true, 0.4});
  add({"odd f16", DType::kF16, 1000, 264, 136, 1, 1, 1, 1, 1, false, 0.4});
  add({"odd f16 trans_b", DType::kF16, 1000, 264, 136, 1, 1, 1, 1, 1, true, 0.6});
  add({"tile_h=2 bf16", DType::kBF16, 999, 512, 256, 1, 1, 1, 1, 2, false, 0.5});
  add({"tile_h=3 bf16 trans_b", DType::kBF16, 1000, 320, 200, 1, 1, 1, 1, 3, true, 0.3});
  add({"batch2 B shared, idx per entry", DType::kBF16, 700, 384, 264, 2, 2, 1, 2, 1, false, 0.4});
  add({"batch4 a4 b2 idx1 f16 trans_b", DType::kF16, 300, 136, 72, 4, 4, 2, 1, 1, true, 0.5});
  add({"batch2 a1 b2 idx2 th2", DType::kBF16, 513, 264, 128, 2, 1, 2, 2, 2, false, 0.7});
  add({"tf32 trans_b", DType::kF32, 2048, 512, 520, 1, 1, 1, 1, 1, true, 0.25});
  add({"tf32 batch2 th2", DType::kF32, 300, 136, 72, 2, 2, 2, 2, 2, true, 0.5});
  add({"all dead", DType::kBF16, 512, 256, 64, 1, 1, 1, 1, 1, false, 0.0});
  add({"all live", DType::kBF16, 384, 512, 128, 1, 1, 1, 1, 1, false, 1.0});
  add({"one row", DType::kBF16, 1, 8, 8, 1, 1, 1, 1, 1, false, 1.0});
  add({"K=8 N=8", DType::kF16, 129, 8, 8, 1, 1, 1, 1, 1, true, 0.5});
  // split-K paths of the default launcher (batch 1, few tiles, K >= 32 k-blocks): S = 4, 2
  // and 1 by live tiles; k-blocks not a multiple of S
  add({"split4 bf16", DType::kBF16, 4096, 768, 3072, 1, 1, 1, 1, 1, false, 0.27});
  add({"split4 odd bf16", DType::kBF16, 1000, 264, 2056, 1, 1, 1, 1, 1, false, 0.4});
  add({"split2 f16 trans_b", DType::kF16, 4096, 1536, 2048, 1, 1, 1, 1, 1, true, 0.27});
  add({"split1 bf16", DType::kBF16, 4096, 2048, 2056, 1, 1, 1, 1, 1, false, 0.27});
  add({"split4 tf32 odd", DType::kF32, 1500, 264, 1000, 1, 1, 1, 1, 1, true, 0.3});
  // Column parts (q, k, v apart): odd M and K, trans_b, tile_h 2 with batches, all dead,
  // the BERT qkv shape (which would take split-K's 4-CTA walk without parts: not here).
  add({"parts3 bf16", DType::kBF16, 1000, 768, 264, 1, 1, 1, 1, 1, false, 0.4, false, 3});
  add({"parts3 f16 trans_b", DType::kF16, 777, 768, 136, 1, 1, 1, 1, 1, true, 0.6, false, 3});
  add({"parts2 batch2 th2", DType::kBF16, 513, 512, 128, 2, 2, 1, 2, 2, false, 0.5, false, 2});
  add({"parts4 all dead", DType::kBF16, 300, 1024, 64, 1, 1, 1, 1, 1, false, 0.0, false, 4});
  add({"parts3 qkv K3072", DType::kBF16, 4096, 2304, 3072, 1, 1, 1, 1, 1, false, 0.27, false, 3});
  // The clustered kernel's narrow tiles (static tiles > 4 an SM, few live row tiles): N not
  // a multiple of 208 or 256, a last row tile partly live, one live row tile, and more live
  // rows than the narrow tiles pay for (the wide ones then).
  add({"narrow bf16", DType::kBF16, 16384, 2056, 264, 1, 1, 1, 1, 1, false, 0.06});
  add({"narrow f16 K520", DType::kF16, 9000, 4096, 520, 1, 1, 1, 1, 1, false, 0.1});
  add({"narrow one tile", DType::kBF16, 16384, 4096, 136, 1, 1, 1, 1, 1, false, 0.004});
  add({"narrow th2", DType::kBF16, 16383, 1240, 200, 1, 1, 1, 1, 2, false, 0.08});
  add({"narrow not taken", DType::kBF16, 16384, 2048, 128, 1, 1, 1, 1, 1, false, 0.5});
  if (!small) {
    // The target shapes: M=16384 rows, K=N=4096, at 10 / 30 / 50 % live rows.
    auto add_targets = [&](const char* what, DType dt, bool trans_b) {
      for (double f : {0.1, 0.3, 0.5}) {
        char name[64];
        snprintf(name, sizeof name, "%s %d%%", what, int(f * 100 + 0.5));
        add({name, dt, 16384, 4096, 4096, 1, 1, 1, 1, 1, trans_b, f, true});
      }
    };
    add_targets("bf16 fwd", DType::kBF16, false);
    add_targets("f16 fwd", DType::kF16, false);
    add_targets("bf16 trans_b", DType::kBF16, true);
    add({"tf32 trans_b 30%", DType::kF32, 16384, 4096, 4096, 1, 1, 1, 1, 1, true, 0.3, true});
    // Live counts whose rounds of tiles the narrow tiles fill better (20 %) or not (15 %).
    add({"bf16 fwd 20%", DType::kBF16, 16384, 4096, 4096, 1, 1, 1, 1, 1, false, 0.2, true});
    add({"bf16 fwd 15%", DType::kBF16, 16384, 4096, 4096, 1, 1, 1, 1, 1, false, 0.15, true});
    add({"bf16 fwd 100%", DType::kBF16, 16384, 4096, 4096, 1, 1, 1, 1, 1, false, 1.0, true});
    // Small problems (split-K): BERT-base linears at batch 32 x 128 with 27 % valid tokens
    // (N x K: qkv, attn_out, ffn_in, ffn_out; trans_b: their dx).
    for (auto nk : {std::pair<int, int>{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}})
      for (bool tb : {false, true}) {
        char name[64];
        snprintf(name, sizeof name, "bert %dx%d%s", nk.first, nk.second, tb ? " tb" : "");
        add({name, DType::kBF16, 4096, nk.first, nk.second, 1, 1, 1, 1, 1, tb, 0.27, true});
      }
    add({"bert 2304x768 parts3", DType::kBF16, 4096, 2304, 768, 1, 1, 1, 1, 1, false, 0.27, true, 3});
    // Fixed cost against reduction length at BERT batch 32's live rows (27 % of 4096).
    for (int n : {768, 2304})
      for (int k : {64, 192, 384, 768, 1536, 3072}) {
        char name[64];
        snprintf(name, sizeof name, "sweep N%d K%d", n, k);
        add({name, DType::kBF16, 4096, n, k, 1, 1, 1, 1, 1, false, 0.27, true});
      }
    // The same products at full density (4096 rows: the single-CTA form's static bound).
    for (auto nk : {std::pair<int, int>{3072, 768}, {2304, 768}, {768, 768}, {768, 1536}, {768, 3072}}) {
      char name[64];
      snprintf(name, sizeof name, "sweep full N%d K%d", nk.first, nk.second);
      add({name, DType::kBF16, 4096, nk.first, nk.second, 1, 1, 1, 1, 1, false, 1.0, true});
    }
  }
  CheckNotSupported(s);
  for (auto& c : cases)
    if (g_case.empty() || c.name.find(g_case) != std::string::npos) Run(c, s, do_time);

  if (!g_rows.empty()) {
    printf("\n%-20s %-16s %6s %9s %9s %6s %8s\n", "case", "variant", "live%", "ours ms", "oracle", "ratio", "TFLOP/s");
    for (auto& r : g_rows)
      for (auto& v : r.ours)
        printf("%-20s %-16s %6.1f %9.4f %9.4f %6.3f %8.1f\n", r.name.c_str(), v.first.c_str(), r.live_pct, v.second,
               r.oracle_ms, r.oracle_ms > 0 ? v.second / r.oracle_ms : -1.0, r.flops / v.second * 1e-9);
  }
  printf("\n%s: %d failure(s)\n", g_fail ? "FAILED" : "PASSED", g_fail);
  return g_fail ? 1 : 0;
}

// Standalone correctness + timing harness of the sm_90a MoE grouped GEMM (not part of the
// library; needs no jax/XLA/FFI). Build (here or on the H100):
//   nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
//     -DPIT_GG_EXPERIMENTS cuda/kernels/sm90/grouped_bench.cu cuda/kernels/sm90/grouped_gemm.cu -o gg_bench
// (-DPIT_GG_EXPERIMENTS compiles the 2-CTA cluster variants; without it they report NotSupported.)
// With the generic kernels as a comparison ("generic"), add -DPIT_GG_WITH_GENERIC and an object
// of cuda/kernels/grouped_gemm.cu built with -DLaunchGroupedGemmSm90=GenericOnlyGemmSm90
// -DLaunchGroupedWgradSm90=GenericOnlyWgradSm90 (so it runs its own kernels only).
// cuBLAS (the oracle: one dense product of the same token count) is loaded at run time
// with dlopen. Flags: --small (correctness cases only, small shapes: for compute-sanitizer),
// --no-time (skip timing), --case=TEXT (just the cases whose name contains TEXT), --only=v1,v2 (just these
// variants, see kVariants; for the weight gradient: auto, v2, v3, v3.s1, v3.s2, v3.s4, v3.s8, v3.r56, v3.r96, v3.t64,
// see RunWgrad).
// v3.stamp (phase timestamps of the weight gradient's CTAs) also needs -DPIT_RG_EXPERIMENTS.
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
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include "cuda/kernels/sm90/bench_util.cuh"
#include "cuda/kernels/sm90/grouped_gemm.h"

#ifdef PIT_GG_WITH_GENERIC
// The generic kernels (cuda/kernels/grouped_gemm.cu) for comparison, built with their calls
// of the sm90 fast paths renamed to these stubs (see the build line above).
#include "cuda/kernels/grouped_gemm.h"
namespace pit {
cudaError_t GenericOnlyGemmSm90(const GroupedMatmulParams&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t GenericOnlyWgradSm90(const GroupedWgradParams&, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace pit
#endif

namespace pit {
namespace sm90_grouped_testing {
// grouped_gemm.cu (bench only): the weight gradient's version 2 / 3 / 0 (auto) with split 0
// (auto) or 1..8, without the size gate.
cudaError_t LaunchWgradVariant(const GroupedWgradParams& p, cudaStream_t stream, int version, int split);
cudaError_t WgradStamps(unsigned long long* host, int ctas, bool clear);
}  // namespace sm90_grouped_testing
}  // namespace pit

using pit::DType;

struct Stats {
  double d2, r2;
  unsigned long long bad_live, bad_dropped;  // non-finite computed values; dropped values not exactly 0
};

template <typename T>
__global__ void CompareRows(const T* y, const int* slots, int N, const float* ref, Stats* st) {
  const int j = blockIdx.x, a = slots[j];
  if (a < 0) return;
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const float c = ToF(y[int64_t{a} * N + n]), r = ref[int64_t{j} * N + n];
    if (!isfinite(c)) {
      ++bad;
      continue;
    }
    d2 += double(c - r) * (c - r);
    r2 += double(r) * r;
  }
  atomicAdd(&st->d2, d2);
  atomicAdd(&st->r2, r2);
  if (bad) atomicAdd(&st->bad_live, bad);
}

template <typename T>
__global__ void CheckDropped(const T* y, const int* rows, int N, Stats* st) {
  const int a = rows[blockIdx.x];
  unsigned long long bad = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x)
    if (!(ToF(y[int64_t{a} * N + n]) == 0.0f)) ++bad;  // NaN poison or garbage
  if (bad) atomicAdd(&st->bad_dropped, bad);
}

// ------------------------------- cases -------------------------------
enum Routing { kUniform, kSkew, kOneExpert, kAllDropped, kSomeEmpty, kZipf };

struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  int64_t T = 0, k = 1, D = 0, F = 0, E = 1;
  bool row_div_k = true;  // src holds tokens (row_div = k), else assignments (row_div = 1)
  bool trans_w = false;
  int batch = 1, src_batch = 1, w_batch = 1, idx_batch = 1;
  Routing routing = kUniform;
  double drop = 0.0;  // fraction of assignments with an out-of-range expert id
  bool time = false;
  bool weight_bound = false;  // report GB/s of weight reads
  bool wgrad = false;         // the weight gradient (LaunchGroupedWgradSm90) instead
  int dw_batch = 1, dy_batch = 1;
  int64_t listed = -1;  // >= 0: exactly this many assignments (at random) in group 0, the rest dropped
  bool packed = false;  // with listed: group 0 lists rows 0 .. listed-1 in order (GroupedWgradParams::packed)
};

static int g_fail = 0;
static uint64_t g_seed = 777;
static std::string g_case;
static double g_copy_gbs = 0;

struct Variant {
  const char* name;
  int cluster;  // 0: LaunchGroupedGemmSm90 (cluster from the shapes)
  int band, diag;  // band: see LaunchVariant; diag: kDiagNoStore (timed only) or kDiagLag (checked only)
};
using pit::sm90_grouped::kDiagLag;
using pit::sm90_grouped::kDiagNoStore;
using pit::sm90_grouped::kDiagStampFwd;
void PrintFwdStamps(const char* what);  // below
// auto = the launcher's default (c1.b8). cN: N-CTA cluster; .bN: bands of N items (.rf: one
// band per expert, row tiles fastest); .noStore: no epilogue stores (wrong results);
// .lag: warps 1-3 of warpgroup 1 sleep before every tile they skip, so warp 0 runs ahead
// (once a hang: the B stages were released per warpgroup).
static const Variant kVariants[] = {{"auto", 0, 0, 0},      {"c1", 1, 0, 0},          {"c2", 2, 0, 0},
                                    {"c2.b2", 2, 2, 0},     {"c2.b4", 2, 4, 0},       {"c2.b8", 2, 8, 0},
                                    {"c2.rf", 2, 1 << 20, 0}, {"c1.b4", 1, 4, 0},     {"c1.b16", 1, 16, 0},
                                    {"c2.noStore", 2, 0, kDiagNoStore}, {"c1.b8.noStore", 1, 8, kDiagNoStore},
                                    {"c1.b8.lag", 1, 8, kDiagLag}, {"c1.b8.stamp", 1, 8, kDiagStampFwd},
                                    {"generic", -1, 0, 0}};
static std::vector<std::string> g_only;  // --only=a,b: just these variants
bool Selected(const Variant& v) {
  if (g_only.empty()) return true;
  for (auto& n : g_only)
    if (n == v.name) return true;
  return false;
}

cudaError_t LaunchV(const Variant& v, const pit::GroupedMatmulParams& p, cudaStream_t s) {
  if (v.cluster == 0) return pit::LaunchGroupedGemmSm90(p, s);
#ifdef PIT_GG_WITH_GENERIC
  if (v.cluster == -1) return pit::LaunchGroupedMatmul(p, s);
#else
  if (v.cluster == -1) return cudaErrorNotSupported;
#endif
  return pit::sm90_grouped_testing::LaunchVariant(p, s, v.cluster, v.band, v.diag);
}

struct TimingRow {
  std::string name;
  double oracle_ms, flops, weight_bytes;
  bool weight_bound;
  std::vector<std::pair<std::string, double>> ours;
};
static std::vector<TimingRow> g_rows;

float MedianMs(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

cudaDataType BlasType(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// Host routing index of one index entry: lists [E+1, A] (each group shuffled, -1 past the
// count), counts [E+1].
void MakeIndex(const Case& cs, int entry, std::mt19937_64& rng, int32_t* lists, int32_t* counts) {
  const int64_t A = cs.T * cs.k, E = cs.E;
  std::vector<std::vector<int32_t>> groups(E + 1);
  std::vector<double> cdf(E);
  double acc = 0;
  for (int e = 0; e < E; ++e) {
    double w = cs.routing == kSkew ? 1.0 / (e + 1) : 1.0;
    // Zipf s = 1.2 over ranks permuted by e -> (37 e + 11) mod E (a permutation when E is coprime to 37).
    if (cs.routing == kZipf) w = 1.0 / std::pow(double((e * 37 + 11) % E) + 1.0, 1.2);
    if (cs.routing == kSomeEmpty && (e % 3 == 1 || e == E - 1)) w = 0;
    acc += w;
    cdf[e] = acc;
  }
  std::uniform_real_distribution<double> u01(0, 1);
  if (cs.listed >= 0) {  // an "M-axis" gradient: `listed` random assignments in group 0, the rest dropped
    std::vector<int32_t> all(A);
    std::iota(all.begin(), all.end(), 0);
    if (!cs.packed) std::shuffle(all.begin(), all.end(), rng);
    const int64_t n = std::min<int64_t>(cs.listed, A);
    for (int64_t s = 0; s < A; ++s) groups[s < n ? 0 : E].push_back(all[s]);
  }
  for (int64_t t = 0; t < (cs.listed >= 0 ? 0 : cs.T); ++t) {
    std::vector<int> chosen;
    for (int64_t j = 0; j < cs.k; ++j) {
      int e;
      if (cs.routing == kAllDropped || u01(rng) < cs.drop) {
        e = static_cast<int>(E);
      } else if (cs.routing == kOneExpert) {
        e = static_cast<int>((E - 1 + entry) % E);
      } else {
        // distinct experts per token where possible (top-k)
        for (int tries = 0;; ++tries) {
          const double x = u01(rng) * acc;
          e = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin());
          if (e >= E) e = static_cast<int>(E - 1);
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() || tries > 8) break;
        }
        chosen.push_back(e);
      }
      groups[e].push_back(static_cast<int32_t>(t * cs.k + j));
    }
  }
  for (int64_t e = 0; e <= E; ++e) {
    std::shuffle(groups[e].begin(), groups[e].end(), rng);
    counts[e] = static_cast<int32_t>(groups[e].size());
    for (int64_t s = 0; s < A; ++s) lists[e * A + s] = s < counts[e] ? groups[e][s] : -1;
  }
}

template <typename T>
void RunCase(const Case& cs, cudaStream_t stream, bool do_time) {
  const int64_t A = cs.T * cs.k, D = cs.D, F = cs.F, E = cs.E;
  const int64_t row_div = cs.row_div_k ? cs.k : 1, R = A / row_div;
  const int es = sizeof(T);
  std::mt19937_64 rng(g_seed++);

  std::vector<int32_t> lists(cs.idx_batch * (E + 1) * A), counts(cs.idx_batch * (E + 1));
  for (int i = 0; i < cs.idx_batch; ++i) MakeIndex(cs, i, rng, &lists[i * (E + 1) * A], &counts[i * (E + 1)]);

  T *dSrc, *dW, *dY;
  int32_t *dLists, *dCounts;
  CK(cudaMalloc(&dSrc, std::max<int64_t>(1, cs.src_batch * R * D) * es));
  CK(cudaMalloc(&dW, cs.w_batch * E * D * F * es));
  CK(cudaMalloc(&dY, std::max<int64_t>(1, cs.batch * A * F) * es));
  CK(cudaMalloc(&dLists, std::max<size_t>(1, lists.size()) * 4));
  CK(cudaMalloc(&dCounts, counts.size() * 4));
  if (!lists.empty()) CK(cudaMemcpy(dLists, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dCounts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  if (R * D) FillRandom<<<1024, 256, 0, stream>>>(dSrc, cs.src_batch * R * D, g_seed++);
  FillRandom<<<1024, 256, 0, stream>>>(dW, cs.w_batch * E * D * F, g_seed++);
  CK(cudaGetLastError());

  pit::GroupedMatmulParams p;
  p.dtype = cs.dtype;
  p.allow_tf32 = true;
  p.batch = cs.batch;
  p.E = E, p.A = A, p.D = D, p.F = F, p.row_div = row_div;
  p.src = {dSrc, cs.src_batch, R, D};
  p.w = dW;
  p.w_batch = cs.w_batch;
  p.trans_w = cs.trans_w;
  p.index.lists = dLists;
  p.index.counts = dCounts;
  p.index.batch = cs.idx_batch;
  p.y = dY;

  // ---- reference per batch entry: per-expert slots padded to 32, fp32 products ----
  std::vector<int*> dSlots(cs.batch), dDropped(cs.batch);
  std::vector<int> nSlots(cs.batch), nDropped(cs.batch);
  std::vector<float*> dRef(cs.batch, nullptr);
  int64_t expert_rows_b0 = 0;
  for (int b = 0; b < cs.batch; ++b) {
    const int ib = b / (cs.batch / cs.idx_batch);
    std::vector<int> slots, blk_e, dropped;
    int64_t covered = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int c = counts[ib * (E + 1) + e];
      for (int s = 0; s < c; ++s) slots.push_back(lists[(ib * (E + 1) + e) * A + s]);
      covered += c;
      while (slots.size() % 32) slots.push_back(-1);
      blk_e.resize(slots.size() / 32, static_cast<int>(e));
    }
    const int cE = counts[ib * (E + 1) + E];
    for (int s = 0; s < cE; ++s) dropped.push_back(lists[(ib * (E + 1) + E) * A + s]);
    if (covered + cE != A) {
      printf("[FAIL] %s: index does not cover every assignment\n", cs.name.c_str());
      ++g_fail;
    }
    if (b == 0) expert_rows_b0 = covered;
    nSlots[b] = slots.size(), nDropped[b] = dropped.size();
    CK(cudaMalloc(&dSlots[b], std::max<size_t>(1, slots.size()) * 4));
    CK(cudaMalloc(&dDropped[b], std::max<size_t>(1, dropped.size()) * 4));
    if (!slots.empty()) CK(cudaMemcpy(dSlots[b], slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    if (!dropped.empty()) CK(cudaMemcpy(dDropped[b], dropped.data(), dropped.size() * 4, cudaMemcpyHostToDevice));
    if (!slots.empty()) {
      int* dBlk;
      CK(cudaMalloc(&dBlk, blk_e.size() * 4));
      CK(cudaMemcpy(dBlk, blk_e.data(), blk_e.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&dRef[b], slots.size() * F * 4));
      const T* src_b = dSrc + (b / (cs.batch / cs.src_batch)) * R * D;
      const T* w_b = dW + (b / (cs.batch / cs.w_batch)) * E * D * F;
      dim3 grid((F + 31) / 32, slots.size() / 32);
      RefGatheredGemm<T><<<grid, 256, 0, stream>>>(src_b, w_b, dSlots[b], (int)row_div, dBlk, (int)slots.size(),
                                                   (int)F, (int)D, cs.trans_w, dRef[b]);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(stream));
      CK(cudaFree(dBlk));
    }
  }
  CK(cudaStreamSynchronize(stream));
  Stats* dSt;
  CK(cudaMalloc(&dSt, sizeof(Stats)));

  // ---- correctness of every variant: poison, run, compare every row ----
  const double tol = cs.dtype == DType::kBF16 ? 8e-3 : cs.dtype == DType::kF16 ? 2e-3 : 3e-3;
  for (const Variant& v : kVariants) {
    if ((v.diag & kDiagNoStore) || !Selected(v)) continue;
    if (A * F) CK(cudaMemsetAsync(dY, 0xFF, cs.batch * A * F * es, stream));
    cudaError_t e = LaunchV(v, p, stream);
    if (e == cudaErrorNotSupported && (v.cluster == 2 || v.cluster == -1)) continue;  // not compiled in
    if (e != cudaSuccess) {
      printf("[FAIL] %-34s %-5s launch returned %s\n", cs.name.c_str(), v.name, cudaGetErrorName(e));
      ++g_fail;
      continue;
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemset(dSt, 0, sizeof(Stats)));
    for (int b = 0; b < cs.batch; ++b) {
      const T* y_b = dY + b * A * F;
      if (nSlots[b]) CompareRows<T><<<nSlots[b], 256, 0, stream>>>(y_b, dSlots[b], (int)F, dRef[b], dSt);
      if (nDropped[b]) CheckDropped<T><<<nDropped[b], 256, 0, stream>>>(y_b, dDropped[b], (int)F, dSt);
      CK(cudaGetLastError());
    }
    Stats st;
    CK(cudaMemcpy(&st, dSt, sizeof(Stats), cudaMemcpyDeviceToHost));
    const double rel = st.r2 > 0 ? std::sqrt(st.d2 / st.r2) : std::sqrt(st.d2);
    const bool ok = st.bad_live == 0 && st.bad_dropped == 0 && rel <= tol;
    if (!ok) ++g_fail;
    printf("[%s] %-34s %-5s T=%lld k=%lld E=%lld D=%lld F=%lld rd=%lld tw=%d b=%d(s%d,w%d,i%d) rows_b0=%lld "
           "dropped_b0=%d rel=%.2e nonfinite=%llu nonzero_dropped=%llu\n",
           ok ? " OK " : "FAIL", cs.name.c_str(), v.name, (long long)cs.T, (long long)cs.k, (long long)E, (long long)D,
           (long long)F, (long long)row_div, (int)cs.trans_w, cs.batch, cs.src_batch, cs.w_batch, cs.idx_batch,
           (long long)expert_rows_b0, nDropped[0], rel, st.bad_live, st.bad_dropped);
  }

  // ---- determinism: a second run must give the same bits (16-bit types, timed cases) ----
  if (es == 2 && cs.time) {
    T* dY2;
    CK(cudaMalloc(&dY2, cs.batch * A * F * es));
    CK(cudaMemsetAsync(dY, 0xFF, cs.batch * A * F * es, stream));
    CK(pit::LaunchGroupedGemmSm90(p, stream));
    CK(cudaMemcpyAsync(dY2, dY, cs.batch * A * F * es, cudaMemcpyDeviceToDevice, stream));
    CK(cudaMemsetAsync(dY, 0xFF, cs.batch * A * F * es, stream));
    CK(pit::LaunchGroupedGemmSm90(p, stream));
    unsigned long long* dDiff;
    CK(cudaMalloc(&dDiff, 8));
    CK(cudaMemsetAsync(dDiff, 0, 8, stream));
    CountDiff<<<1024, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(dY), reinterpret_cast<uint16_t*>(dY2),
                                        cs.batch * A * F, dDiff);
    unsigned long long diff = 0;
    CK(cudaMemcpyAsync(&diff, dDiff, 8, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    printf("[%s] %-34s rerun bitwise diff = %llu\n", diff == 0 ? " OK " : "FAIL", cs.name.c_str(), diff);
    if (diff) ++g_fail;
    CK(cudaFree(dY2));
    CK(cudaFree(dDiff));
  }
  for (int b = 0; b < cs.batch; ++b)
    if (dRef[b]) CK(cudaFree(dRef[b]));

  // ---- timing: each variant; oracle = one dense cuBLAS product of all A rows ----
  if (do_time && cs.time) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    TimingRow row;
    row.name = cs.name;
    row.flops = 2.0 * expert_rows_b0 * D * F * cs.batch;
    row.weight_bytes = double(cs.w_batch) * E * D * F * es;
    row.weight_bound = cs.weight_bound;
    // Interleaved: each round times every variant (and cuBLAS) once, so all see the same
    // clock and temperature (timed back to back, whichever runs later runs hotter).
    std::vector<const Variant*> vs;
    for (const Variant& v : kVariants)
      if (Selected(v) && !(v.diag & kDiagLag)) vs.push_back(&v);
    T* dA2 = nullptr;
    const bool with_blas = blas::handle && !cs.weight_bound;
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType dt = BlasType(cs.dtype);
    const int compute = cs.dtype == DType::kF32 ? blas::kCompute32FFastTf32 : blas::kCompute32F;
    if (with_blas) {
      // y[A, F] = src_rows[A, D] @ op(W[0]) on a dense, already-gathered src.
      CK(cudaMalloc(&dA2, A * D * es));
      FillRandom<<<1024, 256, 0, stream>>>(dA2, A * D, g_seed++);
    }
    auto blas_call = [&] {
      return blas::gemm(blas::handle, cs.trans_w ? blas::kOpT : blas::kOpN, blas::kOpN, (int)F, (int)A, (int)D, &alpha,
                        dW, dt, cs.trans_w ? (int)D : (int)F, dA2, dt, (int)D, &beta, dY, dt, (int)F, compute,
                        blas::kAlgoDefault) == 0;
    };
    const int n = static_cast<int>(vs.size()) + (with_blas ? 1 : 0);
    std::vector<std::vector<float>> ms_v(n);
    std::vector<bool> ok(n, true);
    for (int it = 0; it < 40; ++it)
      for (int i = 0; i < n; ++i) {
        if (!ok[i]) continue;
        CK(cudaEventRecord(e0, stream));
        ok[i] = i < (int)vs.size() ? LaunchV(*vs[i], p, stream) == cudaSuccess : blas_call();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 5) ms_v[i].push_back(ms);
      }
    for (const Variant* v : vs)
      if (v->diag & kDiagStampFwd) {
        pit::sm90_grouped_testing::WgradStamps(nullptr, 0, true);
        LaunchV(*v, p, stream);
        CK(cudaStreamSynchronize(stream));
        PrintFwdStamps(cs.name.c_str());
      }
    double oracle_ms = -1;
    for (int i = 0; i < n; ++i) {
      if (!ok[i] || ms_v[i].empty()) continue;
      std::sort(ms_v[i].begin(), ms_v[i].end());
      const double med = MedianMs(ms_v[i]);
      const char* name = i < (int)vs.size() ? vs[i]->name : "cuBLAS";
      printf("       %-34s %-10s median %.4f ms (min %.4f, max %.4f)\n", cs.name.c_str(), name, med, ms_v[i].front(),
             ms_v[i].back());
      if (i < (int)vs.size())
        row.ours.push_back({name, med});
      else
        oracle_ms = med;
    }
    if (dA2) CK(cudaFree(dA2));
    row.oracle_ms = oracle_ms;
    g_rows.push_back(row);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
  }
  for (int b = 0; b < cs.batch; ++b) {
    CK(cudaFree(dSlots[b]));
    CK(cudaFree(dDropped[b]));
  }
  CK(cudaFree(dSrc));
  CK(cudaFree(dW));
  CK(cudaFree(dY));
  CK(cudaFree(dLists));
  CK(cudaFree(dCounts));
  CK(cudaFree(dSt));
}

// Reference weight gradient, one (dw entry c, expert e) per blockIdx.z: each thread owns
// column f of 8 consecutive rows d and sums over the group's tokens of the entries of c.
template <typename T>
__global__ void RefWgrad(const T* src, const T* dy, const int* lists, const int* counts, int A, int D, int F, int E,
                         int row_div, int per_c, int src_div, int dy_div, int idx_div, int64_t src_bs, int64_t dy_bs,
                         float* ref) {
  const int f = blockIdx.x * blockDim.x + threadIdx.x, d0 = blockIdx.y * 8;
  const int e = blockIdx.z % E, c = blockIdx.z / E;
  if (f >= F) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int b = c * per_c; b < (c + 1) * per_c; ++b) {
    const int ib = b / idx_div;
    const int n = counts[ib * (E + 1) + e];
    const int* list = lists + (int64_t(ib) * (E + 1) + e) * A;
    const T* s_b = src + (b / src_div) * src_bs;
    const T* y_b = dy + (b / dy_div) * dy_bs;
    for (int j = 0; j < n; ++j) {
      const int a = list[j];
      const float g = ToF(y_b[int64_t(a) * F + f]);
      for (int i = 0; i < 8; ++i)
        if (d0 + i < D) acc[i] += ToF(s_b[int64_t(a / row_div) * D + d0 + i]) * g;
    }
  }
  for (int i = 0; i < 8; ++i)
    if (d0 + i < D) ref[(int64_t(blockIdx.z) * D + d0 + i) * F + f] = acc[i];
}

template <typename T>
__global__ void CompareAll(const T* x, const float* ref, int64_t n, Stats* st) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float c = ToF(x[i]), r = ref[i];
    if (!isfinite(c)) {
      ++bad;
      continue;
    }
    d2 += double(c - r) * (c - r);
    r2 += double(r) * r;
  }
  atomicAdd(&st->d2, d2);
  atomicAdd(&st->r2, r2);
  if (bad) atomicAdd(&st->bad_live, bad);
}

// Timestamps of the last c1.b8.stamp launch of the forward (grouped_gemm.cuh, FwdStamp).
void PrintFwdStamps(const char* what) {
  constexpr int kSlots = 24;  // sm90_rg::kStampSlots
  std::vector<unsigned long long> st(1024 * kSlots);
  if (pit::sm90_grouped_testing::WgradStamps(st.data(), 1024, false) != cudaSuccess) return;
  unsigned long long t0 = ~0ull;
  std::vector<int> ctas;
  for (int c = 0; c < 1024; ++c)
    if (st[c * kSlots]) t0 = std::min(t0, st[c * kSlots]), ctas.push_back(c);
  if (ctas.empty()) return;
  auto us = [&](int c, int slot) { return (st[c * kSlots + slot] - t0) * 1e-3; };
  auto q = [](std::vector<double> v, double f) { std::sort(v.begin(), v.end()); return v[size_t(f * (v.size() - 1))]; };
  std::vector<double> entry, prefix, first_b, end, tiles, dur_first, dur_mid;
  double last = 0;
  for (int c : ctas) last = std::max(last, us(c, 23));
  double idle = 0;
  for (int c : ctas) {
    entry.push_back(us(c, 0)), prefix.push_back(us(c, 1)), first_b.push_back(us(c, 21)), end.push_back(us(c, 23));
    const int n = int(st[c * kSlots + 22]);
    tiles.push_back(n);
    if (n > 0) dur_first.push_back(us(c, 2) - us(c, 1));
    for (int i = 1; i < std::min(n, 19); ++i) dur_mid.push_back(us(c, 2 + i) - us(c, 1 + i));
    idle += last - us(c, 23) + us(c, 0);
  }
  printf("       fwd stamps %s: %zu CTAs, tiles %g / %g / %g; us from the first entry (min / p10 / median / p90 / max)\n",
         what, ctas.size(), q(tiles, 0), q(tiles, .5), q(tiles, 1));
  auto row = [&](const char* name, const std::vector<double>& v) {
    printf("         %-22s %7.2f %7.2f %7.2f %7.2f %7.2f\n", name, q(v, 0), q(v, .1), q(v, .5), q(v, .9), q(v, 1));
  };
  row("entry", entry), row("prefix built", prefix), row("first B landed", first_b);
  row("first tile (dur)", dur_first), row("later tiles (dur)", dur_mid), row("consumer done", end);
  printf("         SM time idle (before entry + after done) %.1f %%\n", 100 * idle / (last * ctas.size()));
}

// Phase timestamps of the last v3.stamp launch (grouped_wgrad.cuh): per slot, min / median
// / max over the CTAs that wrote it, in us from the earliest CTA's entry.
void PrintWgradStamps(const char* what) {
  static const char* kNames[20] = {"entry", "set-up done", "producer: stage 1 issued", "producer: done",
                                   "consumer: start", "", "", "consumer: loop done", "stored / partials stored",
                                   "", "(k-blocks)", "", "", "", "", "", "CTA end", "", "split: reduced",
                                   "split: cluster synced"};
  constexpr int kSlots = 24;  // sm90_rg::kStampSlots
  std::vector<unsigned long long> st(1024 * kSlots);
  if (pit::sm90_grouped_testing::WgradStamps(st.data(), 1024, false) != cudaSuccess) return;
  unsigned long long t0 = ~0ull;
  int ctas = 0;
  for (int c = 0; c < 1024; ++c)
    if (st[c * kSlots]) t0 = std::min(t0, st[c * kSlots]), ++ctas;
  if (!ctas) return;
  std::vector<double> kb;
  for (int c = 0; c < 1024; ++c)
    if (st[c * kSlots]) kb.push_back(double(st[c * kSlots + 10]));
  std::sort(kb.begin(), kb.end());
  printf("       stamps %s: %d CTAs, k-blocks per CTA %.0f / %.0f / %.0f (us from the first entry; min / median / max)\n",
         what, ctas, kb.front(), kb[kb.size() / 2], kb.back());
  for (int slot = 0; slot < 20; ++slot) {
    if (!kNames[slot][0] || slot == 10) continue;
    std::vector<double> v;
    for (int c = 0; c < 1024; ++c)
      if (st[c * kSlots] && st[c * kSlots + slot]) v.push_back((st[c * kSlots + slot] - t0) * 1e-3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    printf("         %-26s %7.2f %7.2f %7.2f\n", kNames[slot], v.front(), v[v.size() / 2], v.back());
  }
}

template <typename T>
void RunWgrad(const Case& cs, cudaStream_t stream, bool do_time) {
  const int64_t A = cs.T * cs.k, D = cs.D, F = cs.F, E = cs.E;
  const int64_t row_div = cs.row_div_k ? cs.k : 1, R = A / row_div;
  const int es = sizeof(T);
  std::mt19937_64 rng(g_seed++);
  std::vector<int32_t> lists(cs.idx_batch * (E + 1) * A), counts(cs.idx_batch * (E + 1));
  for (int i = 0; i < cs.idx_batch; ++i) MakeIndex(cs, i, rng, &lists[i * (E + 1) * A], &counts[i * (E + 1)]);
  T *dSrc, *dDy, *dDw;
  int32_t *dLists, *dCounts;
  float* dRef;
  const int64_t n_dw = cs.dw_batch * E * D * F;
  CK(cudaMalloc(&dSrc, std::max<int64_t>(1, cs.src_batch * R * D) * es));
  CK(cudaMalloc(&dDy, std::max<int64_t>(1, cs.dy_batch * A * F) * es));
  CK(cudaMalloc(&dDw, n_dw * es));
  CK(cudaMalloc(&dRef, n_dw * 4));
  CK(cudaMalloc(&dLists, std::max<size_t>(1, lists.size()) * 4));
  CK(cudaMalloc(&dCounts, counts.size() * 4));
  if (!lists.empty()) CK(cudaMemcpy(dLists, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dCounts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  if (R * D) FillRandom<<<1024, 256, 0, stream>>>(dSrc, cs.src_batch * R * D, g_seed++);
  if (A * F) FillRandom<<<1024, 256, 0, stream>>>(dDy, cs.dy_batch * A * F, g_seed++);
  if (cs.packed) {  // pit_sread_live's padding: rows listed .. round_up(listed, kPackedRowPad) are zeros
    const int64_t pad = std::min<int64_t>(A, (cs.listed + pit::kPackedRowPad - 1) / pit::kPackedRowPad *
                                                 pit::kPackedRowPad);
    for (int b = 0; b < cs.src_batch && pad > cs.listed; ++b)
      CK(cudaMemsetAsync(dSrc + (b * R + cs.listed) * D, 0, (pad - cs.listed) * D * es, stream));
    for (int b = 0; b < cs.dy_batch && pad > cs.listed; ++b)
      CK(cudaMemsetAsync(dDy + (b * A + cs.listed) * F, 0, (pad - cs.listed) * F * es, stream));
  }
  const int per_c = cs.batch / cs.dw_batch;
  {
    dim3 grid((F + 255) / 256, (D + 7) / 8, cs.dw_batch * E);
    RefWgrad<T><<<grid, 256, 0, stream>>>(dSrc, dDy, dLists, dCounts, (int)A, (int)D, (int)F, (int)E, (int)row_div,
                                          per_c, cs.batch / cs.src_batch, cs.batch / cs.dy_batch,
                                          cs.batch / cs.idx_batch, R * D, A * F, dRef);
    CK(cudaGetLastError());
  }
  pit::GroupedWgradParams p;
  p.dtype = cs.dtype;
  p.batch = cs.batch;
  p.E = E, p.A = A, p.D = D, p.F = F, p.row_div = row_div;
  p.src = {dSrc, cs.src_batch, R, D};
  p.dy = {dDy, cs.dy_batch, A, F};
  p.index.lists = dLists;
  p.index.counts = dCounts;
  p.index.batch = cs.idx_batch;
  p.dw = dDw;
  p.dw_batch = cs.dw_batch;
  p.packed = cs.packed;
  Stats* dSt;
  CK(cudaMalloc(&dSt, sizeof(Stats)));
  const double tol = cs.dtype == DType::kBF16 ? 8e-3 : 2e-3;
  auto launch_generic = [&]() -> cudaError_t {
#ifdef PIT_GG_WITH_GENERIC
    return pit::LaunchGroupedWgrad(p, stream);
#else
    return cudaErrorNotSupported;
#endif
  };
  // Variants: the launcher's choice, v2, v3 with a forced split; each checked twice (fresh
  // poison each time, the reruns compared bit for bit), then the generic kernel once.
  struct WV {
    const char* name;
    int version, split;
  };
  // v3.stamp: v3 (auto split) recording phase timestamps (needs -DPIT_RG_EXPERIMENTS too).
  static const WV kWV[] = {{"auto", 0, 0},  {"v2", 2, 0},    {"v3", 3, 0},    {"v3.s1", 3, 1},
                           {"v3.s2", 3, 2}, {"v3.s4", 3, 4}, {"v3.s8", 3, 8}, {"v3.stamp", 13, 0},
                           {"v3.stamp.noGather", 14, 0}, {"v3.stamp.noMath", 15, 0}, {"v3.r56", 16, 0},
                           {"v3.r96", 17, 0}, {"v3.t64", 18, 0}};
  std::vector<WV> wv;
  for (const WV& v : kWV) {
    const Variant sel{v.name, 0, 0, 0};
    if (Selected(sel)) wv.push_back(v);
  }
  T* dFirst;
  unsigned long long* dDiff;
  CK(cudaMalloc(&dFirst, n_dw * es));
  CK(cudaMalloc(&dDiff, sizeof(unsigned long long)));
  for (size_t vi = 0; vi <= wv.size(); ++vi) {
    const bool generic = vi == wv.size();
    if (!generic && (wv[vi].version == 14 || wv[vi].version == 15)) continue;  // timing diagnostics: wrong results
    for (int rep = 0; rep < (generic ? 1 : 2); ++rep) {
      CK(cudaMemsetAsync(dDw, 0xFF, n_dw * es, stream));
      cudaError_t e = generic ? launch_generic()
                              : pit::sm90_grouped_testing::LaunchWgradVariant(p, stream, wv[vi].version, wv[vi].split);
      if (generic && e == cudaErrorNotSupported) break;
      if (!generic && e == cudaErrorNotSupported && (wv[vi].version == 2 || wv[vi].version >= 13)) break;  // bench builds only
      if (e != cudaSuccess) {
        printf("[FAIL] %-34s %s launch returned %s\n", cs.name.c_str(), generic ? "generic" : wv[vi].name,
               cudaGetErrorName(e));
        ++g_fail;
        break;
      }
      CK(cudaStreamSynchronize(stream));
      CK(cudaMemset(dSt, 0, sizeof(Stats)));
      CompareAll<T><<<1024, 256, 0, stream>>>(dDw, dRef, n_dw, dSt);
      CK(cudaGetLastError());
      Stats st;
      CK(cudaMemcpy(&st, dSt, sizeof(Stats), cudaMemcpyDeviceToHost));
      unsigned long long diff = 0;
      if (rep == 0) {
        CK(cudaMemcpy(dFirst, dDw, n_dw * es, cudaMemcpyDeviceToDevice));
      } else {
        CK(cudaMemset(dDiff, 0, sizeof(unsigned long long)));
        CountDiff<<<1024, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(dDw), reinterpret_cast<uint16_t*>(dFirst),
                                            n_dw, dDiff);
        CK(cudaGetLastError());
        CK(cudaMemcpy(&diff, dDiff, sizeof(diff), cudaMemcpyDeviceToHost));
      }
      const double rel = st.r2 > 0 ? std::sqrt(st.d2 / st.r2) : std::sqrt(st.d2);
      const bool ok = st.bad_live == 0 && rel <= tol && diff == 0;
      if (!ok) ++g_fail;
      printf("[%s] %-34s %-7s T=%lld k=%lld E=%lld D=%lld F=%lld rd=%lld b=%d(s%d,dy%d,i%d,dw%d) rel=%.2e "
             "nonfinite=%llu%s\n",
             ok ? " OK " : "FAIL", cs.name.c_str(), generic ? "generic" : wv[vi].name, (long long)cs.T,
             (long long)cs.k, (long long)E, (long long)D, (long long)F, (long long)row_div, cs.batch, cs.src_batch,
             cs.dy_batch, cs.idx_batch, cs.dw_batch, rel, st.bad_live,
             rep == 1 ? (diff ? " RERUN DIFFERS" : " rerun bit-identical") : "");
    }
  }
  CK(cudaFree(dFirst));
  CK(cudaFree(dDiff));
  if (do_time && cs.time) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Oracles: dense products dw[D, F] = X[K, D]^T dY[K, F] (column-major: dw^T[F, D] =
    // dY^T[F, K] X[K, D]) with K = A (all rows: "dense") and, for one expert, K = its count
    // (the compacted rows: "compact").
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType dt = BlasType(cs.dtype);
    const int compact_k = E == 1 ? counts[0] : -1;
    auto blas_call = [&](int K) {
      return blas::gemm(blas::handle, blas::kOpN, blas::kOpT, (int)F, (int)D, K, &alpha, dDy, dt, (int)F, dSrc, dt,
                        (int)D, &beta, dDw, dt, (int)F, blas::kCompute32F, blas::kAlgoDefault) == 0;
    };
    const bool with_blas = blas::handle && row_div == 1 && cs.batch == 1;
    const int nv = static_cast<int>(wv.size());
    std::vector<std::vector<float>> times(nv + 3);  // variants, generic, cuBLAS dense, cuBLAS compact
    pit::sm90_grouped_testing::WgradStamps(nullptr, 0, true);
    for (int it = 0; it < 30; ++it)
      for (int i = 0; i < nv + 3; ++i) {
        if (i >= nv + 1 && !with_blas) continue;
        if (i == nv + 2 && compact_k <= 0) continue;
        CK(cudaEventRecord(e0, stream));
        const bool ok = i < nv        ? pit::sm90_grouped_testing::LaunchWgradVariant(p, stream, wv[i].version,
                                                                                      wv[i].split) == cudaSuccess
                        : i == nv     ? launch_generic() == cudaSuccess
                        : i == nv + 1 ? blas_call((int)A)
                                      : blas_call(compact_k);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ok && it >= 5) times[i].push_back(ms);
      }
    for (int i = 0; i < nv; ++i)
      if (wv[i].version >= 13 && wv[i].version <= 15 && !times[i].empty()) {
        // each stamped variant's last launch overwrote the stamps: time it alone again
        pit::sm90_grouped_testing::WgradStamps(nullptr, 0, true);
        pit::sm90_grouped_testing::LaunchWgradVariant(p, stream, wv[i].version, wv[i].split);
        CK(cudaStreamSynchronize(stream));
        PrintWgradStamps((cs.name + " " + wv[i].name).c_str());
      }
    TimingRow row;
    row.name = cs.name;
    row.flops = 2.0 * (E == 1 ? counts[0] : A) * D * F;  // the listed tokens (none dropped in the E > 1 timed cases)
    row.weight_bytes = double(n_dw) * es;
    row.weight_bound = false;
    row.oracle_ms = times[nv + 1].empty() ? -1 : MedianMs(times[nv + 1]);
    for (int i = 0; i < nv; ++i)
      if (!times[i].empty()) row.ours.push_back({wv[i].name, MedianMs(times[i])});
    if (!times[nv].empty()) row.ours.push_back({"generic", MedianMs(times[nv])});
    if (!times[nv + 2].empty()) row.ours.push_back({"blasCompact", MedianMs(times[nv + 2])});
    g_rows.push_back(row);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
  }
  CK(cudaFree(dSrc));
  CK(cudaFree(dDy));
  CK(cudaFree(dDw));
  CK(cudaFree(dRef));
  CK(cudaFree(dLists));
  CK(cudaFree(dCounts));
  CK(cudaFree(dSt));
}

void Run(const Case& cs, cudaStream_t s, bool do_time) {
  if (cs.wgrad) {
    if (cs.dtype == DType::kBF16) RunWgrad<__nv_bfloat16>(cs, s, do_time);
    if (cs.dtype == DType::kF16) RunWgrad<__half>(cs, s, do_time);
    return;
  }
  if (cs.dtype == DType::kBF16) RunCase<__nv_bfloat16>(cs, s, do_time);
  if (cs.dtype == DType::kF16) RunCase<__half>(cs, s, do_time);
  if (cs.dtype == DType::kF32) RunCase<float>(cs, s, do_time);
}

// Configurations the kernel must refuse (launching nothing).
void CheckNotSupported(cudaStream_t s) {
  void* buf;
  int32_t* idx;
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaMalloc(&idx, 1 << 16));
  CK(cudaMemset(idx, 0, 1 << 16));
  auto base = [&] {
    pit::GroupedMatmulParams p;
    p.dtype = DType::kBF16;
    p.E = 4, p.A = 64, p.D = 64, p.F = 64;
    p.src = {buf, 1, 64, 64};
    p.w = buf;
    p.y = buf;
    p.index.lists = idx;
    p.index.counts = idx;
    return p;
  };
  struct T {
    const char* what;
    pit::GroupedMatmulParams p;
  };
  std::vector<T> tests;
  auto add = [&](const char* what, auto&& edit) {
    auto p = base();
    edit(p);
    tests.push_back({what, p});
  };
  add("D % 8 != 0", [](auto& p) { p.D = 60; });
  add("F % 8 != 0", [](auto& p) { p.F = 36; });
  add("A % row_div != 0", [](auto& p) { p.row_div = 3; });
  add("f32 without allow_tf32", [](auto& p) { p.dtype = DType::kF32, p.trans_w = true; });
  add("f32 tf32 without trans_w", [](auto& p) { p.dtype = DType::kF32, p.allow_tf32 = true; });
  add("batch * E > 4096", [](auto& p) { p.E = 4097; });
  add("src batch not dividing", [](auto& p) { p.batch = 3, p.src.batch = 2; });
  add("misaligned y", [&](auto& p) { p.y = static_cast<char*>(buf) + 8; });
  for (auto& t : tests) {
    const cudaError_t e = pit::LaunchGroupedGemmSm90(t.p, s);
    const bool ok = e == cudaErrorNotSupported;
    if (!ok) ++g_fail;
    printf("[%s] NotSupported: %-28s -> %s\n", ok ? " OK " : "FAIL", t.what, cudaGetErrorName(e));
  }
  CK(cudaGetLastError());
  CK(cudaFree(buf));
  CK(cudaFree(idx));
}

// Device copy bandwidth (bytes read + written per second), the ceiling of the weight-bound cases.
double CopyGBs(cudaStream_t s) {
  const size_t n = size_t{1} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemsetAsync(a, 1, n, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> v;
  for (int i = 0; i < 12; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) v.push_back(ms);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * n / (MedianMs(v) * 1e-3) * 1e-9;
}

int main(int argc, char** argv) {
  bool small = false, do_time = true;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--small")) small = true;
    if (!strcmp(argv[i], "--no-time")) do_time = false;
    if (!strncmp(argv[i], "--case=", 7)) g_case = argv[i] + 7;
    if (!strncmp(argv[i], "--only=", 7)) SplitCommaList(argv[i] + 7, g_only);
  }
  bool have_blas = false;
  cudaStream_t s = StartBench(small, &have_blas);

  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  auto mk = [](const char* name, DType dt, int64_t T, int64_t k, int64_t D, int64_t F, int64_t E) {
    Case c;
    c.name = name, c.dtype = dt, c.T = T, c.k = k, c.D = D, c.F = F, c.E = E;
    return c;
  };
  {  // Small / odd shapes (correctness).
    Case c = mk("odd k2 drop bf16", DType::kBF16, 500, 2, 136, 264, 5);
    c.drop = 0.1;
    add(c);
    c = mk("odd k2 drop f16 trans_w", DType::kF16, 500, 2, 136, 264, 5);
    c.drop = 0.1, c.trans_w = true;
    add(c);
    c = mk("some empty experts bf16 trans_w", DType::kBF16, 1000, 1, 256, 512, 8);
    c.routing = kSomeEmpty, c.trans_w = true;
    add(c);
    c = mk("all on one expert bf16", DType::kBF16, 777, 1, 128, 200, 4);
    c.routing = kOneExpert;
    add(c);
    c = mk("all dropped f16", DType::kF16, 300, 2, 64, 72, 3);
    c.routing = kAllDropped;
    add(c);
    c = mk("batch2 W shared k2 bf16", DType::kBF16, 333, 2, 96, 320, 6);
    c.batch = 2, c.src_batch = 2, c.w_batch = 1, c.idx_batch = 2, c.drop = 0.05;
    add(c);
    c = mk("batch4 s1 w2 i1 f16 trans_w", DType::kF16, 200, 2, 72, 136, 3);
    c.batch = 4, c.src_batch = 1, c.w_batch = 2, c.idx_batch = 1, c.drop = 0.1, c.trans_w = true;
    add(c);
    c = mk("batch2 one expert per entry", DType::kBF16, 300, 1, 64, 256, 2);
    c.batch = 2, c.src_batch = 2, c.w_batch = 2, c.idx_batch = 2, c.routing = kOneExpert;
    add(c);
    c = mk("tf32 trans_w k2 rd1", DType::kF32, 300, 2, 72, 136, 6);
    c.trans_w = true, c.row_div_k = false, c.drop = 0.1;
    add(c);
    c = mk("one assignment", DType::kBF16, 1, 1, 8, 8, 3);
    add(c);
    c = mk("E=64 T=300 k2", DType::kBF16, 300, 2, 64, 128, 64);
    add(c);
    c = mk("skew T=3000 multi-tile bf16", DType::kBF16, 3000, 1, 520, 1032, 8);
    c.routing = kSkew;
    add(c);
    c = mk("skew T=3000 multi-tile f16 trans_w", DType::kF16, 3000, 1, 520, 1032, 8);
    c.routing = kSkew, c.trans_w = true;
    add(c);
    // The weight gradient.
    c = mk("wgrad odd k2 drop bf16", DType::kBF16, 500, 2, 136, 264, 5);
    c.wgrad = true, c.drop = 0.1;
    add(c);
    c = mk("wgrad empty experts f16", DType::kF16, 1000, 1, 256, 512, 8);
    c.wgrad = true, c.routing = kSomeEmpty;
    add(c);
    c = mk("wgrad batch2 summed bf16", DType::kBF16, 333, 2, 96, 320, 6);
    c.wgrad = true, c.batch = 2, c.src_batch = 2, c.dy_batch = 2, c.idx_batch = 2, c.dw_batch = 1, c.drop = 0.05;
    add(c);
    c = mk("wgrad batch4 s1 dy4 i2 dw2 f16", DType::kF16, 200, 2, 72, 136, 3);
    c.wgrad = true, c.batch = 4, c.src_batch = 1, c.dy_batch = 4, c.idx_batch = 2, c.dw_batch = 2;
    add(c);
    c = mk("wgrad all dropped bf16", DType::kBF16, 300, 2, 64, 72, 3);
    c.wgrad = true, c.routing = kAllDropped;
    add(c);
    c = mk("wgrad skew multi-block bf16", DType::kBF16, 3000, 1, 520, 1032, 8);
    c.wgrad = true, c.routing = kSkew;
    add(c);
    c = mk("wgrad maxis small f16", DType::kF16, 1000, 1, 200, 264, 1);
    c.wgrad = true, c.listed = 333;
    add(c);
    // Packed rows (every stage by TMA; rows past the count zero up to a multiple of 64):
    // counts around a stage, none, all rows; a batch summed into one dw and kept.
    for (int64_t listed : {0, 20, 32, 320, 333, 1000}) {
      char name[64];
      snprintf(name, sizeof name, "wgrad packed L%lld bf16", (long long)listed);
      c = mk(name, DType::kBF16, 1000, 1, 200, 264, 1);
      c.wgrad = true, c.listed = listed, c.packed = true;
      add(c);
    }
    c = mk("wgrad packed batch2 summed f16", DType::kF16, 700, 1, 136, 520, 1);
    c.wgrad = true, c.listed = 411, c.packed = true;
    c.batch = 2, c.src_batch = 2, c.dy_batch = 2, c.idx_batch = 2, c.dw_batch = 1;
    add(c);
    c = mk("wgrad packed batch2 split f16", DType::kF16, 700, 1, 136, 520, 1);
    c.wgrad = true, c.listed = 411, c.packed = true;
    c.batch = 2, c.src_batch = 2, c.dy_batch = 2, c.idx_batch = 2, c.dw_batch = 2;
    add(c);
  }
  if (!small) {
    // Target 1: T=16384, D=2048, F=8192, E=8, top-1, skewed routing (share ~ 1/(e+1)).
    Case c = mk("skew T16384 bf16", DType::kBF16, 16384, 1, 2048, 8192, 8);
    c.routing = kSkew, c.time = true;
    add(c);
    c.name = "skew T16384 bf16 trans_w", c.trans_w = true;
    add(c);
    c.name = "skew T16384 f16", c.trans_w = false, c.dtype = DType::kF16;
    add(c);
    c = mk("uniform T16384 bf16", DType::kBF16, 16384, 1, 2048, 8192, 8);
    c.time = true;
    add(c);
    c = mk("one expert T16384 bf16", DType::kBF16, 16384, 1, 2048, 8192, 8);
    c.time = true, c.routing = kOneExpert;
    add(c);
    // Target 2 (PIT Fig. 8): weight-read bound, D=768, F=3072, uniform top-1.
    for (int64_t T : {1024, 4096})
      for (int64_t E : {64, 128, 256}) {
        char name[64];
        snprintf(name, sizeof name, "fig8 T%lld E%lld bf16", (long long)T, (long long)E);
        c = mk(name, DType::kBF16, T, 1, 768, 3072, E);
        c.time = true, c.weight_bound = true;
        add(c);
      }
    for (int64_t T : {1024, 4096}) {
      char name[64];
      snprintf(name, sizeof name, "fig8 T%lld E64 zipf bf16", (long long)T);
      c = mk(name, DType::kBF16, T, 1, 768, 3072, 64);
      c.time = true, c.weight_bound = true, c.routing = kZipf;
      add(c);
    }
    c = mk("fig8 T4096 E128 bf16 trans_w", DType::kBF16, 4096, 1, 768, 3072, 128);
    c.time = true, c.weight_bound = true, c.trans_w = true;
    add(c);
    c = mk("fig8 T4096 E128 f16", DType::kF16, 4096, 1, 768, 3072, 128);
    c.time = true, c.weight_bound = true;
    add(c);
    c = mk("wgrad skew T16384 bf16", DType::kBF16, 16384, 1, 2048, 8192, 8);
    c.wgrad = true, c.routing = kSkew, c.time = true;
    add(c);
    c = mk("wgrad fig8 T4096 E128 bf16", DType::kBF16, 4096, 1, 768, 3072, 128);
    c.wgrad = true, c.time = true;
    add(c);
    // "M-axis" weight gradients: one expert, `listed` random rows of A (row_div 1), the rest dropped.
    for (int64_t A : {4096, 16384})
      for (auto df : {std::pair<int64_t, int64_t>{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) {
        char name[64];
        const int64_t listed = A == 4096 ? 1089 : 5107;
        snprintf(name, sizeof name, "wgrad maxis A%lld L%lld %lldx%lld bf16", (long long)A, (long long)listed,
                 (long long)df.first, (long long)df.second);
        c = mk(name, DType::kBF16, A, 1, df.first, df.second, 1);
        c.wgrad = true, c.time = true, c.listed = listed;
        add(c);
        snprintf(name, sizeof name, "wgrad packed A%lld L%lld %lldx%lld bf16", (long long)A, (long long)listed,
                 (long long)df.first, (long long)df.second);
        c.name = name, c.packed = true;
        add(c);
      }
    // The split's choice at long reductions: BERT's 72-tile 768 x 3072 at 50 / 100 % of 16384
    // rows (the launcher estimates the tokens from the capacity, 16384; notes run 19).
    for (int64_t listed : {8192, 16384}) {
      char name[64];
      snprintf(name, sizeof name, "wgrad maxis A16384 L%lld 768x3072 bf16", (long long)listed);
      c = mk(name, DType::kBF16, 16384, 1, 768, 3072, 1);
      c.wgrad = true, c.time = true, c.listed = listed;
      add(c);
    }
    // Issue 4's backward shape: 16384 x 4096 x 4096 at 10 / 30 / 50 % live rows, gathered
    // (random rows) and packed (rows 0 .. L-1, as pit_sread_live leaves them).
    for (int64_t listed : {1638, 1664, 4915, 4928, 8192})
      for (bool packed : {false, true}) {
        char name[64];
        snprintf(name, sizeof name, "wgrad %s A16384 L%lld 4096x4096 bf16", packed ? "packed" : "maxis",
                 (long long)listed);
        c = mk(name, DType::kBF16, 16384, 1, 4096, 4096, 1);
        c.wgrad = true, c.time = true, c.listed = listed, c.packed = packed;
        add(c);
      }
  }
  CheckNotSupported(s);
  if (!small && do_time) {
    g_copy_gbs = CopyGBs(s);
    printf("device copy: %.0f GB/s (read + write)\n", g_copy_gbs);
  }
  for (auto& c : cases)
    if (g_case.empty() || c.name.find(g_case) != std::string::npos) Run(c, s, do_time);

  if (!g_rows.empty()) {
    printf("\n%-30s %-10s %9s %9s %6s %8s %8s %6s\n", "case", "var", "ours ms", "oracle", "ratio", "TFLOP/s", "W GB/s",
           "%copy");
    for (auto& r : g_rows)
      for (auto& v : r.ours) {
        const double gbs = r.weight_bytes / (v.second * 1e-3) * 1e-9;
        printf("%-30s %-10s %9.4f %9.4f %6.3f %8.1f %8.0f %6.1f\n", r.name.c_str(), v.first.c_str(), v.second,
               r.oracle_ms, r.oracle_ms > 0 ? v.second / r.oracle_ms : -1.0, r.flops / v.second * 1e-9, gbs,
               g_copy_gbs > 0 ? 100.0 * gbs / g_copy_gbs : -1.0);
      }
  }
  printf("\n%s: %d failure(s)\n", g_fail ? "FAILED" : "PASSED", g_fail);
  return g_fail ? 1 : 0;
}

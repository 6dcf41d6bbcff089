// Correctness and timing harness of the sm_90a pit_stile_matmul kernel (stile_gemm.cu).
// Not part of the library (Bazel excludes *_bench.cu). Build on an H100:
//   nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/stile_bench.cu cuda/kernels/sm90/stile_gemm.cu -o /tmp/sb
// optionally with the generic kernel for comparison (-DWITH_GENERIC and an object of
// cuda/kernels/sparse_gemm.cu compiled with -DLaunchStileGemmSm90=BenchNoStile
// -DLaunchRowGatherGemmSm90=BenchNoRowGather, so that its launcher skips the fast paths).
// Flags: --small (correctness only: for compute-sanitizer), --time-only.
// cuBLAS (dense and the "oracle" product over the live K only) comes in by dlopen.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/matmul_params.h"
#include "cuda/kernels/sm90/bench_util.cuh"
#include "cuda/kernels/sm90/stile_gemm.h"

#ifdef WITH_GENERIC
#include "cuda/kernels/sparse_gemm.h"
namespace pit {
cudaError_t BenchNoStile(const MatmulParams&, const TileList&, bool, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t BenchNoRowGather(const MatmulParams&, const TileList&, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace pit
#endif

#ifdef PIT_STILE_EXPERIMENTS
namespace pit {
extern int g_stile_force_ka64, g_stile_no_mma, g_stile_groups_fastest;
}
#endif

using pit::DType;

namespace blas {
// Row-major C[M, N] = A[M, K] @ B[K, N] (bf16, f32 accumulate) = column-major C^T = B^T A^T.
inline bool Gemm(const void* A, const void* B, void* C, int M, int N, int K) {
  const float alpha = 1.f, beta = 0.f;
  return gemm(handle, kOpN, kOpN, N, M, K, &alpha, B, CUDA_R_16BF, N, A, CUDA_R_16BF, K, &beta, C, CUDA_R_16BF, N,
              kCompute32F, kAlgoDefault) == 0;
}
}  // namespace blas

static uint64_t g_seed = 12345;

static float Host(uint16_t bits, DType t) {
  if (t == DType::kBF16) {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

struct Case {
  std::string name;
  bool sparse_b = true;
  DType dtype = DType::kBF16;
  int64_t batch = 1, a_batch = 1, b_batch = 1, idx_batch = 1;
  int64_t M = 0, N = 0, K = 0;
  int64_t kt = 32, gs = 64;  // tile_h (k rows per entry), tile_w (group extent)
  double density = 0.5;
  int64_t capacity = -1;  // -1: every tile (dead tiles as -1 - id); else -1 tails
  int over = 0;           // counts += over (exceed the capacity)
  bool check = true, time = false;
  bool x_km = false;  // weight blocks with x stored [M, K] (trans_a false); else x^T [K, M]
};

struct Lists {
  std::vector<int32_t> lists, counts;
  int64_t groups = 0, capacity = 0, tiles_k = 0;
  double live_rows = 0;  // mean listed k rows per group
};

static Lists MakeLists(const Case& cs, std::mt19937_64& rng) {
  Lists L;
  const int64_t narrow = cs.sparse_b ? cs.N : cs.M;
  L.groups = (narrow + cs.gs - 1) / cs.gs;
  L.tiles_k = (cs.K + cs.kt - 1) / cs.kt;
  const bool full_cap = cs.capacity < 0;
  L.capacity = full_cap ? L.tiles_k : cs.capacity;
  L.lists.assign(cs.idx_batch * L.groups * L.capacity, -1);
  L.counts.assign(cs.idx_batch * L.groups, 0);
  std::uniform_real_distribution<double> u(0, 1);
  double rows = 0;
  for (int64_t ib = 0; ib < cs.idx_batch; ++ib)
    for (int64_t g = 0; g < L.groups; ++g) {
      std::vector<int32_t> live, dead;
      for (int64_t e = 0; e < L.tiles_k; ++e) (u(rng) < cs.density ? live : dead).push_back((int32_t)e);
      std::shuffle(live.begin(), live.end(), rng);  // any order must do
      int32_t* l = &L.lists[(ib * L.groups + g) * L.capacity];
      const int64_t n = std::min<int64_t>(live.size(), L.capacity);
      for (int64_t i = 0; i < n; ++i) l[i] = live[i];
      if (full_cap)
        for (size_t i = 0; i < dead.size(); ++i) l[n + i] = -1 - dead[i];
      L.counts[ib * L.groups + g] = (int32_t)live.size() + cs.over;
      for (int64_t i = 0; i < n; ++i) rows += std::min<int64_t>(cs.kt, cs.K - (int64_t)live[i] * cs.kt);
    }
  L.live_rows = rows / double(cs.idx_batch * L.groups);
  return L;
}

static int g_fail = 0;
static bool g_ours_only = false;

static void RunCase(const Case& cs, cudaStream_t stream) {
  std::mt19937_64 rng(g_seed++);
  const Lists L = MakeLists(cs, rng);
  const int64_t es = 2;
  const int64_t a_elems = cs.a_batch * cs.K * cs.M, b_elems = cs.b_batch * cs.K * cs.N, c_elems = cs.batch * cs.M * cs.N;
  uint16_t *dA, *dB, *dC;
  int32_t *dL, *dN;
  CK(cudaMalloc(&dA, std::max<int64_t>(a_elems, 8) * es));
  CK(cudaMalloc(&dB, std::max<int64_t>(b_elems, 8) * es));
  CK(cudaMalloc(&dC, std::max<int64_t>(c_elems, 8) * es));
  CK(cudaMalloc(&dL, std::max<size_t>(L.lists.size(), 1) * 4));
  CK(cudaMalloc(&dN, std::max<size_t>(L.counts.size(), 1) * 4));
  if (cs.dtype == DType::kBF16) {
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dA), a_elems, g_seed++);
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dB), b_elems, g_seed++);
  } else {
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__half*>(dA), a_elems, g_seed++);
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__half*>(dB), b_elems, g_seed++);
  }
  if (!L.lists.empty()) CK(cudaMemcpy(dL, L.lists.data(), L.lists.size() * 4, cudaMemcpyHostToDevice));
  if (!L.counts.empty()) CK(cudaMemcpy(dN, L.counts.data(), L.counts.size() * 4, cudaMemcpyHostToDevice));

  pit::MatmulParams p;
  p.dtype = cs.dtype;
  p.M = cs.M, p.N = cs.N, p.K = cs.K, p.batch = cs.batch;
  p.a = cs.x_km ? pit::MatrixRef{dA, cs.a_batch, cs.M, cs.K} : pit::MatrixRef{dA, cs.a_batch, cs.K, cs.M};
  p.b = {dB, cs.b_batch, cs.K, cs.N};
  p.c = dC;
  p.c_batch = cs.batch;
  p.trans_a = !cs.x_km;
  pit::TileList t;
  t.lists = dL, t.counts = dN, t.batch = cs.idx_batch, t.groups = L.groups, t.capacity = L.capacity;
  t.tile_h = cs.kt, t.tile_w = cs.gs;

  for (int variant = 0; variant < 2; ++variant) {
  if (variant == 1) {
#ifdef PIT_STILE_EXPERIMENTS
    if (cs.sparse_b || cs.gs > 32 || !cs.check) break;
    pit::g_stile_force_ka64 = 1;
#else
    break;
#endif
  }
  if (cs.check) {
    CK(cudaMemsetAsync(dC, 0xFF, std::max<int64_t>(c_elems, 8) * es, stream));
    const cudaError_t e = pit::LaunchStileGemmSm90(p, t, cs.sparse_b, stream);
    CK(cudaStreamSynchronize(stream));
    if (e != cudaSuccess) {
      printf("FAIL %-44s launch: %s\n", cs.name.c_str(), cudaGetErrorName(e));
      ++g_fail;
    } else {
      std::vector<uint16_t> A(a_elems), B(b_elems), C(c_elems);
      CK(cudaMemcpy(A.data(), dA, a_elems * es, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(B.data(), dB, b_elems * es, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(C.data(), dC, c_elems * es, cudaMemcpyDeviceToHost));
      std::vector<float> Af(a_elems), Bf(b_elems);
      for (int64_t i = 0; i < a_elems; ++i) Af[i] = Host(A[i], cs.dtype);
      for (int64_t i = 0; i < b_elems; ++i) Bf[i] = Host(B[i], cs.dtype);
      double max_err = 0;
      int64_t bad = 0;
      std::vector<double> ref(cs.N), mag(cs.N);
      for (int64_t b = 0; b < cs.batch; ++b) {
        const float* Ab = Af.data() + (b / (cs.batch / cs.a_batch)) * cs.K * cs.M;
        const float* Bb = Bf.data() + (b / (cs.batch / cs.b_batch)) * cs.K * cs.N;
        const int64_t ib = b / (cs.batch / cs.idx_batch);
        for (int64_t m = 0; m < cs.M; ++m) {
          std::fill(ref.begin(), ref.end(), 0.0);
          std::fill(mag.begin(), mag.end(), 0.0);
          // Group of (m, n): n / gs (weight blocks) or m / gs (K axis).
          auto accumulate = [&](int64_t g, int64_t n_lo, int64_t n_hi) {
            const int32_t* l = &L.lists[(ib * L.groups + g) * L.capacity];
            const int64_t cnt = std::min<int64_t>(std::max(L.counts[ib * L.groups + g], 0), L.capacity);
            for (int64_t i = 0; i < cnt; ++i)
              // Negative entries (a count past the live ones) list nothing.
              for (int64_t k = l[i] < 0 ? cs.K : l[i] * cs.kt; k < std::min<int64_t>(l[i] * cs.kt + cs.kt, cs.K); ++k) {
                const double a = cs.x_km ? Ab[m * cs.K + k] : Ab[k * cs.M + m];
                for (int64_t n = n_lo; n < n_hi; ++n) {
                  const double v = a * Bb[k * cs.N + n];
                  ref[n] += v, mag[n] += std::fabs(v);
                }
              }
          };
          if (cs.sparse_b) {
            for (int64_t g = 0; g < L.groups; ++g) accumulate(g, g * cs.gs, std::min(cs.N, g * cs.gs + cs.gs));
          } else {
            accumulate(m / cs.gs, 0, cs.N);
          }
          for (int64_t n = 0; n < cs.N; ++n) {
            const double got = Host(C[(b * cs.M + m) * cs.N + n], cs.dtype);
            const double err = std::fabs(got - ref[n]);
            const double tol = 8e-3 * mag[n] + 1e-3;
            if (!(err <= tol)) {
              if (bad < 3)
                printf("   mismatch b=%lld m=%lld n=%lld got %g want %g\n", (long long)b, (long long)m, (long long)n,
                       got, ref[n]);
              ++bad;
            }
            if (std::isfinite(err)) max_err = std::max(max_err, err);
          }
        }
      }
      printf("%s %-44s%s max|err| %.3g  bad %lld / %lld\n", bad ? "FAIL" : "ok  ", cs.name.c_str(),
             variant ? " (n64)" : "", max_err, (long long)bad, (long long)c_elems);
      if (bad) ++g_fail;
    }
  }
#ifdef PIT_STILE_EXPERIMENTS
  pit::g_stile_force_ka64 = 0;
#endif
  }

  if (cs.time) {
    // Oracle: dense [M, K_live] @ [K_live, N], K_live = round(K * density) (and the same
    // rounded up to a multiple of 64: cuBLAS is erratic at odd K).
    const int k_live = std::max<int>(1, (int)std::lround(cs.K * cs.density));
    const int k_live64 = (k_live + 63) / 64 * 64;
    uint16_t *dX, *dW, *dY;
    CK(cudaMalloc(&dX, cs.M * cs.K * es));
    CK(cudaMalloc(&dW, cs.K * cs.N * es));
    CK(cudaMalloc(&dY, cs.M * cs.N * es));
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dX), cs.M * cs.K, g_seed++);
    FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dW), cs.K * cs.N, g_seed++);
    struct V {
      const char* name;
      int id;
    };
    std::vector<V> vs = {{"ours", 0}, {"oracle", 1}, {"oracle64", 7}, {"dense", 2}};
    if (g_ours_only) vs.resize(1);
#ifdef WITH_GENERIC
    if (!g_ours_only) vs.push_back({"generic", 3});
#endif
#ifdef PIT_STILE_EXPERIMENTS
    if (!g_ours_only) {
    if (!cs.sparse_b && cs.gs <= 32) vs.push_back({"ours-n64", 4});
    vs.push_back({"gather-only", 5});
    vs.push_back({"other-order", 6});
    }
#endif
    auto call = [&](int id) -> bool {
      switch (id) {
        case 0:
          return pit::LaunchStileGemmSm90(p, t, cs.sparse_b, stream) == cudaSuccess;
        case 1:
          return blas::handle && blas::Gemm(dX, dW, dY, (int)cs.M, (int)cs.N, k_live);
        case 2:
          return blas::handle && blas::Gemm(dX, dW, dY, (int)cs.M, (int)cs.N, (int)cs.K);
        case 7:
          return blas::handle && blas::Gemm(dX, dW, dY, (int)cs.M, (int)cs.N, k_live64);
#ifdef WITH_GENERIC
        case 3:
          return pit::LaunchStileMatmul(p, t, cs.sparse_b, stream) == cudaSuccess;
#endif
#ifdef PIT_STILE_EXPERIMENTS
        case 4: {
          pit::g_stile_force_ka64 = 1;
          const bool ok = pit::LaunchStileGemmSm90(p, t, cs.sparse_b, stream) == cudaSuccess;
          pit::g_stile_force_ka64 = 0;
          return ok;
        }
        case 5:
        case 6: {
          (id == 5 ? pit::g_stile_no_mma : pit::g_stile_groups_fastest) = 1;
          const bool ok = pit::LaunchStileGemmSm90(p, t, cs.sparse_b, stream) == cudaSuccess;
          pit::g_stile_no_mma = pit::g_stile_groups_fastest = 0;
          return ok;
        }
#endif
      }
      return false;
    };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<std::vector<float>> ms(vs.size());
    std::vector<bool> ok(vs.size(), true);
    const int rounds = 25;
    for (int it = 0; it < rounds; ++it)
      for (size_t i = 0; i < vs.size(); ++i) {
        if (!ok[i]) continue;
        if (vs[i].id == 3 && it >= 8) continue;  // the generic kernel is slow: fewer rounds
        CK(cudaEventRecord(e0, stream));
        ok[i] = call(vs[i].id);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float x;
        CK(cudaEventElapsedTime(&x, e0, e1));
        if (it >= 3) ms[i].push_back(x);
      }
    printf("TIME %-30s K_live %5d (listed %6.0f) ", cs.name.c_str(), k_live, L.live_rows);
    for (size_t i = 0; i < vs.size(); ++i) {
      if (!ok[i] || ms[i].empty()) {
        printf(" %s n/a", vs[i].name);
        continue;
      }
      std::sort(ms[i].begin(), ms[i].end());
      printf(" %s %.4f", vs[i].name, ms[i][ms[i].size() / 2]);
    }
    printf(" ms\n");
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(dX));
    CK(cudaFree(dW));
    CK(cudaFree(dY));
  }
  CK(cudaFree(dA));
  CK(cudaFree(dB));
  CK(cudaFree(dC));
  CK(cudaFree(dL));
  CK(cudaFree(dN));
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill
  bool small = false, time_only = false, ours_only = false;
  const char* only = nullptr;  // run only the cases whose name contains this
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--small")) small = true;
    if (!strcmp(argv[i], "--time-only")) time_only = true;
    if (!strcmp(argv[i], "--ours-only")) ours_only = true;  // time no other variant (profiling)
    if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  if (!small && !blas::Init(stream)) printf("cuBLAS not found: no baselines\n");
  std::vector<Case> cases;
  auto add = [&](std::string name, bool sparse_b, DType dt, int64_t M, int64_t N, int64_t K, int64_t kt, int64_t gs,
                 double d) {
    Case c;
    c.name = name, c.sparse_b = sparse_b, c.dtype = dt, c.M = M, c.N = N, c.K = K, c.kt = kt, c.gs = gs, c.density = d;
    cases.push_back(c);
    return &cases.back();
  };
  if (!time_only) {
    const DType bf = DType::kBF16, hf = DType::kF16;
    add("wb 32x64 bf16 odd M/N, ragged K", true, bf, 200, 136, 300, 32, 64, 0.5);
    add("wb 32x64 f16 odd M/N, ragged K", true, hf, 520, 72, 301, 32, 64, 0.5);
    add("wb 1x64 bf16", true, bf, 264, 192, 203, 1, 64, 0.3);
    add("wb 32x32 bf16", true, bf, 136, 96, 250, 32, 32, 0.6);
    add("wb 1x32 f16", true, hf, 64, 104, 129, 1, 32, 0.5);
    add("wb 7x16 bf16 (odd k tile)", true, bf, 72, 80, 99, 7, 16, 0.5);
    add("wb full (density 1)", true, bf, 128, 128, 256, 32, 64, 1.0);
    add("wb empty (density 0)", true, bf, 128, 128, 256, 32, 64, 0.0);
    add("wb one entry", true, bf, 64, 64, 64, 64, 64, 1.0);
    add("wb capacity 3, counts +5, -1 tails", true, bf, 96, 128, 320, 32, 64, 0.8)->capacity = 3;
    cases.back().over = 5;
    add("wb counts over full capacity", true, hf, 96, 128, 320, 16, 64, 0.7)->over = 2;
    {
      Case* c = add("wb batch 2, shared w and lists", true, bf, 136, 128, 200, 32, 64, 0.5);
      c->batch = 2, c->a_batch = 2;
    }
    {
      Case* c = add("wb batch 3, all batched", true, hf, 64, 64, 96, 8, 64, 0.5);
      c->batch = 3, c->a_batch = 3, c->b_batch = 3, c->idx_batch = 3;
    }
    add("wb-xk 32x64 bf16 odd M/N, ragged K", true, bf, 200, 136, 296, 32, 64, 0.5)->x_km = true;
    add("wb-xk 8x64 f16", true, hf, 520, 72, 200, 8, 64, 0.5)->x_km = true;
    add("wb-xk 16x32 bf16", true, bf, 264, 96, 160, 16, 32, 0.4)->x_km = true;
    add("wb-xk 64x64 f16 full", true, hf, 64, 128, 256, 64, 64, 1.0)->x_km = true;
    add("wb-xk empty", true, bf, 64, 128, 256, 32, 64, 0.0)->x_km = true;
    {
      Case* c = add("wb-xk capacity 2, counts +4, batch 2 shared w", true, bf, 72, 64, 128, 32, 64, 0.7);
      c->x_km = true, c->capacity = 2, c->over = 4, c->batch = 2, c->a_batch = 2;
    }
    add("ka 32x1 bf16 odd M/N, ragged", false, bf, 200, 136, 301, 1, 32, 0.4);
    add("ka 32x1 f16 wide N", false, hf, 96, 1048, 150, 1, 32, 0.5);
    add("ka 64x1 bf16", false, bf, 200, 520, 129, 1, 64, 0.5);
    add("ka 32x4 (k tile 4) bf16", false, bf, 96, 64, 130, 4, 32, 0.5);
    add("ka 8x3 f16", false, hf, 40, 88, 77, 3, 8, 0.5);
    add("ka full", false, bf, 64, 512, 256, 1, 32, 1.0);
    add("ka empty", false, bf, 64, 512, 256, 1, 32, 0.0);
    add("ka capacity 5, counts +3", false, bf, 64, 256, 200, 1, 32, 0.6)->capacity = 5;
    cases.back().over = 3;
    {
      Case* c = add("ka batch 2, shared w, shared lists", false, bf, 64, 136, 100, 1, 32, 0.5);
      c->batch = 2, c->a_batch = 2;
    }
    if (!small) {
      add("wb 32x64 bf16 1024^3", true, bf, 1024, 1024, 1024, 32, 64, 0.3);
      add("wb-xk 32x64 bf16 1024^3", true, bf, 1024, 1024, 1024, 32, 64, 0.3)->x_km = true;
      add("ka 32x1 bf16 1024^3", false, bf, 1024, 1024, 1024, 1, 32, 0.3);
    }
  }
  if (!small) {
    const double dens[] = {0.5, 0.1, 0.05, 0.01};
    for (double d : dens) {
      char buf[64];
      snprintf(buf, sizeof buf, "wb 32x64 x^T s=%.2f", 1 - d);
      add(buf, true, DType::kBF16, 4096, 4096, 4096, 32, 64, d)->check = false;
      cases.back().time = true;
    }
    for (double d : dens) {
      char buf[64];
      snprintf(buf, sizeof buf, "wb 32x64 x[M,K] s=%.2f", 1 - d);
      add(buf, true, DType::kBF16, 4096, 4096, 4096, 32, 64, d)->check = false;
      cases.back().time = true;
      cases.back().x_km = true;
    }
    for (double d : dens) {
      char buf[64];
      snprintf(buf, sizeof buf, "wb 1x64 x^T s=%.2f", 1 - d);
      add(buf, true, DType::kBF16, 4096, 4096, 4096, 1, 64, d)->check = false;
      cases.back().time = true;
    }
    for (double d : dens) {
      char buf[64];
      snprintf(buf, sizeof buf, "ka 32x1 s=%.2f", 1 - d);
      add(buf, false, DType::kBF16, 4096, 4096, 4096, 1, 32, d)->check = false;
      cases.back().time = true;
    }
  }
  g_ours_only = ours_only;
  for (const Case& c : cases)
    if (!only || c.name.find(only) != std::string::npos) RunCase(c, stream);
  printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "PASSED", g_fail);
  return g_fail ? 1 : 0;
}

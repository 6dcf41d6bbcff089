// Standalone sm_90a microbenchmark (not part of the library): can TF32 wgmma take its A
// operand from registers, loaded from a tile stored N-major, at the rate of A from shared
// memory? TF32 wgmma reads shared-memory operands K-major only, so the M-axis product
// x @ w copies w transposed per call (`_lowering.tf32_k_major`, ~4 % of issue 4's TF32
// calls). Computing C^T = w^T x^T instead puts w^T in A, which wgmma takes from registers
// in any layout, and the gathered rows of x in B, K-major as they are
// (docs/notes/sm90_row_gather.md, thirty-ninth session). This measures the main loop only.
//
// Each CTA (one an SM): two warpgroups, each running m64n256k8 wgmma over one 32-deep K
// block held in shared memory, `iters` times (no global traffic in the loop). Forms:
//   S:     A K-major in shared memory (128-byte swizzle), the kernels' form today;
//   Rpad:  A from registers, each lane loading its 4 fragment values from w stored
//          [k][n] with rows padded to 136 floats (bank-conflict free);
//   Rswz:  the same from w as TMA would store it: 32-float boxes of [k][n], 128-byte swizzle.
// The R forms double-buffer their fragments (the next k-step's loaded while the last
// wgmma runs; wait_group 1 before a buffer is reused).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/tf32_areg_bench.cu -o tf32_areg && ./tf32_areg
// prints, per form, the largest relative error of one K block's product against the host
// (TF32 rounding: ~1e-3) and the TFLOP/s over all CTAs.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/kernels/sm90/row_gather_gemm.cuh"  // MakeDesc, wgmma fences (sm90_rg)

namespace {

using pit::sm90_rg::FenceOperands;
using pit::sm90_rg::MakeDesc;
using pit::sm90_rg::SmemAddr;
using pit::sm90_rg::WgmmaCommit;
using pit::sm90_rg::WgmmaFence;
using pit::sm90_rg::WgmmaWait;

constexpr int kM = 128, kN = 256, kK = 32;  // C^T tile: w's 128 columns x 256 tokens, one K block
constexpr int kPad = 136;                   // Rpad: floats a padded row of w [k][n]
enum Form { kS = 0, kRpad = 1, kRswz = 2 };

#define ACC128                                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),           \
  "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),       \
  "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),       \
  "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),       \
  "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define REGS128                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "   \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "   \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "      \
  "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "      \
  "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

__device__ __forceinline__ void MmaSmem(float* d, uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " REGS128 ", %128, %129, 1, 1, 1;\n"
               : ACC128 : "l"(da), "l"(db));
}

__device__ __forceinline__ void MmaRegs(float* d, const uint32_t* a, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " REGS128
               ", {%128, %129, %130, %131}, %132, 1, 1, 1;\n"
               : ACC128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Byte offset of element (row, col) of a K-major tile of 128-byte rows (32 floats), 128-byte swizzle.
__host__ __device__ inline uint32_t Swz(int row, int col) {
  const int chunk = col >> 2;
  return row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 3) * 4;
}

// w [k][n] as 32-column boxes of [32 k][32 n] (4 KB each), each row of a box 128 bytes, swizzled.
__host__ __device__ inline uint32_t SwzBoxes(int k, int n) { return (n >> 5) * 4096 + Swz(k, n & 31); }

// A (= w^T) fragment of m64nNk8 tf32 for k-step kk: (row lane/4 [+8], col lane%4 [+4]) of the warp's 16 rows.
template <int kForm>
__device__ __forceinline__ void LoadA(const char* w, int m0, int kk, int lane, uint32_t* a) {
  const int r = m0 + (lane >> 2), c = kk * 8 + (lane & 3);
  const int rr[4] = {r, r + 8, r, r + 8}, cc[4] = {c, c, c + 4, c + 4};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t off = kForm == kRpad ? (cc[i] * kPad + rr[i]) * 4 : SwzBoxes(cc[i], rr[i]);
    a[i] = *reinterpret_cast<const uint32_t*>(w + off);
  }
}

template <int kForm>
__global__ void __launch_bounds__(256, 1) Bench(const float* a_mk, const float* b_nk, float* c, int iters) {
  extern __shared__ __align__(1024) char smem[];
  char* sb = smem;                 // B: x's 256 rows, K-major, 32 KB
  char* sa = smem + kN * 128;      // S: A (w^T) 128 rows K-major, 16 KB; R: w [k][n]
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  for (int i = tid; i < kN * kK; i += blockDim.x) {
    const int n = i / kK, k = i % kK;
    *reinterpret_cast<float*>(sb + Swz(n, k)) = b_nk[i];
  }
  for (int i = tid; i < kM * kK; i += blockDim.x) {
    const int m = i / kK, k = i % kK;
    const uint32_t off = kForm == kS ? Swz(m, k) : kForm == kRpad ? (k * kPad + m) * 4 : SwzBoxes(k, m);
    *reinterpret_cast<float*>(sa + off) = a_mk[i];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  FenceOperands(d);
  const uint64_t db = MakeDesc(SmemAddr(sb), 16, 1024);
  const uint64_t da = MakeDesc(SmemAddr(sa) + wg * 64 * 128, 16, 1024);
  const int m0 = wg * 64 + warp * 16;
  uint32_t a[2][4];
  if constexpr (kForm != kS) LoadA<kForm>(sa, m0, 0, lane, a[0]);
  for (int it = 0; it < iters; ++it) {
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t step = static_cast<uint64_t>(kk * 32) >> 4;  // +8 floats of K in the swizzle row
      if constexpr (kForm == kS) {
        MmaSmem(d, da + step, db + step);
      } else {
        WgmmaFence();  // the fragment registers were written since the last wgmma
        MmaRegs(d, a[kk & 1], db + step);
        WgmmaCommit();
        WgmmaWait<1>();  // the wgmma before this one is done: its fragment buffer is free
        FenceOperands(d);
        LoadA<kForm>(sa, m0, (kk + 1) & 3, lane, a[(kk + 1) & 1]);
      }
    }
    if constexpr (kForm == kS) {
      WgmmaCommit();
      WgmmaWait<1>();
      FenceOperands(d);
    }
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceOperands(d);
  if (blockIdx.x == 0) {  // C^T [128][256] from the accumulator layout (wgmma.cuh)
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = 8 * j + 2 * (lane & 3), row = m0 + (lane >> 2);
      c[row * kN + col] = d[4 * j];
      c[row * kN + col + 1] = d[4 * j + 1];
      c[(row + 8) * kN + col] = d[4 * j + 2];
      c[(row + 8) * kN + col + 1] = d[4 * j + 3];
    }
  }
}

template <int kForm>
void Run(const char* name, const float* a, const float* b, float* c, const std::vector<double>& want, int sms) {
  const int smem = kN * 128 + (kForm == kRpad ? kK * kPad * 4 : kM * 128) + 1024;
  cudaFuncSetAttribute(Bench<kForm>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaMemset(c, 0, sizeof(float) * kM * kN);
  Bench<kForm><<<1, 256, smem>>>(a, b, c, 1);
  std::vector<float> got(kM * kN);
  cudaMemcpy(got.data(), c, sizeof(float) * got.size(), cudaMemcpyDeviceToHost);
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) err = fmax(err, fabs(got[i] - want[i])), scale = fmax(scale, fabs(want[i]));
  const int iters = 20000;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  Bench<kForm><<<sms, 256, smem>>>(a, b, c, 100);  // warm-up
  cudaEventRecord(e0);
  Bench<kForm><<<sms, 256, smem>>>(a, b, c, iters);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const double flops = 2.0 * kM * kN * kK * iters * sms;
  printf("%-5s  max rel err %.2e  %.3f ms  %.1f TFLOP/s  (%s)\n", name, err / scale, ms, flops / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<float> a(kM * kK), b(kN * kK);
  uint32_t s = 12345;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return static_cast<float>(static_cast<int>(s >> 9) % 2001 - 1000) / 1000.f; };
  for (auto& v : a) v = rnd();
  for (auto& v : b) v = rnd();
  std::vector<double> want(kM * kN);  // C^T[m][n] = sum_k A[m][k] B[n][k]
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double acc = 0;
      for (int k = 0; k < kK; ++k) acc += static_cast<double>(a[m * kK + k]) * b[n * kK + k];
      want[m * kN + n] = acc;
    }
  float *da, *db, *dc;
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dc, kM * kN * 4);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  printf("tf32 m64n256k8, 2 warpgroups x 1 CTA on each of %d SMs, one 32-deep K block in shared memory\n", sms);
  for (int round = 0; round < 2; ++round) {
    Run<kS>("S", da, db, dc, want, sms);
    Run<kRpad>("Rpad", da, db, dc, want, sms);
    Run<kRswz>("Rswz", da, db, dc, want, sms);
  }
  return 0;
}

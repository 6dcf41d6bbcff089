// Shared by the standalone sm_90a harnesses (grouped_bench.cu, row_gather_bench.cu,
// stile_bench.cu; not part of the library): CUDA error checks, cuBLAS loaded with dlopen
// (the oracle; the harnesses link without libcublas), random fills and the checks'
// reference product.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
              cudaGetErrorString(e_));                                                         \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

// ------------------------------- cuBLAS via dlopen -------------------------------
namespace blas {
typedef void* Handle;
typedef int (*CreateFn)(Handle*);
typedef int (*SetStreamFn)(Handle, cudaStream_t);
typedef int (*GemmExFn)(Handle, int, int, int, int, int, const void*, const void*, cudaDataType, int, const void*,
                        cudaDataType, int, const void*, void*, cudaDataType, int, int, int);
constexpr int kOpN = 0, kOpT = 1, kCompute32F = 68, kCompute32FFastTf32 = 77, kAlgoDefault = -1;
inline Handle handle = nullptr;
inline GemmExFn gemm = nullptr;
// Loads cuBLAS and makes a handle on `stream`; false when it is not there.
inline bool Init(cudaStream_t stream) {
  const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void* lib = nullptr;
  for (const char* n : names)
    if ((lib = dlopen(n, RTLD_NOW | RTLD_GLOBAL))) break;
  if (!lib) return false;
  auto create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
  auto set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
  gemm = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
  if (!create || !gemm || !set_stream) return false;
  return create(&handle) == 0 && set_stream(handle, stream) == 0;
}
}  // namespace blas

// ------------------------------- device helpers -------------------------------
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF(float v) { return v; }
template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 FromF(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half FromF(float v) { return __float2half(v); }
template <>
__device__ __forceinline__ float FromF(float v) { return v; }

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Set by StartBench from PIT_BENCH_COARSE=1: FillRandom then draws from {+-1/4, +-1/2,
// +-3/4, +-1} (few mantissa bits), so a timing difference between coarse and fine data
// is the tensor pipe's data-dependent power draw, not the kernel.
static __device__ bool g_bench_coarse = false;

// Uniform in [-1, 1), never zero (or coarse, above).
template <typename T>
__global__ void FillRandom(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t h = Hash(seed * 0x9E3779B97F4A7C15ull + i);
    float v = (h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (g_bench_coarse) v = ((h & 3) + 1) * 0.25f * ((h & 4) ? -1.0f : 1.0f);
    T t = FromF<T>(v);
    if (ToF(t) == 0.0f) t = FromF<T>(0.5f);
    p[i] = t;
  }
}

// The checks' reference product in fp32: out[j, n] = sum_k A[rows[j] / row_div, k] *
// opB[k, n] for j < R (a negative rows[j]: a zero row), with B + blk_b[j / 32] * K * N as
// the B of rows j (one weight per 32-row block; B itself when blk_b is null). 256
// threads a block, grid (ceil(N / 32), ceil(R / 32)).
template <typename T>
__global__ void RefGatheredGemm(const T* A, const T* B, const int* rows, int row_div, const int* blk_b, int R, int N,
                                int K, bool trans_b, float* out) {
  __shared__ float sa[32][33], sb[32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // ty 0..7
  const int j0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
  const T* Bj = blk_b ? B + static_cast<int64_t>(blk_b[blockIdx.y]) * K * N : B;
  float acc[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 32) {
    for (int i = ty; i < 32; i += 8) {
      const int j = j0 + i, k = k0 + tx;
      const int a = j < R ? rows[j] : -1;
      sa[i][tx] = (a >= 0 && k < K) ? ToF(A[int64_t{a / row_div} * K + k]) : 0.f;
      const int kk = k0 + i, n = n0 + tx;
      float bv = 0.f;
      if (kk < K && n < N) bv = trans_b ? ToF(Bj[int64_t{n} * K + kk]) : ToF(Bj[int64_t{kk} * N + n]);
      sb[i][tx] = bv;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < 32; ++k) {
      const float b = sb[k][tx];
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += sa[ty + 8 * q][k] * b;
    }
    __syncthreads();
  }
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + ty + 8 * q, n = n0 + tx;
    if (j < R && n < N) out[int64_t{j} * N + n] = acc[q];
  }
}

// Adds to *diff the positions where two 16-bit buffers differ (rerun determinism).
static __global__ void CountDiff(const uint16_t* x, const uint16_t* y, int64_t n, unsigned long long* diff) {
  unsigned long long d = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d += x[i] != y[i];
  if (d) atomicAdd(diff, d);
}

// ------------------------------- host helpers -------------------------------
// "a,b,c" appended to `out` as {"a", "b", "c"} (empty items skipped).
inline void SplitCommaList(const std::string& list, std::vector<std::string>& out) {
  for (size_t pos = 0; pos <= list.size();) {
    size_t c = list.find(',', pos);
    if (c == std::string::npos) c = list.size();
    if (c > pos) out.push_back(list.substr(pos, c - pos));
    pos = c + 1;
  }
}

// Prints the device, creates the harness's stream and loads cuBLAS unless `small`.
inline cudaStream_t StartBench(bool small, bool* have_blas) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, cc %d.%d, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor,
         prop.l2CacheSize >> 20);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const char* coarse_env = getenv("PIT_BENCH_COARSE");
  const bool coarse = coarse_env && *coarse_env == '1';
  CK(cudaMemcpyToSymbol(g_bench_coarse, &coarse, sizeof coarse));
  if (coarse) printf("data: coarse (PIT_BENCH_COARSE=1)\n");
  *have_blas = !small && blas::Init(s);
  printf("cuBLAS: %s\n", *have_blas ? "loaded" : "not loaded");
  return s;
}

// Small device helpers shared by pit_jax's kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <cuda_runtime.h>

namespace pit {

constexpr unsigned kFullMask = 0xffffffffu;

// Number of multiprocessors of the current device, looked up once per device.
inline int DeviceSmCount() {
  static int cached[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cached[device] = sms > 0 ? sms : 132;
  }
  return cached[device];
}

// A kernel's host-side switch for A/B timing and debugging: the environment variable
// `name` unset or empty gives `fallback`, a value starting with '0' false, any other true.
// Callers keep the answer in a static (read once per process).
inline bool EnvFlag(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  return (e == nullptr || e[0] == '\0') ? fallback : e[0] != '0';
}

// Lets kKernel launch with `bytes` of dynamic shared memory on the current device (above
// the default 48 KB the limit is raised per kernel and device), remembered per device so
// that launches pay the driver call once. Setting it twice is harmless, so threads racing
// here need no lock.
template <auto kKernel>
cudaError_t AllowDynamicSmem(size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  constexpr int kMaxDevices = 64;
  static size_t allowed[kMaxDevices] = {};  // one table per kernel (template instance)
  int dev = 0;
  const bool known = cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kMaxDevices;
  if (known && allowed[dev] >= bytes) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess && known) allowed[dev] = bytes;
  return e;
}

// The sum of `value` over lanes 0..lane of the warp (every lane takes part).
template <typename T>
__device__ __forceinline__ T WarpInclusiveSum(T value, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(kFullMask, value, o);
    if (lane >= o) value += n;
  }
  return value;
}

// Block-wide exclusive sum over kThreads threads; also returns the block total.
// Uses `scratch` (kThreads / 32 ints of shared memory); ends with a barrier.
template <int kThreads>
__device__ __forceinline__ int BlockExclusiveSum(int value, int* scratch, int* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int incl = WarpInclusiveSum(value, lane);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  const int warp_incl = WarpInclusiveSum(lane < kWarps ? scratch[lane] : 0, lane);
  const int block_total = __shfl_sync(kFullMask, warp_incl, kWarps - 1);
  const int warp_excl = __shfl_sync(kFullMask, warp_incl - (lane < kWarps ? scratch[lane] : 0), warp);
  __syncthreads();  // scratch may be reused by the caller
  *total = block_total;
  return warp_excl + incl - value;
}

// The same sum with one barrier (the per-warp totals added serially, kThreads / 32 reads of
// shared memory), for the set-up of the persistent stile and grouped kernels: there
// BlockExclusiveSum's second barrier and scan measured 0.5-0.9 % of the kernel
// (docs/notes/sm90_stile.md, run 10). T: int, or int64_t where sums may pass 2^31.
// `scratch` (kThreads / 32 of T) must not be rewritten before the caller's next barrier.
template <int kThreads, typename T>
__device__ __forceinline__ T BlockExclusiveSumOnce(T value, T* scratch, T* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T incl = WarpInclusiveSum(value, lane);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  T sum = 0, before = incl - value;
  for (int w = 0; w < kThreads / 32; ++w) {
    sum += scratch[w];
    if (w < warp) before += scratch[w];
  }
  *total = sum;
  return before;
}

}  // namespace pit

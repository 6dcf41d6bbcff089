// Small device helpers shared by pit_jax's kernels.
#pragma once

#include <cstdint>

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

// The sum of `value` over lanes 0..lane of the warp (every lane takes part).
__device__ __forceinline__ int WarpInclusiveSum(int value, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, value, o);
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
// (docs/notes/sm90_stile.md, run 10). `scratch` must not be rewritten before the caller's
// next barrier.
template <int kThreads>
__device__ __forceinline__ int BlockExclusiveSumOnce(int value, int* scratch, int* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int incl = WarpInclusiveSum(value, lane);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  int sum = 0, before = incl - value;
  for (int w = 0; w < kThreads / 32; ++w) {
    sum += scratch[w];
    if (w < warp) before += scratch[w];
  }
  *total = sum;
  return before;
}

}  // namespace pit

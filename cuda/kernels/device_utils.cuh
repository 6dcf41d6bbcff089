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

// Block-wide exclusive sum over kThreads threads; also returns the block total.
// Uses `scratch` (kThreads / 32 ints of shared memory); ends with a barrier.
template <int kThreads>
__device__ __forceinline__ int BlockExclusiveSum(int value, int* scratch, int* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  int warp_incl = lane < kWarps ? scratch[lane] : 0;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, warp_incl, o);
    if (lane >= o) warp_incl += n;
  }
  const int block_total = __shfl_sync(kFullMask, warp_incl, kWarps - 1);
  const int warp_excl = __shfl_sync(kFullMask, warp_incl - (lane < kWarps ? scratch[lane] : 0), warp);
  __syncthreads();  // scratch may be reused by the caller
  *total = block_total;
  return warp_excl + incl - value;
}

}  // namespace pit

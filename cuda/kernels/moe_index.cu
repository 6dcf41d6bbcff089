// The MoE routing index: two launches on one stream.
//  1. init: counts = 0, lists = -1 (every slot past a count reads -1).
//  2. one pass: a block takes a chunk of assignments (kPerThread per thread) of one
//     batch entry. Each warp groups its lanes by expert (__match_any_sync) and one lane
//     per group takes the group's slots with ONE atomicAdd, so a skewed routing (all
//     tokens on one expert) costs one atomic per warp, not per assignment. In shared
//     mode (E+1 small enough) that atomic hits a block-local histogram; the block then
//     reserves a base per non-empty group with one global atomicAdd and writes each
//     assignment at base + its local rank. Otherwise the warps' atomics go straight to
//     the global counters.
// Expert ids outside [0, E) (negative ones too) go to group E, the dropped ones.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/moe_index.h"

namespace pit {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSharedGroups = 4096;  // E+1 up to this: block-local histogram
// Assignments per thread of a block item: 8 when that still gives every SM items, else 1,
// so a few thousand assignments spread over many blocks instead of two long ones
// (T = 4096: 16 blocks of one round each, ~2x faster than 2 blocks of eight rounds).
constexpr int kLongPerThread = 8;

__global__ void MoeIndexInitKernel(MoeIndexParams p) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = p.batch * (p.E + 1);
  const int64_t slots = groups * p.T * p.k;
  for (int64_t i = start; i < groups; i += stride) p.counts[i] = 0;
  for (int64_t i = start; i < slots; i += stride) p.lists[i] = -1;
}

template <bool kShared, int kPerThread>
__global__ void __launch_bounds__(kThreads) MoeIndexKernel(MoeIndexParams p, int64_t chunks) {
  constexpr int kChunk = kThreads * kPerThread;
  __shared__ int s_hist[kShared ? kMaxSharedGroups : 1];  // per group: local count, then global base
  const int A = static_cast<int>(p.T * p.k), E = static_cast<int>(p.E), G = E + 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int64_t item = blockIdx.x; item < p.batch * chunks; item += gridDim.x) {
    const int64_t b = item / chunks;
    const int a0 = static_cast<int>(item - b * chunks) * kChunk;
    const int32_t* ids = p.expert_ids + b * A;
    int32_t* counts = p.counts + b * G;
    int32_t* lists = p.lists + b * G * static_cast<int64_t>(A);
    if constexpr (kShared) {
      for (int g = threadIdx.x; g < G; g += kThreads) s_hist[g] = 0;
      __syncthreads();
    }
    int grp[kPerThread], rank[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      // Consecutive lanes read consecutive ids; a0 + kChunk <= A + kChunk < 2^31.
      const int64_t a = int64_t{a0} + i * kThreads + threadIdx.x;
      int g = -1;  // no assignment
      if (a < A) {
        const int id = __ldg(ids + a);
        g = (id >= 0 && id < E) ? id : E;
      }
      // Every lane runs the match (whole warp), lanes without an assignment form group -1.
      const unsigned peers = __match_any_sync(kFullMask, g);
      const int leader = __ffs(peers) - 1;
      int base = 0;
      if (g >= 0 && lane == leader) {
        int* counter = kShared ? &s_hist[g] : counts + g;
        base = atomicAdd(counter, __popc(peers));
      }
      base = __shfl_sync(kFullMask, base, leader);
      grp[i] = g;
      rank[i] = base + __popc(peers & lanes_below);
      if constexpr (!kShared) {
        if (g >= 0) lists[static_cast<int64_t>(g) * A + rank[i]] = static_cast<int32_t>(a);
      }
    }
    if constexpr (kShared) {
      __syncthreads();  // local counts complete
      for (int g = threadIdx.x; g < G; g += kThreads) {
        const int n = s_hist[g];
        if (n > 0) s_hist[g] = atomicAdd(counts + g, n);
      }
      __syncthreads();  // bases ready
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        if (grp[i] < 0) continue;
        const int64_t a = int64_t{a0} + i * kThreads + threadIdx.x;
        lists[static_cast<int64_t>(grp[i]) * A + s_hist[grp[i]] + rank[i]] = static_cast<int32_t>(a);
      }
      __syncthreads();  // s_hist is cleared by the next item
    }
  }
}

template <int kPerThread>
cudaError_t LaunchFill(const MoeIndexParams& p, cudaStream_t stream) {
  constexpr int kChunk = kThreads * kPerThread;
  const int64_t chunks = (p.T * p.k + kChunk - 1) / kChunk;
  const int grid = static_cast<int>(std::min<int64_t>(p.batch * chunks, DeviceSmCount() * 8));
  if (p.E + 1 <= kMaxSharedGroups) {
    MoeIndexKernel<true, kPerThread><<<grid, kThreads, 0, stream>>>(p, chunks);
  } else {
    MoeIndexKernel<false, kPerThread><<<grid, kThreads, 0, stream>>>(p, chunks);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMoeIndex(const MoeIndexParams& p, cudaStream_t stream) {
  constexpr int kLongChunk = kThreads * kLongPerThread;
  const int64_t A = p.T * p.k, G = p.E + 1;
  if (p.batch < 0 || A < 0 || A > INT_MAX - kLongChunk || p.E < 1 || G > INT_MAX) return cudaErrorInvalidValue;
  const int64_t slots = p.batch * G * A;
  const int64_t largest = std::max(slots, p.batch * G);
  if (largest == 0) return cudaSuccess;
  const int init_blocks = static_cast<int>(std::clamp<int64_t>((largest + 1023) / 1024, 1, DeviceSmCount() * 16));
  MoeIndexInitKernel<<<init_blocks, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.batch == 0 || A == 0) return err;
  const bool long_items = p.batch * ((A + kLongChunk - 1) / kLongChunk) >= DeviceSmCount();
  return long_items ? LaunchFill<kLongPerThread>(p, stream) : LaunchFill<1>(p, stream);
}

}  // namespace pit

// pit_sread / pit_swrite: copies between listed micro-tiles of x and packed slots.
//
// A block takes `spb` consecutive slots (flat over batch x capacity) per iteration of a
// grid-stride loop. It first decodes each slot once into shared memory (where its tile
// starts in x and how much of it is in bounds, or dead), then copies the slots' rows:
// every tile row is served by L = min(32, pow2 >= vectors per row) lanes, so short
// rows do not idle a warp and long rows are read by whole warps. Elements move as
// 16-byte vectors when every row start is 16-byte aligned, one by one otherwise.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/sread_swrite.h"

namespace pit {
namespace {

using gemm::Elem;

constexpr int kThreads = 256;
constexpr int kMaxSlotsPerBlock = 256;
constexpr int64_t kVectorsPerBlock = 4096;  // per grid-stride iteration, about
constexpr int kUnroll = 4;                  // vectors in flight per lane

struct PackArgs {
  const int32_t* tiles;
  const int32_t* count;
  const void* src;
  void* dst;
  int64_t slots;       // batch * capacity
  int64_t rows, cols;  // of x
  int64_t capacity;
  int tile_h, tile_w, tile_cols, num_tiles;
  int vecs;            // vectors (or elements) per tile row
  int log_lanes;       // lanes per tile row = 1 << log_lanes
  int spb;             // slots per block iteration
  bool accumulate;
  bool live_only;  // sread: slots past the count are skipped (origin -2), not zeroed, ...
  int64_t pad_rows;  // ... unless their rows lie below round_up(count * tile_h, pad_rows)
};

// One vector: V words, or a single word in the unaligned case.
template <typename T, bool kVec>
struct Chunk {
  using Word = typename Elem<T>::Word;
  static constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  using Raw = std::conditional_t<kVec, uint4, Word>;

  static __device__ __forceinline__ Raw Load(const Word* p) {
    if constexpr (kVec) {
      return __ldg(reinterpret_cast<const uint4*>(p));
    } else {
      return __ldg(p);
    }
  }
  static __device__ __forceinline__ Raw LoadPlain(const Word* p) {  // out may be written by this kernel
    return *reinterpret_cast<const Raw*>(p);
  }
  static __device__ __forceinline__ void Store(Word* p, Raw v) { *reinterpret_cast<Raw*>(p) = v; }
  static __device__ __forceinline__ Raw Zero() {
    if constexpr (kVec) {
      return make_uint4(0, 0, 0, 0);
    } else {
      return Word{0};
    }
  }
  // float32 sum of two chunks, rounded once per element.
  static __device__ __forceinline__ Raw Add(Raw a, Raw b) {
    if constexpr (kVec) {
      Word wa[V], wb[V];
      gemm::Unpack(a, wa);
      gemm::Unpack(b, wb);
#pragma unroll
      for (int e = 0; e < V; ++e) wa[e] = Elem<T>::FromFloat(Elem<T>::ToFloat(wa[e]) + Elem<T>::ToFloat(wb[e]));
      return gemm::Pack(wa);
    } else {
      return Elem<T>::FromFloat(Elem<T>::ToFloat(a) + Elem<T>::ToFloat(b));
    }
  }
};

template <typename T, bool kVec, bool kWrite>
__global__ void __launch_bounds__(kThreads, 4) PackKernel(const PackArgs a) {
  using C = Chunk<T, kVec>;
  using Word = typename C::Word;
  constexpr int V = C::V;
  __shared__ int64_t s_origin[kMaxSlotsPerBlock];  // element offset of the tile in x, or -1
  __shared__ int s_h[kMaxSlotsPerBlock], s_w[kMaxSlotsPerBlock];  // in-bounds rows / columns

  const int tid = static_cast<int>(threadIdx.x);
  const int lanes = 1 << a.log_lanes;
  const int lane = tid & (lanes - 1);
  const int row_step = kThreads >> a.log_lanes;
  const int rows_per_iter = a.spb * a.tile_h;
  const int64_t iters = (a.slots + a.spb - 1) / a.spb;
  const Word* src = static_cast<const Word*>(a.src);
  Word* dst = static_cast<Word*>(a.dst);

  for (int64_t it = blockIdx.x; it < iters; it += gridDim.x) {
    const int64_t slot0 = it * a.spb;
    __syncthreads();  // the previous iteration is done with the slot table
    for (int ls = tid; ls < a.spb; ls += kThreads) {
      const int64_t gs = slot0 + ls;
      int64_t origin = -1;
      int h = 0, w = 0;
      if (gs < a.slots) {
        const int64_t b = gs / a.capacity, s = gs - b * a.capacity;
        const int n = __ldg(a.count + b);
        if (s < n) {  // s < min(count, capacity) since s < capacity
          const int t = __ldg(a.tiles + gs);
          if (t >= 0 && t < a.num_tiles) {  // dead (negative) or foreign ids: no tile
            const int tr = t / a.tile_cols, tc = t - tr * a.tile_cols;
            const int64_t r0 = static_cast<int64_t>(tr) * a.tile_h, c0 = static_cast<int64_t>(tc) * a.tile_w;
            origin = (b * a.rows + r0) * a.cols + c0;
            h = static_cast<int>(a.rows - r0 < a.tile_h ? a.rows - r0 : a.tile_h);
            w = static_cast<int>(a.cols - c0 < a.tile_w ? a.cols - c0 : a.tile_w);
          }
        } else if (a.live_only) {
          const int64_t padded = (static_cast<int64_t>(n) * a.tile_h + a.pad_rows - 1) / a.pad_rows * a.pad_rows;
          if (s * a.tile_h >= padded) origin = -2;
        }
      }
      s_origin[ls] = origin;
      s_h[ls] = h;
      s_w[ls] = w;
    }
    __syncthreads();

    for (int lr = tid >> a.log_lanes; lr < rows_per_iter; lr += row_step) {
      const int ls = lr / a.tile_h, i = lr - ls * a.tile_h;
      const int64_t gs = slot0 + ls;
      if (gs >= a.slots) break;  // later rows belong to later slots
      const int64_t origin = s_origin[ls];
      const bool live_row = origin >= 0 && i < s_h[ls];
      if (kWrite && !live_row) continue;
      if (!kWrite && origin == -2) continue;
      const int w = s_w[ls];
      const int64_t packed_row = (gs * a.tile_h + i) * a.tile_w;
      const int64_t x_row = origin + static_cast<int64_t>(i) * a.cols;
      // kUnroll vectors a lane: all loads issued before the stores, so a lane keeps that
      // many in flight (one at a time ran the live-row packing at ~77 % of the copy rate).
      // With kVec, w and tile_w are multiples of V: no partial vectors.
      for (int jv0 = lane; jv0 < a.vecs; jv0 += kUnroll * lanes) {
        typename C::Raw v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int jv = jv0 + u * lanes, j = jv * V;
          const bool in = jv < a.vecs && j < w;
          if (!kWrite) {
            v[u] = live_row && in ? C::Load(src + x_row + j) : C::Zero();
          } else if (in) {
            v[u] = C::Load(src + packed_row + j);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int jv = jv0 + u * lanes, j = jv * V;
          if (jv >= a.vecs) break;
          if (!kWrite) {
            C::Store(dst + packed_row + j, v[u]);
          } else if (j < w) {
            C::Store(dst + x_row + j, a.accumulate ? C::Add(C::LoadPlain(dst + x_row + j), v[u]) : v[u]);
          }
        }
      }
    }
  }
}

int Log2Ceil(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

template <typename T, bool kWrite>
cudaError_t LaunchTyped(const PackLaunch& p, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (p.batch <= 0 || p.capacity <= 0 || p.tile_h <= 0 || p.tile_w <= 0) return cudaSuccess;
  constexpr int64_t kIntMax = int64_t{1} << 30;
  if (p.tile_h > kIntMax || p.tile_w > kIntMax || p.tile_rows * p.tile_cols > kIntMax)
    return cudaErrorInvalidValue;
  const bool vec = p.cols % V == 0 && p.tile_w % V == 0 && reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.dst) % 16 == 0;
  PackArgs a;
  a.tiles = p.tiles;
  a.count = p.count;
  a.src = p.src;
  a.dst = p.dst;
  a.slots = p.batch * p.capacity;
  a.rows = p.rows;
  a.cols = p.cols;
  a.capacity = p.capacity;
  a.tile_h = static_cast<int>(p.tile_h);
  a.tile_w = static_cast<int>(p.tile_w);
  a.tile_cols = static_cast<int>(p.tile_cols);
  a.num_tiles = static_cast<int>(p.tile_rows * p.tile_cols);
  a.vecs = static_cast<int>(vec ? p.tile_w / V : p.tile_w);
  a.log_lanes = std::min(5, Log2Ceil(a.vecs));
  const int64_t per_slot = p.tile_h * static_cast<int64_t>(a.vecs);
  // Several slots per iteration when tiles are small; spb * tile_h stays below 2^31
  // (tile_h alone when spb is 1, otherwise at most kVectorsPerBlock).
  a.spb = static_cast<int>(std::clamp<int64_t>(kVectorsPerBlock / per_slot, 1, kMaxSlotsPerBlock));
  a.accumulate = p.accumulate;
  a.live_only = p.live_only;
  a.pad_rows = p.live_pad_rows < 1 ? 1 : p.live_pad_rows;
  const int64_t iters = (a.slots + a.spb - 1) / a.spb;
  const int grid = static_cast<int>(std::min<int64_t>(iters, int64_t{DeviceSmCount()} * 16));
  if (vec) {
    PackKernel<T, true, kWrite><<<grid, kThreads, 0, stream>>>(a);
  } else {
    PackKernel<T, false, kWrite><<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <bool kWrite>
cudaError_t Launch(const PackLaunch& p, cudaStream_t stream) {
  return WithFloatType(p.dtype, [&](auto t) { return LaunchTyped<decltype(t), kWrite>(p, stream); });
}

}  // namespace

cudaError_t LaunchSread(const PackLaunch& p, cudaStream_t stream) { return Launch<false>(p, stream); }

cudaError_t LaunchSwrite(const PackLaunch& p, cudaStream_t stream) { return Launch<true>(p, stream); }

}  // namespace pit

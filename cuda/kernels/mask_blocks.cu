// pit_mask_blocks: y = live block ? convert(w) : 0, element by element.
//
// Bound by memory: a thread takes 8 consecutive elements of a row (one 16-byte store
// of 16-bit results) when a row and a block both hold whole vectors of 8, and reads w
// only for a live block, so at density d the kernel moves d * |w| + |y| bytes (the
// pruned BERT step's dense route: half the float32 weights at 50 %, where XLA's masked
// cast read all of them, one launch per matrix). Otherwise one element a thread.
// One launch takes up to kMaskMaxMatrices matrices (grid.y).
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/mask_blocks.h"

namespace pit {
namespace {

struct MaskTable {
  const void* src[kMaskMaxMatrices];
  void* dst[kMaskMaxMatrices];
};

template <typename W, int kN>
struct alignas(sizeof(W) * kN) Words {
  W w[kN];
};

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // vectors a thread loads before it stores

template <typename In, typename Out, int kVec, typename Index>
__global__ void __launch_bounds__(kThreads) MaskBlocksKernel(const MaskBlocksParams p, const MaskTable t,
                                                             int64_t first) {
  using InW = typename gemm::Elem<In>::Word;
  using OutW = typename gemm::Elem<Out>::Word;
  const int m = blockIdx.y;
  const auto* src = static_cast<const Words<InW, kVec>*>(t.src[m]);
  auto* dst = static_cast<Words<OutW, kVec>*>(t.dst[m]);
  const bool* live = p.live + (first + m) * p.tile_rows * p.tile_cols;
  // 32-bit index math where a matrix allows it (a division by a runtime value is a
  // sequence of instructions, 64-bit ones longer)
  const Index vecs = static_cast<Index>(p.rows * p.cols / kVec), cols = static_cast<Index>(p.cols);
  const Index tile_h = static_cast<Index>(p.tile_h), tile_w = static_cast<Index>(p.tile_w);
  const Index tile_cols = static_cast<Index>(p.tile_cols);
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index base = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; base < vecs;
       base += stride * kUnroll) {
    // kUnroll vectors' loads in flight before the first store
    Words<InW, kVec> in[kUnroll];
    bool on[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = base + u * stride;
      const Index e = v * kVec;
      const Index r = e / cols, c = e - r * cols;
      on[u] = v < vecs && live[(r / tile_h) * tile_cols + c / tile_w];
      if (on[u]) in[u] = src[v];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = base + u * stride;
      if (v >= vecs) break;
      Words<OutW, kVec> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        out.w[i] = on[u] ? gemm::Elem<Out>::FromFloat(gemm::Elem<In>::ToFloat(in[u].w[i])) : OutW{0};
      dst[v] = out;
    }
  }
}

template <typename In, typename Out, int kVec, typename Index>
void LaunchOne(const dim3 grid, const MaskBlocksParams& p, const MaskTable& t, int64_t first, cudaStream_t stream) {
  MaskBlocksKernel<In, Out, kVec, Index><<<grid, kThreads, 0, stream>>>(p, t, first);
}

template <typename In, typename Out>
cudaError_t Launch(const MaskBlocksParams& p, const void* const* src, void* const* dst, cudaStream_t stream) {
  // Whole vectors of 8 in every row and every block (and so aligned: XLA's buffers are).
  const bool vec = p.cols % 8 == 0 && p.tile_w % 8 == 0;
  const int64_t vecs = p.rows * p.cols / (vec ? 8 : 1);
  for (int64_t first = 0; first < p.matrices; first += kMaskMaxMatrices) {
    const int n = static_cast<int>(std::min<int64_t>(kMaskMaxMatrices, p.matrices - first));
    // About 16 CTAs an SM (132 SMs) over the launch's matrices, each thread several
    // rounds of kUnroll vectors (H200, the pruned BERT step's 4 x 12 kernels at 50 %:
    // 112 us against 121 at one vector a thread and 8x more CTAs; 100 us with 32-bit
    // index math).
    const int64_t cap = std::max<int64_t>(1, 2112 / n);
    const unsigned blocks =
        static_cast<unsigned>(std::min<int64_t>((vecs + kThreads * kUnroll - 1) / (kThreads * kUnroll), cap));
    MaskTable t{};
    for (int i = 0; i < n; ++i) {
      t.src[i] = src[first + i];
      t.dst[i] = dst[first + i];
    }
    const dim3 grid(blocks, n);
    // 32-bit indices when every element index a thread forms (up to kUnroll strides past
    // the last vector) fits
    const bool narrow = p.rows * p.cols + int64_t{blocks} * kThreads * kUnroll * 8 < (int64_t{1} << 31);
    if (vec)
      narrow ? LaunchOne<In, Out, 8, uint32_t>(grid, p, t, first, stream)
             : LaunchOne<In, Out, 8, int64_t>(grid, p, t, first, stream);
    else
      narrow ? LaunchOne<In, Out, 1, uint32_t>(grid, p, t, first, stream)
             : LaunchOne<In, Out, 1, int64_t>(grid, p, t, first, stream);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchMaskBlocks(const MaskBlocksParams& p, const void* const* src, void* const* dst,
                             cudaStream_t stream) {
  if (p.matrices == 0 || p.rows == 0 || p.cols == 0) return cudaSuccess;
  return WithFloatType(p.in_dtype, [&](auto in) {
    return WithFloatType(p.out_dtype, [&](auto out) {
      return Launch<decltype(in), decltype(out)>(p, src, dst, stream);
    });
  });
}

}  // namespace pit

// pit_block_topk on the GPU: two kernels per call.
//
// BlockScoresKernel: block (column chunk, band group, matrix). The chunk is whole block
// columns; thread t owns V columns of it (V = 16 / sizeof(T) where rows are whole 16-byte
// vectors and a block column whole vectors wide, else 1) and walks the rows of the group's
// bands (32 rows, or one band of tile_h > 32 rows) with independent loads, leaving one
// partial sum per band in shared memory; the partials then add per block in column order.
// Every block's score is summed in a fixed order: the same on every run. (One 4- or
// 2-byte load per thread and row moved ~2.6 TB/s in the pruned BERT step on the H200.)
//
// TopkSelectKernel: block = matrix. The scores are non-negative floats, so their bits
// order as unsigned ints; three radix passes (shared-memory histograms of the candidates
// that share the digits found so far) find the exact keep-th largest, which no sort
// needs. Then live = score >= cut, as `scores >= sorted[n - keep]` in jnp.
#include "cuda/kernels/block_topk.h"

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/elem_types.cuh"

namespace pit {
namespace {

using gemm::Elem;

constexpr int kScoreThreads = 256;
constexpr int kGroupRows = 32;                          // rows per band group (tile_h <= 32)
constexpr int kPartStride = kScoreThreads + kScoreThreads / 32;  // a pad word per 32: no bank conflicts
constexpr int kSelectThreads = 1024;

struct MatrixTable {
  const void* base[kTopkMaxMatrices];
};

__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t CeilDivHost(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ int PartSlot(int band, int col) { return band * kPartStride + col + col / 32; }

// V columns a thread reads per row: 1 (one word), or 16 / sizeof(T) (one 16-byte load).
// The chunk is whole block columns: tile_w * floor(V * 256 / tile_w), or one block column
// when tile_w > V * 256; thread t owns vector t of it (and t + 256, ... in the wide case),
// so all its columns lie in one block column (with V > 1 the launcher checks tile_w % V).
template <typename T, int V>
__global__ void __launch_bounds__(kScoreThreads)
    BlockScoresKernel(const BlockTopkParams p, const MatrixTable table, int64_t first, int64_t chunk,
                      int64_t bands_per_group, int64_t groups) {
  // Loads issued before any add (16 words or 8 vectors), then 4 running sums in a fixed
  // order (one dependent sum read ~2.2 TB/s on the H200, 16 words ~2.8).
  constexpr int kInFlight = V == 1 ? 16 : 8;
  __shared__ float part[kGroupRows * kPartStride];
  const int t = threadIdx.x;
  const int64_t n = p.cols, k = p.rows, bh = p.tile_h, bw = p.tile_w;
  const T* __restrict__ w = static_cast<const T*>(table.base[blockIdx.z]);
  float* __restrict__ scores = p.scores + (first + blockIdx.z) * p.tile_rows * p.tile_cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t cend = Min64(c0 + chunk, n);
  const int64_t span = int64_t{V} * kScoreThreads;  // columns the block's threads cover at once
  const int width = bw <= span ? static_cast<int>(bw / V) : kScoreThreads;  // partials per block
  const int64_t blocks_here = bw <= span ? chunk / bw : 1;
  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {
    const int64_t band0 = g * bands_per_group;
    const int nb = static_cast<int>(Min64(bands_per_group, p.tile_rows - band0));
    const int64_t row0 = band0 * bh;
    const int64_t rows = Min64(static_cast<int64_t>(nb) * bh, k - row0);
    for (int b = 0; b < nb; ++b) part[PartSlot(b, t)] = 0.f;
    for (int64_t c = c0 + int64_t{V} * t; c < cend; c += span) {
      const T* col = w + row0 * n + c;
      for (int b = 0; b < nb; ++b) {
        const int64_t r1 = Min64((b + 1) * bh, rows);
        int64_t r = b * bh;
        float a[4] = {0.f, 0.f, 0.f, 0.f};
        for (; r + kInFlight <= r1; r += kInFlight) {
          gemm::Words<T, V> v[kInFlight];
#pragma unroll
          for (int i = 0; i < kInFlight; ++i) gemm::LoadWords<T, V>(col + (r + i) * n, v[i]);
#pragma unroll
          for (int i = 0; i < kInFlight; ++i) {
            float f[V];
            gemm::ToFloats<T, V>(v[i], f);
#pragma unroll
            for (int j = 0; j < V; ++j) a[(i * V + j) % 4] += fabsf(f[j]);
          }
        }
        for (; r < r1; ++r) {
          float f[V];
          gemm::LoadF<T, V>(col + r * n, f);
#pragma unroll
          for (int j = 0; j < V; ++j) a[j % 4] += fabsf(f[j]);
        }
        part[PartSlot(b, t)] += (a[0] + a[1]) + (a[2] + a[3]);
      }
    }
    __syncthreads();
    const int64_t outputs = static_cast<int64_t>(nb) * blocks_here;
    for (int64_t o = t; o < outputs; o += kScoreThreads) {
      const int b = static_cast<int>(o / blocks_here);
      const int j = static_cast<int>(o % blocks_here);
      const int64_t tc = c0 / bw + j;
      if (tc >= p.tile_cols) continue;
      float s = 0.f;
      for (int x = 0; x < width; ++x) s += part[PartSlot(b, j * width + x)];
      scores[(band0 + b) * p.tile_cols + tc] = s;
    }
    __syncthreads();  // part is reused by the next group
  }
}

// The select's digits, high to low: 11 + 11 + 10 bits (bit 31, the sign, is 0 for
// every score), so three passes over the scores.
constexpr int kSelectBins = 2048;
constexpr int kSelectPasses = 3;
__device__ __forceinline__ int DigitShift(int pass) { return pass == 0 ? 21 : (pass == 1 ? 10 : 0); }
__device__ __forceinline__ unsigned DigitMask(int pass) { return pass == 2 ? 1023u : 2047u; }

__device__ __forceinline__ void CountDigit(unsigned* hist, unsigned b, unsigned mask, unsigned prefix, int shift,
                                           unsigned dmask) {
  if ((b & mask) == prefix) atomicAdd(&hist[(b >> shift) & dmask], 1u);
}

__global__ void __launch_bounds__(kSelectThreads) TopkSelectKernel(const BlockTopkParams p) {
  __shared__ unsigned hist[kSelectBins];
  __shared__ unsigned warp_sums[kSelectThreads / 32];
  __shared__ unsigned s_digit, s_below;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t nb = p.tile_rows * p.tile_cols;
  const int64_t m = blockIdx.x;
  const float* scores = p.scores + m * nb;
  const unsigned* bits = reinterpret_cast<const unsigned*>(scores);
  // Four scores per load where the matrix's scores start 16-byte aligned.
  const bool vec = (nb % 4) == 0;
  const int64_t n4 = vec ? nb / 4 : 0;
  // The cut's rank among the scores in ascending order (0-based).
  unsigned rank = static_cast<unsigned>(nb - TopkKeep(*p.density, nb));
  unsigned prefix = 0, mask = 0;
  for (int pass = 0; pass < kSelectPasses; ++pass) {
    const int shift = DigitShift(pass);
    const unsigned dmask = DigitMask(pass);
    for (int i = t; i < kSelectBins; i += kSelectThreads) hist[i] = 0;
    __syncthreads();
    // Two 16-byte loads in flight per thread: the pass is bound by L2 latency.
    int64_t i = t;
    for (; i + kSelectThreads < n4; i += 2 * kSelectThreads) {
      const uint4 a = reinterpret_cast<const uint4*>(bits)[i];
      const uint4 b = reinterpret_cast<const uint4*>(bits)[i + kSelectThreads];
      CountDigit(hist, a.x, mask, prefix, shift, dmask);
      CountDigit(hist, a.y, mask, prefix, shift, dmask);
      CountDigit(hist, a.z, mask, prefix, shift, dmask);
      CountDigit(hist, a.w, mask, prefix, shift, dmask);
      CountDigit(hist, b.x, mask, prefix, shift, dmask);
      CountDigit(hist, b.y, mask, prefix, shift, dmask);
      CountDigit(hist, b.z, mask, prefix, shift, dmask);
      CountDigit(hist, b.w, mask, prefix, shift, dmask);
    }
    for (; i < n4; i += kSelectThreads) {
      const uint4 a = reinterpret_cast<const uint4*>(bits)[i];
      CountDigit(hist, a.x, mask, prefix, shift, dmask);
      CountDigit(hist, a.y, mask, prefix, shift, dmask);
      CountDigit(hist, a.z, mask, prefix, shift, dmask);
      CountDigit(hist, a.w, mask, prefix, shift, dmask);
    }
    for (int64_t r = 4 * n4 + t; r < nb; r += kSelectThreads) CountDigit(hist, bits[r], mask, prefix, shift, dmask);
    __syncthreads();
    // The digit whose bin holds the rank: a block-wide scan, two bins per thread.
    const unsigned c0 = hist[2 * t], c1 = hist[2 * t + 1];
    unsigned incl = c0 + c1;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    unsigned before = 0;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    incl += before;
    const unsigned below = incl - c0 - c1;
    if (below <= rank && rank < incl) {
      if (rank < below + c0) {
        s_digit = 2u * t;
        s_below = below;
      } else {
        s_digit = 2u * t + 1;
        s_below = below + c0;
      }
    }
    __syncthreads();
    rank -= s_below;
    prefix |= s_digit << shift;
    mask |= dmask << shift;
    __syncthreads();  // hist, warp_sums, s_digit and s_below are rewritten by the next pass
  }
  const float cut = __uint_as_float(prefix);
  if (t == 0) p.thresholds[m] = cut;
  bool* live = p.live + m * nb;
  if (vec) {
    for (int64_t i = t; i < n4; i += kSelectThreads) {
      const float4 v = reinterpret_cast<const float4*>(scores)[i];
      const uchar4 o = make_uchar4(v.x >= cut, v.y >= cut, v.z >= cut, v.w >= cut);
      *reinterpret_cast<uchar4*>(live + 4 * i) = o;  // live + m * nb is 4-byte aligned: nb % 4 == 0
    }
  } else {
    for (int64_t i = t; i < nb; i += kSelectThreads) live[i] = scores[i] >= cut;
  }
}

unsigned GridDim(int64_t v, int64_t cap) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(v, cap))); }

template <typename T>
cudaError_t Launch(const BlockTopkParams& p, const void* const* bases, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int64_t bands_per_group = p.tile_h >= kGroupRows ? 1 : kGroupRows / p.tile_h;
  const int64_t groups = CeilDivHost(p.tile_rows, bands_per_group);
  for (int64_t first = 0; first < p.matrices; first += kTopkMaxMatrices) {
    MatrixTable table{};
    const int64_t count = std::min<int64_t>(kTopkMaxMatrices, p.matrices - first);
    bool aligned = true;
    for (int64_t i = 0; i < count; ++i) {
      table.base[i] = bases[first + i];
      aligned = aligned && reinterpret_cast<uintptr_t>(bases[first + i]) % 16 == 0;
    }
    // 16-byte loads where rows are whole vectors and a block column is whole vectors wide.
    const bool vec = aligned && p.cols % kVec == 0 && p.tile_w % kVec == 0;
    const int64_t span = (vec ? kVec : 1) * kScoreThreads;
    const int64_t chunk = p.tile_w <= span ? p.tile_w * (span / p.tile_w) : p.tile_w;
    const dim3 grid(GridDim(CeilDivHost(p.cols, chunk), 0x7fffffff), GridDim(groups, 65535),
                    static_cast<unsigned>(count));
    auto kernel = vec ? BlockScoresKernel<T, kVec> : BlockScoresKernel<T, 1>;
    kernel<<<grid, kScoreThreads, 0, stream>>>(p, table, first, chunk, bands_per_group, groups);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  for (int64_t first = 0; first < p.matrices; first += 65535) {
    BlockTopkParams q = p;  // matrices [first, first + 65535) of the select
    const int64_t count = std::min<int64_t>(65535, p.matrices - first);
    const int64_t nb = p.tile_rows * p.tile_cols;
    q.scores = p.scores + first * nb;
    q.live = p.live + first * nb;
    q.thresholds = p.thresholds + first;
    TopkSelectKernel<<<static_cast<unsigned>(count), kSelectThreads, 0, stream>>>(q);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchBlockTopk(const BlockTopkParams& p, const void* const* bases, cudaStream_t stream) {
  return WithFloatType(p.dtype, [&](auto t) { return Launch<decltype(t)>(p, bases, stream); });
}

}  // namespace pit

// pit_block_topk on the GPU: two kernels per call.
//
// BlockScoresKernel: block (column chunk, band group, matrix). The chunk is whole block
// columns; thread t owns V columns of it (V = 16 / sizeof(T) where rows are whole 16-byte
// vectors and a block column whole vectors wide, else 1) and walks the rows of the group's
// bands (32 rows, or one band of tile_h > 32 rows) with independent loads, leaving one
// partial sum per band in shared memory; the partials then add per block in column order.
// Every block's score is summed in a fixed order: the same on every run. (One 4- or
// 2-byte load per thread and row moved ~2.6 TB/s in the pruned BERT step on the H200.)
// NarrowBlockScoresKernel takes blocks narrower than a vector (32x1 strips),
// RowBlockScoresKernel one-row blocks a few vectors wide (1x32 strips).
//
// TopkSelectKernel: a matrix per CTA, or per cluster of up to 8 CTAs on Hopper (each a
// slice of its scores). The scores are non-negative floats, so their bits order as
// unsigned ints; three radix passes (histograms of the candidates that share the digits
// found so far, summed over the cluster through distributed shared memory) find the
// exact keep-th largest, which no sort needs. Then live = score >= cut, as
// `scores >= sorted[n - keep]` in jnp.
#include "cuda/kernels/block_topk.h"

#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/sm90/launch_util.h"

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

// kRows rows of V columns from p (rows n apart), all loads issued before any is used.
template <typename T, int V, int kRows>
__device__ __forceinline__ void LoadRowWords(const T* p, int64_t n, gemm::Words<T, V> (&v)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) gemm::LoadWords<T, V>(p + i * n, v[i]);
}

// |f| summed as the band walk sums one row: V / 4 values in each of 4 running sums.
template <int V>
__device__ __forceinline__ float RowSum(const float (&f)[V]) {
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < V; ++j) a[j % 4] += fabsf(f[j]);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

// V columns a thread reads per row: 1 (one word), or 16 / sizeof(T) (one 16-byte load).
// The chunk is whole block columns: tile_w * floor(V * 256 / tile_w), or one block column
// when tile_w > V * 256; thread t owns vector t of it (and t + 256, ... in the wide case),
// so all its columns lie in one block column (with V > 1 the launcher checks tile_w % V).
template <int V>
constexpr int ScoreLoadsInFlight() { return V == 1 ? 16 : 8; }

// kThin: bands thinner than the loads in flight (1x32 strips: one-row bands). Walking
// band by band would leave one load in flight per band (~1.5 TB/s, 224 us of a pruned
// BERT step on the H200); these loads run across the group's bands instead (127 us;
// RowBlockScoresKernel now takes one-row blocks where N is a multiple of the block).
// kDeep = 2: twice the loads in flight, for bands at least that thick (the launcher).
template <typename T, int V, bool kThin, int kDeep = 1>
__global__ void __launch_bounds__(kScoreThreads, kDeep == 2 ? 3 : 0)
    BlockScoresKernel(const BlockTopkParams p, const MatrixTable table, int64_t first, int64_t chunk,
                      int64_t bands_per_group, int64_t groups) {
  // Loads issued before any add (16 words or 8 vectors, times kDeep), then 4 running sums
  // in a fixed order (one dependent sum read ~2.2 TB/s on the H200, 16 words ~2.8).
  constexpr int kInFlight = ScoreLoadsInFlight<V>() * kDeep;
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
      if constexpr (kThin) {
        int64_t r = 0;
        for (; r + kInFlight <= rows; r += kInFlight) {
          gemm::Words<T, V> v[kInFlight];
          LoadRowWords<T, V, kInFlight>(col + r * n, n, v);
#pragma unroll
          for (int i = 0; i < kInFlight; ++i) {
            float f[V];
            gemm::ToFloats<T, V>(v[i], f);
            part[PartSlot(static_cast<int>((r + i) / bh), t)] += RowSum<V>(f);
          }
        }
        for (; r < rows; ++r) {
          float f[V];
          gemm::LoadF<T, V>(col + r * n, f);
          part[PartSlot(static_cast<int>(r / bh), t)] += RowSum<V>(f);
        }
      } else {
        for (int b = 0; b < nb; ++b) {
          const int64_t r1 = Min64((b + 1) * bh, rows);
          int64_t r = b * bh;
          float a[4] = {0.f, 0.f, 0.f, 0.f};
          for (; r + kInFlight <= r1; r += kInFlight) {
            gemm::Words<T, V> v[kInFlight];
            LoadRowWords<T, V, kInFlight>(col + r * n, n, v);
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

// Blocks narrower than a 16-byte vector (32x1 strips; V a multiple of tile_w): thread t
// sums each of its V columns over a band's rows (4 running sums per column, as the
// one-column walk) and writes the V / tile_w scores of its columns itself: no partials to
// combine across threads. Bands at least ScoreLoadsInFlight<V>() rows thick. (32x1 strips
// of BERT's float32 kernels read one word per load before: 128 us a step on the H200.)
template <typename T, int V>
__global__ void __launch_bounds__(kScoreThreads)
    NarrowBlockScoresKernel(const BlockTopkParams p, const MatrixTable table, int64_t first, int64_t bands_per_group,
                            int64_t groups) {
  constexpr int kInFlight = ScoreLoadsInFlight<V>();
  const int64_t n = p.cols, k = p.rows, bh = p.tile_h;
  const int bw = static_cast<int>(p.tile_w);
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kScoreThreads + threadIdx.x) * V;
  if (c >= n) return;  // no barriers below
  const T* __restrict__ w = static_cast<const T*>(table.base[blockIdx.z]);
  float* __restrict__ scores = p.scores + (first + blockIdx.z) * p.tile_rows * p.tile_cols;
  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {
    const int64_t band0 = g * bands_per_group;
    const int64_t bands = Min64(bands_per_group, p.tile_rows - band0);
    for (int64_t b = band0; b < band0 + bands; ++b) {
      const int64_t r1 = Min64((b + 1) * bh, k);
      float a[V][4];
#pragma unroll
      for (int j = 0; j < V; ++j) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.f;
      int64_t r = b * bh;
      for (; r + kInFlight <= r1; r += kInFlight) {
        gemm::Words<T, V> v[kInFlight];
        LoadRowWords<T, V, kInFlight>(w + r * n + c, n, v);
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          float f[V];
          gemm::ToFloats<T, V>(v[i], f);
#pragma unroll
          for (int j = 0; j < V; ++j) a[j][i % 4] += fabsf(f[j]);
        }
      }
      for (; r < r1; ++r) {
        float f[V];
        gemm::LoadF<T, V>(w + r * n + c, f);
#pragma unroll
        for (int j = 0; j < V; ++j) a[j][0] += fabsf(f[j]);
      }
      // The columns' sums, added per block in column order.
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        s += (a[j][0] + a[j][1]) + (a[j][2] + a[j][3]);
        if ((j + 1) % bw == 0) {
          scores[b * p.tile_cols + (c + j) / bw] = s;
          s = 0.f;
        }
      }
    }
  }
}

// One-row blocks a few vectors wide (1x32 strips: kLanes = tile_w / V of 2, 4 or 8), N a
// multiple of tile_w: thread i of the flat grid takes vector i % (N / V) of rows 8 (i /
// (N / V)) .. + 7, all 8 loads in flight, and the kLanes lanes of a block add their row
// sums by shuffles (a fixed tree): no shared memory, no barrier, no idle columns. (The
// band kernel's thin variant gave these blocks 127 us of a pruned BERT step on the H200,
// its last column chunk partly idle, against an 82 us read floor.)
template <typename T, int V, int kLanes>
__global__ void __launch_bounds__(kScoreThreads)
    RowBlockScoresKernel(const BlockTopkParams p, const MatrixTable table, int64_t first) {
  constexpr int kRows = ScoreLoadsInFlight<V>();
  const int64_t n = p.cols, k = p.rows, vecs = n / V;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kScoreThreads + threadIdx.x;
  const int64_t row0 = (i / vecs) * kRows, c = (i % vecs) * V;
  // Whole warps stay in (kLanes divides 32 and N / V): lanes past the rows add zeros.
  const T* __restrict__ w = static_cast<const T*>(table.base[blockIdx.y]);
  float* __restrict__ scores = p.scores + (first + blockIdx.y) * p.tile_rows * p.tile_cols;
  gemm::Words<T, V> v[kRows];
  if (row0 + kRows <= k) {
    LoadRowWords<T, V, kRows>(w + row0 * n + c, n, v);
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (row0 + r < k) gemm::LoadWords<T, V>(w + (row0 + r) * n + c, v[r]);
  }
  float sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float f[V];
    gemm::ToFloats<T, V>(v[r], f);
    sum[r] = row0 + r < k ? RowSum<V>(f) : 0.f;
  }
#pragma unroll
  for (int d = 1; d < kLanes; d *= 2)
#pragma unroll
    for (int r = 0; r < kRows; ++r) sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], d);
  if (threadIdx.x % kLanes == 0) {
    const int64_t tc = c / p.tile_w;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (row0 + r < k) scores[(row0 + r) * p.tile_cols + tc] = sum[r];
  }
}

// The select's digits, high to low: 11 + 11 + 10 bits (bit 31, the sign, is 0 for
// every score), so three passes over the scores.
constexpr int kSelectBins = 2048;
constexpr int kSelectPasses = 3;
// On Hopper a matrix's scores are split over a cluster of CTAs (one per kSelectScoresPerCta,
// at most 8) that sum their histograms through distributed shared memory. One CTA per
// matrix walked the 32x1 strips' 74k-score matrices at L2 latency on 12 SMs: 77 us a pruned
// BERT step on the H200; in clusters of 4-5, 58-63 us (their barriers and remote reads
// cost ~1.5 us a pass: 8 CTAs were no faster than 4).
constexpr int kSelectMaxCluster = 8;
constexpr int64_t kSelectScoresPerCta = 16384;
constexpr int kSelectUnroll = 4;  // word loads in flight per thread (odd block counts)
__device__ __forceinline__ int DigitShift(int pass) { return pass == 0 ? 21 : (pass == 1 ? 10 : 0); }
__device__ __forceinline__ unsigned DigitMask(int pass) { return pass == 2 ? 1023u : 2047u; }

// (Adding a warp's equal digits once, by ballots, made the first pass slower, not faster:
// the shared-memory atomics' conflicts are not what bounds it.)
__device__ __forceinline__ void CountDigit(unsigned* hist, unsigned b, unsigned mask, unsigned prefix, int shift,
                                           unsigned dmask) {
  if ((b & mask) == prefix) atomicAdd(&hist[(b >> shift) & dmask], 1u);
}

// Bins 2t and 2t + 1 summed over the cluster's histograms, in rank order: every CTA finds
// the same digit. One 8-byte load per rank, all in flight at once. Clusters are launched
// on sm_90 only.
__device__ __forceinline__ void ClusterBins(unsigned* hist, int cluster, int t, unsigned& c0, unsigned& c1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  cl.sync();  // every CTA's counts are in
  uint2 h[kSelectMaxCluster];
#pragma unroll
  for (int q = 0; q < kSelectMaxCluster; ++q)
    h[q] = q < cluster ? *reinterpret_cast<const uint2*>(cl.map_shared_rank(hist, q) + 2 * t) : make_uint2(0u, 0u);
  c0 = 0;
  c1 = 0;
#pragma unroll
  for (int q = 0; q < kSelectMaxCluster; ++q) {
    c0 += h[q].x;
    c1 += h[q].y;
  }
#else
  __trap();
#endif
}

__device__ __forceinline__ void ClusterSync() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();
#endif
}

// The matrices of one select launch: every group of the call, numbered group after group.
struct SelectGroups {
  int count = 0;
  int64_t first[kTopkMaxGroups + 1] = {};  // each group's first matrix; first[count]: all of them
  int64_t blocks[kTopkMaxGroups] = {};     // scores a matrix
  int64_t per[kTopkMaxGroups] = {};        // scores a CTA of a matrix's cluster (a multiple of 4)
  const float* scores[kTopkMaxGroups] = {};
  bool* live[kTopkMaxGroups] = {};
  float* thresholds[kTopkMaxGroups] = {};
  const float* density = nullptr;
};

// grid.x = matrices * cluster, matrices [first, first + gridDim.x / cluster) of `groups`;
// CTA r of a matrix's cluster takes its scores [r * per, (r + 1) * per). Two histograms
// alternate between passes: a CTA clears one only after the cluster barrier that follows
// every CTA's reads of it.
__global__ void __launch_bounds__(kSelectThreads)
    TopkSelectKernel(const __grid_constant__ SelectGroups groups, int cluster, int64_t first) {
  __shared__ __align__(16) unsigned hists[2][kSelectBins];
  __shared__ unsigned warp_sums[kSelectThreads / 32];
  __shared__ unsigned s_digit, s_below;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t gm = first + blockIdx.x / cluster;
  int g = 0;
  while (g + 1 < groups.count && gm >= groups.first[g + 1]) ++g;
  const int64_t m = gm - groups.first[g];
  const int64_t nb = groups.blocks[g], per = groups.per[g];
  const int r = static_cast<int>(blockIdx.x % cluster);  // the CTA's rank in its cluster (1-D)
  const int64_t s0 = Min64(r * per, nb), len = Min64(s0 + per, nb) - s0;
  const float* scores = groups.scores[g] + m * nb + s0;
  const unsigned* bits = reinterpret_cast<const unsigned*>(scores);
  // 16-byte loads where the matrices' scores are whole vectors (then so is every slice).
  const bool vec = nb % 4 == 0;
  const int64_t n4 = vec ? len / 4 : 0;
  // The cut's rank among the scores in ascending order (0-based).
  unsigned rank = static_cast<unsigned>(nb - TopkKeep(*groups.density, nb));
  unsigned prefix = 0, mask = 0;
  for (int pass = 0; pass < kSelectPasses; ++pass) {
    const int shift = DigitShift(pass);
    const unsigned dmask = DigitMask(pass);
    unsigned* hist = hists[pass & 1];
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
    for (int64_t j0 = 4 * n4 + t; j0 < len; j0 += int64_t{kSelectUnroll} * kSelectThreads) {
      unsigned b[kSelectUnroll];
#pragma unroll
      for (int u = 0; u < kSelectUnroll; ++u) {
        const int64_t j = j0 + u * kSelectThreads;
        b[u] = j < len ? bits[j] : 0u;
      }
#pragma unroll
      for (int u = 0; u < kSelectUnroll; ++u)
        if (j0 + u * kSelectThreads < len) CountDigit(hist, b[u], mask, prefix, shift, dmask);
    }
    // The matrix's histogram: the sum of its cluster's.
    unsigned c0, c1;
    if (cluster > 1) {
      ClusterBins(hist, cluster, t, c0, c1);
    } else {
      __syncthreads();
      c0 = hist[2 * t];
      c1 = hist[2 * t + 1];
    }
    // The digit whose bin holds the rank: a block-wide scan, two bins per thread (a scan
    // of each warp, then of the 32 warps' sums).
    unsigned incl = WarpInclusiveSum(c0 + c1, lane);
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    const unsigned ws = warp_sums[lane];
    incl += __shfl_sync(0xffffffffu, WarpInclusiveSum(ws, lane) - ws, warp);
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
    __syncthreads();  // warp_sums, s_digit and s_below are rewritten by the next pass
  }
  const float cut = __uint_as_float(prefix);
  if (t == 0 && r == 0) groups.thresholds[g][m] = cut;
  bool* live = groups.live[g] + m * nb + s0;
  if (vec) {
    for (int64_t i = t; i < n4; i += kSelectThreads) {
      const float4 v = reinterpret_cast<const float4*>(scores)[i];
      const uchar4 o = make_uchar4(v.x >= cut, v.y >= cut, v.z >= cut, v.w >= cut);
      *reinterpret_cast<uchar4*>(live + 4 * i) = o;  // 4-byte aligned: nb % 4 == 0, s0 % 4 == 0
    }
  } else {
    for (int64_t i = t; i < len; i += kSelectThreads) live[i] = scores[i] >= cut;
  }
  // No CTA leaves while another may still read its histogram.
  if (cluster > 1) ClusterSync();
}

unsigned GridDim(int64_t v, int64_t cap) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(v, cap))); }

// One group's block scores.
template <typename T>
cudaError_t LaunchScores(const BlockTopkParams& p, const void* const* bases, cudaStream_t stream) {
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
    // 16-byte loads where rows are whole vectors and a block column is whole vectors wide,
    // or a vector whole block columns (narrow: each thread's own blocks).
    const bool rows_vec = aligned && p.cols % kVec == 0;
    const bool vec = rows_vec && p.tile_w % kVec == 0;
    const bool narrow =
        rows_vec && p.tile_w < kVec && kVec % p.tile_w == 0 && p.tile_h >= ScoreLoadsInFlight<kVec>();
    if (narrow) {
      const dim3 grid(GridDim(CeilDivHost(p.cols, kVec * kScoreThreads), 0x7fffffff), GridDim(groups, 65535),
                      static_cast<unsigned>(count));
      NarrowBlockScoresKernel<T, kVec><<<grid, kScoreThreads, 0, stream>>>(p, table, first, bands_per_group, groups);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      continue;
    }
    const int64_t lanes = vec ? p.tile_w / kVec : 0;
    if (p.tile_h == 1 && (lanes == 2 || lanes == 4 || lanes == 8) && p.cols % p.tile_w == 0) {
      // Every row's blocks from one flat grid of (8-row group, vector) threads.
      const int64_t threads = CeilDivHost(p.rows, ScoreLoadsInFlight<kVec>()) * (p.cols / kVec);
      const dim3 grid(GridDim(CeilDivHost(threads, kScoreThreads), 0x7fffffff), static_cast<unsigned>(count));
      auto kernel = lanes == 2 ? RowBlockScoresKernel<T, kVec, 2>
                               : (lanes == 4 ? RowBlockScoresKernel<T, kVec, 4> : RowBlockScoresKernel<T, kVec, 8>);
      kernel<<<grid, kScoreThreads, 0, stream>>>(p, table, first);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      continue;
    }
    const int64_t span = (vec ? kVec : 1) * kScoreThreads;
    const int64_t chunk = p.tile_w <= span ? p.tile_w * (span / p.tile_w) : p.tile_w;
    const dim3 grid(GridDim(CeilDivHost(p.cols, chunk), 0x7fffffff), GridDim(groups, 65535),
                    static_cast<unsigned>(count));
    // Thick bands of 16-byte loads take 16 in flight (two round trips a 32-row band, 3
    // CTAs an SM): 32x64 blocks of BERT's float32 kernels 99 -> 90 us a step (H200).
    // Thin bands keep 8 (16 made 1x32 strips slower: 127 -> 139 us).
    const bool thin = p.tile_h < (vec ? ScoreLoadsInFlight<kVec>() : ScoreLoadsInFlight<1>());
    auto kernel = vec ? (thin ? BlockScoresKernel<T, kVec, true>
                              : (p.tile_h >= 2 * ScoreLoadsInFlight<kVec>() ? BlockScoresKernel<T, kVec, false, 2>
                                                                            : BlockScoresKernel<T, kVec, false>))
                      : (thin ? BlockScoresKernel<T, 1, true> : BlockScoresKernel<T, 1, false>);
    kernel<<<grid, kScoreThreads, 0, stream>>>(p, table, first, chunk, bands_per_group, groups);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The selects of every group in one launch: a cluster of CTAs per matrix where the device
// has clusters (sm_90), as many as the group with the most scores needs (one per
// kSelectScoresPerCta, at most kSelectMaxCluster). The select is latency-bound: four
// launches for BERT's four kernel shapes cost ~4x one (block_topk_select_launches_*.txt).
cudaError_t LaunchSelect(const BlockTopkParams* groups, int n_groups, cudaStream_t stream) {
  const sm90::DeviceInfo* dev = sm90::GetDeviceInfo();
  const bool clusters = dev != nullptr && dev->sm90;
  SelectGroups s;
  s.count = n_groups;
  s.density = groups[0].density;
  int cluster = 1;
  int64_t total = 0;
  for (int g = 0; g < n_groups; ++g) {
    const int64_t nb = groups[g].tile_rows * groups[g].tile_cols;
    if (clusters)
      cluster = std::max(cluster, static_cast<int>(std::min<int64_t>(
                                      kSelectMaxCluster, std::max<int64_t>(1, CeilDivHost(nb, kSelectScoresPerCta)))));
    s.first[g] = total;
    s.blocks[g] = nb;
    s.scores[g] = groups[g].scores;
    s.live[g] = groups[g].live;
    s.thresholds[g] = groups[g].thresholds;
    total += groups[g].matrices;
  }
  s.first[n_groups] = total;
  for (int g = 0; g < n_groups; ++g) s.per[g] = CeilDivHost(CeilDivHost(s.blocks[g], cluster), 4) * 4;
  sm90::ClusterLaunch launch(cluster, kSelectThreads, 0, stream);
  for (int64_t first = 0; first < total; first += 65535) {
    const int64_t count = std::min<int64_t>(65535, total - first);
    launch.cfg.gridDim = dim3(static_cast<unsigned>(count * cluster));
    const cudaError_t err = cudaLaunchKernelEx(&launch.cfg, TopkSelectKernel, s, cluster, first);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchBlockTopk(const BlockTopkParams* groups, int n_groups, const void* const* bases,
                            cudaStream_t stream) {
  if (n_groups < 1 || n_groups > kTopkMaxGroups) return cudaErrorInvalidValue;
  for (int g = 0; g < n_groups; ++g) {
    const BlockTopkParams& p = groups[g];
    const cudaError_t err =
        WithFloatType(p.dtype, [&](auto t) { return LaunchScores<decltype(t)>(p, bases, stream); });
    if (err != cudaSuccess) return err;
    bases += p.matrices;
  }
  return LaunchSelect(groups, n_groups, stream);
}

}  // namespace pit

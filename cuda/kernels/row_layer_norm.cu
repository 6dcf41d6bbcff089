// pit_row_layer_norm on the GPU: one warp per list slot. A live slot normalizes its
// block's rows (held in registers up to 4 vectors per lane; longer rows take two passes,
// the second read hitting L1), a dead slot (the
// list's tail at full capacity) writes its rows' zeros, so every row is written once
// and only live rows are read.
#include "cuda/kernels/row_layer_norm.h"

#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/row_blocks.cuh"

namespace pit {
namespace {

using gemm::Elem;
using gemm::LoadF;
using gemm::StoreF;

constexpr int kWarps = 8;
// Two blocks an SM at most 128 registers a thread: room for the forward's scale and
// offset loaded with the row (kParamsFirst) without lowering residency below what the
// kernel had (87-89 registers gave two blocks too).
constexpr int kMinBlocks = 2;

// Rows of up to 3 vectors per lane (768 16-bit elements) load scale and offset with the
// row rather than after its statistics: one memory latency less on the live rows' path
// (H100, BERT b32's 25 norms: 5.8 -> 5.2 us each). At 4 vectors that spilled.
template <int kChunks>
constexpr bool kParamsFirst = kChunks > 0 && kChunks <= 3;

// v[0..V) = a (+ b when given) at column c, float32: a row and an optional second row
// added to it (the residual in the forward, a second consumer's cotangent in the backward).
template <typename T, int V>
__device__ __forceinline__ void LoadAdd(const T* a, const T* b, int64_t c, float (&v)[V]) {
  LoadF<T, V>(a + c, v);
  if (b) {
    float t[V];
    LoadF<T, V>(b + c, t);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += t[i];
  }
}

// h[0..V) = x + residual + bias at column c (float32).
template <typename T, int V>
__device__ __forceinline__ void Sum(const RowLayerNormParams& p, const T* x, const T* r, int64_t c, float (&h)[V]) {
  LoadAdd<T, V>(x, r, c, h);
  if (p.bias) {
#pragma unroll
    for (int i = 0; i < V; ++i) h[i] += __ldg(p.bias + c + i);
  }
}

struct RowStats {
  float mean, rstd;
};

// The sum of v over the warp's lanes, every lane getting it.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A row's mean and 1 / sqrt(variance + eps) from its lanes' partial sums of h and h^2
// (float32; the biased variance, as Flax's LayerNorm), every lane getting the result.
__device__ __forceinline__ RowStats WarpRowStats(float s, float s2, int64_t cols, float epsilon) {
  s = WarpSum(s), s2 = WarpSum(s2);
  const float inv_n = 1.f / static_cast<float>(cols);
  const float mean = s * inv_n;
  const float var = fmaxf(s2 * inv_n - mean * mean, 0.f);
  return {mean, rsqrtf(var + epsilon)};
}

template <typename T, int V>
__device__ void NormalizeRow(const RowLayerNormParams& p, int64_t row, int lane) {
  const T* x = static_cast<const T*>(p.x) + row * p.cols;
  const T* r = p.residual ? static_cast<const T*>(p.residual) + row * p.cols : nullptr;
  T* y = static_cast<T*>(p.y) + row * p.cols;
  float s = 0.f, s2 = 0.f;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < p.cols; c += 32 * V) {
    float h[V];
    Sum<T, V>(p, x, r, c, h);
#pragma unroll
    for (int i = 0; i < V; ++i) s += h[i], s2 += h[i] * h[i];
  }
  const RowStats st = WarpRowStats(s, s2, p.cols, p.epsilon);
  const float mean = st.mean, rstd = st.rstd;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < p.cols; c += 32 * V) {
    float h[V];
    Sum<T, V>(p, x, r, c, h);
#pragma unroll
    for (int i = 0; i < V; ++i) h[i] = (h[i] - mean) * (rstd * __ldg(p.scale + c + i)) + __ldg(p.offset + c + i);
    StoreF<T, V>(y + c, h);
  }
}

// Rows of at most 32 * V * kChunks elements, held in registers: h = x + residual + bias
// for the lane's chunks (float32) and the row's statistics, in one pass over the row (a
// two-pass loop was latency-bound: ~10 us per BERT-sized call). The loads are written
// before the first use, but LoadF converts at each load and ptxas waits for each chunk's
// x and residual before issuing the next chunk's (sm_90a SASS). Converting after all loads
// (gemm::LoadWords, as the row activation does) wants more registers than the two blocks
// an SM allow here and spilled: slower (docs/workloads.md, twenty-sixth session).
template <typename T, int V, int kChunks>
__device__ __forceinline__ RowStats LoadRowInRegisters(const RowLayerNormParams& p, int64_t row, int lane,
                                                       float (&h)[kChunks][V]) {
  static_assert(V % 4 == 0, "float32 vectors of 4");
  const T* x = static_cast<const T*>(p.x) + row * p.cols;
  const T* r = p.residual ? static_cast<const T*>(p.residual) + row * p.cols : nullptr;
  float t[kChunks][V];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < p.cols) {
      LoadF<T, V>(x + c, h[j]);
      if (r) LoadF<T, V>(r + c, t[j]);
    }
  }
  float s = 0.f, s2 = 0.f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < p.cols) {
      if (r) {
#pragma unroll
        for (int i = 0; i < V; ++i) h[j][i] += t[j][i];
      }
      if (p.bias) {
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float4 b = __ldg(reinterpret_cast<const float4*>(p.bias + c + i));
          h[j][i] += b.x, h[j][i + 1] += b.y, h[j][i + 2] += b.z, h[j][i + 3] += b.w;
        }
      }
#pragma unroll
      for (int i = 0; i < V; ++i) s += h[j][i], s2 += h[j][i] * h[j][i];
    }
  }
  return WarpRowStats(s, s2, p.cols, p.epsilon);
}

// NormalizeRow for rows held in registers (LoadRowInRegisters).
template <typename T, int V, int kChunks>
__device__ void NormalizeRowInRegisters(const RowLayerNormParams& p, int64_t row, int lane) {
  T* y = static_cast<T*>(p.y) + row * p.cols;
  float h[kChunks][V];
  float4 gs[kChunks][V / 4], os[kChunks][V / 4];  // scale and offset of the lane's columns
  auto load_params = [&](int j, int64_t c, int i) {
    gs[j][i / 4] = __ldg(reinterpret_cast<const float4*>(p.scale + c + i));
    os[j][i / 4] = __ldg(reinterpret_cast<const float4*>(p.offset + c + i));
  };
  if constexpr (kParamsFirst<kChunks>) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
      if (c < p.cols) {
#pragma unroll
        for (int i = 0; i < V; i += 4) load_params(j, c, i);
      }
    }
  }
  const RowStats st = LoadRowInRegisters<T, V, kChunks>(p, row, lane, h);
  const float mean = st.mean, rstd = st.rstd;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < p.cols) {
#pragma unroll
      for (int i = 0; i < V; i += 4) {
        if constexpr (!kParamsFirst<kChunks>) load_params(j, c, i);
        const float4 g = gs[j][i / 4], o = os[j][i / 4];
        h[j][i] = (h[j][i] - mean) * (rstd * g.x) + o.x;
        h[j][i + 1] = (h[j][i + 1] - mean) * (rstd * g.y) + o.y;
        h[j][i + 2] = (h[j][i + 2] - mean) * (rstd * g.z) + o.z;
        h[j][i + 3] = (h[j][i + 3] - mean) * (rstd * g.w) + o.w;
      }
      StoreF<T, V>(y + c, h[j]);
    }
  }
}

template <typename T, int V>
__device__ void ZeroRow(void* out, int64_t row, int64_t cols, int lane) {
  T* y = static_cast<T*>(out) + row * cols;
  const float z[V] = {};
  for (int64_t c = static_cast<int64_t>(lane) * V; c < cols; c += 32 * V) StoreF<T, V>(y + c, z);
}

// kChunks > 0: rows held in registers (NormalizeRowInRegisters); 0: the two-pass loop.
template <typename T, int V, int kChunks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) RowLayerNormKernel(const RowLayerNormParams p, bool dead_tail) {
  const int lane = threadIdx.x & 31;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (unit >= p.batch * p.capacity) return;
  bool normalize;
  int64_t id;
  if (!SlotBlock(p, unit, dead_tail, &normalize, &id)) return;  // without a dead tail y was zeroed before
  const int64_t b = unit / p.capacity;
  const int64_t r0 = id * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
  for (int64_t r = r0; r < r1; ++r) {
    if (normalize) {
      if constexpr (kChunks > 0)
        NormalizeRowInRegisters<T, V, kChunks>(p, b * p.rows + r, lane);
      else
        NormalizeRow<T, V>(p, b * p.rows + r, lane);
    }
    else
      ZeroRow<T, V>(p.y, b * p.rows + r, p.cols, lane);
  }
}

bool Aligned(const void* q, int bytes) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) % bytes) == 0; }

template <typename T>
cudaError_t Launch(const RowLayerNormParams& p, bool dead_tail, cudaStream_t stream) {
  const int64_t units = p.batch * p.capacity;
  const unsigned blocks = static_cast<unsigned>((units + kWarps - 1) / kWarps);
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename Elem<T>::Word));
  // 16-byte vectors when every row starts 16-byte aligned; the float32 vectors (bias,
  // scale, offset) are read per element, so they need no alignment beyond their type.
  const bool vec = (p.cols * static_cast<int64_t>(sizeof(typename Elem<T>::Word))) % 16 == 0 && Aligned(p.x, 16) &&
                   Aligned(p.residual, 16) && Aligned(p.y, 16);
  // Rows of up to 4 vectors per lane (1024 16-bit or 512 float32 elements) stay in
  // registers; that path also reads the float32 vectors 16 bytes at a time.
  const int64_t chunks = (p.cols + 32 * kVec - 1) / (32 * kVec);
  const bool regs = vec && Aligned(p.bias, 16) && Aligned(p.scale, 16) && Aligned(p.offset, 16);
  const dim3 grid(blocks), block(kWarps * 32);
  if (regs && chunks <= 1)
    RowLayerNormKernel<T, kVec, 1><<<grid, block, 0, stream>>>(p, dead_tail);
  else if (regs && chunks == 2)
    RowLayerNormKernel<T, kVec, 2><<<grid, block, 0, stream>>>(p, dead_tail);
  else if (regs && chunks == 3)
    RowLayerNormKernel<T, kVec, 3><<<grid, block, 0, stream>>>(p, dead_tail);
  else if (regs && chunks == 4)
    RowLayerNormKernel<T, kVec, 4><<<grid, block, 0, stream>>>(p, dead_tail);
  else if (vec)
    RowLayerNormKernel<T, kVec, 0><<<grid, block, 0, stream>>>(p, dead_tail);
  else
    RowLayerNormKernel<T, 1, 0><<<grid, block, 0, stream>>>(p, dead_tail);
  return cudaGetLastError();
}

// ---- backward -----------------------------------------------------------------------
// Per live row, with h = x + residual + bias, xhat = (h - mean) * rstd, g = dy (+ dy2):
//   dh = rstd * (g scale - mean(g scale) - xhat * mean(g scale xhat)),
// and the row adds g xhat, g and dh to the column sums of d scale, d offset and d bias.
// A warp takes every warps-th list slot; the column sums go through `work` in a fixed
// order (no atomics).

constexpr int kBwdWarps = 8;

// Row `row` of the optional second cotangent, or null.
template <typename T>
__device__ __forceinline__ const T* Dy2Row(const RowLayerNormBwdParams& q, int64_t row) {
  return q.dy2 ? static_cast<const T*>(q.dy2) + row * q.fwd.cols : nullptr;
}

// Rows of up to 2 vectors per lane load the scale with the row; at 3 that spilled under the
// 128 registers of two blocks an SM.
template <int kChunks>
constexpr bool kBwdParamsFirst = kChunks > 0 && kChunks <= 2;

// The row held in registers (LoadRowInRegisters), dy's loads and the scale's issued
// first; the row's terms of the column sums are added to the warp's slice `sums` [3, n] in
// shared memory (each lane its own columns: no race, the same order on every run), or, for
// the warp's first row (`first`), stored there: the slice is not zeroed first.
template <typename T, int V, int kChunks>
__device__ void BwdRowInRegisters(const RowLayerNormBwdParams& q, int64_t row, int lane, float* sums, bool first) {
  const RowLayerNormParams& p = q.fwd;
  const int64_t n = p.cols;
  const T* dy = static_cast<const T*>(q.dy) + row * n;
  const T* dy2 = Dy2Row<T>(q, row);
  float h[kChunks][V], g[kChunks][V];
  float4 sc[kChunks][V / 4];
  // dy2's 16 bytes a vector kept as loaded, added to g after the row's loads are issued
  // (added at once, its wait came before them: BERT b32's norms 12.1 us a call, not 11.5).
  uint4 g2[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < n) {
      LoadF<T, V>(dy + c, g[j]);
      if (dy2) g2[j] = *reinterpret_cast<const uint4*>(dy2 + c);
      if constexpr (kBwdParamsFirst<kChunks>) {
#pragma unroll
        for (int i = 0; i < V; i += 4) sc[j][i / 4] = __ldg(reinterpret_cast<const float4*>(p.scale + c + i));
      }
    }
  }
  const RowStats st = LoadRowInRegisters<T, V, kChunks>(p, row, lane, h);
  float a1 = 0.f, a2 = 0.f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < n) {
      if (dy2) {
        const auto* w = reinterpret_cast<const typename Elem<T>::Word*>(&g2[j]);
#pragma unroll
        for (int i = 0; i < V; ++i) g[j][i] += Elem<T>::ToFloat(w[i]);
      }
#pragma unroll
      for (int i = 0; i < V; i += 4) {
        if constexpr (!kBwdParamsFirst<kChunks>) sc[j][i / 4] = __ldg(reinterpret_cast<const float4*>(p.scale + c + i));
        const float scv[4] = {sc[j][i / 4].x, sc[j][i / 4].y, sc[j][i / 4].z, sc[j][i / 4].w};
        float4* s0 = reinterpret_cast<float4*>(sums + c + i);
        float4* s1 = reinterpret_cast<float4*>(sums + n + c + i);
        float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
        if (!first) v0 = *s0, v1 = *s1;
        float* w0 = &v0.x;
        float* w1 = &v1.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float xhat = (h[j][i + e] - st.mean) * st.rstd;
          w0[e] += g[j][i + e] * xhat;
          w1[e] += g[j][i + e];
          const float gs = g[j][i + e] * scv[e];
          h[j][i + e] = xhat;
          g[j][i + e] = gs;
          a1 += gs, a2 += gs * xhat;
        }
        *s0 = v0, *s1 = v1;
      }
    }
  }
  const float inv_n = 1.f / static_cast<float>(n);
  a1 = WarpSum(a1) * inv_n, a2 = WarpSum(a2) * inv_n;
  T* dh = static_cast<T*>(q.dh) + row * n;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < n) {
#pragma unroll
      for (int i = 0; i < V; i += 4) {
        float4* s2 = reinterpret_cast<float4*>(sums + 2 * n + c + i);
        float4 v2 = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!first) v2 = *s2;
        float* w2 = &v2.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          h[j][i + e] = st.rstd * (g[j][i + e] - a1 - h[j][i + e] * a2);
          w2[e] += h[j][i + e];
        }
        *s2 = v2;
      }
      StoreF<T, V>(dh + c, h[j]);
    }
  }
}

// Any row length and alignment: three passes over the row (the later ones from L1/L2),
// the column sums read and written in the warp's own slice `sums` [3, cols] (each lane
// owns its columns, so there is no race).
template <typename T, int V>
__device__ void BwdRow(const RowLayerNormBwdParams& q, int64_t row, int lane, float* sums) {
  const RowLayerNormParams& p = q.fwd;
  const int64_t n = p.cols;
  const T* x = static_cast<const T*>(p.x) + row * n;
  const T* r = p.residual ? static_cast<const T*>(p.residual) + row * n : nullptr;
  const T* dy = static_cast<const T*>(q.dy) + row * n;
  const T* dy2 = Dy2Row<T>(q, row);
  float s = 0.f, s2 = 0.f;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < n; c += 32 * V) {
    float h[V];
    Sum<T, V>(p, x, r, c, h);
#pragma unroll
    for (int i = 0; i < V; ++i) s += h[i], s2 += h[i] * h[i];
  }
  const RowStats st = WarpRowStats(s, s2, n, p.epsilon);
  float a1 = 0.f, a2 = 0.f;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < n; c += 32 * V) {
    float h[V], g[V];
    Sum<T, V>(p, x, r, c, h);
    LoadAdd<T, V>(dy, dy2, c, g);  // dy (+ dy2)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float xhat = (h[i] - st.mean) * st.rstd, gs = g[i] * __ldg(p.scale + c + i);
      a1 += gs, a2 += gs * xhat;
    }
  }
  const float inv_n = 1.f / static_cast<float>(n);
  a1 = WarpSum(a1) * inv_n, a2 = WarpSum(a2) * inv_n;
  T* dh = static_cast<T*>(q.dh) + row * n;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < n; c += 32 * V) {
    float h[V], g[V];
    Sum<T, V>(p, x, r, c, h);
    LoadAdd<T, V>(dy, dy2, c, g);  // dy (+ dy2)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float xhat = (h[i] - st.mean) * st.rstd;
      const float d = st.rstd * (g[i] * __ldg(p.scale + c + i) - a1 - xhat * a2);
      sums[c + i] += g[i] * xhat;
      sums[n + c + i] += g[i];
      sums[2 * n + c + i] += d;
      h[i] = d;
    }
    StoreF<T, V>(dh + c, h);
  }
}

// grid (ceil(warps / kBwdWarps), batch entries): warp w of entry b takes the list slots
// w, w + warps, ...: live ones, and with a dead tail the dead ones too (it writes their
// zeros; without one, dh was zeroed before). Rows held in registers (kChunks > 0): each
// warp stores its first row's terms of the column sums in its own slice of shared memory
// and adds the later rows' terms, then the block adds the slices of its warps that had a
// row, in warp order (zeros where none had one), and writes slice x of work. (Zeroing every
// slice first and adding the first row to it took ~0.8 us more of BERT b32's ~8.8.)
// Otherwise each warp adds into its own slice of work as it goes. (The sums in shared
// memory rather than registers: 72 fewer registers a thread, two blocks an SM instead of
// one, so twice the warps run at once and, at BERT's densities, none holds more than one
// live row; rows of 4 vectors a lane keep one block an SM, which spilled at two.)
template <typename T, int V, int kChunks>
__global__ void __launch_bounds__(kBwdWarps * 32, kChunks > 0 && kChunks <= 3 ? 2 : 1)
    RowLayerNormBwdKernel(const RowLayerNormBwdParams q, bool dead_tail) {
  const RowLayerNormParams& p = q.fwd;
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kBwdWarps + wib;
  const bool active = warp < q.warps;  // every thread stays for the block's barriers
  const int64_t n = p.cols;
  extern __shared__ float4 red4[];  // [kBwdWarps, 3, n] (kChunks > 0)
  float* red = reinterpret_cast<float*>(red4);
  __shared__ bool has_rows[kBwdWarps];  // whether warp w's slice holds a row's terms (kChunks > 0)
  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    float* sums = nullptr;
    bool seen = false;  // a row's terms are in the warp's slice
    if constexpr (kChunks > 0) {
      sums = red + wib * 3 * n;
    } else if (active) {
      sums = q.work + (b * q.warps + warp) * 3 * n;
      for (int64_t c = lane; c < 3 * n; c += 32) sums[c] = 0.f;
    }
    int64_t live = __ldg(p.count + b);
    live = live < 0 ? 0 : (live > p.capacity ? p.capacity : live);
    // With a dead tail (the list at full capacity) the warps also write the dead rows'
    // zeros, in place of a memset of all of dh before the kernel.
    const int64_t end = dead_tail ? p.capacity : live;
    // The warp's first 32 list entries in one read (lane i: its i-th slot), not one
    // dependent L2 round trip per slot before that slot's row can load.
    const int64_t first = active ? warp : end;
    int32_t entries = 0;
    if (first + lane * q.warps < end) entries = __ldg(p.tiles + b * p.capacity + first + lane * q.warps);
    int i = 0;
    for (int64_t slot = first; slot < end; slot += q.warps, ++i) {
      const int32_t entry = i < 32 ? __shfl_sync(0xffffffffu, entries, i) : __ldg(p.tiles + b * p.capacity + slot);
      const int64_t id = EntryBlock(entry, slot < live);
      if (id < 0 || id >= p.tile_rows) continue;  // not a row block of x
      const int64_t r0 = id * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
      for (int64_t r = r0; r < r1; ++r) {
        if (slot >= live)
          ZeroRow<T, V>(q.dh, b * p.rows + r, p.cols, lane);
        else if constexpr (kChunks > 0) {
          BwdRowInRegisters<T, V, kChunks>(q, b * p.rows + r, lane, sums, !seen);
          seen = true;
        } else
          BwdRow<T, V>(q, b * p.rows + r, lane, sums);
      }
    }
    if constexpr (kChunks > 0) {
      // The block's slice: the slices of its warps with a row added in warp order (the same
      // sums for the same list), zeros if none had one.
      if (lane == 0) has_rows[wib] = seen;
      __syncthreads();
      float* dst = q.work + (b * q.warps + blockIdx.x) * 3 * n;
      for (int64_t e = static_cast<int64_t>(threadIdx.x) * 4; e < 3 * n; e += kBwdWarps * 32 * 4) {
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < kBwdWarps; ++w) {
          if (!has_rows[w]) continue;
          const float4 v = *reinterpret_cast<const float4*>(red + w * 3 * n + e);
          s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        *reinterpret_cast<float4*>(dst + e) = s;
      }
      __syncthreads();  // the slices are read before the next entry's rows write them
    }
  }
}

// dvec[b, i] = sum over w of work[b, w, i], in the same order on every run: a block of
// 32 columns x 32 threads, thread y summing the slices y, y + 32, ... (up to 8 loads in
// flight), then the 32 partial sums in order. (8 threads a column took 3.2 us for the 256
// slices of BERT's 2048 warps, one dependent add chain of 32 loads a thread.) Every slice
// is read, the dead blocks' zeros too: bounding the loop by the live count made its loads
// wait for the count, and skipping the dead blocks' stores left their slices to be read
// from DRAM rather than L2 (BERT b32: 2.0 -> 3.0 and 2.5 us).
constexpr int kSumSplit = 32;

__global__ void __launch_bounds__(32 * kSumSplit) SumSlicesKernel(const float* work, int64_t slices,
                                                                  int64_t stride, int64_t n, int64_t batch,
                                                                  float* dvec) {
  __shared__ float part[kSumSplit][33];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const float* w = work + b * stride * n;
    float s = 0.f;
    if (i < n) {
#pragma unroll 8
      for (int64_t k = threadIdx.y; k < slices; k += kSumSplit) s += w[k * n + i];
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < n) {
      float t = 0.f;
#pragma unroll
      for (int j = 0; j < kSumSplit; ++j) t += part[j][threadIdx.x];
      dvec[b * n + i] = t;
    }
    __syncthreads();
  }
}

// Launches the backward kernel with `smem` bytes of shared memory (AllowDynamicSmem).
template <typename T, int V, int kChunks>
cudaError_t LaunchBwdKernel(const RowLayerNormBwdParams& q, bool dead_tail, dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream) {
  if (cudaError_t e = AllowDynamicSmem<RowLayerNormBwdKernel<T, V, kChunks>>(smem); e != cudaSuccess) return e;
  RowLayerNormBwdKernel<T, V, kChunks><<<grid, block, smem, stream>>>(q, dead_tail);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBwd(const RowLayerNormBwdParams& q, bool dead_tail, cudaStream_t stream) {
  const RowLayerNormParams& p = q.fwd;
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename Elem<T>::Word));
  const bool vec = (p.cols * static_cast<int64_t>(sizeof(typename Elem<T>::Word))) % 16 == 0 && Aligned(p.x, 16) &&
                   Aligned(p.residual, 16) && Aligned(q.dy, 16) && Aligned(q.dy2, 16) && Aligned(q.dh, 16);
  const int64_t chunks = (p.cols + 32 * kVec - 1) / (32 * kVec);
  // Rows of up to 4 vectors per lane in registers; otherwise three passes.
  const bool regs = vec && chunks <= 4 && Aligned(p.bias, 16) && Aligned(p.scale, 16) && Aligned(q.work, 16);
  const unsigned ys = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
  const int64_t blocks = (q.warps + kBwdWarps - 1) / kBwdWarps;
  const dim3 grid(static_cast<unsigned>(blocks), ys), block(kBwdWarps * 32);
  // The warps' column sums in shared memory on the register path: <= 96 KB (H <= 1024).
  const size_t red = static_cast<size_t>(kBwdWarps * 3 * p.cols) * sizeof(float);
  cudaError_t e;
  if (regs && chunks <= 1)
    e = LaunchBwdKernel<T, kVec, 1>(q, dead_tail, grid, block, red, stream);
  else if (regs && chunks == 2)
    e = LaunchBwdKernel<T, kVec, 2>(q, dead_tail, grid, block, red, stream);
  else if (regs && chunks == 3)
    e = LaunchBwdKernel<T, kVec, 3>(q, dead_tail, grid, block, red, stream);
  else if (regs)
    e = LaunchBwdKernel<T, kVec, 4>(q, dead_tail, grid, block, red, stream);
  else if (vec)
    e = LaunchBwdKernel<T, kVec, 0>(q, dead_tail, grid, block, 0, stream);
  else
    e = LaunchBwdKernel<T, 1, 0>(q, dead_tail, grid, block, 0, stream);
  if (e != cudaSuccess) return e;
  const int64_t n = 3 * p.cols;
  const int64_t slices = regs ? blocks : q.warps;  // a block's slice, or a warp's
  SumSlicesKernel<<<dim3(static_cast<unsigned>((n + 31) / 32), ys), dim3(32, kSumSplit), 0, stream>>>(
      q.work, slices, q.warps, n, p.batch, q.dvec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRowLayerNorm(const RowLayerNormParams& p, cudaStream_t stream) {
  if (p.batch * p.rows * p.cols == 0) return cudaSuccess;
  // The list's tail names the dead blocks only when it can hold every block. skip_dead:
  // no dead tail (dead slots return at once) and no zeroing, so dead rows stay unwritten.
  const bool dead_tail = p.capacity == p.tile_rows && !p.skip_dead;
  if (!dead_tail && !p.skip_dead) {
    const int64_t bytes = p.batch * p.rows * p.cols * DTypeBytes(p.dtype);
    cudaError_t e = cudaMemsetAsync(p.y, 0, static_cast<size_t>(bytes), stream);
    if (e != cudaSuccess) return e;
  }
  if (p.batch * p.capacity == 0) return cudaSuccess;
  return WithFloatType(p.dtype, [&](auto t) { return Launch<decltype(t)>(p, dead_tail, stream); });
}

}  // namespace pit

namespace pit {

cudaError_t LaunchRowLayerNormBwd(const RowLayerNormBwdParams& q, cudaStream_t stream) {
  const RowLayerNormParams& p = q.fwd;
  if (p.batch * p.cols == 0) return cudaSuccess;
  // Dead rows: with a dead tail the kernel's warps write their zeros (BERT fine-tuning,
  // 24 calls a step: no memset of all of dh); otherwise a memset zeroes dh first.
  const bool dead_tail = p.capacity == p.tile_rows && p.capacity > 0;
  if (p.rows > 0 && !dead_tail) {
    cudaError_t e = cudaMemsetAsync(q.dh, 0, static_cast<size_t>(p.batch * p.rows * p.cols * DTypeBytes(p.dtype)), stream);
    if (e != cudaSuccess) return e;
  }
  if (p.rows == 0 || p.capacity == 0)  // no row: every sum is 0
    return cudaMemsetAsync(q.dvec, 0, static_cast<size_t>(p.batch * 3 * p.cols * 4), stream);
  return WithFloatType(p.dtype, [&](auto t) { return LaunchBwd<decltype(t)>(q, dead_tail, stream); });
}

}  // namespace pit

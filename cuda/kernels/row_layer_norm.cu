// pit_row_layer_norm on the GPU: one warp per list slot. A live slot normalizes its
// block's rows (held in registers up to 4 vectors per lane; longer rows take two passes,
// the second read hitting L1), a dead slot (the
// list's tail at full capacity) writes its rows' zeros, so every row is written once
// and only live rows are read.
#include "cuda/kernels/row_layer_norm.h"

#include <cstdint>

#include "cuda/kernels/elem_types.cuh"

namespace pit {
namespace {

using gemm::Elem;

constexpr int kWarps = 8;

// V consecutive elements at p as floats: one 16-byte load when V words make 16 bytes.
template <typename T, int V>
__device__ __forceinline__ void LoadF(const T* p, float (&f)[V]) {
  using W = typename Elem<T>::Word;
  if constexpr (V * sizeof(W) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const W* w = reinterpret_cast<const W*>(&u);
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = Elem<T>::ToFloat(w[i]);
  } else {
    const W* w = reinterpret_cast<const W*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = Elem<T>::ToFloat(w[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreF(T* p, const float (&f)[V]) {
  using W = typename Elem<T>::Word;
  W w[V];
#pragma unroll
  for (int i = 0; i < V; ++i) w[i] = Elem<T>::FromFloat(f[i]);
  if constexpr (V * sizeof(W) == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(w);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) reinterpret_cast<W*>(p)[i] = w[i];
  }
}

// h[0..V) = x + residual + bias at column c (float32).
template <typename T, int V>
__device__ __forceinline__ void Sum(const RowLayerNormParams& p, const T* x, const T* r, int64_t c, float (&h)[V]) {
  LoadF<T, V>(x + c, h);
  if (r) {
    float t[V];
    LoadF<T, V>(r + c, t);
#pragma unroll
    for (int i = 0; i < V; ++i) h[i] += t[i];
  }
  if (p.bias) {
#pragma unroll
    for (int i = 0; i < V; ++i) h[i] += __ldg(p.bias + c + i);
  }
}

struct RowStats {
  float mean, rstd;
};

// A row's mean and 1 / sqrt(variance + eps) from its lanes' partial sums of h and h^2
// (float32; the biased variance, as Flax's LayerNorm), every lane getting the result.
__device__ __forceinline__ RowStats WarpRowStats(float s, float s2, int64_t cols, float epsilon) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    s2 += __shfl_xor_sync(0xffffffffu, s2, o);
  }
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

// NormalizeRow for rows of at most 32 * V * kChunks elements: the row stays in
// registers, and every load of a lane (x, residual and the float32 vectors) is issued
// before the first use, so a row costs one memory latency rather than one per chunk and
// pass (the two-pass loop above was latency-bound: ~10 us per BERT-sized call).
template <typename T, int V, int kChunks>
__device__ void NormalizeRowInRegisters(const RowLayerNormParams& p, int64_t row, int lane) {
  static_assert(V % 4 == 0, "float32 vectors of 4");
  const T* x = static_cast<const T*>(p.x) + row * p.cols;
  const T* r = p.residual ? static_cast<const T*>(p.residual) + row * p.cols : nullptr;
  T* y = static_cast<T*>(p.y) + row * p.cols;
  float h[kChunks][V];
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
  const RowStats st = WarpRowStats(s, s2, p.cols, p.epsilon);
  const float mean = st.mean, rstd = st.rstd;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * V;
    if (c < p.cols) {
#pragma unroll
      for (int i = 0; i < V; i += 4) {
        const float4 g = __ldg(reinterpret_cast<const float4*>(p.scale + c + i));
        const float4 o = __ldg(reinterpret_cast<const float4*>(p.offset + c + i));
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
__device__ void ZeroRow(const RowLayerNormParams& p, int64_t row, int lane) {
  T* y = static_cast<T*>(p.y) + row * p.cols;
  const float z[V] = {};
  for (int64_t c = static_cast<int64_t>(lane) * V; c < p.cols; c += 32 * V) StoreF<T, V>(y + c, z);
}

// kChunks > 0: rows held in registers (NormalizeRowInRegisters); 0: the two-pass loop.
template <typename T, int V, int kChunks>
__global__ void __launch_bounds__(kWarps * 32) RowLayerNormKernel(const RowLayerNormParams p, bool dead_tail) {
  const int lane = threadIdx.x & 31;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (unit >= p.batch * p.capacity) return;
  const int64_t b = unit / p.capacity, slot = unit - b * p.capacity;
  int64_t live = __ldg(p.count + b);
  live = live < 0 ? 0 : (live > p.capacity ? p.capacity : live);
  const int32_t entry = __ldg(p.tiles + unit);
  int64_t id;
  bool normalize;
  if (slot < live) {
    id = entry, normalize = true;
  } else if (dead_tail) {
    id = -1 - static_cast<int64_t>(entry), normalize = false;
  } else {
    return;  // y was zeroed before
  }
  if (id < 0 || id >= p.tile_rows) return;  // not a row block of x
  const int64_t r0 = id * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
  for (int64_t r = r0; r < r1; ++r) {
    if (normalize) {
      if constexpr (kChunks > 0)
        NormalizeRowInRegisters<T, V, kChunks>(p, b * p.rows + r, lane);
      else
        NormalizeRow<T, V>(p, b * p.rows + r, lane);
    }
    else
      ZeroRow<T, V>(p, b * p.rows + r, lane);
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

}  // namespace

cudaError_t LaunchRowLayerNorm(const RowLayerNormParams& p, cudaStream_t stream) {
  if (p.batch * p.rows * p.cols == 0) return cudaSuccess;
  // The list's tail names the dead blocks only when it can hold every block.
  const bool dead_tail = p.capacity == p.tile_rows;
  if (!dead_tail) {
    const int64_t bytes = p.batch * p.rows * p.cols * DTypeBytes(p.dtype);
    cudaError_t e = cudaMemsetAsync(p.y, 0, static_cast<size_t>(bytes), stream);
    if (e != cudaSuccess) return e;
  }
  if (p.batch * p.capacity == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF32:
      return Launch<float>(p, dead_tail, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(p, dead_tail, stream);
    case DType::kF16:
      return Launch<__half>(p, dead_tail, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pit

// Element types of the float operands as raw words (copies move bits; math converts
// to float32 and rounds once to nearest even on the way back).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// Host side: f(T{}) with T the element type of `dtype` (float, __nv_bfloat16, __half), the
// launchers' one dispatch on the FFI dtype; cudaErrorInvalidValue for any other value.
template <typename F>
cudaError_t WithFloatType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF16:
      return f(__half{});
  }
  return cudaErrorInvalidValue;
}

namespace gemm {

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Word = uint32_t;
  static __device__ __forceinline__ float ToFloat(uint32_t w) { return __uint_as_float(w); }
  static __device__ __forceinline__ uint32_t FromFloat(float x) { return __float_as_uint(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Word = uint16_t;
  static __device__ __forceinline__ float ToFloat(uint16_t w) { return __uint_as_float(static_cast<uint32_t>(w) << 16); }
  static __device__ __forceinline__ uint16_t FromFloat(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  // Two values in one 32-bit word (lo in the low half), as mma.sync fragments hold them.
  static __device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 Unpack2(uint32_t w) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  }
};
template <>
struct Elem<__half> {
  using Word = uint16_t;
  static __device__ __forceinline__ float ToFloat(uint16_t w) { return __half2float(__ushort_as_half(w)); }
  static __device__ __forceinline__ uint16_t FromFloat(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 Unpack2(uint32_t w) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
};

// Two values of one row at columns n, n + 1 of a 16-bit result (p = that row's element n,
// the next column `step` words on), each rounded once: one 4-byte store where `vec`
// (contiguous columns, the row pitch and n even) and the pair ends by n_hi, else element by
// element up to n_hi.
template <typename T>
__device__ __forceinline__ void StorePair(typename Elem<T>::Word* p, int64_t step, bool vec, int n, int n_hi,
                                          float v0, float v1) {
  static_assert(sizeof(typename Elem<T>::Word) == 2, "pairs of 16-bit values");
  if (vec && n + 2 <= n_hi) {
    *reinterpret_cast<uint32_t*>(p) = Elem<T>::FromFloat(v0) | (static_cast<uint32_t>(Elem<T>::FromFloat(v1)) << 16);
  } else {
    if (n < n_hi) p[0] = Elem<T>::FromFloat(v0);
    if (n + 1 < n_hi) p[step] = Elem<T>::FromFloat(v1);
  }
}

// Four values of one row at columns n .. n + 3 of a result (p = that row's element n, the
// next columns `step` words apart), each rounded once: one 16- or 8-byte store where `vec`
// (contiguous columns, the row pitch and n multiples of 4) and the quad ends by n_hi, else
// element by element up to n_hi.
template <typename T>
__device__ __forceinline__ void StoreQuad(typename Elem<T>::Word* p, int64_t step, bool vec, int n, int n_hi,
                                          float v0, float v1, float v2, float v3) {
  if (vec && n + 4 <= n_hi) {
    if constexpr (sizeof(typename Elem<T>::Word) == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(v0, v1, v2, v3);
    } else {
      *reinterpret_cast<uint2*>(p) =
          make_uint2(Elem<T>::FromFloat(v0) | (static_cast<uint32_t>(Elem<T>::FromFloat(v1)) << 16),
                     Elem<T>::FromFloat(v2) | (static_cast<uint32_t>(Elem<T>::FromFloat(v3)) << 16));
    }
  } else {
    if (n < n_hi) p[0] = Elem<T>::FromFloat(v0);
    if (n + 1 < n_hi) p[step] = Elem<T>::FromFloat(v1);
    if (n + 2 < n_hi) p[2 * step] = Elem<T>::FromFloat(v2);
    if (n + 3 < n_hi) p[3 * step] = Elem<T>::FromFloat(v3);
  }
}

// V elements at p as loaded, unconverted (LoadWords), and as floats (ToFloats). Kernels
// that keep several vectors in flight load them all into Words first and convert after:
// LoadF's conversion next to its load, inside a `c < n` branch, made ptxas wait for each
// load before issuing the next (one memory round trip per vector: BERT's row kernels).
template <typename T, int V>
struct alignas(V * sizeof(typename Elem<T>::Word) == 16 ? 16 : alignof(typename Elem<T>::Word)) Words {
  typename Elem<T>::Word w[V];
};

template <typename T, int V>
__device__ __forceinline__ void LoadWords(const T* p, Words<T, V>& r) {
  using W = typename Elem<T>::Word;
  if constexpr (V * sizeof(W) == 16) {
    *reinterpret_cast<uint4*>(r.w) = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r.w[i] = reinterpret_cast<const W*>(p)[i];
  }
}

template <typename T, int V>
__device__ __forceinline__ void ToFloats(const Words<T, V>& r, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = Elem<T>::ToFloat(r.w[i]);
}

// V consecutive elements at p as floats, and back (rounded once): one 16-byte access when
// V words make 16 bytes (p then 16-byte aligned), else word by word.
template <typename T, int V>
__device__ __forceinline__ void LoadF(const T* p, float (&f)[V]) {
  Words<T, V> w;
  LoadWords<T, V>(p, w);
  ToFloats<T, V>(w, f);
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

// 16 bytes of words <-> uint4 (word 0 in the low bits, as in memory).
__device__ __forceinline__ uint4 Pack(const uint32_t (&w)[4]) { return make_uint4(w[0], w[1], w[2], w[3]); }
__device__ __forceinline__ uint4 Pack(const uint16_t (&w)[8]) {
  return make_uint4(w[0] | (static_cast<uint32_t>(w[1]) << 16), w[2] | (static_cast<uint32_t>(w[3]) << 16),
                    w[4] | (static_cast<uint32_t>(w[5]) << 16), w[6] | (static_cast<uint32_t>(w[7]) << 16));
}
__device__ __forceinline__ void Unpack(const uint4& v, uint32_t (&w)[4]) {
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}
__device__ __forceinline__ void Unpack(const uint4& v, uint16_t (&w)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[2 * i] = static_cast<uint16_t>(u[i] & 0xffffu);
    w[2 * i + 1] = static_cast<uint16_t>(u[i] >> 16);
  }
}

}  // namespace gemm
}  // namespace pit

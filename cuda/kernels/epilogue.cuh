// The row-gather product's fused epilogue on the device: v -> act(v + bias[n]), rounded
// once to C's dtype by the caller. Dead rows are a copy of the `dead` row (the caller
// computes act(bias) once: per element here, the fill warps would turn compute-bound).
// Shared by the generic kernel (sparse_gemm_kernel.cuh) and the Hopper one
// (sm90/row_gather_gemm.cuh).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// Phi(v), the standard normal CDF, for jax.nn.gelu(v, approximate=False) = v Phi(v) and
// its derivative: with a = |v| / sqrt(2), erfc(a) = 2^(-a (1 + q(a))), q a degree-9
// polynomial fitted here (weighted least squares, coefficients rounded to float32) on
// a in [0, 4]; Phi = 1 - erfc(a) / 2 for v >= 0, erfc(a) / 2 below (0 past a ~ 9.2).
// gelu's relative error <= 4e-6 for v >= -5.66 (<= 5e-7 for |v| <= 1), below 2e-13
// absolute past it, where v (1 + erf) / 2 loses the negative tail to cancellation. ~16
// instructions, one MUFU.EX2, no branch, against ~25 and a branch for erff: the 16-bit
// epilogue of BERT's FFN-in product is bound by issuing them (sm90_row_gather.md, stop 42).
__device__ __forceinline__ float NormalCdf(float v) {
  const float a = fabsf(v * 0.70710678118654752f);
  float q = 5.219052355e-07f;
  q = fmaf(q, a, -1.187794078e-05f);
  q = fmaf(q, a, 1.156906583e-04f);
  q = fmaf(q, a, -6.069309893e-04f);
  q = fmaf(q, a, 1.575988950e-03f);
  q = fmaf(q, a, 1.026122249e-03f);
  q = fmaf(q, a, -2.873083204e-02f);
  q = fmaf(q, a, 1.488070339e-01f);
  q = fmaf(q, a, 9.183238745e-01f);
  q = fmaf(q, a, 1.627916932e+00f);  // 1 + q's constant term
  float h;                            // erfc(a) / 2 = 2^(-a (1 + q) - 1)
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(h) : "f"(fmaf(q, -a, -1.0f)));
  return v >= 0.0f ? 1.0f - h : h;  // NaN -> NaN
}

// The formulas of jax.nn.relu, gelu (approximate=True: tanh; False: erf) and silu, in
// float32; kAct an Activation code (anything else: the identity).
template <int kAct>
__device__ __forceinline__ float ActivateT(float v) {
  if constexpr (kAct == static_cast<int>(Activation::kRelu)) {
    // max.NaN (sm_80+): NaN stays NaN, as in jax.nn.relu; fmaxf(NaN, 0) would give 0.
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(v));
    return r;
  } else if constexpr (kAct == static_cast<int>(Activation::kGeluTanh)) {
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  } else if constexpr (kAct == static_cast<int>(Activation::kGeluErf)) {
    return v * NormalCdf(v);  // +inf -> +inf; -inf, NaN -> NaN, as jax.nn.gelu
  } else if constexpr (kAct == static_cast<int>(Activation::kSilu)) {
    return v / (1.0f + expf(-v));
  } else {
    return v;
  }
}

// The same with the code known at run time (a branch per call: for rolled loops).
__device__ __forceinline__ float Activate(float v, int act) {
  switch (act) {
    case static_cast<int>(Activation::kRelu): return ActivateT<static_cast<int>(Activation::kRelu)>(v);
    case static_cast<int>(Activation::kGeluTanh): return ActivateT<static_cast<int>(Activation::kGeluTanh)>(v);
    case static_cast<int>(Activation::kGeluErf): return ActivateT<static_cast<int>(Activation::kGeluErf)>(v);
    case static_cast<int>(Activation::kSilu): return ActivateT<static_cast<int>(Activation::kSilu)>(v);
    default: return v;
  }
}

// d act / dv at v (float32): the derivatives jax.nn's formulas have under autodiff
// (relu: 1 where v > 0, else 0); kAct as ActivateT.
template <int kAct>
__device__ __forceinline__ float ActivateGradT(float v) {
  if constexpr (kAct == static_cast<int>(Activation::kRelu)) {
    return v > 0.0f ? 1.0f : 0.0f;
  } else if constexpr (kAct == static_cast<int>(Activation::kGeluTanh)) {
    const float k = 0.7978845608028654f, t = tanhf(k * (v + 0.044715f * v * v * v));
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * v * v);
  } else if constexpr (kAct == static_cast<int>(Activation::kGeluErf)) {
    float e;  // exp(-v^2 / 2)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * (v * -0.72134752044448170f)));
    return NormalCdf(v) + v * 0.3989422804014327f * e;
  } else if constexpr (kAct == static_cast<int>(Activation::kSilu)) {
    const float sg = 1.0f / (1.0f + expf(-v));
    return sg * (1.0f + v * (1.0f - sg));
  } else {
    return 1.0f;
  }
}

struct EpilogueDev {
  const void* bias = nullptr;  // [n_limit] in `dtype` (or float32: bias_f32), or null
  const char* dead = nullptr;  // [n_limit] in `dtype`: the dead rows' value, or null (zeros)
  char* pre = nullptr;         // Epilogue::pre: v + bias on the live rows, laid out as C, or null
  int act = 0;
  int dtype = 0;    // DType of C and the bias
  int n_limit = 0;  // N: columns at or past it read no bias (their results are dropped)
  bool on = false;  // anything to do on live rows
  bool bias_f32 = false;  // a float32 bias for a 16-bit C, rounded to `dtype` per value
  bool skip_dead = false;  // Epilogue::skip_dead: the dead rows are left unwritten

  static EpilogueDev From(const Epilogue& e, DType t, int64_t n) {
    EpilogueDev d;
    d.bias = e.bias;
    d.dead = static_cast<const char*>(e.dead);
    d.pre = static_cast<char*>(e.pre);
    d.act = static_cast<int>(e.act);
    d.dtype = static_cast<int>(t);
    d.n_limit = static_cast<int>(n);
    d.on = !e.Trivial();
    d.bias_f32 = e.bias_f32;
    d.skip_dead = e.skip_dead;
    return d;
  }

  __device__ __forceinline__ float Bias(int n) const {
    if (!bias || n >= n_limit) return 0.0f;
    if (dtype == static_cast<int>(DType::kF32)) return __ldg(static_cast<const float*>(bias) + n);
    if (bias_f32) {  // rounded to C's dtype, as a cast beforehand would
      const float b = __ldg(static_cast<const float*>(bias) + n);
      if (dtype == static_cast<int>(DType::kBF16)) return __bfloat162float(__float2bfloat16_rn(b));
      return __half2float(__float2half_rn(b));
    }
    const unsigned short w = __ldg(static_cast<const unsigned short*>(bias) + n);
    if (dtype == static_cast<int>(DType::kBF16)) return __uint_as_float(static_cast<uint32_t>(w) << 16);
    return __half2float(__ushort_as_half(w));
  }
  __device__ __forceinline__ float Apply(float v, int n) const { return Activate(v + Bias(n), act); }
};

}  // namespace pit

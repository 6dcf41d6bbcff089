// Helpers the CPU handlers share: half-precision conversions done on the bits (round
// to nearest even, same result on every host), typed row load/store by DType, float
// views of operands, and output poisoning.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/common/matmul_params.h"
#include "cuda/common/row_blocks.h"
#include "cuda/ffi/ffi_common.h"

namespace pit {
namespace cpu {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quieted, so truncation cannot make it Inf).
inline uint16_t FloatToBF16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + bias) >> 16);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, with subnormals, overflow to Inf and NaN kept quiet.
inline uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x >= 0x7f800000u) {
    if (x == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {                          // below 2^-14: subnormal result
    if (x < 0x33000000u) return sign;              // below 2^-25 rounds to zero
    const uint32_t e = x >> 23;                    // 102..112
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;               // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = x - 0x38000000u;  // rebias the exponent from 127 to 15
  uint32_t h = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
  return static_cast<uint16_t>(sign | h);
}

// n elements of dtype t starting at element `offset` of src -> float dst.
inline void LoadRow(DType t, const void* src, int64_t offset, int64_t n, float* dst) {
  if (n <= 0) return;  // empty buffers may have null data
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(src) + offset, n * sizeof(float));
      break;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(s[i]);
      break;
    }
  }
}

// v[0..n) rounded to dtype t (in place, still float).
inline void RoundTo(DType t, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::kBF16) v[i] = BF16ToFloat(FloatToBF16(v[i]));
    if (t == DType::kF16) v[i] = F16ToFloat(FloatToF16(v[i]));
  }
}

// n floats -> dtype t at element `offset` of dst, each rounded once.
inline void StoreRow(DType t, const float* src, int64_t n, void* dst, int64_t offset) {
  if (n <= 0) return;
  switch (t) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(dst) + offset, src, n * sizeof(float));
      break;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToBF16(src[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToF16(src[i]);
      break;
    }
  }
}

// One stored batch entry [rows, cols] as a float matrix, transposed on request, so the
// products below always read contiguous rows. float32 without a transpose is used in
// place; anything else is converted once into `own`.
class FloatMatrix {
 public:
  // Logical shape after the optional transpose: [out_rows, out_cols].
  void Load(DType t, const void* base, int64_t entry, int64_t rows, int64_t cols, bool transpose) {
    const int64_t offset = entry * rows * cols;
    out_cols_ = transpose ? rows : cols;
    if (t == DType::kF32 && !transpose) {
      data_ = static_cast<const float*>(base) + offset;
      return;
    }
    own_.resize(static_cast<size_t>(rows * cols));
    if (!transpose) {
      LoadRow(t, base, offset, rows * cols, own_.data());
    } else {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        LoadRow(t, base, offset + r * cols, cols, row.data());
        for (int64_t c = 0; c < cols; ++c) own_[c * rows + r] = row[c];
      }
    }
    data_ = own_.data();
  }
  const float* row(int64_t r) const { return data_ + r * out_cols_; }

 private:
  std::vector<float> own_;
  const float* data_ = nullptr;
  int64_t out_cols_ = 0;
};

// Caches the last loaded entry, so a shared (unbatched) operand converts once.
class CachedMatrix {
 public:
  CachedMatrix(const MatrixRef& m, DType t, bool transpose) : m_(m), t_(t), transpose_(transpose) {}
  const FloatMatrix& Get(int64_t entry) {
    if (entry != loaded_) {
      mat_.Load(t_, m_.data, entry, m_.rows, m_.cols, transpose_);
      loaded_ = entry;
    }
    return mat_;
  }

 private:
  MatrixRef m_;
  DType t_;
  bool transpose_;
  int64_t loaded_ = -1;
  FloatMatrix mat_;
};

// Writes a float accumulator acc [rows, cols] into C's entry `entry`, transposing when
// C is stored the other way round ([cols, rows]). One rounding per element.
inline void StoreMatrix(DType t, const float* acc, int64_t rows, int64_t cols, bool transpose, void* c,
                        int64_t entry) {
  const int64_t offset = entry * rows * cols;
  if (!transpose) {
    StoreRow(t, acc, rows * cols, c, offset);
    return;
  }
  std::vector<float> row(static_cast<size_t>(rows));
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) row[i] = acc[i * cols + j];
    StoreRow(t, row.data(), rows, c, offset + j * rows);
  }
}

// acc[0:n] += a * b[0:n]: the inner loop of every product (vectorizes at -O2).
inline void Axpy(float a, const float* __restrict b, float* __restrict acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += a * b[j];
}

// Rows updated together: each row of R is loaded once for all of them, which cuts the
// memory traffic of a product by this factor (one row at a time is bandwidth-bound).
constexpr int kRowBlock = 4;

inline void Axpy4(float a0, float a1, float a2, float a3, const float* __restrict b, float* __restrict o0,
                  float* __restrict o1, float* __restrict o2, float* __restrict o3, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float bj = b[j];
    o0[j] += a0 * bj;
    o1[j] += a1 * bj;
    o2[j] += a2 * bj;
    o3[j] += a3 * bj;
  }
}

// For r < rows (<= kRowBlock): out[r][0:n] += sum over k in [k0, k1) of
// l[r][k] * R.row(k)[col0 : col0 + n]. Each element sums over k in ascending order,
// exactly as a one-row loop would.
inline void UpdateRows(int rows, const float* const* l, float* const* out, const FloatMatrix& r, int64_t col0,
                       int64_t k0, int64_t k1, int64_t n) {
  if (rows == kRowBlock) {
    for (int64_t k = k0; k < k1; ++k)
      Axpy4(l[0][k], l[1][k], l[2][k], l[3][k], r.row(k) + col0, out[0], out[1], out[2], out[3], n);
    return;
  }
  for (int i = 0; i < rows; ++i)
    for (int64_t k = k0; k < k1; ++k) Axpy(l[i][k], r.row(k) + col0, out[i], n);
}

// Live entries of a list: min(count, capacity), and none for a negative count.
inline int64_t LiveCount(int32_t count, int64_t capacity) {
  if (count <= 0) return 0;
  return count < capacity ? count : capacity;
}

// Calls f(b, off) for every row of the row blocks listed for each batch entry b, in list
// order (off: the row's first element); slots past the count and ids out of range are
// skipped. The row-wise targets' walk (cuda/common/row_blocks.h).
template <class F>
void ForListedRows(const RowBlocks& p, F&& f) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t live = LiveCount(p.count[b], p.capacity);
    for (int64_t s = 0; s < live; ++s) {
      const int64_t id = p.tiles[b * p.capacity + s];
      if (id < 0 || id >= p.tile_rows) continue;  // not a row block of the matrix
      for (int64_t r = id * p.tile_h; r < std::min((id + 1) * p.tile_h, p.rows); ++r) f(b, (b * p.rows + r) * p.cols);
    }
  }
}

// memset that accepts the null data of an empty buffer.
inline void Zero(void* data, int64_t bytes) {
  if (bytes > 0) std::memset(data, 0, static_cast<size_t>(bytes));
}

// NaN in every float dtype (all-one bytes): rows left unspecified (skip_dead) on the CPU.
inline void FillNaN(void* data, int64_t bytes) {
  if (bytes > 0) std::memset(data, 0xff, static_cast<size_t>(bytes));
}

// Debug poisoning (docs/kernels.md): NaN bytes everywhere before computing.
inline void Poison(void* data, size_t bytes) {
  if (PoisonOutputs() && data != nullptr && bytes > 0) std::memset(data, 0xff, bytes);
}

// The epilogues' activations (the formulas of cuda/kernels/epilogue.cuh, on the host).
inline float Activate(float v, Activation act) {
  switch (act) {
    case Activation::kRelu: return v < 0.0f ? 0.0f : v;  // NaN stays NaN, as on the device
    case Activation::kGeluTanh: return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case Activation::kGeluErf: return 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
    case Activation::kSilu: return v / (1.0f + std::exp(-v));
    default: return v;
  }
}

// d Activate / dv (the device's ActivateGrad, on the host).
inline float ActivateGrad(float v, Activation act) {
  switch (act) {
    case Activation::kRelu: return v > 0.0f ? 1.0f : 0.0f;
    case Activation::kGeluTanh: {
      const float k = 0.7978845608028654f, t = std::tanh(k * (v + 0.044715f * v * v * v));
      return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * v * v);
    }
    case Activation::kGeluErf:
      return 0.5f * (1.0f + std::erf(v * 0.7071067811865476f)) + v * 0.3989422804014327f * std::exp(-0.5f * v * v);
    case Activation::kSilu: {
      const float sg = 1.0f / (1.0f + std::exp(-v));
      return sg * (1.0f + v * (1.0f - sg));
    }
    default: return 1.0f;
  }
}

}  // namespace cpu
}  // namespace pit

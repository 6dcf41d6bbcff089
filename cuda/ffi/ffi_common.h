// Shared helpers for pit_jax's XLA FFI handlers (CPU and CUDA).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace pit {

namespace ffi = ::xla::ffi;

// An invalid-argument error, convertible to any ffi::ErrorOr<T>.
inline ffi::Unexpected<ffi::Error> InvalidArg(const std::string& msg) {
  return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument(msg));
}

// Trailing-2-D view of a buffer [..., rows, cols]: leading dims flatten into `batch`.
struct Matrix2D {
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
};

inline ffi::ErrorOr<Matrix2D> AsBatchedMatrix(ffi::AnyBuffer::Dimensions dims, const char* what) {
  if (dims.size() < 2) {
    return InvalidArg(std::string(what) + ": expected rank >= 2, got rank " + std::to_string(dims.size()));
  }
  Matrix2D m;
  for (size_t i = 0; i + 2 < dims.size(); ++i) m.batch *= dims[i];
  m.rows = dims[dims.size() - 2];
  m.cols = dims[dims.size() - 1];
  return m;
}

// Debug switch (tests): handlers fill their outputs with 0xFF bytes (NaN for floats)
// before computing, so elements a kernel fails to write are caught. One flag per
// binding module, set through its set_poison_outputs().
inline std::atomic<bool>& PoisonOutputs() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Debug counter (tests): how many times this module's handlers ran on the host. A
// handler captured in an XLA command buffer (CUDA graph) is not re-run on replay, so
// tests can see that capture happened.
inline std::atomic<int64_t>& HandlerCalls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether two dimension lists are equal.
template <class Dims>
inline bool SameDims(const Dims& a, const Dims& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// "[d0, d1, ...]", for error messages.
template <class Dims>
inline std::string DimsString(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Product of the leading `n` dims.
template <typename Dims>
inline int64_t LeadingProduct(const Dims& dims, size_t n) {
  int64_t p = 1;
  for (size_t i = 0; i < n && i < dims.size(); ++i) p *= dims[i];
  return p;
}


}  // namespace pit

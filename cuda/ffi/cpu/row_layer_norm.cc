// pit_row_layer_norm on the CPU: the same semantics as the kernel (float32 math, one
// rounding), row by row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/row_layer_norm_args.h"

namespace pit {
namespace {

void RowLayerNorm(const RowLayerNormParams& p) {
  const int64_t es = DTypeBytes(p.dtype);
  cpu::Zero(p.y, p.batch * p.rows * p.cols * es);  // dead rows
  std::vector<float> h(p.cols), t(p.cols);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t live = cpu::LiveCount(p.count[b], p.capacity);
    for (int64_t s = 0; s < live; ++s) {
      const int64_t id = p.tiles[b * p.capacity + s];
      if (id < 0 || id >= p.tile_rows) continue;  // not a row block of x
      for (int64_t r = id * p.tile_h; r < std::min((id + 1) * p.tile_h, p.rows); ++r) {
        const int64_t off = (b * p.rows + r) * p.cols;
        cpu::LoadRow(p.dtype, p.x, off, p.cols, h.data());
        if (p.residual) {
          cpu::LoadRow(p.dtype, p.residual, off, p.cols, t.data());
          for (int64_t c = 0; c < p.cols; ++c) h[c] += t[c];
        }
        if (p.bias)
          for (int64_t c = 0; c < p.cols; ++c) h[c] += p.bias[c];
        float sum = 0.f, sum2 = 0.f;
        for (int64_t c = 0; c < p.cols; ++c) sum += h[c], sum2 += h[c] * h[c];
        const float mean = sum / static_cast<float>(p.cols);
        const float var = std::max(sum2 / static_cast<float>(p.cols) - mean * mean, 0.f);
        const float rstd = 1.f / std::sqrt(var + p.epsilon);
        for (int64_t c = 0; c < p.cols; ++c) h[c] = (h[c] - mean) * (rstd * p.scale[c]) + p.offset[c];
        cpu::StoreRow(p.dtype, h.data(), p.cols, p.y, off);
      }
    }
  }
}

ffi::Error RowLayerNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias, ffi::AnyBuffer scale,
                           ffi::AnyBuffer offset, S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> y,
                           int64_t tile_h, float epsilon) {
  auto p = DecodeRowLayerNorm(x, residual, bias, scale, offset, tiles, count, y, tile_h, epsilon);
  if (p.has_error()) return p.error();
  cpu::Poison(y->untyped_data(), y->size_bytes());
  RowLayerNorm(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowLayerNormCpu, pit::RowLayerNormCpu,
                              pit::bind::RowLayerNorm(xla::ffi::Ffi::Bind()));

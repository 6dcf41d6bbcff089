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

struct Stats {
  float mean, rstd;
};

// h = x + residual + bias of the row at `off` (float32; t: scratch), and its statistics.
Stats LoadRowSum(const RowLayerNormParams& p, int64_t off, std::vector<float>& h, std::vector<float>& t) {
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
  return {mean, 1.f / std::sqrt(var + p.epsilon)};
}

void RowLayerNorm(const RowLayerNormParams& p) {
  const int64_t bytes = p.batch * p.rows * p.cols * DTypeBytes(p.dtype);
  if (p.skip_dead)
    cpu::FillNaN(p.y, bytes);  // unspecified dead rows: NaN, so that a reader of them shows
  else
    cpu::Zero(p.y, bytes);  // dead rows
  std::vector<float> h(p.cols), t(p.cols);
  cpu::ForListedRows(p, [&](int64_t, int64_t off) {
    const Stats st = LoadRowSum(p, off, h, t);
    for (int64_t c = 0; c < p.cols; ++c) h[c] = (h[c] - st.mean) * (st.rstd * p.scale[c]) + p.offset[c];
    cpu::StoreRow(p.dtype, h.data(), p.cols, p.y, off);
  });
}

// The cotangents of RowLayerNorm on its live rows (float32 math): with h = x + residual +
// bias, xhat = (h - mean) * rstd and g = dy (+ dy2), dh = rstd * (g scale - mean(g scale) - xhat
// mean(g scale xhat)); d scale, d offset, d bias sum g xhat, g and dh over the entry's rows.
void RowLayerNormBwd(const RowLayerNormBwdParams& q) {
  const RowLayerNormParams& p = q.fwd;
  const int64_t n = p.cols;
  cpu::Zero(q.dh, p.batch * p.rows * n * DTypeBytes(p.dtype));  // dead rows
  cpu::Zero(q.work, p.batch * q.warps * 3 * n * 4);  // the kernel's per-warp partials: unused here
  std::fill(q.dvec, q.dvec + p.batch * 3 * n, 0.f);
  std::vector<float> h(n), t(n), g(n);
  cpu::ForListedRows(p, [&](int64_t b, int64_t off) {
    float* dvec = q.dvec + b * 3 * n;
    const Stats st = LoadRowSum(p, off, h, t);
    cpu::LoadRow(p.dtype, q.dy, off, n, g.data());
    if (q.dy2) {
      cpu::LoadRow(p.dtype, q.dy2, off, n, t.data());
      for (int64_t c = 0; c < n; ++c) g[c] += t[c];
    }
    float a1 = 0.f, a2 = 0.f;
    for (int64_t c = 0; c < n; ++c) {
      h[c] = (h[c] - st.mean) * st.rstd;  // xhat
      const float gs = g[c] * p.scale[c];
      a1 += gs, a2 += gs * h[c];
      dvec[c] += g[c] * h[c];
      dvec[n + c] += g[c];
    }
    a1 /= static_cast<float>(n), a2 /= static_cast<float>(n);
    for (int64_t c = 0; c < n; ++c) {
      t[c] = st.rstd * (g[c] * p.scale[c] - a1 - h[c] * a2);
      dvec[2 * n + c] += t[c];
    }
    cpu::StoreRow(p.dtype, t.data(), n, q.dh, off);
  });
}

ffi::Error RowLayerNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias, ffi::AnyBuffer scale,
                           ffi::AnyBuffer offset, S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> y,
                           int64_t tile_h, float epsilon, bool skip_dead) {
  auto p = DecodeRowLayerNorm(x, residual, bias, scale, offset, tiles, count, y, tile_h, epsilon, skip_dead);
  if (p.has_error()) return p.error();
  cpu::Poison(y->untyped_data(), y->size_bytes());
  RowLayerNorm(*p);
  return ffi::Error::Success();
}

ffi::Error RowLayerNormBwdCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias, ffi::AnyBuffer scale,
                              S32Buffer tiles, S32Buffer count, ffi::AnyBuffer dy, ffi::AnyBuffer dy2,
                              ffi::Result<ffi::AnyBuffer> dh, ffi::Result<ffi::AnyBuffer> dvec,
                              ffi::Result<ffi::AnyBuffer> work, int64_t tile_h, float epsilon) {
  auto q = DecodeRowLayerNormBwd(x, residual, bias, scale, tiles, count, dy, dy2, dh, dvec, work, tile_h, epsilon);
  if (q.has_error()) return q.error();
  cpu::Poison(dh->untyped_data(), dh->size_bytes());
  cpu::Poison(dvec->untyped_data(), dvec->size_bytes());
  RowLayerNormBwd(*q);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowLayerNormCpu, pit::RowLayerNormCpu,
                              pit::bind::RowLayerNorm(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowLayerNormBwdCpu, pit::RowLayerNormBwdCpu,
                              pit::bind::RowLayerNormBwd(xla::ffi::Ffi::Bind()));

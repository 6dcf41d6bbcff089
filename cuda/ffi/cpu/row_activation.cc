// pit_row_activation(_bwd) on the CPU: the same semantics as the kernels (float32 math,
// one rounding), row by row.
#include <algorithm>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/row_activation_args.h"

namespace pit {
namespace {

void RowActivation(const RowActivationParams& p) {
  const int64_t n = p.cols;
  std::vector<float> v(n);
  if (p.fill) {
    cpu::LoadRow(p.dtype, p.fill, 0, n, v.data());
  } else {
    std::fill(v.begin(), v.end(), 0.f);
  }
  for (int64_t row = 0; row < p.batch * p.rows; ++row) cpu::StoreRow(p.dtype, v.data(), n, p.out, row * n);
  cpu::ForListedRows(p, [&](int64_t, int64_t off) {
    cpu::LoadRow(p.dtype, p.z, off, n, v.data());
    for (float& e : v) e = cpu::Activate(e, p.act);
    cpu::StoreRow(p.dtype, v.data(), n, p.out, off);
  });
}

void RowActivationBwd(const RowActivationParams& p) {
  const int64_t n = p.cols;
  if (p.dead_zeros) cpu::Zero(p.out, p.batch * p.rows * n * DTypeBytes(p.dtype));  // else: left as poisoned
  std::vector<float> v(n), g(n);
  cpu::ForListedRows(p, [&](int64_t, int64_t off) {
    cpu::LoadRow(p.dtype, p.z, off, n, v.data());
    cpu::LoadRow(p.dtype, p.dy, off, n, g.data());
    for (int64_t c = 0; c < n; ++c) v[c] = g[c] * cpu::ActivateGrad(v[c], p.act);
    cpu::StoreRow(p.dtype, v.data(), n, p.out, off);
  });
}

ffi::Error RowActivationCpu(ffi::AnyBuffer z, ffi::AnyBuffer fill, S32Buffer tiles, S32Buffer count,
                            ffi::Result<ffi::AnyBuffer> y, int64_t tile_h, int64_t activation) {
  auto p = DecodeRowActivation(z, fill, tiles, count, y, tile_h, activation);
  if (p.has_error()) return p.error();
  cpu::Poison(y->untyped_data(), y->size_bytes());
  RowActivation(*p);
  return ffi::Error::Success();
}

ffi::Error RowActivationBwdCpu(ffi::AnyBuffer z, S32Buffer tiles, S32Buffer count, ffi::AnyBuffer dy,
                               ffi::Result<ffi::AnyBuffer> dz, int64_t tile_h, int64_t activation,
                               bool dead_zeros) {
  auto p = DecodeRowActivationBwd(z, tiles, count, dy, dz, tile_h, activation, dead_zeros);
  if (p.has_error()) return p.error();
  cpu::Poison(dz->untyped_data(), dz->size_bytes());
  RowActivationBwd(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowActivationCpu, pit::RowActivationCpu,
                              pit::bind::RowActivation(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowActivationBwdCpu, pit::RowActivationBwdCpu,
                              pit::bind::RowActivationBwd(xla::ffi::Ffi::Bind()));

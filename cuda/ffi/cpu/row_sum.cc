// pit_row_sum on the CPU: the same semantics as the kernel (float32 sums over the listed
// rows, one rounding); work is not used.
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/row_sum_args.h"

namespace pit {
namespace {

void RowSum(const RowSumParams& p) {
  const int64_t n = p.cols;
  std::vector<float> acc(static_cast<size_t>(p.batch * n), 0.f), v(static_cast<size_t>(n));
  cpu::ForListedRows(p, [&](int64_t b, int64_t off) {
    cpu::LoadRow(p.dtype, p.x, off, n, v.data());
    for (int64_t c = 0; c < n; ++c) acc[b * n + c] += v[c];
  });
  for (int64_t b = 0; b < p.batch; ++b) cpu::StoreRow(p.dtype, acc.data() + b * n, n, p.sums, b * n);
}

ffi::Error RowSumCpu(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> sums,
                     ffi::Result<ffi::AnyBuffer> work, int64_t tile_h) {
  auto p = DecodeRowSum(x, tiles, count, sums, work, tile_h);
  if (p.has_error()) return p.error();
  cpu::Poison(sums->untyped_data(), sums->size_bytes());
  RowSum(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowSumCpu, pit::RowSumCpu, pit::bind::RowSum(xla::ffi::Ffi::Bind()));

// pit_row_sum and pit_row_concat_sum on the CPU: the same semantics as the kernel (float32
// sums over the listed rows, one rounding); work is not used.
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/row_sum_args.h"

namespace pit {
namespace {

// With column parts (p.part_cols > 0) each listed row is read from the parts and written
// to p.cat; cat's other rows hold NaN, as rows left unspecified do on the CPU.
void RowSum(const RowSumParams& p) {
  const int64_t n = p.cols, np = p.part_cols;
  std::vector<float> acc(static_cast<size_t>(p.batch * n), 0.f), v(static_cast<size_t>(n));
  if (np > 0) cpu::FillNaN(p.cat, p.batch * p.rows * n * DTypeBytes(p.dtype));
  cpu::ForListedRows(p, [&](int64_t b, int64_t off) {
    if (np > 0) {
      const int64_t row = off / n;  // b * rows + r
      for (int k = 0; k < RowSumParams::kMaxParts; ++k)
        cpu::LoadRow(p.dtype, p.parts[k], row * np, np, v.data() + k * np);
      cpu::StoreRow(p.dtype, v.data(), n, p.cat, off);
    } else {
      cpu::LoadRow(p.dtype, p.x, off, n, v.data());
    }
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

ffi::Error RowConcatSumCpu(ffi::AnyBuffer x0, ffi::AnyBuffer x1, ffi::AnyBuffer x2, S32Buffer tiles,
                           S32Buffer count, ffi::Result<ffi::AnyBuffer> cat, ffi::Result<ffi::AnyBuffer> sums,
                           ffi::Result<ffi::AnyBuffer> work, int64_t tile_h) {
  auto p = DecodeRowConcatSum(x0, x1, x2, tiles, count, cat, sums, work, tile_h);
  if (p.has_error()) return p.error();
  cpu::Poison(sums->untyped_data(), sums->size_bytes());
  RowSum(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowSumCpu, pit::RowSumCpu, pit::bind::RowSum(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowConcatSumCpu, pit::RowConcatSumCpu,
                              pit::bind::RowConcatSum(xla::ffi::Ffi::Bind()));

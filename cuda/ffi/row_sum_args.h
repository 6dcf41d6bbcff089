// Decoding and validation of pit_row_sum, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies it).
#pragma once

#include <string>

#include "cuda/common/row_sum_params.h"
#include "cuda/ffi/row_blocks_args.h"

namespace pit {

// x [..., M, N], tiles [..., capacity], count [...] (a flat list of row blocks of tile_h
// rows) -> sums [..., N] in x's dtype, work float32 [..., slices, N] (slices >= 1; one
// slice needs no work: [..., 1, N] or [0]).
inline ffi::ErrorOr<RowSumParams> DecodeRowSum(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                                               ffi::Result<ffi::AnyBuffer>& sums,
                                               ffi::Result<ffi::AnyBuffer>& work, int64_t tile_h) {
  const std::string target = "pit_row_sum";
  auto rb = DecodeRowBlocks(target, "x", x, tiles, count, tile_h);
  if (rb.has_error()) return ffi::Unexpected<ffi::Error>(rb.error());
  if (sums->element_type() != x.element_type() || static_cast<int64_t>(sums->element_count()) != rb->batch * rb->cols)
    return InvalidArg(target + ": sums must be [..., N] (x's batch dims, N = " + std::to_string(rb->cols) +
                      ") in x's dtype");
  RowSumParams p;
  static_cast<RowBlocks&>(p) = *rb;
  p.x = x.untyped_data();
  p.sums = sums->untyped_data();
  const auto wd = work->dimensions();
  if (work->element_count() != 0) {
    const int64_t slices = wd.size() >= 2 ? wd[wd.size() - 2] : 0;
    if (work->element_type() != ffi::DataType::F32 || slices < 1 || slices > 65535 ||
        static_cast<int64_t>(work->element_count()) != rb->batch * slices * rb->cols)
      return InvalidArg(target + ": work must be float32 [..., slices, N] (x's batch dims, 1 <= slices <= 65535) "
                                 "or [0]");
    p.slices = slices;
    p.work = static_cast<float*>(work->untyped_data());
  }
  return p;
}

}  // namespace pit

// Decoding and validation of pit_row_sum, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies it).
#pragma once

#include <string>

#include "cuda/common/row_sum_params.h"
#include "cuda/ffi/row_blocks_args.h"

namespace pit {

// The results both targets share, for rows of rb.cols (N) columns: sums [..., N] in the
// rows' dtype, work float32 [..., slices, N] (slices >= 1; one slice needs no work:
// [..., 1, N] or [0]).
inline ffi::ErrorOr<RowSumParams> DecodeRowSumResults(const std::string& target, const RowBlocks& rb,
                                                      ffi::DataType dtype, ffi::Result<ffi::AnyBuffer>& sums,
                                                      ffi::Result<ffi::AnyBuffer>& work) {
  if (sums->element_type() != dtype || static_cast<int64_t>(sums->element_count()) != rb.batch * rb.cols)
    return InvalidArg(target + ": sums must be [..., N] (x's batch dims, N = " + std::to_string(rb.cols) +
                      ") in x's dtype");
  RowSumParams p;
  static_cast<RowBlocks&>(p) = rb;
  p.sums = sums->untyped_data();
  const auto wd = work->dimensions();
  if (work->element_count() != 0) {
    const int64_t slices = wd.size() >= 2 ? wd[wd.size() - 2] : 0;
    if (work->element_type() != ffi::DataType::F32 || slices < 1 || slices > 65535 ||
        static_cast<int64_t>(work->element_count()) != rb.batch * slices * rb.cols)
      return InvalidArg(target + ": work must be float32 [..., slices, N] (x's batch dims, 1 <= slices <= 65535) "
                                 "or [0]");
    p.slices = slices;
    p.work = static_cast<float*>(work->untyped_data());
  }
  return p;
}

// pit_row_sum: x [..., M, N], tiles [..., capacity], count [...] (a flat list of row
// blocks of tile_h rows) -> sums, work.
inline ffi::ErrorOr<RowSumParams> DecodeRowSum(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                                               ffi::Result<ffi::AnyBuffer>& sums,
                                               ffi::Result<ffi::AnyBuffer>& work, int64_t tile_h) {
  const std::string target = "pit_row_sum";
  auto rb = DecodeRowBlocks(target, "x", x, tiles, count, tile_h);
  if (rb.has_error()) return ffi::Unexpected<ffi::Error>(rb.error());
  auto p = DecodeRowSumResults(target, *rb, x.element_type(), sums, work);
  if (p.has_error()) return p;
  p->x = x.untyped_data();
  return p;
}

// pit_row_concat_sum: the three column parts x0, x1, x2 [..., M, Np] of x [..., M, 3 Np]
// (the same shape and dtype), the index as pit_row_sum's -> cat (x's shape, x0's dtype:
// the listed rows of x, the others unwritten), sums and work for x.
inline ffi::ErrorOr<RowSumParams> DecodeRowConcatSum(ffi::AnyBuffer x0, ffi::AnyBuffer x1, ffi::AnyBuffer x2,
                                                     S32Buffer tiles, S32Buffer count,
                                                     ffi::Result<ffi::AnyBuffer>& cat,
                                                     ffi::Result<ffi::AnyBuffer>& sums,
                                                     ffi::Result<ffi::AnyBuffer>& work, int64_t tile_h) {
  const std::string target = "pit_row_concat_sum";
  auto rb = DecodeRowBlocks(target, "x0", x0, tiles, count, tile_h);
  if (rb.has_error()) return ffi::Unexpected<ffi::Error>(rb.error());
  for (const ffi::AnyBuffer* xk : {&x1, &x2})
    if (xk->element_type() != x0.element_type() || !SameDims(xk->dimensions(), x0.dimensions()))
      return InvalidArg(target + ": x1 and x2 must have x0's shape and dtype");
  RowBlocks whole = *rb;
  whole.cols = RowSumParams::kMaxParts * rb->cols;
  if (cat->element_type() != x0.element_type() ||
      static_cast<int64_t>(cat->element_count()) != whole.batch * whole.rows * whole.cols)
    return InvalidArg(target + ": cat must be [..., M, 3 Np] = x0's shape with 3 x its columns, in x0's dtype");
  auto p = DecodeRowSumResults(target, whole, x0.element_type(), sums, work);
  if (p.has_error()) return p;
  p->parts[0] = x0.untyped_data();
  p->parts[1] = x1.untyped_data();
  p->parts[2] = x2.untyped_data();
  p->part_cols = rb->cols;
  p->cat = cat->untyped_data();
  return p;
}

}  // namespace pit

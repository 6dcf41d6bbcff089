// Decoding and validation of the `pit_index` custom call, shared by its CPU and CUDA
// handlers. The Python primitive already validated everything; this re-checks what a
// hand-written custom call could get wrong, so a bad call is an error, never a crash.
#pragma once

#include <string>

#include "cuda/common/index_params.h"
#include "cuda/ffi/ffi_common.h"

namespace pit {

using S32Result = ffi::Result<ffi::Buffer<ffi::S32>>;

// The results of pit_index, in order.
struct IndexResults {
  S32Result tiles, count, row_tiles, row_count, col_tiles, col_count, scratch;
};

inline ffi::ErrorOr<IndexParams> DecodeIndexArgs(ffi::AnyBuffer x, IndexResults out, int64_t tile_h,
                                                 int64_t tile_w, bool group_rows, bool group_cols) {
  IndexParams p;
  switch (x.element_type()) {
    case ffi::DataType::PRED: p.elem_bytes = 1; break;
    case ffi::DataType::F16:
    case ffi::DataType::BF16: p.elem_bytes = 2; break;
    case ffi::DataType::F32: p.elem_bytes = 4; break;
    default: return InvalidArg("pit_index: x must be bool, float16, bfloat16 or float32");
  }
  auto m = AsBatchedMatrix(x.dimensions(), "pit_index: x");
  if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
  if (tile_h < 1 || tile_w < 1 || tile_h > m->rows || tile_w > m->cols)
    return InvalidArg("pit_index: micro-tile must be positive and fit in the array");
  p.x = x.untyped_data();
  p.batch = m->batch;
  p.rows = m->rows;
  p.cols = m->cols;
  p.tile_h = tile_h;
  p.tile_w = tile_w;
  p.tile_rows = CeilDiv(p.rows, tile_h);
  p.tile_cols = CeilDiv(p.cols, tile_w);
  const int64_t per_matrix = p.tile_rows * p.tile_cols;
  if (per_matrix >= (int64_t{1} << 31)) return InvalidArg("pit_index: more than 2^31 micro-tiles per matrix");

  const auto tdims = out.tiles->dimensions();
  if (tdims.size() < 1 || LeadingProduct(tdims, tdims.size() - 1) != p.batch)
    return InvalidArg("pit_index: tiles must be [..., capacity] with x's leading dims");
  p.capacity = tdims.back();
  if (static_cast<int64_t>(out.count->element_count()) != p.batch)
    return InvalidArg("pit_index: count must have x's leading dims");
  p.tiles = out.tiles->typed_data();
  p.count = out.count->typed_data();
  if (static_cast<int64_t>(out.scratch->element_count()) != p.batch)
    return InvalidArg("pit_index: scratch must have x's leading dims");
  p.dead = out.scratch->typed_data();

  auto sized = [](S32Result& r, int64_t n) { return static_cast<int64_t>(r->element_count()) == n; };
  if (group_rows) {
    if (!sized(out.row_tiles, p.batch * per_matrix) || !sized(out.row_count, p.batch * p.tile_rows))
      return InvalidArg("pit_index: row lists must be [..., tile_rows, tile_cols] and [..., tile_rows]");
    p.row_tiles = out.row_tiles->typed_data();
    p.row_count = out.row_count->typed_data();
  }
  if (group_cols) {
    if (!sized(out.col_tiles, p.batch * per_matrix) || !sized(out.col_count, p.batch * p.tile_cols))
      return InvalidArg("pit_index: column lists must be [..., tile_cols, tile_rows] and [..., tile_cols]");
    p.col_tiles = out.col_tiles->typed_data();
    p.col_count = out.col_count->typed_data();
  }
  return p;
}

}  // namespace pit

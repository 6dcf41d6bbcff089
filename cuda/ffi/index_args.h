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

// x and the micro-tile: the part of IndexParams both forms of the call share.
inline ffi::ErrorOr<IndexParams> DecodeIndexInput(ffi::AnyBuffer x, int64_t tile_h, int64_t tile_w) {
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
  if (p.tile_rows * p.tile_cols >= (int64_t{1} << 31)) return InvalidArg("pit_index: more than 2^31 micro-tiles per matrix");
  return p;
}

inline ffi::ErrorOr<IndexParams> DecodeIndexArgs(ffi::AnyBuffer x, IndexResults out, int64_t tile_h,
                                                 int64_t tile_w, bool group_rows, bool group_cols) {
  auto decoded = DecodeIndexInput(x, tile_h, tile_w);
  if (decoded.has_error()) return decoded;
  IndexParams p = *decoded;
  const int64_t per_matrix = p.tile_rows * p.tile_cols;

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

// pit_index_split: x [n, rows, cols] (n <= IndexParams::kMaxSplit); results, per entry b,
// tiles [capacity], count [], row_tiles, row_count, col_tiles, col_count (a grouping not
// asked for: empty), then scratch [n].
inline ffi::ErrorOr<IndexParams> DecodeIndexSplitArgs(ffi::AnyBuffer x, ffi::RemainingRets rets, int64_t tile_h,
                                                      int64_t tile_w, bool group_rows, bool group_cols) {
  auto decoded = DecodeIndexInput(x, tile_h, tile_w);
  if (decoded.has_error()) return decoded;
  IndexParams p = *decoded;
  const int64_t n = p.batch, per_matrix = p.tile_rows * p.tile_cols;
  if (n < 1 || n > IndexParams::kMaxSplit)
    return InvalidArg("pit_index_split: x must be [n, rows, cols] with 1 <= n <= " +
                      std::to_string(IndexParams::kMaxSplit) + ", got n = " + std::to_string(n));
  if (static_cast<int64_t>(rets.size()) != 6 * n + 1)
    return InvalidArg("pit_index_split: expected 6 results per entry of x and a scratch result");
  // Result k of entry b goes to slot b of the k-th per-entry array.
  int32_t** slots[6] = {p.split_tiles,     p.split_count,     p.split_row_tiles,
                        p.split_row_count, p.split_col_tiles, p.split_col_count};
  for (int64_t b = 0; b < n; ++b) {
    for (int k = 0; k < 6; ++k) {
      auto r = rets.get<ffi::Buffer<ffi::S32>>(6 * b + k);
      if (r.has_error()) return ffi::Unexpected<ffi::Error>(r.error());
      const int64_t got = static_cast<int64_t>((*r)->element_count());
      // tiles: capacity (any, the same for every entry); count: 1; groupings: full or empty.
      const int64_t want[6] = {b == 0 ? got : p.capacity, 1, group_rows ? per_matrix : 0,
                               group_rows ? p.tile_rows : 0, group_cols ? per_matrix : 0, group_cols ? p.tile_cols : 0};
      if (got != want[k])
        return InvalidArg("pit_index_split: an entry's results must be tiles [capacity], count [], row_tiles [tile_rows, "
                          "tile_cols], row_count [tile_rows], col_tiles [tile_cols, tile_rows], col_count [tile_cols]");
      if (b == 0 && k == 0) p.capacity = got;
      slots[k][b] = (*r)->typed_data();
    }
  }
  auto scratch = rets.get<ffi::Buffer<ffi::S32>>(6 * n);
  if (scratch.has_error()) return ffi::Unexpected<ffi::Error>(scratch.error());
  if (static_cast<int64_t>((*scratch)->element_count()) != n) return InvalidArg("pit_index_split: scratch must be [n]");
  p.dead = (*scratch)->typed_data();
  p.split = static_cast<int>(n);
  // The batched pointers say which groupings are built (the kernels test them for null).
  p.tiles = p.split_tiles[0];
  p.count = p.split_count[0];
  if (group_rows) p.row_tiles = p.split_row_tiles[0], p.row_count = p.split_row_count[0];
  if (group_cols) p.col_tiles = p.split_col_tiles[0], p.col_count = p.split_col_count[0];
  return p;
}

}  // namespace pit

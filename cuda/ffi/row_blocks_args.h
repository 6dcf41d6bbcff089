// Decoding of the operands every row-wise target shares (cuda/common/row_blocks.h): the
// matrix whose rows the index lists, tile_h and the row-block list.
#pragma once

#include <string>

#include "cuda/common/row_blocks.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/matmul_args.h"
#include "cuda/ffi/sread_swrite_args.h"

namespace pit {

// `name` [..., M, N] (a float type), tile_h in [1, M], tiles [..., capacity], count [...]
// (the matrix's leading dims).
inline ffi::ErrorOr<RowBlocks> DecodeRowBlocks(const std::string& target, const char* name, ffi::AnyBuffer x,
                                               S32Buffer tiles, S32Buffer count, int64_t tile_h) {
  const std::string what = target + ": " + name;
  auto dtype = DecodeDType(x.element_type(), what);
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  auto m = AsBatchedMatrix(x.dimensions(), what.c_str());
  if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
  if (m->rows > 0 && (tile_h < 1 || tile_h > m->rows))
    return InvalidArg(target + ": tile_h must be in [1, M] = [1, " + std::to_string(m->rows) + "], got " +
                      std::to_string(tile_h));
  const auto td = tiles.dimensions();
  if (td.size() < 1) return InvalidArg(target + ": tiles must be [..., capacity]");
  RowBlocks r;
  r.dtype = *dtype;
  r.batch = m->batch;
  r.rows = m->rows;
  r.cols = m->cols;
  r.tile_h = tile_h < 1 ? 1 : tile_h;
  r.tile_rows = CeilDiv(r.rows, r.tile_h);
  r.capacity = td.back();
  auto err = CheckTileOperands(target, tiles, count, r.batch, r.capacity);
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  r.tiles = tiles.typed_data();
  r.count = count.typed_data();
  return r;
}

}  // namespace pit

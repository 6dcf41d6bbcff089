// pit_index on the CPU: the same target as the CUDA handler, so CI runs the whole
// primitive -> FFI -> native path without a GPU. Tiles are listed in row-major order
// here (dead ones from the back); callers must not rely on any order (the GPU's is
// arbitrary).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/index_args.h"

namespace pit {
namespace {

inline bool NonZero(uint8_t w) { return w != 0; }
inline bool NonZero(uint16_t w) { return (w & 0x7fffu) != 0; }
inline bool NonZero(uint32_t w) { return (w & 0x7fffffffu) != 0; }

template <typename Word>
void BuildIndex(const IndexParams& p) {
  const int64_t per_matrix = p.tile_rows * p.tile_cols;
  std::fill(p.dead, p.dead + p.batch, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    std::fill(p.Tiles(b), p.Tiles(b) + p.capacity, -1);
    *p.Count(b) = 0;
    if (p.row_tiles) {
      std::fill(p.RowTiles(b), p.RowTiles(b) + per_matrix, -1);
      std::fill(p.RowCount(b), p.RowCount(b) + p.tile_rows, 0);
    }
    if (p.col_tiles) {
      std::fill(p.ColTiles(b), p.ColTiles(b) + per_matrix, -1);
      std::fill(p.ColCount(b), p.ColCount(b) + p.tile_cols, 0);
    }
  }
  const Word* x = static_cast<const Word*>(p.x);
  std::vector<uint8_t> live(p.tile_cols);
  for (int64_t b = 0; b < p.batch; ++b) {
    int32_t* count = p.Count(b);
    for (int64_t tr = 0; tr < p.tile_rows; ++tr) {
      std::fill(live.begin(), live.end(), 0);
      const int64_t r1 = std::min(p.rows, (tr + 1) * p.tile_h);
      for (int64_t r = tr * p.tile_h; r < r1; ++r) {
        const Word* row = x + (b * p.rows + r) * p.cols;
        for (int64_t c = 0; c < p.cols; ++c)
          if (NonZero(row[c])) live[c / p.tile_w] = 1;
      }
      for (int64_t tc = 0; tc < p.tile_cols; ++tc) {
        if (!live[tc]) {
          // At full capacity the dead tiles fill the flat list from the back.
          if (p.full_capacity())
            p.Tiles(b)[p.capacity - 1 - p.dead[b]++] = -1 - static_cast<int32_t>(tr * p.tile_cols + tc);
          continue;
        }
        const int64_t slot = (*count)++;
        if (slot < p.capacity) p.Tiles(b)[slot] = static_cast<int32_t>(tr * p.tile_cols + tc);
        if (p.row_tiles) p.RowTiles(b)[tr * p.tile_cols + p.RowCount(b)[tr]++] = static_cast<int32_t>(tc);
        if (p.col_tiles) p.ColTiles(b)[tc * p.tile_rows + p.ColCount(b)[tc]++] = static_cast<int32_t>(tr);
      }
    }
  }
}

ffi::Error Build(const ffi::ErrorOr<IndexParams>& p) {
  if (p.has_error()) return p.error();
  switch (p->elem_bytes) {
    case 1: BuildIndex<uint8_t>(*p); break;
    case 2: BuildIndex<uint16_t>(*p); break;
    default: BuildIndex<uint32_t>(*p); break;
  }
  return ffi::Error::Success();
}

ffi::Error IndexCpu(ffi::AnyBuffer x, S32Result tiles, S32Result count, S32Result row_tiles, S32Result row_count,
                    S32Result col_tiles, S32Result col_count, S32Result scratch, int64_t tile_h, int64_t tile_w, bool group_rows,
                    bool group_cols) {
  return Build(DecodeIndexArgs(x, {tiles, count, row_tiles, row_count, col_tiles, col_count, scratch}, tile_h, tile_w,
                               group_rows, group_cols));
}

ffi::Error IndexSplitCpu(ffi::AnyBuffer x, ffi::RemainingRets rets, int64_t tile_h, int64_t tile_w, bool group_rows,
                         bool group_cols) {
  return Build(DecodeIndexSplitArgs(x, rets, tile_h, tile_w, group_rows, group_cols));
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitIndexCpu, pit::IndexCpu,
                              pit::bind::Index(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitIndexSplitCpu, pit::IndexSplitCpu,
                              pit::bind::IndexSplit(xla::ffi::Ffi::Bind()));

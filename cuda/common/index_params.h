// What one index construction works on: plain data, shared by the CPU and CUDA paths.
//
// x [batch, rows, cols] is cut into micro-tiles of tile_h x tile_w (edge tiles may be
// partial). A micro-tile is live when any of its elements is non-zero (+0 and -0 are
// zero; NaN is live). Every live micro-tile takes one slot per list, in any order:
//   tiles[b, slot]          = tile_row * tile_cols + tile_col   (flat list)
//   row_tiles[b, tr, slot]  = tile_col  (per tile row, optional)
//   col_tiles[b, tc, slot]  = tile_row  (per tile column, optional)
// count[b], row_count[b, tr], col_count[b, tc] count ALL live tiles, also past the
// flat list's capacity (those are dropped). Slots past a count are negative: in the
// flat list at full capacity (capacity == tiles per matrix) they hold the DEAD tiles as
// -1 - id, from the back (consumers zero their outputs in the same launch); elsewhere -1.
//
// Split results (pit_index_split): each batch entry's lists and counts in buffers of their
// own (split_*[b]), so that consumers taking one entry each need no slice copies; `dead`
// stays one [batch] buffer. Code reaches entry b's lists through the accessors below only.
#pragma once

#include <cstdint>

#include "cuda/common/host_device.h"  // methods of these plain structs run on both sides

namespace pit {

struct IndexParams {
  const void* x = nullptr;
  int elem_bytes = 2;  // 1 (bool mask), 2 (f16/bf16), 4 (f32)
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t tile_h = 1, tile_w = 1;
  int64_t tile_rows = 0, tile_cols = 0;

  int32_t* tiles = nullptr;  // [batch, capacity]
  int64_t capacity = 0;
  int32_t* count = nullptr;  // [batch]
  int32_t* dead = nullptr;   // [batch] scratch: dead tiles placed so far (full capacity only)

  int32_t* row_tiles = nullptr;  // [batch, tile_rows, tile_cols], or null
  int32_t* row_count = nullptr;  // [batch, tile_rows]
  int32_t* col_tiles = nullptr;  // [batch, tile_cols, tile_rows], or null
  int32_t* col_count = nullptr;  // [batch, tile_cols]

  static constexpr int kMaxSplit = 16;  // batch entries of a split build (kernel parameter space)
  int split = 0;                         // 0: batched buffers above; else == batch
  int32_t* split_tiles[kMaxSplit] = {};
  int32_t* split_count[kMaxSplit] = {};
  int32_t* split_row_tiles[kMaxSplit] = {};
  int32_t* split_row_count[kMaxSplit] = {};
  int32_t* split_col_tiles[kMaxSplit] = {};
  int32_t* split_col_count[kMaxSplit] = {};

  PIT_HOST_DEVICE bool full_capacity() const { return capacity == tile_rows * tile_cols; }
  // Entry b's flat list [capacity], count [1], row lists [tile_rows, tile_cols] and counts
  // [tile_rows], column lists [tile_cols, tile_rows] and counts [tile_cols].
  PIT_HOST_DEVICE int32_t* Tiles(int64_t b) const { return split ? split_tiles[b] : tiles + b * capacity; }
  PIT_HOST_DEVICE int32_t* Count(int64_t b) const { return split ? split_count[b] : count + b; }
  PIT_HOST_DEVICE int32_t* RowTiles(int64_t b) const {
    return split ? split_row_tiles[b] : row_tiles + b * tile_rows * tile_cols;
  }
  PIT_HOST_DEVICE int32_t* RowCount(int64_t b) const { return split ? split_row_count[b] : row_count + b * tile_rows; }
  PIT_HOST_DEVICE int32_t* ColTiles(int64_t b) const {
    return split ? split_col_tiles[b] : col_tiles + b * tile_cols * tile_rows;
  }
  PIT_HOST_DEVICE int32_t* ColCount(int64_t b) const { return split ? split_col_count[b] : col_count + b * tile_cols; }
};

}  // namespace pit

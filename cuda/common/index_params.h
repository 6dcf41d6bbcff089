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

  PIT_HOST_DEVICE bool full_capacity() const { return capacity == tile_rows * tile_cols; }
};

}  // namespace pit

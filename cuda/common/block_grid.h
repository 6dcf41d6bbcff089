// The block grid that pit_block_topk and pit_mask_blocks decode alike: M matrices of one
// shape [K, N], each covered by (tile_h, tile_w) blocks, partial ones at the edges.
#pragma once

#include <cstdint>

namespace pit {

struct BlockGrid {
  int64_t matrices = 0;   // M: the matrices of all operands, in operand order
  int64_t rows = 0;       // K
  int64_t cols = 0;       // N
  int64_t tile_h = 1;     // block rows
  int64_t tile_w = 1;     // block columns
  int64_t tile_rows = 0;  // ceil(K / tile_h)
  int64_t tile_cols = 0;  // ceil(N / tile_w)

  // tile_rows / tile_cols from rows, cols and the block.
  void CountTiles() {
    tile_rows = (rows + tile_h - 1) / tile_h;
    tile_cols = (cols + tile_w - 1) / tile_w;
  }
};

}  // namespace pit

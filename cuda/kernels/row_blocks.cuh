// The row block of a list slot, for the row-wise kernels (one warp per slot).
#pragma once

#include <cstdint>

#include "cuda/common/row_blocks.h"

namespace pit {

// The row block of a list entry: a live slot holds its id, a dead-tail slot -1 - id.
__device__ __forceinline__ int64_t EntryBlock(int32_t entry, bool live) {
  return live ? entry : -1 - static_cast<int64_t>(entry);
}

// Slot `unit` (b * capacity + slot): whether it lists a live block or (with a dead tail:
// the list at full capacity) a dead one, and the block id; false when the slot names no
// block of the matrix (a slot past the count without a dead tail, or an id out of range).
__device__ __forceinline__ bool SlotBlock(const RowBlocks& p, int64_t unit, bool dead_tail, bool* live,
                                          int64_t* id) {
  const int64_t b = unit / p.capacity, slot = unit - b * p.capacity;
  int64_t n_live = __ldg(p.count + b);
  n_live = n_live < 0 ? 0 : (n_live > p.capacity ? p.capacity : n_live);
  const int32_t entry = __ldg(p.tiles + unit);
  if (slot < n_live) {
    *live = true, *id = EntryBlock(entry, true);
  } else if (dead_tail) {
    *live = false, *id = EntryBlock(entry, false);
  } else {
    return false;
  }
  return *id >= 0 && *id < p.tile_rows;
}

}  // namespace pit

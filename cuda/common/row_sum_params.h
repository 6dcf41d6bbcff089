// pit_row_sum's decoded call (docs/kernels.md): plain data shared by the FFI handlers
// (cuda/ffi/row_sum_args.h) and the kernel.
#pragma once

#include <cstdint>

#include "cuda/common/row_blocks.h"

namespace pit {

// The RowBlocks are x's (dtype: x and the sums).
struct RowSumParams : RowBlocks {
  const void* x = nullptr;  // [batch, rows, cols]
  void* sums = nullptr;     // [batch, cols]: the column sums over the listed rows
  float* work = nullptr;    // [batch, slices, cols]: partial sums (slices > 1)
  int64_t slices = 1;       // list slices summed apart, then added in order
};

}  // namespace pit

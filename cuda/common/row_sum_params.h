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
  // pit_row_concat_sum: x comes as kMaxParts column parts of part_cols columns each
  // (parts[k]: [batch, rows, part_cols]; x unused), and the listed rows are written to
  // `cat` [batch, rows, cols] (the parts side by side) as they are read.
  static constexpr int kMaxParts = 3;
  const void* parts[kMaxParts] = {nullptr, nullptr, nullptr};
  int64_t part_cols = 0;  // 0: x whole
  void* cat = nullptr;
};

}  // namespace pit

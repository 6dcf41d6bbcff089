// Column sums over the listed rows of a padded batch: the M axis for a bias's gradient
// (docs/kernels.md, pit_row_sum). No host sync, no allocation, no host reads of device
// data; safe to capture in a CUDA graph. The handlers validated the parameters
// (cuda/ffi/row_sum_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/row_sum_params.h"

namespace pit {

// sums[b, :] = the sum of x[b, r, :] over the rows r of the listed row blocks (float32
// accumulation in a fixed order, one rounding): the rows past the count are never read.
// With column parts (p.part_cols > 0, pit_row_concat_sum) x is read from its parts and the
// listed rows are also written to p.cat (its other rows are left unwritten).
cudaError_t LaunchRowSum(const RowSumParams& p, cudaStream_t stream);

}  // namespace pit

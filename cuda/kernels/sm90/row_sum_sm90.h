// Hopper (sm_90a) path of pit_row_sum (docs/kernels.md): the column sums over the listed
// rows in one launch, the list's slices added through distributed shared memory.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/row_sum_params.h"

namespace pit {

// Covered: 16-byte aligned rows (cols * element size a multiple of 16, x and sums 16-byte
// aligned), any dtype, tile_h and batch; an sm_90 device. Anything else returns
// cudaErrorNotSupported and launches nothing (work is not used).
cudaError_t LaunchRowSumSm90(const RowSumParams& p, cudaStream_t stream);

}  // namespace pit

// An activation (and its derivative) on the listed rows of a padded batch: the M axis for
// the elementwise work after a product, in training (docs/kernels.md, pit_row_activation).
// No host sync, no allocation, no host reads of device data; safe to capture in a CUDA
// graph. The handlers validated the parameters (cuda/ffi/row_activation_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/row_activation_params.h"

namespace pit {

// out = act(z) on the rows of the listed row blocks (float32 math, one rounding), `fill`
// (or zeros) on every other row. At full capacity the dead blocks come from the list's
// tail (one pass); otherwise every row is filled first.
cudaError_t LaunchRowActivation(const RowActivationParams& p, cudaStream_t stream);

// out = dy * act'(z) on the listed rows, zeros on every other row (a memset first).
cudaError_t LaunchRowActivationBwd(const RowActivationParams& p, cudaStream_t stream);

}  // namespace pit

// Layer norm on the listed rows of a padded batch: the M axis for the elementwise work
// between a padded model's products (docs/kernels.md, pit_row_layer_norm). No host
// sync, no allocation, no host reads of device data; safe to capture in a CUDA graph.
// The handlers validated the parameters (cuda/ffi/row_layer_norm_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/row_layer_norm_params.h"

namespace pit {

// y = LN(x + residual + bias) * scale + offset on the rows of the listed row blocks
// (float32 math, one rounding; variance as E[h^2] - E[h]^2, clamped at 0), zeros on every
// other row. At full capacity the dead blocks come from the list's tail (one pass);
// otherwise y is zeroed first.
cudaError_t LaunchRowLayerNorm(const RowLayerNormParams& p, cudaStream_t stream);

// The cotangents of LaunchRowLayerNorm on the same rows: dh = d(x + residual + bias) (zeros
// on every other row) and, per batch entry, the sums over its live rows of d scale, d
// offset and d bias. Each warp sums its rows into its own slice of `work`, a second
// kernel adds the slices in a fixed order: the sums do not depend on scheduling.
cudaError_t LaunchRowLayerNormBwd(const RowLayerNormBwdParams& q, cudaStream_t stream);

}  // namespace pit

// The MoE routing index on the GPU (docs/kernels.md, "MoE"): one pass over the
// assignments, slots taken by aggregated atomics, no sort, no host sync and no
// allocation, so it can be captured in a CUDA graph. See common/moe_params.h.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/moe_params.h"

namespace pit {

// Expects the sizes DecodeMoeIndexArgs accepts (T*k and E+1 below 2^31); returns
// cudaErrorInvalidValue otherwise.
cudaError_t LaunchMoeIndex(const MoeIndexParams& p, cudaStream_t stream);

}  // namespace pit

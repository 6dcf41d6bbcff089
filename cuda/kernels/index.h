// Online sparsity index construction on the GPU: one pass, atomic slots, no host sync
// and no allocation, so it can be captured in a CUDA graph. See common/index_params.h.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/index_params.h"

namespace pit {

cudaError_t LaunchIndex(const IndexParams& p, cudaStream_t stream);

}  // namespace pit

// A block mask applied to weight matrices on the GPU (docs/kernels.md, pit_mask_blocks):
// the elements of live blocks converted to the results' dtype, dead blocks written as 0
// without being read. No host sync, no allocation; safe to capture in a CUDA graph. The
// handlers validated the parameters (cuda/ffi/mask_blocks_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/mask_blocks_params.h"

namespace pit {

// `src` / `dst`: the p.matrices matrices' and results' addresses (host arrays, read
// before returning).
cudaError_t LaunchMaskBlocks(const MaskBlocksParams& p, const void* const* src, void* const* dst,
                             cudaStream_t stream);

}  // namespace pit

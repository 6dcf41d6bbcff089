// Block magnitude pruning's mask on the GPU (docs/kernels.md, pit_block_topk): each
// block's L1 norm, each matrix's keep-th largest norm by a radix select (no sort), and
// the blocks at or above it. No host sync, no allocation, no host reads of device data;
// safe to capture in a CUDA graph. The handlers validated the parameters
// (cuda/ffi/block_topk_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/block_topk_params.h"

namespace pit {

// `groups`: n_groups groups of matrices (each one shape, dtype and block), each group's
// scores by launches of its own, the selects of all of them by one launch. `bases`: the
// matrices' addresses, group after group (host array, read before returning).
cudaError_t LaunchBlockTopk(const BlockTopkParams* groups, int n_groups, const void* const* bases,
                            cudaStream_t stream);

}  // namespace pit

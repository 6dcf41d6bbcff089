// Hopper (sm_90a) path of pit_stile_matmul for (32, 64) weight blocks at training sizes:
// the forward x @ (w o mask) and the dx dy @ (w o mask)^T straight from the untransposed
// operands, one 256-row tile of C per column group and its list (wblock_gemm.cuh).
// No host sync, no allocation, no host read of device data.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// Same arguments as LaunchStileMatmul (cuda/kernels/sparse_gemm.h). Returns
// cudaErrorNotSupported, launching nothing, for what it does not cover (see wblock_gemm.cu).
cudaError_t LaunchWeightBlockGemmSm90(const MatmulParams& p, const TileList& lists, bool sparse_b, cudaStream_t stream);

}  // namespace pit

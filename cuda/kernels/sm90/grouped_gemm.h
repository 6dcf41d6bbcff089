// Hopper (sm_90a) fast paths of the MoE grouped products (docs/kernels.md, "MoE").
// Each returns cudaErrorNotSupported (launching nothing) for a case it does not cover;
// the generic kernels (cuda/kernels/grouped_gemm.cu) then run instead.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/moe_params.h"

namespace pit {

cudaError_t LaunchGroupedGemmSm90(const GroupedMatmulParams& p, cudaStream_t stream);
cudaError_t LaunchGroupedWgradSm90(const GroupedWgradParams& p, cudaStream_t stream);

}  // namespace pit

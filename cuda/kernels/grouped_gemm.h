// The MoE grouped products on the GPU (docs/kernels.md, "MoE"): pit_grouped_matmul and
// pit_grouped_wgrad. Each launcher tries the Hopper kernels first (sm90/grouped_gemm.h)
// and runs the generic tiled kernels (grouped_gemm_kernel.cuh) when those return
// cudaErrorNotSupported. No host sync, no allocation and no host reads of device data:
// grids are sized from static bounds and blocks past the device-side counts exit at
// once, so both are safe to capture in a CUDA graph. The inputs were validated by the
// handlers (cuda/ffi/moe_args.h); the launchers return cudaErrorInvalidValue for sizes
// the kernels cannot index (a block count or extent past 2^31).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/moe_params.h"

namespace pit {

// y[b, a] = src[b', a / row_div] @ op(W[b'', e]) for a in group e < E; 0 for group E.
cudaError_t LaunchGroupedMatmul(const GroupedMatmulParams& p, cudaStream_t stream);

// dw[c, e] = sum over the entries of c and a in group e of src[a / row_div]^T (x) dy[a].
cudaError_t LaunchGroupedWgrad(const GroupedWgradParams& p, cudaStream_t stream);

}  // namespace pit

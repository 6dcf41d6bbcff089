// Hopper (sm_90a) fast path of pit_stile_matmul (K axis / weight blocks, docs/kernels.md):
//   C = op_a(A o mask) @ op_b(B)   or   op_a(A) @ op_b(B o mask)
// where each group of output rows (sparse A) or output columns (sparse B) reduces only
// over the K ranges of its listed micro-tiles. Both forward uses become "gather rows k of
// two [K, *] matrices": B stored [K, N] (rows k: n contiguous) and A stored transposed
// [K, M] (trans_a; rows k: m contiguous), so every listed k -- even a single one, as in
// 1x64 or 32x1 micro-tiles -- is a 16-byte-vector row copy into a wgmma operand.
// No host sync, no allocation, no host read of device data.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// Same arguments as LaunchStileMatmul (cuda/kernels/sparse_gemm.h). Covered (everything
// else returns cudaErrorNotSupported and launches nothing, and the generic kernel runs):
// see the comment at the definition in stile_gemm.cu.
cudaError_t LaunchStileGemmSm90(const MatmulParams& p, const TileList& lists, bool sparse_b, cudaStream_t stream);

}  // namespace pit

// The three sparse products on the GPU (docs/kernels.md): one generic tiled GEMM that
// serves pit_row_gather_matmul, pit_stile_matmul and pit_sdd_matmul. No host sync, no
// allocation and no host reads of device data: grids are sized from the static
// capacities and blocks whose work lies past a device-side count exit at once, so
// every launcher is safe to capture in a CUDA graph. The inputs were validated by the
// handlers (cuda/ffi/matmul_args.h); the launchers return cudaErrorInvalidValue only
// for sizes the kernels cannot index (a dimension or block count past 2^31).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// c[b, r, :] = a[b, r, :] @ op_b(B) for the rows of the row blocks listed in `rows`
// (a flat list over a's row blocks of rows.tile_h rows), zeros elsewhere. Expects
// p.trans_a == p.trans_c == false and c with a's leading dims.
// Fast paths (e.g. Hopper kernels under cuda/kernels/sm90/) belong first in this
// launcher; the generic kernel below is the fallback that handles every case.
cudaError_t LaunchRowGatherMatmul(const MatmulParams& p, const TileList& rows, cudaStream_t stream);

// C = op_a(A o mask) @ op_b(B), or op_a(A) @ op_b(B o mask) with sparse_b; lists as in
// DecodeStileGeometry (groups along the output dim of the sparse operand, entries
// K ranges). Every output element is written (empty groups give zeros).
cudaError_t LaunchStileMatmul(const MatmulParams& p, const TileList& lists, bool sparse_b, cudaStream_t stream);

// c[tile] = (op_a(A) @ op_b(B))[tile] for the listed tiles of C's (tile_h, tile_w)
// grid, zeros elsewhere. Expects p.trans_c == false and the index with c's batch.
cudaError_t LaunchSddMatmul(const MatmulParams& p, const TileList& tiles, cudaStream_t stream);

}  // namespace pit

// Hopper (sm_90a) fast path of pit_row_gather_matmul (M axis, docs/kernels.md):
//   C[b, r, :] = A[b, r, :] @ op(B[b']) for the rows of listed row blocks, 0 elsewhere.
// Dense 128x256 tiles of gathered rows on wgmma (2-CTA clusters sharing B by TMA
// multicast), one persistent launch that also zeroes the dead rows (list tail). No host
// sync, no allocation, no host read of device data; per call: one tensor-map encode and
// the launch (first call per device also sets the smem opt-in and queries cluster occupancy).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// Covered: dtype bf16 / f16 (trans_b false or true), float32 with allow_tf32 and
// trans_b (tf32 wgmma, K-major operands); trans_a = trans_c = false; no batch
// reduction (c_batch == batch); A / B / index batched or shared; any M, N % 8 == 0,
// K % 8 == 0 (K > 0); any tile_h >= 1; the list at full capacity (one slot per row
// block, dead ids `-1 - id` past the count); 16-byte aligned A, B, C; an sm_90 device.
// Anything else returns cudaErrorNotSupported and launches nothing.
cudaError_t LaunchRowGatherGemmSm90(const MatmulParams& p, const TileList& rows, cudaStream_t stream);

namespace sm90_rg_testing {
// For the standalone bench only: one compiled configuration of the kernel (cluster = CTAs
// per cluster along M sharing B by TMA multicast; stages_a / stages_b = pipeline depths;
// gather_warps = 0 (the consumer warps gather A) or 2 / 3 producer warps; carve = smallest
// shared-memory carve-out; diag =
// timing-only switches that make the result wrong; epi_in_a = epilogue staging in the
// freed A stage; split_k = the cluster splits K, batch 1; bn = columns per tile, 256 or
// 128; dual = both widths, chosen on the device; narrow = the 2-CTA clustered kernel with
// 128 x 208 tiles compiled in, chosen on the device). Only the default and split-K
// configurations are compiled unless the .cu is built with -DPIT_RG_EXPERIMENTS;
// NotSupported where not compiled. Unlike LaunchRowGatherGemmSm90, a variant never
// switches to split-K by itself.
cudaError_t LaunchVariant(const MatmulParams& p, const TileList& rows, cudaStream_t stream, int cluster, int stages_a,
                          int stages_b, int gather_warps, bool carve, int diag, bool epi_in_a, bool split_k = false,
                          int bn = 256, bool dual = false, bool narrow = false);
#ifdef PIT_RG_EXPERIMENTS
// The phase timestamps of the last kDiagStamp launch (diag 128): ctas x kStampSlots values
// (row_gather_gemm.cuh, Stamp), or with clear = true zeroes them.
cudaError_t Stamps(unsigned long long* host, int ctas, bool clear);
#endif
}  // namespace sm90_rg_testing

}  // namespace pit

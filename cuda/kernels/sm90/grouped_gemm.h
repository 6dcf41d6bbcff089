// Hopper (sm_90a) fast paths of the MoE grouped products (docs/kernels.md, "MoE").
// Each returns cudaErrorNotSupported (launching nothing) for a case it does not cover;
// the generic kernels (cuda/kernels/grouped_gemm.cu) then run instead.
//
// LaunchGroupedGemmSm90 covers: bf16 / f16 with trans_w false or true, float32 with
// allow_tf32 and trans_w (tf32 wgmma, K-major operands); D % 8 == 0, F % 8 == 0, any A,
// E, row_div dividing A; src / W / index batched or shared; batch * E <= 4096; 16-byte
// aligned src, W, y; an sm_90 device. One persistent launch computes
// sum_e ceil(count_e / 128) row tiles from the device-side counts and zeroes group E's rows.
// LaunchGroupedWgradSm90 covers: bf16 / f16, D % 8 == 0, F % 8 == 0, A > 0, row_div dividing
// A, src / dy / index batched or shared, dw_batch dividing batch (dw sums the entries); a
// 128 x 256 tile of dw[c, e] per CTA, or per cluster of up to 8 CTAs splitting its tokens
// when the tiles leave SMs idle (summed in a fixed order: deterministic), zeros for an
// empty expert; taken with >= 32 tokens per expert on average (batch / dw_batch * A >=
// 32 * E: measured faster than the generic kernel there, docs/notes/sm90_grouped.md run 8).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cuda/common/moe_params.h"

namespace pit {

namespace sm90_grouped {
// Args::diag of the grouped GEMM (experiments: LaunchVariant, the bench, LagWarps below).
constexpr int kDiagNoStore = 1;  // skip the epilogue's stores (timing only: wrong results)
constexpr int kDiagLag = 2;      // warps 1-3 of warpgroup 1 sleep 20 us before a tile they skip
constexpr int kDiagStampFwd = 4; // record phase timestamps (bench builds with -DPIT_RG_EXPERIMENTS)
}  // namespace sm90_grouped

cudaError_t LaunchGroupedGemmSm90(const GroupedMatmulParams& p, cudaStream_t stream);
cudaError_t LaunchGroupedWgradSm90(const GroupedWgradParams& p, cudaStream_t stream);

namespace sm90_grouped_testing {
// For the standalone bench only: the grouped GEMM with a given cluster size (1, or 2 CTAs
// sharing W tiles by TMA multicast: compiled only with -DPIT_GG_EXPERIMENTS); band > 0 walks
// each expert's work in bands of `band` row-tile sets, row tiles fastest inside a band
// (0: column tiles fastest); diag: sm90_grouped::kDiag* above.
cudaError_t LaunchVariant(const GroupedMatmulParams& p, cudaStream_t stream, int cluster, int band, int diag);
// The weight gradient without the size heuristic (runs whenever the case is covered).
cudaError_t LaunchWgradAlways(const GroupedWgradParams& p, cudaStream_t stream);
// Debug switch (tests): LaunchGroupedGemmSm90 runs its kernel with lagging warps (warps
// 1-3 of consumer warpgroup 1 sleep before each tile they skip; same results), the stress
// under which a lost B-stage release once hung at once. Off by default.
std::atomic<bool>& LagWarps();
}  // namespace sm90_grouped_testing

}  // namespace pit

// Attention over padded sequences, on the valid tokens only (docs/kernels.md,
// pit_varlen_attention). Up to kVarlenAttentionShortSeq tokens one CTA per (head,
// sequence) holds the whole sequence in shared memory (varlen_attention.cu); longer
// sequences run in blocks of 128 tokens with an online softmax (varlen_attention_long.cu).
// No atomics, a fixed summation order, no host sync, no allocation; safe to capture in a
// CUDA graph. The handlers validated the parameters (cuda/ffi/varlen_attention_args.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/varlen_attention_params.h"

namespace pit {

// out = softmax(scale q k^T) v over each sequence's valid keys, for its valid queries;
// lse their log-sum-exp; zeros (out) and 0 (lse) on padding rows.
cudaError_t LaunchVarlenAttention(const VarlenAttentionParams& p, cudaStream_t stream);

// dq, dk, dv from q, k, v, o, lse, dout; zeros on padding rows.
cudaError_t LaunchVarlenAttentionBwd(const VarlenAttentionParams& p, cudaStream_t stream);

}  // namespace pit

// The varlen attention kernels for sequences longer than kVarlenAttentionShortSeq
// (varlen_attention_long.cu); LaunchVarlenAttention(Bwd) dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/varlen_attention_params.h"

namespace pit {

cudaError_t LaunchVarlenAttentionLong(const VarlenAttentionParams& p, cudaStream_t stream);
cudaError_t LaunchVarlenAttentionLongBwd(const VarlenAttentionParams& p, cudaStream_t stream);

}  // namespace pit

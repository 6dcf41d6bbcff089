// Placeholder until the sm_90a grouped kernels land: every case goes to the generic path.
#include "cuda/kernels/sm90/grouped_gemm.h"

namespace pit {

cudaError_t LaunchGroupedGemmSm90(const GroupedMatmulParams&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t LaunchGroupedWgradSm90(const GroupedWgradParams&, cudaStream_t) { return cudaErrorNotSupported; }

}  // namespace pit

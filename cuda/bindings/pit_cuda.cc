// pit_jax._pit_cuda: the CUDA FFI handlers. Linked with the static CUDA runtime; it
// loads libcuda only when a kernel first runs, so importing it needs no GPU.
#include <cuda_runtime_api.h>

#include "cuda/bindings/registration.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/kernels/sm90/grouped_gemm.h"

PYBIND11_MODULE(_pit_cuda, m) {
  m.doc() = "pit_jax CUDA custom-call targets (XLA typed FFI)";
  m.def("registrations", []() {
    pybind11::dict targets;
    targets["pit_index"] = pit::HandlerCapsule(PitIndexCuda);
    targets["pit_index_split"] = pit::HandlerCapsule(PitIndexSplitCuda);
    targets["pit_sread"] = pit::HandlerCapsule(PitSreadCuda);
    targets["pit_sread_live"] = pit::HandlerCapsule(PitSreadLiveCuda);
    targets["pit_row_layer_norm"] = pit::HandlerCapsule(PitRowLayerNormCuda);
    targets["pit_row_layer_norm_bwd"] = pit::HandlerCapsule(PitRowLayerNormBwdCuda);
    targets["pit_row_activation"] = pit::HandlerCapsule(PitRowActivationCuda);
    targets["pit_row_activation_bwd"] = pit::HandlerCapsule(PitRowActivationBwdCuda);
    targets["pit_row_sum"] = pit::HandlerCapsule(PitRowSumCuda);
    targets["pit_row_concat_sum"] = pit::HandlerCapsule(PitRowConcatSumCuda);
    targets["pit_block_topk"] = pit::HandlerCapsule(PitBlockTopkCuda);
    targets["pit_mask_blocks"] = pit::HandlerCapsule(PitMaskBlocksCuda);
    targets["pit_swrite"] = pit::HandlerCapsule(PitSwriteCuda);
    targets["pit_row_gather_matmul"] = pit::HandlerCapsule(PitRowGatherMatmulCuda);
    targets["pit_row_gather_matmul3"] = pit::HandlerCapsule(PitRowGatherMatmul3Cuda);
    targets["pit_row_gather_matmul_pre"] = pit::HandlerCapsule(PitRowGatherMatmulPreCuda);
    targets["pit_row_gather_matmul_packed"] = pit::HandlerCapsule(PitRowGatherMatmulPackedCuda);
    targets["pit_stile_matmul"] = pit::HandlerCapsule(PitStileMatmulCuda);
    targets["pit_sdd_matmul"] = pit::HandlerCapsule(PitSddMatmulCuda);
    targets["pit_moe_index"] = pit::HandlerCapsule(PitMoeIndexCuda);
    targets["pit_grouped_matmul"] = pit::HandlerCapsule(PitGroupedMatmulCuda);
    targets["pit_grouped_wgrad"] = pit::HandlerCapsule(PitGroupedWgradCuda);
    targets["pit_grouped_wgrad_packed"] = pit::HandlerCapsule(PitGroupedWgradPackedCuda);
    targets["pit_varlen_attention"] = pit::HandlerCapsule(PitVarlenAttentionCuda);
    targets["pit_varlen_attention_bwd"] = pit::HandlerCapsule(PitVarlenAttentionBwdCuda);
    return targets;
  });
  m.def("set_poison_outputs", [](bool on) { pit::PoisonOutputs() = on; },
        "Debug: fill outputs with NaN bytes before each kernel (tests catch unwritten elements).");
  m.def("set_grouped_gemm_lag", [](bool on) { pit::sm90_grouped_testing::LagWarps() = on; },
        "Debug: the sm_90a MoE grouped GEMM runs with lagging warps (a stress test; same results).");
  m.def("handler_calls", []() { return pit::HandlerCalls().load(); },
        "Debug: host invocations of the CUDA handlers so far (not re-run when replayed in a CUDA graph).");
  m.def("build_info", []() {
    pybind11::dict info = pit::BuildInfo("CUDA");
    info["cuda_runtime_version"] = CUDART_VERSION;
    return info;
  });
}

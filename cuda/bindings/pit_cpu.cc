// pit_jax._pit_cpu: the CPU FFI handlers, as capsules for jax.ffi.register_ffi_target.
#include "cuda/bindings/registration.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/cpu/handlers.h"

PYBIND11_MODULE(_pit_cpu, m) {
  m.doc() = "pit_jax CPU custom-call targets (XLA typed FFI)";
  m.def("registrations", []() {
    pybind11::dict targets;
    targets["pit_index"] = pit::HandlerCapsule(PitIndexCpu);
    targets["pit_index_split"] = pit::HandlerCapsule(PitIndexSplitCpu);
    targets["pit_sread"] = pit::HandlerCapsule(PitSreadCpu);
    targets["pit_sread_live"] = pit::HandlerCapsule(PitSreadLiveCpu);
    targets["pit_row_layer_norm"] = pit::HandlerCapsule(PitRowLayerNormCpu);
    targets["pit_row_layer_norm_bwd"] = pit::HandlerCapsule(PitRowLayerNormBwdCpu);
    targets["pit_row_activation"] = pit::HandlerCapsule(PitRowActivationCpu);
    targets["pit_row_activation_bwd"] = pit::HandlerCapsule(PitRowActivationBwdCpu);
    targets["pit_row_sum"] = pit::HandlerCapsule(PitRowSumCpu);
    targets["pit_row_concat_sum"] = pit::HandlerCapsule(PitRowConcatSumCpu);
    targets["pit_block_topk"] = pit::HandlerCapsule(PitBlockTopkCpu);
    targets["pit_mask_blocks"] = pit::HandlerCapsule(PitMaskBlocksCpu);
    targets["pit_swrite"] = pit::HandlerCapsule(PitSwriteCpu);
    targets["pit_row_gather_matmul"] = pit::HandlerCapsule(PitRowGatherMatmulCpu);
    targets["pit_row_gather_matmul3"] = pit::HandlerCapsule(PitRowGatherMatmul3Cpu);
    targets["pit_row_gather_matmul_pre"] = pit::HandlerCapsule(PitRowGatherMatmulPreCpu);
    targets["pit_row_gather_matmul_packed"] = pit::HandlerCapsule(PitRowGatherMatmulPackedCpu);
    targets["pit_stile_matmul"] = pit::HandlerCapsule(PitStileMatmulCpu);
    targets["pit_sdd_matmul"] = pit::HandlerCapsule(PitSddMatmulCpu);
    targets["pit_moe_index"] = pit::HandlerCapsule(PitMoeIndexCpu);
    targets["pit_grouped_matmul"] = pit::HandlerCapsule(PitGroupedMatmulCpu);
    targets["pit_grouped_wgrad"] = pit::HandlerCapsule(PitGroupedWgradCpu);
    // Packed rows with identity lists: the same sums through the same loop.
    targets["pit_grouped_wgrad_packed"] = pit::HandlerCapsule(PitGroupedWgradCpu);
    targets["pit_varlen_attention"] = pit::HandlerCapsule(PitVarlenAttentionCpu);
    targets["pit_varlen_attention_bwd"] = pit::HandlerCapsule(PitVarlenAttentionBwdCpu);
    return targets;
  });
  m.def("set_poison_outputs", [](bool on) { pit::PoisonOutputs() = on; },
        "Debug: fill outputs with NaN bytes before each kernel (tests catch unwritten elements).");
  m.def("build_info", []() { return pit::BuildInfo("cpu"); });
}

// The CPU FFI handlers pit_jax registers (platform "cpu"); docs/kernels.md is their contract.
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(PitIndexCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSreadCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSreadLiveCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowLayerNormCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSwriteCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowGatherMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowGatherMatmul3Cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitStileMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSddMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitMoeIndexCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitGroupedMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitGroupedWgradCpu);

// The CUDA FFI handlers pit_jax registers (platform "CUDA"); docs/kernels.md is their contract.
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(PitIndexCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSreadCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSreadLiveCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowLayerNormCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSwriteCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowGatherMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitRowGatherMatmul3Cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitStileMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitSddMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitMoeIndexCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitGroupedMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitGroupedWgradCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PitGroupedWgradPackedCuda);

// The CUDA FFI handlers pit_jax registers (platform "CUDA").
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(PitIndexCuda);

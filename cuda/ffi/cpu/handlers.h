// The CPU FFI handlers pit_jax registers (platform "cpu").
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(PitIndexCpu);

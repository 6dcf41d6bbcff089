// What both binding modules export: FFI handler capsules and the build's versions.
#pragma once

#include <pybind11/pybind11.h>

#include "pit_build_info.h"
#include "xla/ffi/api/c_api.h"

namespace pit {

// jax.ffi.register_ffi_target takes a capsule holding the handler's address.
template <typename Fn>
pybind11::capsule HandlerCapsule(Fn* fn) {
  return pybind11::capsule(reinterpret_cast<void*>(fn), "xla._CUSTOM_CALL_TARGET");
}

// Versions this module was compiled against; pit_jax._native compares them with the
// running jaxlib so an FFI API mismatch is a readable error, not "No FFI handler".
inline pybind11::dict BuildInfo(const char* platform) {
  pybind11::dict info;
  info["platform"] = platform;
  info["jaxlib_version"] = PIT_BUILD_JAXLIB_VERSION;
  info["ffi_api_version"] = pybind11::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  return info;
}

}  // namespace pit

// Host-side helpers shared by the sm_90a launchers (row-gather and grouped GEMMs): which
// devices can run them, and the driver's tensor-map encoder. Both are looked up once.
#pragma once

#include <mutex>

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include "cuda/kernels/device_utils.cuh"  // EnvFlag

namespace pit {
namespace sm90 {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  // Compute capability 9.0 exactly (sm_90a code runs nowhere else), unless PIT_JAX_HOPPER=0
  // asks for the generic kernels, as on other GPUs; the Python lowerings read the same
  // variable (pit_jax/primitives/_lowering.py, cuda_is_sm90).
  bool sm90 = false;
  int sms = 0;
};

// The current device's info, or nullptr when there is no usable current device.
inline const DeviceInfo* GetDeviceInfo() {
  static DeviceInfo info[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return nullptr;
  std::call_once(once[dev], [dev] {
    int major = 0, minor = 0, sms = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    info[dev].sm90 = major == 9 && minor == 0 && EnvFlag("PIT_JAX_HOPPER", true);
    info[dev].sms = sms;
  });
  return &info[dev];
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), or
// nullptr when the driver does not offer it.
inline PFN_cuTensorMapEncodeTiled_v12000 GetEncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
#else
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
#endif
  });
  return fn;
}

// A cudaLaunchKernelEx configuration whose CTAs form clusters of `cluster` along x (no
// cluster attribute for 1). `cfg.attrs` points into the object, so it is not copyable.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};

  ClusterLaunch(int cluster, int threads, int smem_bytes, cudaStream_t stream, unsigned grid = 0) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(threads);
    cfg.gridDim = dim3(grid);
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace sm90
}  // namespace pit

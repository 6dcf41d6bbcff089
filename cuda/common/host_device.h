// PIT_HOST_DEVICE: for the helpers of the plain structs in cuda/common/, which run on the
// host and, under nvcc, on the device.
#pragma once

#if defined(__CUDACC__)
#define PIT_HOST_DEVICE __host__ __device__
#else
#define PIT_HOST_DEVICE
#endif

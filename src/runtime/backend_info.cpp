#include "runtime/backend_info.h"

#include "util/error.h"

#ifdef AUTOSP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ops/cuda_attention.h"
#include "runtime/cuda_blas.h"
#endif

#ifndef AUTOSP_GPU_CHECK
#define AUTOSP_GPU_CHECK "not yet verified on a GPU (scripts/gpu_check.sh writes docs/gpu_check.json)"
#endif
#ifndef AUTOSP_CUDA_ARCHS
#define AUTOSP_CUDA_ARCHS "?"
#endif

namespace autosp {

std::string gpu_verification() { return AUTOSP_GPU_CHECK; }

std::string backends_summary() {
#ifdef AUTOSP_HAVE_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  const std::string devices = rc == cudaSuccess ? str(count, " visible") : str("none visible: ", cudaGetErrorName(rc));
  if (rc != cudaSuccess) cudaGetLastError();
  return str("cpu; cuda (built: CUDA runtime ", runtime / 1000, ".", (runtime % 1000) / 10, ", ", cublas_summary(),
             ", ", cuda_cudnn_summary(), ", architectures ", AUTOSP_CUDA_ARCHS, "; GPUs here: ", devices, "; ",
             gpu_verification(), ")");
#else
  return "cpu; cuda (not built: configure with nvcc and the CUDA toolkit found, or -DAUTOSP_CUDA=ON)";
#endif
}

std::string nccl_summary() {
#ifdef AUTOSP_HAVE_CUDA
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return ", nccl (version unknown)";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch
  return str(", nccl ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
#else
  return "";
#endif
}

}  // namespace autosp

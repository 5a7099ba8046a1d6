#include "runtime/cuda_blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "ops/cuda_kernels.h"
#include "util/error.h"
#include "util/shared_library.h"

namespace autosp {

std::string default_cublas_library() { return str("libcublas.so.", CUBLAS_VER_MAJOR); }

CublasApi load_cublas(const std::string& library) {
  std::string why;
  void* handle = open_shared_library(library, &why);
  if (!handle)
    throw CudaError(str("cuda backend: cuBLAS: ", why, "; install CUDA ", CUBLAS_VER_MAJOR,
                        "'s cuBLAS, add its directory to LD_LIBRARY_PATH, or set AUTOSP_CUBLAS_LIBRARY to the "
                        "library's path"));
  CublasApi api;
  api.library = library;
  auto resolve = [&](auto& fn, const char* name) {
    dlerror();
    void* sym = dlsym(handle, name);
    if (!sym) {
      const char* why = dlerror();
      const std::string reason = why ? why : "not found";
      dlclose(handle);
      throw CudaError(str("cuda backend: ", library, " is not the cuBLAS autosp was built against (CUDA ",
                          CUBLAS_VER_MAJOR, "): it has no ", name, " (", reason, ")"));
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  resolve(api.create, "cublasCreate_v2");
  resolve(api.destroy, "cublasDestroy_v2");
  resolve(api.set_stream, "cublasSetStream_v2");
  resolve(api.gemm_ex, "cublasGemmEx");
  resolve(api.status_name, "cublasGetStatusName");
  resolve(api.status_string, "cublasGetStatusString");
  resolve(api.get_property, "cublasGetProperty");
  return api;  // the handle stays open for the process's life, as a linked library would
}

const CublasApi& cublas() {
  static std::mutex mu;
  static CublasApi api;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) {
    const char* chosen = std::getenv("AUTOSP_CUBLAS_LIBRARY");
    api = load_cublas(chosen && *chosen ? chosen : default_cublas_library());
    loaded = true;
  }
  return api;
}

std::string cublas_summary() {
  try {
    const CublasApi& api = cublas();
    int v[3] = {0, 0, 0};
    const libraryPropertyType parts[3] = {MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL};
    for (int i = 0; i < 3; ++i)
      if (api.get_property(parts[i], &v[i]) != CUBLAS_STATUS_SUCCESS) return str("cuBLAS (", api.library, ")");
    return str("cuBLAS ", v[0], ".", v[1], ".", v[2], " (", api.library, ")");
  } catch (const CudaError& e) {
    return str("cuBLAS not loadable: ", e.what());
  }
}

}  // namespace autosp

// cuBLAS, loaded when the cuda backend first needs it, not when autosp starts.
//
// Linking libcublas makes every process pay libcublasLt's static initialisers before main:
// about 0.1 s and 250 MB touched, measured on a 2-core Zen 4, in every CPU run, every
// `autosp --version` and every test process. So autosp does not link it: the first cuda
// executor (or anything else that calls cublas()) opens it with dlopen and resolves the few
// functions the backend calls. The functions are typed by cublas_v2.h itself (decltype), so a
// changed signature is a compile error, not a crash.
#pragma once
#include <cublas_v2.h>

#include <string>

namespace autosp {

// cublasGemmEx has a C++ overload (a cudaDataType compute type, for old code); the table holds
// the one with cublasComputeType_t, chosen by its exact type (unevaluated: no reference to the
// symbol, which the link would then need).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(sizeof(static_cast<CublasGemmEx>(&::cublasGemmEx)) > 0, "cublas_api.h's cublasGemmEx changed");

struct CublasApi {
  std::string library;  // what was opened: its soname, or AUTOSP_CUBLAS_LIBRARY's path
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  CublasGemmEx gemm_ex = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
};

// The process's cuBLAS, opened on the first call: AUTOSP_CUBLAS_LIBRARY when set (a path or a
// soname), else the soname of the major version autosp was built against (libcublas.so.13),
// found as the dynamic linker finds a library (LD_LIBRARY_PATH, the executable's run path, the
// ld.so cache). Throws CudaError naming the library, the loader's reason and how to point
// autosp at one; a later call tries again.
const CublasApi& cublas();

// Opens `library` and resolves the functions: cublas()'s work, uncached (a test names a
// library that is not cuBLAS, or none). Each call opens the library again (dlopen counts).
CublasApi load_cublas(const std::string& library);

// The library cublas() opens when AUTOSP_CUBLAS_LIBRARY is unset.
std::string default_cublas_library();

// "cuBLAS 13.1.0 (libcublas.so.13)", or why it cannot be loaded: for `autosp --version`.
std::string cublas_summary();

}  // namespace autosp

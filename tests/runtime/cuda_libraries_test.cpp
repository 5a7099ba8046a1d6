// cuBLAS (runtime/cuda_blas.h), cuDNN and NVRTC (ops/cuda_attention_cudnn.cpp) are opened when
// the cuda backend first needs them, never linked: a CPU run, `autosp --version` and every test
// process start without their static initialisers (0.09 s and 250 MB resident per process,
// measured). Host-side only: nothing here needs a GPU (the libraries load and report their
// versions without one).
#ifdef AUTOSP_HAVE_CUDA
#include "runtime/cuda_blas.h"

#include <gtest/gtest.h>
#ifdef AUTOSP_HAVE_CUDNN
#include <cudnn_version.h>  // CUDNN_MAJOR
#endif

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "ops/cuda_attention.h"
#include "ops/cuda_kernels.h"
#include "testing/errors.h"
#include "testing/process.h"

namespace autosp {
namespace {

using testing::run_command;

// The dynamic section's NEEDED entries of an executable, as the loader reads them.
std::string needed_libraries(const std::string& executable) {
  const auto r = run_command("readelf -d '" + executable + "' | grep NEEDED");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

TEST(CudaLibraries, NeitherTheCliNorTheTestsLinkCublasCudnnOrNvrtc) {
  for (const std::string& exe : {std::string(AUTOSP_BINARY), std::filesystem::read_symlink("/proc/self/exe").string()}) {
    const std::string needed = needed_libraries(exe);
    EXPECT_NE(needed.find("libcudart"), std::string::npos) << exe << " (the check reads nothing?)\n" << needed;
    for (const char* lib : {"libcublas", "libcudnn", "libnvrtc"})
      EXPECT_EQ(needed.find(lib), std::string::npos) << exe << " links " << lib << ":\n" << needed;
  }
}

TEST(CublasLibrary, OpensTheMajorVersionAutospWasBuiltAgainst) {
  EXPECT_EQ(default_cublas_library(), "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  const CublasApi api = load_cublas(default_cublas_library());
  int major = 0;
  ASSERT_EQ(api.get_property(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(major, CUBLAS_VER_MAJOR);
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  // The process-wide table is the same library.
  EXPECT_EQ(cublas().library, default_cublas_library());
  EXPECT_EQ(cublas().create, api.create);
}

TEST(CublasLibrary, AMissingLibraryIsAnErrorNamingItAndTheWayOut) {
  testing::expect_contains(testing::error_of<CudaError>([] { load_cublas("/nonexistent/libcublas.so.13"); }),
                           {"cuBLAS: /nonexistent/libcublas.so.13 cannot be loaded", "LD_LIBRARY_PATH",
                            "AUTOSP_CUBLAS_LIBRARY"});
}

TEST(CublasLibrary, ALibraryThatIsNotCublasIsAnErrorNamingTheMissingFunction) {
  testing::expect_contains(testing::error_of<CudaError>([] { load_cublas("libm.so.6"); }),
                           {"libm.so.6 is not the cuBLAS autosp was built against", "cublasCreate_v2"});
}

TEST(CublasLibrary, VersionSaysWhichCublasLoadsOrWhyNot) {
  const auto ok = run_command(std::string("'") + AUTOSP_BINARY + "' --version");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) + "."), std::string::npos) << ok.output;
  // A user's choice that cannot load: --version still works, and says why (a CPU run needs
  // no cuBLAS).
  const auto bad = run_command(std::string("AUTOSP_CUBLAS_LIBRARY=/nonexistent/libcublas.so '") + AUTOSP_BINARY +
                               "' --version");
  ASSERT_EQ(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("cuBLAS not loadable: cuda backend: cuBLAS: /nonexistent/libcublas.so cannot be loaded"),
            std::string::npos)
      << bad.output;
}

#ifdef AUTOSP_HAVE_CUDNN
// The first question about cuDNN opens libcudnn and checks NVRTC and its builtins (what cuDNN's
// runtime-compiled attention engines need); on a machine with the CUDA toolkit both open.
TEST(CudnnLibrary, OpensCudnnAndNvrtcOnFirstUse) {
  EXPECT_EQ(cuda_cudnn_unavailable(), "");
  std::ifstream maps("/proc/self/maps");
  const std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  for (const char* lib : {"libcudnn.so", "libnvrtc.so", "libnvrtc-builtins.so"})
    EXPECT_NE(mapped.find(lib), std::string::npos) << lib << " is not mapped after cuDNN was opened";
  EXPECT_NE(cuda_cudnn_summary().find("cuDNN " + std::to_string(CUDNN_MAJOR) + "."), std::string::npos)
      << cuda_cudnn_summary();
  const auto version = run_command(std::string("'") + AUTOSP_BINARY + "' --version");
  EXPECT_NE(version.output.find(cuda_cudnn_summary()), std::string::npos) << version.output;
}
#endif

}  // namespace
}  // namespace autosp
#endif  // AUTOSP_HAVE_CUDA

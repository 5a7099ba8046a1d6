// cuBLAS is opened when the cuda backend first needs it (runtime/cuda_blas.h), never linked:
// a CPU run, `autosp --version` and every test process start without libcublasLt's 0.1 s of
// static initialisers. Host-side only: nothing here needs a GPU (cuBLAS loads and reports its
// version without one).
#ifdef AUTOSP_HAVE_CUDA
#include "runtime/cuda_blas.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ops/cuda_kernels.h"
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

TEST(CublasLibrary, NeitherTheCliNorTheTestsLinkIt) {
  for (const std::string& exe : {std::string(AUTOSP_BINARY), std::filesystem::read_symlink("/proc/self/exe").string()}) {
    const std::string needed = needed_libraries(exe);
    EXPECT_NE(needed.find("libcudart"), std::string::npos) << exe << " (the check reads nothing?)\n" << needed;
    EXPECT_EQ(needed.find("libcublas"), std::string::npos) << exe << " links cuBLAS:\n" << needed;
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
  try {
    load_cublas("/nonexistent/libcublas.so.13");
    FAIL() << "loaded a library that does not exist";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot load cuBLAS (/nonexistent/libcublas.so.13)"), std::string::npos) << what;
    EXPECT_NE(what.find("LD_LIBRARY_PATH"), std::string::npos) << what;
    EXPECT_NE(what.find("AUTOSP_CUBLAS_LIBRARY"), std::string::npos) << what;
  }
}

TEST(CublasLibrary, ALibraryThatIsNotCublasIsAnErrorNamingTheMissingFunction) {
  try {
    load_cublas("libm.so.6");
    FAIL() << "took libm for cuBLAS";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("libm.so.6 is not the cuBLAS autosp was built against"), std::string::npos) << what;
    EXPECT_NE(what.find("cublasCreate_v2"), std::string::npos) << what;
  }
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
  EXPECT_NE(bad.output.find("cuBLAS not loadable: cuda backend: cannot load cuBLAS (/nonexistent/libcublas.so)"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace autosp
#endif  // AUTOSP_HAVE_CUDA

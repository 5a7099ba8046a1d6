// Open MPI 4 keeps a session directory per host and user, <tmp>/ompi.<host>.<uid>, which each
// mpirun creates and removes; mpiruns of concurrent processes race on it and one fails at start
// ("A call to mkdir was unable to create the desired directory ... File exists", open-mpi/ompi
// #8510), as two ctest jobs' tests did here. Each test process gives the mpiruns it starts a
// directory of its own, made before main() and removed at exit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace autosp {
namespace {

struct OwnMpiSessionDir {
  std::string dir;
  OwnMpiSessionDir() {
    if (std::getenv("OMPI_MCA_orte_tmpdir_base")) return;  // the caller's choice
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/autosp-mpi.XXXXXX";
    if (mkdtemp(path.data())) {
      dir = path;
      setenv("OMPI_MCA_orte_tmpdir_base", dir.c_str(), 1);
    }
  }
  ~OwnMpiSessionDir() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};
const OwnMpiSessionDir own_mpi_session_dir;

TEST(MpiSessionDir, EachTestProcessStartsItsMpirunsInADirectoryOfItsOwn) {
  const char* base = std::getenv("OMPI_MCA_orte_tmpdir_base");
  ASSERT_NE(base, nullptr);
  if (!own_mpi_session_dir.dir.empty()) {
    EXPECT_EQ(std::string(base), own_mpi_session_dir.dir);
    EXPECT_TRUE(std::filesystem::is_directory(base));
  }
}

}  // namespace
}  // namespace autosp

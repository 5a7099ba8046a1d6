// Which communicator the cuda backend's collectives run on (comm/device_comm.h): host logic,
// checked without a GPU. make_device_groups asks it with AUTOSP_COMM (else the config's comm
// key) and whether some node runs more ranks than it has GPUs.
#include "comm/device_comm.h"

#include <gtest/gtest.h>

#include "util/error.h"

namespace autosp {
namespace {

TEST(DeviceComm, AutoStagesOnlyWhereRanksShareAGpu) {
  for (const char* asked : {"", "auto"}) {
    EXPECT_EQ(device_comm_choice(asked, false), DeviceComm::nccl) << asked;
    EXPECT_EQ(device_comm_choice(asked, true), DeviceComm::staged) << asked;
  }
}

TEST(DeviceComm, AnExplicitChoiceWinsEitherWay) {
  for (bool shared : {false, true}) {
    EXPECT_EQ(device_comm_choice("nccl", shared), DeviceComm::nccl);
    EXPECT_EQ(device_comm_choice("mpi", shared), DeviceComm::staged);
  }
}

TEST(DeviceComm, AnythingElseIsAUserErrorNamingTheChoices) {
  for (const char* bad : {"NCCL", "gloo", "mpi ", "1"}) {
    try {
      device_comm_choice(bad, false);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("\"") + bad + "\""), std::string::npos) << what;
      for (const char* part : {"AUTOSP_COMM", "comm key", "nccl", "mpi", "auto"})
        EXPECT_NE(what.find(part), std::string::npos) << what << "\nmissing: " << part;
    }
  }
  EXPECT_STREQ(device_comm_name(DeviceComm::nccl), "nccl");
  EXPECT_NE(std::string(device_comm_name(DeviceComm::staged)).find("mpi"), std::string::npos);
}

}  // namespace
}  // namespace autosp

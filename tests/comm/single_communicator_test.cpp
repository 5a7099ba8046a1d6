// The single-rank communicator: collectives of a group of one are copies, and it refuses
// what MPI would refuse (bad roots, negative counts, overlapping buffers) so code tested
// on one rank does not break under MPI. The MPI communicator is tested by comm_mpi_main.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "util/error.h"

namespace {

using autosp::Communicator;
using autosp::InternalError;
using autosp::make_single_communicator;

std::vector<float> iota(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SingleCommunicator, IsRankZeroOfOne) {
  auto comm = make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
}

TEST(SingleCommunicator, AllReduceLeavesDataAsItIs) {
  auto comm = make_single_communicator();
  std::vector<float> f = iota(7, 0.5f);
  const std::vector<float> f_before = f;
  comm->all_reduce_sum(f.data(), 7);
  EXPECT_EQ(f, f_before);
  std::vector<double> d = {1.25, -3.0, 1e300};
  const std::vector<double> d_before = d;
  comm->all_reduce_sum(d.data(), 3);
  EXPECT_EQ(d, d_before);
  comm->all_reduce_sum(static_cast<float*>(nullptr), 0);
  comm->all_reduce_sum(static_cast<double*>(nullptr), 0);
}

TEST(SingleCommunicator, AllToAllAllGatherReduceScatterCopy) {
  auto comm = make_single_communicator();
  for (int64_t n : {0, 1, 3, 1001}) {
    const std::vector<float> send = iota(n, 10.0f);
    std::vector<float> recv(static_cast<size_t>(n), -1.0f);
    comm->all_to_all(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send) << "all_to_all n=" << n;
    std::fill(recv.begin(), recv.end(), -1.0f);
    comm->all_gather(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send) << "all_gather n=" << n;
    std::fill(recv.begin(), recv.end(), -1.0f);
    comm->reduce_scatter_sum(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send) << "reduce_scatter_sum n=" << n;
  }
}

TEST(SingleCommunicator, BroadcastFromRankZeroKeepsBytesAndBarrierReturns) {
  auto comm = make_single_communicator();
  std::vector<unsigned char> bytes = {1, 2, 3, 255};
  comm->broadcast(bytes.data(), 4, 0);
  EXPECT_EQ(bytes, (std::vector<unsigned char>{1, 2, 3, 255}));
  comm->broadcast(nullptr, 0, 0);
  comm->barrier();
}

TEST(SingleCommunicator, RefusesWhatMpiWouldRefuse) {
  auto comm = make_single_communicator();
  std::vector<float> buf(8, 0.0f);
  char byte = 0;
  EXPECT_THROW(comm->broadcast(&byte, 1, 1), InternalError);   // no rank 1 in a group of one
  EXPECT_THROW(comm->broadcast(&byte, 1, -1), InternalError);
  EXPECT_THROW(comm->broadcast(&byte, -1, 0), InternalError);
  EXPECT_THROW(comm->all_reduce_sum(buf.data(), -1), InternalError);
  EXPECT_THROW(comm->all_gather(buf.data(), buf.data() + 4, -2), InternalError);
  // MPI forbids send and recv to overlap (it has MPI_IN_PLACE for that), so this must too.
  EXPECT_THROW(comm->all_to_all(buf.data(), buf.data(), 4), InternalError);
  EXPECT_THROW(comm->all_gather(buf.data(), buf.data() + 2, 4), InternalError);
  EXPECT_THROW(comm->reduce_scatter_sum(buf.data() + 3, buf.data(), 4), InternalError);
  comm->all_to_all(buf.data(), buf.data() + 4, 4);  // adjacent, not overlapping
  comm->all_gather(buf.data(), buf.data(), 0);      // nothing moves
}

}  // namespace

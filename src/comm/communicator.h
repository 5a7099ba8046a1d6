// Collective communication among the ranks of one group. autosp uses three groups
// (DESIGN.md): the world (DP x SP ranks), sequence-parallel groups of SP consecutive ranks
// (group = rank / SP) and data-parallel groups taking one rank of each SP group.
//
// Every call is collective over the group: all its ranks call it, in the same order, with
// the same sizes. Buffers are fp32 unless the name says otherwise. Implementations: a
// single-rank one (a group of one: copies) and MPI (mpi_communicator.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace autosp {

// A collective started and not yet finished (Communicator::all_to_all_start): its buffers
// must stay untouched until wait() returns.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Lets it progress (MPI moves a nonblocking collective only inside MPI calls); true once it
  // has finished.
  virtual bool test() = 0;
  // Until it has finished.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in this group
  virtual int size() const = 0;

  // data[i] = sum over ranks of data[i], in place.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  virtual void all_reduce_sum(double* data, int64_t n) = 0;
  // send holds size() chunks of `chunk` elements; chunk p goes to rank p, and recv's chunk
  // p comes from rank p.
  virtual void all_to_all(const float* send, float* recv, int64_t chunk) = 0;
  // all_to_all, started: it runs while the caller computes, until wait() (the executor's
  // overlap of the sequence-parallel exchanges with compute). Started collectives of a group
  // finish in the order they were started, on every rank alike. This default runs it at once.
  virtual std::unique_ptr<PendingCollective> all_to_all_start(const float* send, float* recv, int64_t chunk);
  // recv (size() * n) = every rank's send (n), in rank order.
  virtual void all_gather(const float* send, float* recv, int64_t n) = 0;
  // On `root`: recv (size() * n) = every rank's send (n), in rank order; recv is not used on
  // the other ranks (may be null). Only the root receives: what a checkpoint's writer needs.
  // This fallback, for communicators without a rooted gather, all-gathers through a
  // scratch of size() * n floats on the other ranks.
  virtual void gather(const float* send, float* recv, int64_t n, int root) {
    if (rank() == root) return all_gather(send, recv, n);
    std::vector<float> scratch(static_cast<size_t>(size() * n));
    all_gather(send, scratch.data(), n);
  }
  // recv (n) = sum over ranks of their send's chunk number rank() (send has size() * n).
  virtual void reduce_scatter_sum(const float* send, float* recv, int64_t n) = 0;
  // bytes from rank `root` to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

// A group of one: collectives are copies.
std::unique_ptr<Communicator> make_single_communicator();

// A failure that some ranks of `group` see, made every rank's, so that all stop together
// with one message instead of the others waiting in a later collective for the ranks that
// failed: returns, on every rank, the `error` of the failing rank whose failure comes first
// by `order` (where it lies in work the ranks share out, e.g. the index of the file it
// concerns; 0 <= order < 2^53), then by rank; "" on every rank when no rank failed (an
// empty `error`). Collective: one all-reduce of size() doubles, and after a failure two
// broadcasts from that rank.
std::string agreed_error(Communicator& group, const std::string& error, int64_t order = 0);

// The process's groups for a world of `world.size()` ranks split into SP groups of
// `sp_size` consecutive ranks. `world.size() % sp_size == 0` is checked by the caller.
struct ProcessGroups {
  std::unique_ptr<Communicator> world, sp, dp;
  int sp_size = 1, dp_size = 1;
  int sp_rank = 0, dp_rank = 0;  // this rank's index in its SP group and its DP group
  // What the cuda backend runs these groups' collectives on (comm/device_comm.h: "auto",
  // "nccl" or "mpi"; the config's comm key).
  std::string device_comm = "auto";
};

}  // namespace autosp

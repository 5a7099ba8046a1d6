// Communicator over MPI, and the process-wide MPI runtime that builds autosp's groups.
//
// Invariants:
//  - Every MPI call is checked. Communicators run with MPI_ERRORS_RETURN, and a failing
//    call throws MpiError naming the call, the group and MPI's error string.
//  - Counts of any size work: a collective moves at most max_call_bytes() per peer per MPI
//    call and is split into several calls above that (derived datatypes keep the rank-major
//    layouts without copies; reduce_scatter_sum packs its chunks into a bounded buffer).
//    A reduction call also covers at most kMaxReductionCallBytes of all ranks' data, which
//    bounds what MPI allocates for it (see there).
//  - Collectives are nonblocking MPI calls completed by a wait with a deadline
//    (comm_timeout()): a rank that stops taking part ends the job with CommTimeout instead
//    of hanging it.
//  - MPI is initialised with MPI_THREAD_FUNNELED: only the thread that built the runtime
//    calls MPI (OpenMP regions must not).
//
// Failure on a subset of ranks: MPI has no way to unblock ranks waiting in a collective for
// a rank that left it. A rank that fails must call MpiRuntime::abort_all, which ends the
// whole job; returning from main (MPI_Finalize waits for the other ranks) would hang it.
#pragma once
// The C API only: OpenMPI's and MPICH's deprecated C++ bindings warn under -Wextra and
// would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"

namespace autosp {

// A failed MPI call: the job's MPI is broken (a rank or link died) or the ranks made
// mismatched collective calls. Neither the user's input nor (necessarily) an autosp bug.
struct MpiError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A collective that made no progress for comm_timeout() seconds: a rank of its group is
// stopped, deadlocked or cut off. The pending request cannot be cancelled, so the only way
// on is to end the job (MpiRuntime::abort_all); the message names this rank, the call and
// the group.
struct CommTimeout : MpiError {
  using MpiError::MpiError;
};

// Seconds a collective of an MpiCommunicator may wait before it throws CommTimeout (torch's
// NCCL watchdog, for MPI). 0 = wait forever. Process-wide; `autosp train --comm-timeout`.
void set_comm_timeout(double seconds);
double comm_timeout();

// While one lives, collectives wait without a deadline: for waits on another rank's disk
// I/O (rank 0 writing a checkpoint of any size while the others wait for its result),
// which is slow, not stuck. Nests.
class CommTimeoutSuspended {
 public:
  CommTimeoutSuspended();
  ~CommTimeoutSuspended();
  CommTimeoutSuspended(const CommTimeoutSuspended&) = delete;
  CommTimeoutSuspended& operator=(const CommTimeoutSuspended&) = delete;
};

// Throws MpiError if `rc` is not MPI_SUCCESS: "<call> failed on <group>: <MPI's string>".
void check_mpi(int rc, const char* call, const std::string& group);

class MpiCommunicator final : public Communicator {
 public:
  // Adopts `comm` (freed on destruction) and sets MPI_ERRORS_RETURN on it. `name` says
  // which group this is in error messages, e.g. "sp group 1 (world ranks 2..3)".
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // A duplicate of `parent` (MPI_Comm_dup), so that autosp's traffic never matches
  // messages of other code on `parent`.
  static std::unique_ptr<MpiCommunicator> dup(MPI_Comm parent, std::string name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }
  const std::string& name() const { return name_; }

  void all_reduce_sum(float* data, int64_t n) override;
  void all_reduce_sum(double* data, int64_t n) override;
  void all_to_all(const float* send, float* recv, int64_t chunk) override;
  // The MPI_Ialltoall calls of all_to_all, issued; wait() completes them (with the timeout).
  std::unique_ptr<PendingCollective> all_to_all_start(const float* send, float* recv, int64_t chunk) override;
  // Completes a request of this group's, as its collectives do (--comm-timeout applies).
  void wait_request(MPI_Request& request, const char* call, const std::string& what) const {
    wait(request, call, what);
  }
  void all_gather(const float* send, float* recv, int64_t n) override;
  void gather(const float* send, float* recv, int64_t n, int root) override;
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;

  // Bytes per peer above which a collective is split into several MPI calls. 1 GiB keeps
  // counts far below INT_MAX and clear of >2 GiB message bugs in some MPI builds. Tests set
  // a few bytes to exercise the split path; it must be the same on every rank of the group.
  static constexpr int64_t kDefaultMaxCallBytes = int64_t{1} << 30;
  int64_t max_call_bytes() const { return max_call_bytes_; }
  void set_max_call_bytes(int64_t bytes);

  // Bytes of data one reduction call (all_reduce_sum; reduce_scatter_sum: every rank's chunk
  // of the call together) covers at most. MPI stages a nonblocking reduction in temporaries
  // of the call's whole size: Open MPI 4.1's libnbc reduce_scatter_block is a binomial
  // reduce to rank 0 through 2 x the call's bytes, touched on rank 0 (both halves) and on
  // every rank that receives in the tree (one), then a scatter; its allreduce stages 1 x;
  // MPICH's recursive halving allocates the whole count too. One call for a 16 MiB gradient
  // bucket at W = 4 made rank 0 peak 32 MiB and rank 2 16 MiB above every plan. In 1 MiB
  // calls the most is 3 MiB (rank 0: the two halves and the packing buffer), and the calls
  // run faster, their temporaries staying in cache: at W = 4 over shared memory a 16 MiB
  // reduce_scatter_sum took 15 ms instead of 36, an all_reduce_sum 20 ms instead of 33.
  static constexpr int64_t kMaxReductionCallBytes = int64_t{1} << 20;

 private:
  void check(int rc, const char* call) const { check_mpi(rc, call, name_); }
  // Completes `request` of `call` (a nonblocking collective); CommTimeout past the deadline.
  // `what` says what it moves, for the message ("all_reduce_sum of 12 floats").
  void wait(MPI_Request& request, const char* call, const std::string& what) const;
  template <typename T>
  void all_reduce_sum_impl(T* data, int64_t n, MPI_Datatype type);
  int64_t max_count(size_t element_bytes) const;

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int64_t max_call_bytes_ = kDefaultMaxCallBytes;
};

// MPI for the life of the process: initialises MPI (if nobody did) and finalises it on
// destruction. Build one, in main, before any other MPI use; destroy the communicators it
// made before it.
class MpiRuntime {
 public:
  // argc/argv may be null (MPI-2 allows that).
  explicit MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // True when a launcher started this process (OpenMPI's mpirun, or a PMI/PMIx launcher
  // such as srun or hydra): the caller should then use MPI even for one rank.
  static bool launched_by_mpirun();
  // The MPI library's own version line (callable before MPI starts), e.g. "Open MPI v4.1.4".
  static std::string library_version();

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // World, SP and DP groups: SP groups are `sp_size` consecutive world ranks (group
  // rank / sp_size), DP groups take one rank of each SP group (group rank % sp_size).
  // UserError if sp_size < 1 or the world size is not divisible by it. Collective.
  ProcessGroups make_groups(int sp_size) const;

  // Ends every rank of the job with `code` (MPI_Abort on the world). For an error that
  // only some ranks see: the others may be blocked in a collective waiting for this one.
  [[noreturn]] void abort_all(int code) const;

  // For an error raised on this rank: true when every rank of the job calls this within
  // `seconds` (all of them are failing at the same point; they can then finalise and exit
  // normally), false when some rank does not (it is busy elsewhere, e.g. blocked in a
  // collective waiting for this one: the caller must abort_all). Uses a communicator of its
  // own, so pending traffic on the others does not matter.
  bool all_ranks_failing(double seconds) const;

  // Throws UserError "ranks disagree on <what>: ..." on every rank if `value` differs
  // between ranks (compared by a 64-bit hash). Collective over the world; never hangs when
  // all ranks call it, whatever their values.
  void check_same_on_all_ranks(const std::string& what, const std::string& value) const;

 private:
  bool finalize_ = false;  // we initialised MPI, so we finalise it
  int world_rank_ = 0, world_size_ = 1;
  std::unique_ptr<MpiCommunicator> world_;   // our own duplicate of MPI_COMM_WORLD
  std::unique_ptr<MpiCommunicator> errors_;  // another, for all_ranks_failing
};

}  // namespace autosp

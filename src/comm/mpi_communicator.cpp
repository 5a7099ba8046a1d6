#include "comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "util/error.h"
#include "util/hash.h"

namespace autosp {

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return str("MPI error code ", rc);
  return std::string(text, static_cast<size_t>(len));
}

// This process's rank in MPI_COMM_WORLD, or -1 when MPI is not running (error messages only).
int world_rank_or_unknown() {
  int initialized = 0, finalized = 0, rank = -1;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return -1;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return -1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return -1;
  return rank;
}

bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + static_cast<uintptr_t>(b_bytes) && y < x + static_cast<uintptr_t>(a_bytes);
}

// `count` consecutive elements of `base` whose extent is `stride` elements, so that item p
// of a buffer of this type starts at element p * stride: one rank's piece of a rank-major
// buffer. Lets a collective move part of every rank's chunk in one call without copies.
class StridedBlock {
 public:
  StridedBlock(MPI_Datatype base, int64_t count, int64_t stride, const std::string& group) {
    int base_bytes = 0;
    check_mpi(MPI_Type_size(base, &base_bytes), "MPI_Type_size", group);
    AUTOSP_CHECK(count >= 1 && count <= stride && count <= INT32_MAX, count, " of ", stride);
    MPI_Datatype block;
    check_mpi(MPI_Type_contiguous(static_cast<int>(count), base, &block), "MPI_Type_contiguous",
              group);
    const int rc =
        MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(stride) * base_bytes, &type_);
    const int free_rc = MPI_Type_free(&block);  // type_ keeps what it needs of `block`
    check_mpi(rc, "MPI_Type_create_resized", group);
    check_mpi(free_rc, "MPI_Type_free", group);
    const int commit_rc = MPI_Type_commit(&type_);
    if (commit_rc != MPI_SUCCESS) MPI_Type_free(&type_);
    check_mpi(commit_rc, "MPI_Type_commit", group);
  }
  ~StridedBlock() { MPI_Type_free(&type_); }  // a destructor cannot throw; freeing a
                                               // committed type has no failure to act on
  StridedBlock(const StridedBlock&) = delete;
  StridedBlock& operator=(const StridedBlock&) = delete;
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

double timeout_seconds = 0;  // set once at start-up, read by the only MPI thread
int timeout_suspended = 0;

}  // namespace

void set_comm_timeout(double seconds) {
  AUTOSP_CHECK(seconds >= 0, "comm timeout ", seconds);
  timeout_seconds = seconds;
}
double comm_timeout() { return timeout_seconds; }
CommTimeoutSuspended::CommTimeoutSuspended() { ++timeout_suspended; }
CommTimeoutSuspended::~CommTimeoutSuspended() { --timeout_suspended; }

void check_mpi(int rc, const char* call, const std::string& group) {
  if (rc == MPI_SUCCESS) return;
  throw MpiError(str(call, " failed on ", group, " (world rank ", world_rank_or_unknown(),
                     "): ", mpi_error_string(rc),
                     " (every rank of a group must make the same collective calls with the "
                     "same sizes; if another rank failed, its error is the cause)"));
}

// ---------------------------------------------------------------------------------------
// MpiCommunicator

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)) {
  AUTOSP_CHECK(comm != MPI_COMM_NULL && comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF,
               "MpiCommunicator adopts (and frees) its communicator: pass a duplicate");
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize the handle is gone with the rest of MPI; freeing it would be an error.
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::dup(MPI_Comm parent, std::string name) {
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup", name);
  return std::make_unique<MpiCommunicator>(comm, std::move(name));
}

void MpiCommunicator::wait(MPI_Request& request, const char* call, const std::string& what) const {
  const double limit = timeout_suspended > 0 ? 0 : timeout_seconds;
  if (limit <= 0) {
    check(MPI_Wait(&request, MPI_STATUS_IGNORE), call);
    return;
  }
  // Polls as MPI_Wait does (a collective of a step completes in microseconds); one that
  // waits for a busy rank backs off to a test every 100 us, leaving the core to the ranks
  // that have work.
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (int64_t polls = 1;; ++polls) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    if (polls % 256 != 0) continue;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > limit)
      throw CommTimeout(str(call, " (", what, ") on ", name_, " made no progress for ", limit,
                            " s (--comm-timeout) on world rank ", world_rank_or_unknown(),
                            ": another rank of ", name_, " is stuck (stopped, deadlocked or cut "
                            "off) or died; aborting the job"));
    if (waited > 0.01) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void MpiCommunicator::set_max_call_bytes(int64_t bytes) {
  AUTOSP_CHECK(bytes >= 1 && bytes <= kDefaultMaxCallBytes, bytes);
  max_call_bytes_ = bytes;
}

int64_t MpiCommunicator::max_count(size_t element_bytes) const {
  return std::max<int64_t>(1, max_call_bytes_ / static_cast<int64_t>(element_bytes));
}

template <typename T>
void MpiCommunicator::all_reduce_sum_impl(T* data, int64_t n, MPI_Datatype type) {
  AUTOSP_CHECK(n >= 0, n);
  const int64_t step = std::min(max_count(sizeof(T)), kMaxReductionCallBytes / int64_t{sizeof(T)});
  if (n == 0) {
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, 0, type, MPI_SUM, comm_, &request), "MPI_Iallreduce");
    wait(request, "MPI_Iallreduce", "all_reduce_sum of 0 values");
    return;
  }
  for (int64_t off = 0; off < n; off += step) {
    const int count = static_cast<int>(std::min(step, n - off));
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data + off, count, type, MPI_SUM, comm_, &request),
          "MPI_Iallreduce");
    wait(request, "MPI_Iallreduce", str("all_reduce_sum of ", n, sizeof(T) == 4 ? " floats" : " doubles"));
  }
}

void MpiCommunicator::all_reduce_sum(float* data, int64_t n) {
  all_reduce_sum_impl(data, n, MPI_FLOAT);
}
void MpiCommunicator::all_reduce_sum(double* data, int64_t n) {
  all_reduce_sum_impl(data, n, MPI_DOUBLE);
}

void MpiCommunicator::all_to_all(const float* send, float* recv, int64_t chunk) {
  AUTOSP_CHECK(chunk >= 0, chunk);
  const int64_t total_bytes = size_ * chunk * int64_t{sizeof(float)};
  AUTOSP_CHECK(!overlaps(send, total_bytes, recv, total_bytes), "all_to_all buffers overlap");
  const int64_t step = max_count(sizeof(float));
  if (chunk <= step) {
    const int count = static_cast<int>(chunk);
    MPI_Request request;
    check(MPI_Ialltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm_, &request), "MPI_Ialltoall");
    wait(request, "MPI_Ialltoall", str("all_to_all of ", chunk, " floats per rank"));
    return;
  }
  for (int64_t off = 0; off < chunk; off += step) {
    StridedBlock piece(MPI_FLOAT, std::min(step, chunk - off), chunk, name_);
    MPI_Request request;
    check(MPI_Ialltoall(send + off, 1, piece.type(), recv + off, 1, piece.type(), comm_, &request),
          "MPI_Ialltoall");
    wait(request, "MPI_Ialltoall", str("all_to_all of ", chunk, " floats per rank"));
  }
}

namespace {

// The requests of one started all_to_all (one per piece of at most max_call_bytes), and the
// piece types they use (freed after them).
class MpiPending final : public PendingCollective {
 public:
  MpiPending(const MpiCommunicator& comm, std::string what) : comm_(comm), what_(std::move(what)) {}
  ~MpiPending() override {
    // Only reached unfinished when a step failed: the job is being aborted (abort_all), and
    // the requests are left to it rather than waited for here.
  }
  std::vector<MPI_Request> requests;
  std::vector<std::unique_ptr<StridedBlock>> types;
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall",
              comm_.name());
    done_ = flag != 0;
    return done_;
  }
  void wait() override {
    if (done_) return;
    for (MPI_Request& r : requests) comm_.wait_request(r, "MPI_Ialltoall", what_);
    done_ = true;
  }

 private:
  const MpiCommunicator& comm_;
  std::string what_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingCollective> MpiCommunicator::all_to_all_start(const float* send, float* recv, int64_t chunk) {
  AUTOSP_CHECK(chunk >= 0, chunk);
  const int64_t total_bytes = size_ * chunk * int64_t{sizeof(float)};
  AUTOSP_CHECK(!overlaps(send, total_bytes, recv, total_bytes), "all_to_all buffers overlap");
  auto pending = std::make_unique<MpiPending>(*this, str("all_to_all of ", chunk, " floats per rank"));
  const int64_t step = max_count(sizeof(float));
  if (chunk <= step) {
    const int count = static_cast<int>(chunk);
    pending->requests.emplace_back();
    check(MPI_Ialltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm_, &pending->requests.back()),
          "MPI_Ialltoall");
    return pending;
  }
  for (int64_t off = 0; off < chunk; off += step) {
    pending->types.push_back(std::make_unique<StridedBlock>(MPI_FLOAT, std::min(step, chunk - off), chunk, name_));
    pending->requests.emplace_back();
    check(MPI_Ialltoall(send + off, 1, pending->types.back()->type(), recv + off, 1, pending->types.back()->type(),
                        comm_, &pending->requests.back()),
          "MPI_Ialltoall");
  }
  return pending;
}

void MpiCommunicator::all_gather(const float* send, float* recv, int64_t n) {
  AUTOSP_CHECK(n >= 0, n);
  const int64_t bytes = n * int64_t{sizeof(float)};
  AUTOSP_CHECK(!overlaps(send, bytes, recv, size_ * bytes), "all_gather buffers overlap");
  const int64_t step = max_count(sizeof(float));
  if (n <= step) {
    const int count = static_cast<int>(n);
    MPI_Request request;
    check(MPI_Iallgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm_, &request), "MPI_Iallgather");
    wait(request, "MPI_Iallgather", str("all_gather of ", n, " floats per rank"));
    return;
  }
  for (int64_t off = 0; off < n; off += step) {
    const int64_t count = std::min(step, n - off);
    StridedBlock piece(MPI_FLOAT, count, n, name_);
    MPI_Request request;
    check(MPI_Iallgather(send + off, static_cast<int>(count), MPI_FLOAT, recv + off, 1,
                         piece.type(), comm_, &request),
          "MPI_Iallgather");
    wait(request, "MPI_Iallgather", str("all_gather of ", n, " floats per rank"));
  }
}

void MpiCommunicator::gather(const float* send, float* recv, int64_t n, int root) {
  AUTOSP_CHECK(n >= 0, n);
  AUTOSP_CHECK(root >= 0 && root < size_, "gather root ", root, " in ", name_, " of ", size_);
  const bool is_root = rank_ == root;
  const int64_t bytes = n * int64_t{sizeof(float)};
  AUTOSP_CHECK(!is_root || !overlaps(send, bytes, recv, size_ * bytes), "gather buffers overlap");
  const int64_t step = max_count(sizeof(float));
  if (n <= step) {
    const int count = static_cast<int>(n);
    MPI_Request request;
    check(MPI_Igather(send, count, MPI_FLOAT, is_root ? recv : nullptr, count, MPI_FLOAT, root, comm_, &request),
          "MPI_Igather");
    wait(request, "MPI_Igather", str("gather of ", n, " floats per rank to rank ", root));
    return;
  }
  for (int64_t off = 0; off < n; off += step) {
    const int64_t count = std::min(step, n - off);
    StridedBlock piece(MPI_FLOAT, count, n, name_);
    MPI_Request request;
    check(MPI_Igather(send + off, static_cast<int>(count), MPI_FLOAT, is_root ? recv + off : nullptr, 1, piece.type(),
                      root, comm_, &request),
          "MPI_Igather");
    wait(request, "MPI_Igather", str("gather of ", n, " floats per rank to rank ", root));
  }
}

void MpiCommunicator::reduce_scatter_sum(const float* send, float* recv, int64_t n) {
  AUTOSP_CHECK(n >= 0, n);
  const int64_t bytes = n * int64_t{sizeof(float)};
  AUTOSP_CHECK(!overlaps(send, size_ * bytes, recv, bytes), "reduce_scatter_sum buffers overlap");
  // Floats of all ranks' chunks together in one call.
  const int64_t call = std::min(max_count(sizeof(float)), kMaxReductionCallBytes / int64_t{sizeof(float)});
  if (size_ * n <= call) {
    MPI_Request request;
    check(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_, &request),
          "MPI_Ireduce_scatter_block");
    wait(request, "MPI_Ireduce_scatter_block", str("reduce_scatter_sum of ", n, " floats per rank"));
    return;
  }
  // Reductions over non-contiguous derived datatypes are poorly supported by MPI
  // implementations, so each piece of every rank's chunk is packed contiguously instead;
  // the buffer holds at most max(call, size) floats.
  const int64_t piece = std::max<int64_t>(1, call / size_);
  std::vector<float> packed(static_cast<size_t>(size_ * std::min(piece, n)));
  for (int64_t off = 0; off < n; off += piece) {
    const int64_t count = std::min(piece, n - off);
    for (int p = 0; p < size_; ++p)
      std::memcpy(packed.data() + p * count, send + p * n + off, count * sizeof(float));
    MPI_Request request;
    check(MPI_Ireduce_scatter_block(packed.data(), recv + off, static_cast<int>(count), MPI_FLOAT,
                                    MPI_SUM, comm_, &request),
          "MPI_Ireduce_scatter_block");
    wait(request, "MPI_Ireduce_scatter_block", str("reduce_scatter_sum of ", n, " floats per rank"));
  }
}

void MpiCommunicator::broadcast(void* data, int64_t bytes, int root) {
  AUTOSP_CHECK(bytes >= 0, bytes);
  AUTOSP_CHECK(root >= 0 && root < size_, "broadcast root ", root, " in ", name_, " of ", size_);
  auto* p = static_cast<char*>(data);
  if (bytes == 0) {
    MPI_Request request;
    check(MPI_Ibcast(p, 0, MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    wait(request, "MPI_Ibcast", str("broadcast of 0 bytes from rank ", root));
    return;
  }
  for (int64_t off = 0; off < bytes; off += max_call_bytes_) {
    const int count = static_cast<int>(std::min(max_call_bytes_, bytes - off));
    MPI_Request request;
    check(MPI_Ibcast(p + off, count, MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    wait(request, "MPI_Ibcast", str("broadcast of ", bytes, " bytes from rank ", root));
  }
}

void MpiCommunicator::barrier() {
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait(request, "MPI_Ibarrier", "barrier");
}

// ---------------------------------------------------------------------------------------
// MpiRuntime

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  const std::string where = "MPI startup";
  int initialized = 0, finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized", where);
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized", where);
  if (finalized) internal_error("MpiRuntime built after MPI_Finalize");
  if (!initialized) {
    int provided = 0;
    // Errors in MPI_Init_thread abort the process before we see them (no handler is set
    // yet); the check is for implementations that do return.
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread",
              where);
    finalize_ = true;
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      finalize_ = false;
      throw MpiError(str("MPI_Init_thread: this MPI library provides thread level ", provided,
                         ", below MPI_THREAD_FUNNELED which autosp needs (OpenMP threads "
                         "beside MPI); use an MPI built with thread support"));
    }
  }
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
            "MPI_COMM_WORLD");
  // Calls outside any communicator (datatypes) report to MPI_COMM_SELF (MPI-4) or
  // MPI_COMM_WORLD (MPI-3).
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
            "MPI_COMM_SELF");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", "MPI_COMM_WORLD");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size", "MPI_COMM_WORLD");
  world_ = MpiCommunicator::dup(MPI_COMM_WORLD, str("world (", world_size_, " ranks)"));
  errors_ = MpiCommunicator::dup(MPI_COMM_WORLD, "the error agreement");
}

MpiRuntime::~MpiRuntime() {
  world_.reset();
  errors_.reset();
  if (finalize_) {
    const int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS)
      std::fprintf(stderr, "autosp: warning: MPI_Finalize failed: %s\n",
                   mpi_error_string(rc).c_str());
  }
}

bool MpiRuntime::launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

std::string MpiRuntime::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, static_cast<size_t>(std::max(len, 0)));
  v = v.substr(0, v.find_first_of(",\n"));  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return v;
}

ProcessGroups MpiRuntime::make_groups(int sp_size) const {
  if (sp_size < 1) user_error("sequence_parallel_size must be at least 1, got ", sp_size);
  if (world_size_ % sp_size != 0)
    user_error("world size ", world_size_, " is not divisible by sequence_parallel_size ",
               sp_size, " (launch a multiple of ", sp_size, " ranks, or change "
               "sequence_parallel_size)");
  const int sp_group = world_rank_ / sp_size, dp_group = world_rank_ % sp_size;
  const int dp_size = world_size_ / sp_size;
  const std::string sp_name = str("sp group ", sp_group, " (world ranks ", sp_group * sp_size,
                                  "..", sp_group * sp_size + sp_size - 1, ")");
  const std::string dp_name = str("dp group ", dp_group, " (world ranks ", dp_group, "..",
                                  dp_group + (dp_size - 1) * sp_size, " step ", sp_size, ")");

  // Key = world rank, so ranks keep their world order inside each group.
  MPI_Comm sp_comm, dp_comm;
  check_mpi(MPI_Comm_split(world_->comm(), sp_group, world_rank_, &sp_comm), "MPI_Comm_split",
            sp_name);
  auto sp = std::make_unique<MpiCommunicator>(sp_comm, sp_name);
  check_mpi(MPI_Comm_split(world_->comm(), dp_group, world_rank_, &dp_comm), "MPI_Comm_split",
            dp_name);
  auto dp = std::make_unique<MpiCommunicator>(dp_comm, dp_name);
  AUTOSP_CHECK(sp->size() == sp_size && sp->rank() == world_rank_ % sp_size, sp_name);
  AUTOSP_CHECK(dp->size() == dp_size && dp->rank() == world_rank_ / sp_size, dp_name);

  ProcessGroups groups;
  groups.world = MpiCommunicator::dup(world_->comm(), world_->name());
  groups.sp_size = sp_size;
  groups.dp_size = dp_size;
  groups.sp_rank = sp->rank();
  groups.dp_rank = dp->rank();
  groups.sp = std::move(sp);
  groups.dp = std::move(dp);
  return groups;
}

void MpiRuntime::abort_all(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this is in case an implementation does
}

bool MpiRuntime::all_ranks_failing(double seconds) const {
  MPI_Request request;
  if (MPI_Ibarrier(errors_->comm(), &request) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;  // the request dies with the job
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void MpiRuntime::check_same_on_all_ranks(const std::string& what, const std::string& value) const {
  // Every rank gets every rank's hash, so all ranks take the same decision: they all throw,
  // or none does, and none is left waiting in a later collective.
  const uint64_t mine = fnv1a(value);
  std::vector<uint64_t> all(static_cast<size_t>(world_size_));
  check_mpi(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, world_->comm()),
            "MPI_Allgather", world_->name());
  std::string differ;
  int count = 0;
  for (int r = 1; r < world_size_; ++r) {
    if (all[static_cast<size_t>(r)] == all[0]) continue;
    if (++count <= 8) differ += str(differ.empty() ? "" : ", ", r);
  }
  if (count == 0) return;
  if (count > 8) differ += str(" and ", count - 8, " more");
  user_error("ranks disagree on ", what, ": world rank", count > 1 ? "s " : " ", differ,
             count > 1 ? " differ" : " differs", " from rank 0 (it must be the same on every rank)");
}

}  // namespace autosp

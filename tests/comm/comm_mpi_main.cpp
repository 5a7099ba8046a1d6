// comm_mpi_main: MpiCommunicator and MpiRuntime on a real MPI job (not a gtest binary:
// it must be started by mpirun, once per rank).
//
//   mpirun -np 4 --oversubscribe comm_mpi_main      (also -np 2 and -np 1)
//     Checks every collective on the world, the SP groups (sequence_parallel_size 1, 2, 4
//     where they divide the world) and the DP groups, at odd sizes and 0, both in single
//     MPI calls and split into many (a max_call_bytes of a few bytes), against values each
//     rank computes locally: send buffers are a function of (world rank, index), so every
//     rank knows what every other rank sent. Also group membership, error handling and
//     check_same_on_all_ranks; the staging communicator's host collectives
//     (StagedCollectives: f32 and bf16 reductions, moves of any byte count); agreed_error on every group, and the checkpoint verification
//     it serves (train::verify_checkpoint_files over the world: each file read by one rank,
//     every rank with one process's verdict). Rank 0 prints one line per check and a
//     summary; failing ranks print what differed. Exit status 1 on any failure, on every rank.
//
//   mpirun -np 4 --oversubscribe comm_mpi_main --die-rank 1 [--die-how abort|exit|finalize]
//     Rank 1 fails (throws) while the others wait in a world all-reduce for it. With `abort`
//     (the default, what autosp's main does) the rank calls MpiRuntime::abort_all and the job
//     must end within seconds with a non-zero status. `exit` (_Exit(1) without MPI_Finalize)
//     and `finalize` (return from main, so MPI_Finalize) show what happens without it.
//     Seen with OpenMPI 4.1.4, -np 2 and 4: abort ends the job in ~0.6 s, mpirun exit 1;
//     exit in ~1.5 s, exit 1 (mpirun kills a job whose rank exits non-zero); finalize HANGS
//     (MPI_Finalize waits for ranks that wait in the all-reduce): never ship that path.
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/staged_collectives.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/rss.h"

namespace {

using autosp::Communicator;
using autosp::MpiCommunicator;
using autosp::MpiRuntime;
using autosp::str;
namespace fs = std::filesystem;

// What a check found wrong on this rank; empty when nothing.
using Finding = std::string;

class Checker {
 public:
  explicit Checker(const MpiRuntime& mpi) : mpi_(mpi), rank_(mpi.world_rank()) {}

  // Runs `check` on every rank (it makes the same collective calls on every rank, whatever
  // it finds), then agrees with the other ranks whether it passed everywhere. An unexpected
  // exception may leave other ranks waiting in a collective, so it ends the job.
  void run(const std::string& name, const std::function<Finding()>& check) {
    Finding finding;
    try {
      finding = check();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] FAIL %s: threw: %s\n", rank_, name.c_str(), e.what());
      mpi_.abort_all(1);
    }
    if (!finding.empty()) std::fprintf(stderr, "[rank %d] FAIL %s: %s\n", rank_, name.c_str(),
                                       finding.c_str());
    int bad = finding.empty() ? 0 : 1, ranks_bad = 0;
    autosp::check_mpi(MPI_Allreduce(&bad, &ranks_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD),
                      "MPI_Allreduce", "MPI_COMM_WORLD (test bookkeeping)");
    ++checks_;
    if (ranks_bad > 0) ++failed_;
    if (rank_ == 0) {
      if (ranks_bad == 0) std::printf("PASS %s\n", name.c_str());
      else std::printf("FAIL %s (on %d ranks)\n", name.c_str(), ranks_bad);
      std::fflush(stdout);
    }
  }
  int checks() const { return checks_; }
  int failed() const { return failed_; }

 private:
  const MpiRuntime& mpi_;
  int rank_;
  int checks_ = 0, failed_ = 0;
};

// Values every rank can compute for any rank. All are integers (or quarters) small enough
// that float and double sums of a few ranks are exact, whatever the summation order.
float reduce_value(int wr, int64_t i) { return static_cast<float>((wr + 1) * (i % 251 + 1)); }
double reduce_value_d(int wr, int64_t i) { return (wr + 1) * 0.25 + static_cast<double>(i); }
float a2a_value(int wr, int dest, int64_t j) {  // what world rank wr sends group rank dest
  return static_cast<float>(wr * 1000000 + dest * 100000 + j % 100000);
}
float gather_value(int wr, int64_t j) { return static_cast<float>(wr * 1000000 + j % 1000000); }
float scatter_value(int wr, int dest, int64_t j) {
  return static_cast<float>((wr + 1) * 1000 + dest * 10 + j % 7);
}
unsigned char byte_value(int root_wr, int64_t i) {
  return static_cast<unsigned char>((root_wr * 31 + i * 7 + 1) & 0xff);
}

template <typename T>
Finding first_mismatch(const char* what, int64_t n, const std::vector<T>& got,
                       const std::function<T(int64_t)>& want) {
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    if (got[static_cast<size_t>(i)] != want(i))
      return str(what, " n=", n, ": element ", i, " is ", +got[static_cast<size_t>(i)],
                 ", expected ", +want(i));
  }
  return {};
}

// A group under test and what it should be: `members[g]` is the world rank of group rank g.
struct Group {
  std::string label;  // "world", "sp(P=2)", "dp(P=2)"
  Communicator* comm;
  std::vector<int> members;
  int me;  // this process's world rank
  int my_group_rank() const {
    for (size_t g = 0; g < members.size(); ++g)
      if (members[g] == me) return static_cast<int>(g);
    return -1;
  }
};

Finding check_all_reduce_float(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  for (int64_t n : sizes) {
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[static_cast<size_t>(i)] = reduce_value(g.me, i);
    g.comm->all_reduce_sum(data.data(), n);
    Finding f = first_mismatch<float>("all_reduce_sum<float>", n, data, [&](int64_t i) {
      float sum = 0;
      for (int wr : g.members) sum += reduce_value(wr, i);
      return sum;
    });
    if (first.empty()) first = f;
  }
  return first;
}

Finding check_all_reduce_double(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  for (int64_t n : sizes) {
    std::vector<double> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[static_cast<size_t>(i)] = reduce_value_d(g.me, i);
    g.comm->all_reduce_sum(data.data(), n);
    Finding f = first_mismatch<double>("all_reduce_sum<double>", n, data, [&](int64_t i) {
      double sum = 0;
      for (int wr : g.members) sum += reduce_value_d(wr, i);
      return sum;
    });
    if (first.empty()) first = f;
  }
  return first;
}

// Replicated parameters stay replicated only if every rank gets the same bits from an
// all-reduce of inexact values, not merely close ones.
Finding check_all_reduce_same_bits(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size());
  for (int64_t n : sizes) {
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      data[static_cast<size_t>(i)] = static_cast<float>(std::sin(g.me * 1000.0 + i) / 3.0);
    g.comm->all_reduce_sum(data.data(), n);
    std::vector<float> all(static_cast<size_t>(P * n));
    g.comm->all_gather(data.data(), all.data(), n);
    for (int p = 0; p < P; ++p) {
      if (n > 0 && std::memcmp(all.data() + p * n, data.data(), n * sizeof(float)) != 0 &&
          first.empty())
        first = str("all_reduce_sum<float> n=", n, ": group rank ", p,
                   " got different bits from this rank");
    }
  }
  return first;
}

// all_to_all_start (the executor's overlap): two exchanges in flight at once, progressed with
// test() and waited for in the other order than started, give what all_to_all gives; also
// split into many MPI calls.
Finding check_all_to_all_started(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int64_t chunk : sizes) {
    std::vector<float> send(static_cast<size_t>(P * chunk)), a(send.size(), -1.0f), b(send.size(), -1.0f);
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < chunk; ++j) send[static_cast<size_t>(p * chunk + j)] = a2a_value(g.me, p, j);
    auto x = g.comm->all_to_all_start(send.data(), a.data(), chunk);
    auto y = g.comm->all_to_all_start(send.data(), b.data(), chunk);
    for (int i = 0; i < 3; ++i) x->test();
    y->wait();
    x->wait();
    if (!x->test() || !y->test()) first = str("all_to_all_start chunk ", chunk, ": test() is false after wait()");
    for (const std::vector<float>* recv : {&a, &b}) {
      Finding f = first_mismatch<float>("all_to_all_start", chunk, *recv, [&](int64_t i) {
        return a2a_value(g.members[static_cast<size_t>(i / chunk)], me, i % chunk);
      });
      if (first.empty()) first = f;
    }
  }
  return first;
}

// ---- StagedCollectives (comm/staged_collectives.h): the staging communicator's logic ----------
// bf16 values every rank can compute: 1 + k 2^-7 is a bf16 (7 stored mantissa bits), and a
// few ranks' sums are exact in fp32 but need rounding to bf16, which must happen once, to
// nearest even, after an fp32 sum (pairwise bf16 adds round at every step and differ).
float staged_value(int wr, int64_t i) { return 1.0f + float((wr * 5 + i) % 97) * 0.0078125f; }

Finding check_staged_all_reduce(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;
  autosp::StagedCollectives staged(*g.comm);
  for (autosp::DType dt : {autosp::DType::f32, autosp::DType::bf16})
    for (int64_t n : sizes) {
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      std::vector<float> f32(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        f32[size_t(i)] = staged_value(g.me, i);
        bits[size_t(i)] = autosp::io::float_to_bf16(staged_value(g.me, i));
      }
      staged.all_reduce_sum(dt == autosp::DType::f32 ? static_cast<void*>(f32.data()) : bits.data(), n, dt);
      for (int64_t i = 0; i < n && first.empty(); ++i) {
        float sum = 0;
        for (int wr : g.members) sum += staged_value(wr, i);
        const float got = dt == autosp::DType::f32 ? f32[size_t(i)] : autosp::io::bf16_to_float(bits[size_t(i)]);
        const float want = dt == autosp::DType::f32 ? sum : autosp::io::bf16_to_float(autosp::io::float_to_bf16(sum));
        if (got != want)
          first = str("staged all_reduce_sum ", autosp::dtype_name(dt), " n=", n, ": element ", i, " is ", got,
                      ", expected ", want);
      }
    }
  return first;
}

// Moves of any byte count (odd ones too: a bf16 block of 3 elements is 6 bytes).
Finding check_staged_moves(Group& g, const std::vector<int64_t>& byte_sizes) {
  Finding first;
  autosp::StagedCollectives staged(*g.comm);
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  auto byte = [](int wr, int dest, int64_t j) { return static_cast<unsigned char>((wr * 41 + dest * 13 + j * 7 + 3) & 0xff); };
  for (int64_t bytes : byte_sizes) {
    std::vector<unsigned char> send(static_cast<size_t>(P * bytes)), recv(send.size(), 0xEE);
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < bytes; ++j) send[size_t(p * bytes + j)] = byte(g.me, p, j);
    staged.all_to_all(send.data(), recv.data(), bytes);
    for (int64_t i = 0; i < P * bytes && first.empty(); ++i)
      if (recv[size_t(i)] != byte(g.members[size_t(i / bytes)], me, i % bytes))
        first = str("staged all_to_all of ", bytes, " bytes a block: byte ", i, " is wrong");
    std::vector<unsigned char> mine(static_cast<size_t>(bytes)), all(static_cast<size_t>(P * bytes), 0xEE);
    for (int64_t j = 0; j < bytes; ++j) mine[size_t(j)] = byte(g.me, 0, j);
    staged.all_gather(mine.data(), all.data(), bytes);
    for (int64_t i = 0; i < P * bytes && first.empty(); ++i)
      if (all[size_t(i)] != byte(g.members[size_t(i / bytes)], 0, i % bytes))
        first = str("staged all_gather of ", bytes, " bytes: byte ", i, " is wrong");
  }
  return first;
}

Finding check_staged_reduce_scatter(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;
  autosp::StagedCollectives staged(*g.comm);
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int64_t n : sizes) {
    std::vector<uint16_t> send(static_cast<size_t>(P * n)), recv(static_cast<size_t>(n), 0xFFFF);
    for (int64_t i = 0; i < P * n; ++i) send[size_t(i)] = autosp::io::float_to_bf16(staged_value(g.me, i));
    staged.reduce_scatter_sum(send.data(), recv.data(), n, autosp::DType::bf16);
    for (int64_t i = 0; i < n && first.empty(); ++i) {
      float sum = 0;
      for (int wr : g.members) sum += staged_value(wr, me * n + i);
      if (recv[size_t(i)] != autosp::io::float_to_bf16(sum))
        first = str("staged reduce_scatter_sum bf16 n=", n, ": element ", i, " is ",
                    autosp::io::bf16_to_float(recv[size_t(i)]), ", expected ",
                    autosp::io::bf16_to_float(autosp::io::float_to_bf16(sum)));
    }
  }
  return first;
}

Finding check_all_to_all(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int64_t chunk : sizes) {
    std::vector<float> send(static_cast<size_t>(P * chunk)), recv(send.size(), -1.0f);
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < chunk; ++j)
        send[static_cast<size_t>(p * chunk + j)] = a2a_value(g.me, p, j);
    g.comm->all_to_all(send.data(), recv.data(), chunk);
    Finding f = first_mismatch<float>("all_to_all", chunk, recv, [&](int64_t i) {
      return a2a_value(g.members[static_cast<size_t>(i / chunk)], me, i % chunk);
    });
    if (first.empty()) first = f;
  }
  return first;
}

Finding check_all_gather(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size());
  for (int64_t n : sizes) {
    std::vector<float> send(static_cast<size_t>(n)), recv(static_cast<size_t>(P * n), -1.0f);
    for (int64_t j = 0; j < n; ++j) send[static_cast<size_t>(j)] = gather_value(g.me, j);
    g.comm->all_gather(send.data(), recv.data(), n);
    Finding f = first_mismatch<float>("all_gather", n, recv, [&](int64_t i) {
      return gather_value(g.members[static_cast<size_t>(i / n)], i % n);
    });
    if (first.empty()) first = f;
  }
  return first;
}

// Every root; the other ranks' recv stays untouched (they pass null).
Finding check_gather(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int root = 0; root < P; ++root) {
    for (int64_t n : sizes) {
      std::vector<float> send(static_cast<size_t>(n)), recv(static_cast<size_t>(P * n), -1.0f);
      for (int64_t j = 0; j < n; ++j) send[static_cast<size_t>(j)] = gather_value(g.me, j);
      g.comm->gather(send.data(), me == root ? recv.data() : nullptr, n, root);
      if (me != root) continue;
      Finding f = first_mismatch<float>(str("gather root ", root).c_str(), n, recv, [&](int64_t i) {
        return gather_value(g.members[static_cast<size_t>(i / n)], i % n);
      });
      if (first.empty()) first = f;
    }
  }
  return first;
}

Finding check_reduce_scatter(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int64_t n : sizes) {
    std::vector<float> send(static_cast<size_t>(P * n)), recv(static_cast<size_t>(n), -1.0f);
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < n; ++j)
        send[static_cast<size_t>(p * n + j)] = scatter_value(g.me, p, j);
    g.comm->reduce_scatter_sum(send.data(), recv.data(), n);
    Finding f = first_mismatch<float>("reduce_scatter_sum", n, recv, [&](int64_t j) {
      float sum = 0;
      for (int wr : g.members) sum += scatter_value(wr, me, j);
      return sum;
    });
    if (first.empty()) first = f;
  }
  return first;
}

Finding check_broadcast(Group& g, const std::vector<int64_t>& sizes) {
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  for (int root = 0; root < P; ++root) {
    for (int64_t bytes : sizes) {
      std::vector<unsigned char> data(static_cast<size_t>(bytes), 0xEE);
      if (me == root)
        for (int64_t i = 0; i < bytes; ++i) data[static_cast<size_t>(i)] = byte_value(g.me, i);
      g.comm->broadcast(data.data(), bytes, root);
      Finding f = first_mismatch<unsigned char>(
          str("broadcast root ", root).c_str(), bytes, data,
          [&](int64_t i) { return byte_value(g.members[static_cast<size_t>(root)], i); });
      if (first.empty()) first = f;
    }
  }
  return first;
}

// Size, rank and the world ranks of the members, as the group itself reports them.
Finding check_membership(Group& g) {
  const int P = static_cast<int>(g.members.size()), size = g.comm->size();
  float mine = static_cast<float>(g.me);
  std::vector<float> all(static_cast<size_t>(size));
  g.comm->all_gather(&mine, all.data(), 1);  // before any verdict: every rank makes the call
  if (size != P) return str("size ", size, ", expected ", P);
  if (g.comm->rank() != g.my_group_rank())
    return str("rank ", g.comm->rank(), ", expected ", g.my_group_rank());
  for (int p = 0; p < P; ++p)
    if (all[static_cast<size_t>(p)] != static_cast<float>(g.members[static_cast<size_t>(p)]))
      return str("group rank ", p, " is world rank ", all[static_cast<size_t>(p)], ", expected ",
                 g.members[static_cast<size_t>(p)]);
  return {};
}

// agreed_error: the failing rank whose failure comes first (by order, then rank) speaks for
// every rank; no failure anywhere is "" everywhere.
Finding check_agreed_error(Group& g) {
  const int P = static_cast<int>(g.members.size()), me = g.my_group_rank();
  struct Case {
    std::string name;
    std::function<bool(int)> fails;     // which group ranks fail
    std::function<int64_t(int)> order;  // and where
    std::string want;                   // the message every rank must get
  };
  auto says = [&](int p) { return str("rank ", p, " failed: ", std::string(size_t(p) * 40, 'x')); };
  const std::vector<Case> cases = {
      {"none", [](int) { return false; }, [](int) { return 0; }, ""},
      {"last rank only", [&](int p) { return p == P - 1; }, [](int) { return 7; }, says(P - 1)},
      {"all, the last first", [](int) { return true; }, [&](int p) { return P - 1 - p; }, says(P - 1)},
      {"all at the same order", [](int) { return true; }, [](int) { return 3; }, says(0)},
      {"all but rank 0, large orders", [](int p) { return p > 0; },
       [](int p) { return (int64_t{1} << 52) - p; }, P > 1 ? says(P - 1) : ""},
  };
  Finding first;  // the first mismatch; later calls still run, as on the other ranks
  for (const Case& c : cases) {
    const std::string got = autosp::agreed_error(*g.comm, c.fails(me) ? says(me) : "", c.order(me));
    if (got != c.want && first.empty()) first = str(c.name, ": got '", got, "', expected '", c.want, "'");
  }
  return first;
}

// A failing MPI call on the group comes back as MpiError naming the call and the group
// (so MPI_ERRORS_RETURN is set on it: MPI's default would abort the job instead).
Finding check_error_handling(Group& g) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(g.comm);
  if (mpi == nullptr) return "not an MpiCommunicator";
  char byte = 0;
  const int rc = MPI_Bcast(&byte, -1, MPI_BYTE, 0, mpi->comm());  // a negative count: local error
  if (rc == MPI_SUCCESS) return "MPI_Bcast with count -1 succeeded (is MPI parameter checking off?)";
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  autosp::check_mpi(MPI_Error_string(rc, text, &len), "MPI_Error_string", "test");
  try {
    autosp::check_mpi(rc, "MPI_Bcast", mpi->name());
  } catch (const autosp::MpiError& e) {
    const std::string what = e.what();
    for (const std::string& part : {std::string("MPI_Bcast failed on "), mpi->name(),
                                    std::string(text, static_cast<size_t>(len))})
      if (what.find(part) == std::string::npos) return str("message lacks '", part, "': ", what);
    return {};
  }
  return "check_mpi did not throw";
}

void check_group(Checker& checker, Group& g, int64_t max_call_bytes) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(g.comm);
  const bool split = max_call_bytes != MpiCommunicator::kDefaultMaxCallBytes;
  if (mpi != nullptr) mpi->set_max_call_bytes(max_call_bytes);
  // Odd sizes and 0; when split, sizes around the 7-float and 3-double call limits.
  const std::vector<int64_t> sizes =
      split ? std::vector<int64_t>{0, 1, 2, 3, 4, 6, 7, 8, 13, 14, 15, 50}
            : std::vector<int64_t>{0, 1, 2, 3, 7, 64, 1000, 4099};
  const std::vector<int64_t> byte_sizes = split ? std::vector<int64_t>{0, 1, 27, 28, 29, 57, 1001}
                                                : std::vector<int64_t>{0, 1, 3, 4096, 100003};
  const std::string at = str(g.label, split ? " split at " + std::to_string(max_call_bytes) +
                                                  " bytes/call"
                                            : std::string());
  if (!split) {
    checker.run(at + " membership", [&] { return check_membership(g); });
    checker.run(at + " MPI error -> MpiError", [&] { return check_error_handling(g); });
  }
  checker.run(at + " all_reduce_sum<float>", [&] { return check_all_reduce_float(g, sizes); });
  checker.run(at + " all_reduce_sum<double>", [&] { return check_all_reduce_double(g, sizes); });
  checker.run(at + " all_reduce_sum same bits on all ranks",
              [&] { return check_all_reduce_same_bits(g, sizes); });
  checker.run(at + " all_to_all", [&] { return check_all_to_all(g, sizes); });
  checker.run(at + " all_to_all_start, two in flight", [&] { return check_all_to_all_started(g, sizes); });
  checker.run(at + " all_gather", [&] { return check_all_gather(g, sizes); });
  checker.run(at + " gather", [&] { return check_gather(g, sizes); });
  checker.run(at + " reduce_scatter_sum", [&] { return check_reduce_scatter(g, sizes); });
  checker.run(at + " broadcast", [&] { return check_broadcast(g, byte_sizes); });
  checker.run(at + " staged all_reduce_sum f32 and bf16", [&] { return check_staged_all_reduce(g, sizes); });
  checker.run(at + " staged all_to_all and all_gather of any bytes", [&] { return check_staged_moves(g, byte_sizes); });
  checker.run(at + " staged reduce_scatter_sum bf16", [&] { return check_staged_reduce_scatter(g, sizes); });
  checker.run(at + " agreed_error", [&] { return check_agreed_error(g); });
  checker.run(at + " barrier", [&] {
    g.comm->barrier();
    return Finding{};
  });
  if (mpi != nullptr) mpi->set_max_call_bytes(MpiCommunicator::kDefaultMaxCallBytes);
}

void check_groups(Checker& checker, const MpiRuntime& mpi, int P) {
  const int W = mpi.world_size(), me = mpi.world_rank();
  autosp::ProcessGroups groups;
  checker.run(str("make_groups(", P, ") fields"), [&]() -> Finding {
    groups = mpi.make_groups(P);
    if (groups.sp_size != P || groups.dp_size != W / P || groups.sp_rank != me % P ||
        groups.dp_rank != me / P)
      return str("sp_size ", groups.sp_size, " dp_size ", groups.dp_size, " sp_rank ",
                 groups.sp_rank, " dp_rank ", groups.dp_rank);
    return {};
  });
  // The rule (DESIGN.md): SP group = world rank / P, consecutive; DP group = world rank % P.
  std::vector<int> all(static_cast<size_t>(W)), sp, dp;
  for (int r = 0; r < W; ++r) all[static_cast<size_t>(r)] = r;
  for (int r = (me / P) * P; r < (me / P + 1) * P; ++r) sp.push_back(r);
  for (int r = me % P; r < W; r += P) dp.push_back(r);
  Group world{str("world(P=", P, ")"), groups.world.get(), all, me};
  Group sp_group{str("sp(P=", P, ")"), groups.sp.get(), sp, me};
  Group dp_group{str("dp(P=", P, ")"), groups.dp.get(), dp, me};
  for (Group* g : {&world, &sp_group, &dp_group}) {
    check_group(checker, *g, MpiCommunicator::kDefaultMaxCallBytes);
    check_group(checker, *g, 28);  // 7 floats, 3 doubles per MPI call
  }
}

// Every rank must throw the same UserError (a throw on only some ranks would hang the job).
Finding expect_user_error(const std::function<void()>& f, const std::string& message) {
  try {
    f();
  } catch (const autosp::UserError& e) {
    if (std::string(e.what()).find(message) == std::string::npos)
      return str("UserError '", e.what(), "' lacks '", message, "'");
    return {};
  }
  return str("no UserError (expected '", message, "')");
}

void check_runtime(Checker& checker, const MpiRuntime& mpi) {
  const int W = mpi.world_size(), me = mpi.world_rank();
  checker.run("launched_by_mpirun", [&]() -> Finding {
    // Only meaningful under a launcher; run alone (singleton MPI) it must say false.
    return MpiRuntime::launched_by_mpirun() || W == 1 ? Finding{} : "false under mpirun";
  });
  for (int P : {W + 1, 0, -1, 3}) {
    if (P >= 1 && W % P == 0) continue;
    const std::string message =
        P < 1 ? str("sequence_parallel_size must be at least 1, got ", P)
              : str("world size ", W, " is not divisible by sequence_parallel_size ", P);
    checker.run(str("make_groups(", P, ") is a UserError"), [&] {
      return expect_user_error([&] { mpi.make_groups(P); }, message);
    });
  }
  checker.run("check_same_on_all_ranks, same value", [&] {
    mpi.check_same_on_all_ranks("test value", "{\"seq_len\": 8192}");
    return Finding{};
  });
  if (W > 1) {
    checker.run("check_same_on_all_ranks, rank 1 differs", [&] {
      return expect_user_error(
          [&] { mpi.check_same_on_all_ranks("the config file", me == 1 ? "b" : "a"); },
          "ranks disagree on the config file: world rank 1 differs from rank 0");
    });
    checker.run("check_same_on_all_ranks, every rank differs", [&] {
      return expect_user_error(
          [&] { mpi.check_same_on_all_ranks("the config file", std::to_string(me)); },
          W == 2 ? "ranks disagree on the config file: world rank 1 differs from rank 0"
                 : str("ranks disagree on the config file: world ranks 1, 2", W > 3 ? ", 3" : "",
                       W > 4 ? "," : " differ from rank 0"));
    });
  }
}

// A reduction of a 16 MiB buffer (the embedding's gradient bucket of a small Llama) adds
// little to any rank's resident peak: MPI's temporaries are bounded by the calls'
// size, kMaxReductionCallBytes. Unsplit, Open MPI's libnbc added 32 MiB on rank 0 and 16 MiB
// on rank 2 of 4 (mpi_communicator.h). The buffers are touched before the phase starts.
void check_reduction_memory(Checker& checker) {
  auto world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  const int64_t whole = int64_t{4} << 20, n = whole / world->size();  // floats
  std::vector<float> send(static_cast<size_t>(whole), 1.0f), recv(static_cast<size_t>(n), 0.0f);
  // The rank-0 bound: the call's two halves in libnbc and reduce_scatter_sum's packing buffer,
  // and 1 MiB for the allocator's rounding and MPI's own bookkeeping.
  const int64_t bound = 4 * MpiCommunicator::kMaxReductionCallBytes;
  auto peak_growth = [&](const std::function<void()>& call) -> Finding {
    world->barrier();
    const autosp::RssPhase phase;
    call();
    const int64_t growth = phase.peak_growth();
    if (growth > bound) return str("resident peak +", growth >> 10, " KiB, above ", bound >> 10, " KiB");
    return {};
  };
  checker.run("reduce_scatter_sum of 16 MiB: bounded MPI temporaries", [&] {
    return peak_growth([&] { world->reduce_scatter_sum(send.data(), recv.data(), n); });
  });
  checker.run("all_reduce_sum of 16 MiB: bounded MPI temporaries", [&] {
    return peak_growth([&] { world->all_reduce_sum(send.data(), whole); });
  });
}

// A checkpoint's files (sizes chosen so that each rank of 2 or 4 verifies a different share)
// and its manifest.json as autosp writes it; `damage` then edits it. Rank 0 writes; every
// rank sees the directory before the barrier returns.
void write_fixture(const std::string& dir, Communicator& world, const std::function<void()>& damage) {
  if (world.rank() == 0) {
    fs::remove_all(dir);
    const std::vector<std::pair<std::string, int64_t>> files = {
        {"config.json", 300}, {"extra/one.bin", 20000}, {"model.safetensors", 40000},
        {"optimizer.safetensors", 80000}, {"trainer_state.json", 500}};
    nlohmann::json listed = nlohmann::json::object();
    for (const auto& [rel, bytes] : files) {
      fs::create_directories(fs::path(dir + "/" + rel).parent_path());
      std::string text(static_cast<size_t>(bytes), '\0');
      for (int64_t i = 0; i < bytes; ++i) text[static_cast<size_t>(i)] = static_cast<char>(i * 131 + rel.size());
      std::ofstream(dir + "/" + rel, std::ios::binary) << text;
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)autosp::fnv1a(text));
      listed[rel] = {{"bytes", bytes}, {"fnv1a64", hex}};
    }
    std::ofstream(dir + "/manifest.json")
        << nlohmann::json{{"format", "autosp checkpoint manifest"}, {"version", 1}, {"files", listed}}.dump(2);
    damage();
  }
  world.barrier();
}

void flip_byte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x01));
}

// verify_checkpoint_files over the world: each byte is read by one rank, and every rank ends
// with what one process checking it all ends with (the same result, or the same UserError:
// the first failure in the manifest's order, whichever rank found it).
void check_checkpoint_verification(Checker& checker) {
  auto world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  std::string dir;
  if (world->rank() == 0) {
    std::string pattern = (fs::temp_directory_path() / "autosp_verify_XXXXXX").string();
    dir = mkdtemp(pattern.data()) ? pattern : "";
  }
  int64_t n = static_cast<int64_t>(dir.size());
  world->broadcast(&n, sizeof(n), 0);
  dir.resize(static_cast<size_t>(n));
  world->broadcast(dir.data(), n, 0);
  const std::string ck = dir + "/ck";

  checker.run("verify_checkpoint_files: each byte read by one rank", [&]() -> Finding {
    write_fixture(ck, *world, [&] { std::ofstream(ck + "/notes.txt") << "mine"; });
    std::vector<std::string> notes;
    int64_t mine = 0;
    const bool verified = autosp::train::verify_checkpoint_files(ck, *world, &notes, &mine);
    double read = double(mine);
    world->all_reduce_sum(&read, 1);
    const int64_t total = 300 + 20000 + 40000 + 80000 + 500;
    if (!verified) return "not verified";
    if (notes.size() != 1 || notes[0].find("notes.txt: not listed") == std::string::npos)
      return str(notes.size(), " notes, expected one naming notes.txt");
    if (read != double(total)) return str("the ranks read ", read, " bytes in all, the files have ", total);
    if (world->size() > 1 && mine > 80000) return str("this rank read ", mine, " bytes, more than the largest file");
    return {};
  });
  struct Damage {
    std::string name;
    std::function<void()> apply;
  };
  const std::vector<Damage> damages = {
      {"flipped byte in model.safetensors", [&] { flip_byte(ck + "/model.safetensors", 12345); }},
      {"truncated trainer_state.json", [&] { fs::resize_file(ck + "/trainer_state.json", 499); }},
      {"missing extra/one.bin", [&] { fs::remove(ck + "/extra/one.bin"); }},
      {"missing config.json, damaged optimizer.safetensors", [&] {
         fs::remove(ck + "/config.json");
         flip_byte(ck + "/optimizer.safetensors", 7);
       }},
      {"damaged optimizer.safetensors, unlisted fifo", [&] {
         flip_byte(ck + "/optimizer.safetensors", 7);
         mkfifo((ck + "/pipe").c_str(), 0600);
       }},
      {"manifest not JSON", [&] { std::ofstream(ck + "/manifest.json") << "{\"format\": "; }},
  };
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const autosp::UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const Damage& d : damages)
    checker.run("verify_checkpoint_files: " + d.name, [&]() -> Finding {
      write_fixture(ck, *world, d.apply);
      const std::string alone = error_of([&] { autosp::train::verify_checkpoint_files(ck); });
      const std::string shared = error_of([&] { autosp::train::verify_checkpoint_files(ck, *world); });
      if (alone.empty()) return "one process found no damage";
      if (shared != alone) return str("over the world: '", shared, "'; one process: '", alone, "'");
      return {};
    });
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

int run_checks(const MpiRuntime& mpi) {
  Checker checker(mpi);
  check_runtime(checker, mpi);
  std::vector<int> sp_sizes = {1, 2, 4};
  if (mpi.world_size() > 4) sp_sizes.push_back(mpi.world_size());
  for (int P : sp_sizes)
    if (mpi.world_size() % P == 0) check_groups(checker, mpi, P);
  check_reduction_memory(checker);
  check_checkpoint_verification(checker);
  if (mpi.world_rank() == 0) {
    std::printf("comm_mpi_main: %d checks on %d ranks, %d failed\n", checker.checks(),
                mpi.world_size(), checker.failed());
  }
  return checker.failed() == 0 ? 0 : 1;
}

// Rank `die_rank` throws while the others wait for it in a world all-reduce.
void run_until_death(const MpiRuntime& mpi, int die_rank) {
  auto world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  double x = 1;
  world->all_reduce_sum(&x, 1);  // everyone is up
  if (mpi.world_rank() == die_rank)
    autosp::user_error("injected failure on rank ", die_rank, " (--die-rank)");
  world->all_reduce_sum(&x, 1);  // the others block here for the rank that died
  world->barrier();
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  int die_rank = -1;
  std::string die_how = "abort";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--die-rank" && i + 1 < argc) {
      die_rank = std::atoi(argv[++i]);
    } else if (arg == "--die-how" && i + 1 < argc) {
      die_how = argv[++i];
    } else {
      std::fprintf(stderr, "usage: comm_mpi_main [--die-rank R [--die-how abort|exit|finalize]]\n");
      return 2;
    }
  }
  try {
    if (die_rank >= 0) {
      run_until_death(mpi, die_rank);
      return 0;
    }
    return run_checks(mpi);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", mpi.world_rank(), e.what());
    if (die_how == "exit") std::_Exit(1);
    if (die_how == "finalize") return 1;
    mpi.abort_all(1);
  }
}

// The default thread count per rank and the wait policy (issue 25: with the cores shared,
// spinning OpenMP threads made a tiny model's step 30-50x slower). First the policy as a pure
// function, then real processes: threads_probe under `mpirun -np 2`, under `taskset -c 0`, and
// autosp itself restarting with GOMP_SPINCOUNT=kSpinCount under mpirun.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <vector>

#include "runtime/threads.h"
#include "testing/process.h"
#include "util/error.h"

namespace autosp {
namespace {

using testing::run_command;

ThreadInputs inputs(int node_cpus, int affinity_cpus, int local_ranks, std::optional<int> user_threads = {}) {
  ThreadInputs in;
  in.node_cpus = node_cpus;
  in.affinity_cpus = affinity_cpus;
  in.local_ranks = local_ranks;
  in.user_threads = user_threads;
  return in;
}

TEST(ThreadPolicy, TwoCpusTwoRanksTakeOneEach) {
  const ThreadPlan p = plan_threads(inputs(2, 2, 2));
  EXPECT_EQ(p.threads, 1);
  EXPECT_EQ(p.summary(), "threads: 1 per rank (2 CPUs / 2 local ranks)");
}

TEST(ThreadPolicy, SixteenCpusFourRanksTakeFourEach) {
  EXPECT_EQ(plan_threads(inputs(16, 16, 4)).threads, 4);
  EXPECT_EQ(plan_threads(inputs(16, 16, 3)).threads, 5);  // the share rounds down
}

TEST(ThreadPolicy, AffinityMaskBoundsTheCount) {
  const ThreadPlan p = plan_threads(inputs(16, 3, 1));
  EXPECT_EQ(p.threads, 3);
  EXPECT_EQ(p.summary(), "threads: 3 (3 CPUs in this process's affinity mask; GOMP_SPINCOUNT=1000: idle threads sleep after a short spin)");
  // mpirun's binding to one core per rank.
  EXPECT_EQ(plan_threads(inputs(16, 1, 2)).threads, 1);
}

TEST(ThreadPolicy, OneRankOnAWholeNodeTakesEveryCpu) {
  EXPECT_EQ(plan_threads(inputs(8, 8, 1)).threads, 8);
}

TEST(ThreadPolicy, MoreRanksThanCpusStillGetOneThread) {
  const ThreadPlan p = plan_threads(inputs(2, 2, 4));
  EXPECT_EQ(p.threads, 1);
  EXPECT_EQ(p.summary(), "threads: 1 per rank (2 CPUs / 4 local ranks: more ranks than CPUs)");
}

TEST(ThreadPolicy, TheUsersOmpNumThreadsWinsAndTheLineSaysSo) {
  const ThreadPlan p = plan_threads(inputs(2, 2, 2, 3));
  EXPECT_EQ(p.threads, 3);
  EXPECT_EQ(p.summary(), "threads: 3 per rank (OMP_NUM_THREADS=3, set by the user; the default here is 1: "
                         "2 CPUs / 2 local ranks; GOMP_SPINCOUNT=1000: idle threads sleep after a short spin)");
  EXPECT_EQ(plan_threads(inputs(16, 16, 1, 1)).threads, 1);
}

TEST(ThreadPolicy, MoreThanOneThreadRestartsWithAShortSpinOnce) {
  ThreadInputs in = inputs(4, 4, 1);
  EXPECT_TRUE(plan_threads(in).restart);
  in.restarted = true;  // the re-exec itself: the short spin already, and no second exec
  const ThreadPlan again = plan_threads(in);
  EXPECT_FALSE(again.restart);
  EXPECT_EQ(again.summary(), "threads: 4 (4 CPUs; GOMP_SPINCOUNT=1000: idle threads sleep after a short spin)");
}

TEST(ThreadPolicy, OneThreadHasNoIdleThreadsToPutToSleep) {
  const ThreadPlan p = plan_threads(inputs(2, 2, 2));
  EXPECT_FALSE(p.restart);
  EXPECT_EQ(p.wait, "");
}

TEST(ThreadPolicy, TheUsersWaitPolicyWins) {
  ThreadInputs in = inputs(4, 4, 1);
  in.user_wait = "OMP_WAIT_POLICY=active";
  const ThreadPlan p = plan_threads(in);
  EXPECT_FALSE(p.restart);
  EXPECT_EQ(p.summary(), "threads: 4 (4 CPUs; OMP_WAIT_POLICY=active, set by the user)");
  in.user_wait = "GOMP_SPINCOUNT=1000";
  EXPECT_FALSE(plan_threads(in).restart);
}

TEST(ThreadPolicy, SlurmTaskLayoutPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("2(x", 0), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("", 0), std::nullopt);
}

// Real processes. The environment the tests run in may set the variables the policy reads
// (ctest sets OMP_NUM_THREADS=2): each command starts from none of them.
const char* kCleanEnv =
    "env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_PROC_BIND -u OMP_PLACES "
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";

struct ProbeLine {
  int rank = -1, world = -1, threads = -1, node_cpus = -1, affinity_cpus = -1, local_ranks = -1;
  std::string spincount, summary;
};

// The probe's lines, one per rank, by rank.
std::vector<ProbeLine> probe_lines(const std::string& output) {
  const std::regex line(R"(rank (\d+)/(\d+) threads (\d+) node_cpus (\d+) affinity_cpus (\d+) local_ranks (\d+) )"
                        R"(spincount (\S+) \| ([^\n]*))");
  std::vector<ProbeLine> lines;
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    const std::smatch& m = *it;
    lines.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]),
                     std::stoi(m[6]), m[7], m[8]});
  }
  std::sort(lines.begin(), lines.end(), [](const ProbeLine& a, const ProbeLine& b) { return a.rank < b.rank; });
  return lines;
}

testing::ProcessResult mpirun_probe(const std::string& prefix, const std::string& mpirun_flags) {
  return run_command(str(kCleanEnv, prefix, "timeout 120 ", AUTOSP_MPIEXEC, " -np 2 --oversubscribe ", mpirun_flags,
                         " ", AUTOSP_THREADS_PROBE));
}

int node_cpus() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

int own_affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

// Every rank's count is the policy's for this machine: nproc CPUs, 2 local ranks, and (with
// --bind-to none) the affinity mask mpirun inherits from this process.
TEST(ThreadsUnderMpirun, TwoRanksTakeTheirShareOfTheNode) {
  const auto r = mpirun_probe("", "--bind-to none");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  const ThreadPlan expected = plan_threads(inputs(node_cpus(), own_affinity_cpus(), 2));
  for (const ProbeLine& l : lines) {
    EXPECT_EQ(l.world, 2) << r.output;
    EXPECT_EQ(l.local_ranks, 2) << r.output;
    EXPECT_EQ(l.node_cpus, node_cpus()) << r.output;
    EXPECT_EQ(l.threads, expected.threads) << r.output;
    EXPECT_EQ(l.summary, expected.summary()) << r.output;
    if (expected.threads > 1) {
      EXPECT_EQ(l.spincount, std::to_string(kSpinCount)) << "idle threads spin long:\n" << r.output;
    }
  }
}

// With mpirun's own binding (one core per rank where it binds), each rank's count is the
// policy's for the inputs it saw.
TEST(ThreadsUnderMpirun, MpirunsBindingIsRespected) {
  const auto r = mpirun_probe("", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const ProbeLine& l : lines) {
    EXPECT_EQ(l.local_ranks, 2) << r.output;
    EXPECT_LE(l.affinity_cpus, l.node_cpus) << r.output;
    EXPECT_EQ(l.threads, plan_threads(inputs(l.node_cpus, l.affinity_cpus, 2)).threads) << r.output;
  }
}

TEST(ThreadsUnderMpirun, TasksetToOneCpuGivesOneThreadPerRank) {
  const auto r = mpirun_probe("taskset -c 0 ", "--bind-to none");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const ProbeLine& l : lines) {
    EXPECT_EQ(l.affinity_cpus, 1) << r.output;
    EXPECT_EQ(l.threads, 1) << r.output;
  }
}

// The user's OMP_NUM_THREADS=2 on each of 2 ranks: both restart with GOMP_SPINCOUNT=kSpinCount
// (libgomp's default would be 300000), and MPI starts after the re-exec.
TEST(ThreadsUnderMpirun, UsersThreadsRestartWithAShortSpinAndMpiStillStarts) {
  const auto r = mpirun_probe("OMP_NUM_THREADS=2 ", "--bind-to none");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const ProbeLine& l : lines) {
    EXPECT_EQ(l.threads, 2) << r.output;
    EXPECT_EQ(l.spincount, std::to_string(kSpinCount)) << r.output;
    EXPECT_NE(l.summary.find("OMP_NUM_THREADS=2, set by the user"), std::string::npos) << r.output;
  }
}

TEST(ThreadsOneProcess, TasksetToOneCpuGivesOneThread) {
  const auto r = run_command(str(kCleanEnv, "taskset -c 0 ", AUTOSP_THREADS_PROBE));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0].threads, 1) << r.output;
  EXPECT_EQ(lines[0].local_ranks, 1) << r.output;
}

TEST(ThreadsOneProcess, TheUsersWaitPolicyIsKept) {
  const auto r = run_command(str(kCleanEnv, "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=active ", AUTOSP_THREADS_PROBE));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_NE(lines[0].spincount, std::to_string(kSpinCount)) << r.output;
  EXPECT_NE(lines[0].summary.find("OMP_WAIT_POLICY=active, set by the user"), std::string::npos) << r.output;
}

TEST(ThreadsOneProcess, TwoThreadsRestartWithAShortSpin) {
  const auto r = run_command(str(kCleanEnv, "OMP_NUM_THREADS=2 ", AUTOSP_THREADS_PROBE));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0].threads, 2) << r.output;
  EXPECT_EQ(lines[0].spincount, std::to_string(kSpinCount)) << r.output;
}

// The restart marker of another process (an autosp that started this one) is not this
// process's restart: it still restarts.
TEST(ThreadsOneProcess, AnInheritedRestartMarkerIsIgnored) {
  const auto r = run_command(str(kCleanEnv, "OMP_NUM_THREADS=2 AUTOSP_RESTARTED_SPIN=1 ", AUTOSP_THREADS_PROBE));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0].spincount, std::to_string(kSpinCount)) << r.output;
}

// With OMP_PROC_BIND, libgomp binds the main thread to one place when it loads; the count
// is still the process's mask (it once read 1 here).
TEST(ThreadsOneProcess, OmpProcBindDoesNotShrinkTheCount) {
  const auto r = run_command(str(kCleanEnv, "OMP_PROC_BIND=true ", AUTOSP_THREADS_PROBE));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<ProbeLine> lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0].affinity_cpus, own_affinity_cpus()) << r.output;
  EXPECT_EQ(lines[0].threads, plan_threads(inputs(node_cpus(), own_affinity_cpus(), 1)).threads) << r.output;
}

// autosp itself: the start-up line, printed once, and the restarted ranks train.
TEST(ThreadsUnderMpirun, AutospSaysItsThreadsAndTrainsAfterRestarting) {
  const auto r = run_command(str(kCleanEnv, "OMP_NUM_THREADS=2 timeout 300 ", AUTOSP_MPIEXEC,
                                 " -np 2 --oversubscribe --bind-to none ", AUTOSP_BINARY, " train --steps 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = "threads: 2 per rank (OMP_NUM_THREADS=2, set by the user; the default here is ";
  const size_t at = r.output.find(line);
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(line, at + 1), std::string::npos) << "printed more than once:\n" << r.output;
  EXPECT_NE(r.output.find("; GOMP_SPINCOUNT=1000: idle threads sleep after a short spin)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace autosp

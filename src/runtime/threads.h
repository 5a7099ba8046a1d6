// How many OpenMP threads a process runs its kernels on, and whether its idle threads spin.
//
// Issue 25: with the cores shared (two ranks of `mpirun -np 2` with 2 threads each on 2
// cores, or another job on the node), OpenMP's spinning waiters made a tiny model's step
// 30-50x slower. So by default each rank takes only the CPUs it may use, and a rank with
// more than one thread runs with GOMP_SPINCOUNT=kSpinCount: idle threads spin briefly, then
// sleep (why always, and why that count, in threads.cpp).
//
// plan_threads is the policy, pure; configure_threads reads the real process and applies it.
#pragma once
#include <optional>
#include <string>

namespace autosp {

// Pause loops an idle OpenMP thread spins before it sleeps (libgomp's count for a team with
// more threads than CPUs; its default is 300000).
inline constexpr int kSpinCount = 1000;

// What the policy decides from.
struct ThreadInputs {
  int node_cpus = 1;      // CPUs online on the node
  int affinity_cpus = 1;  // CPUs in this process's affinity mask (omp_get_num_procs)
  int local_ranks = 1;    // processes of the job on this node (1 outside mpirun)
  // How local_ranks was found when the launcher did not say ("" when it did), for the line.
  std::string local_ranks_note;
  std::optional<int> user_threads;  // OMP_NUM_THREADS, when the user set it
  // "OMP_WAIT_POLICY=active" or "GOMP_SPINCOUNT=1000" when the user chose how idle threads
  // wait; "" when not.
  std::string user_wait;
  // This process is configure_threads' re-exec with GOMP_SPINCOUNT=kSpinCount: never again.
  bool restarted = false;
};

struct ThreadPlan {
  int threads = 1;
  bool per_rank = false;  // more than one local rank: the line says "per rank"
  std::string reason;     // why this many: "2 CPUs / 2 local ranks", "OMP_NUM_THREADS=3, set by the user; ..."
  std::string wait;       // how idle threads wait, "" with one thread (there are none)
  // Re-exec with GOMP_SPINCOUNT=kSpinCount: libgomp reads it once, when it is loaded.
  bool restart = false;

  // The start-up line, e.g. "threads: 1 per rank (2 CPUs / 2 local ranks)".
  std::string summary() const;
};

// The default: the CPUs this process may use, min(affinity CPUs, node CPUs / local ranks),
// at least 1. The user's OMP_NUM_THREADS wins. Idle threads spin briefly, then sleep, when
// there is more than one thread, unless the user chose how they wait.
ThreadPlan plan_threads(const ThreadInputs& in);

// The ranks on this node from a Slurm task layout: SLURM_STEP_TASKS_PER_NODE ("2(x3),1":
// 2 tasks on each of nodes 0-2, 1 on node 3) at SLURM_NODEID `node`. nullopt if unparsable.
std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// This process's inputs: sysconf, the affinity mask, the launcher's environment (Open MPI,
// MPICH / Intel MPI, Slurm's srun), OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT.
ThreadInputs thread_inputs_from_environment();

// Applies the plan to this process: sets OpenMP's thread count, and when the plan says so
// re-execs /proc/self/exe with GOMP_SPINCOUNT=kSpinCount (same argv, same environment plus
// that, same pid: mpirun's daemons and PMIx see the same process). Call first thing in main,
// before MPI_Init and before anything is printed or started. On return the line is in
// threads_summary(); a failed exec is said there and the run goes on with spinning threads.
void configure_threads(char** argv);

// The start-up line configure_threads decided ("" if it has not run).
const std::string& threads_summary();

}  // namespace autosp

#include "runtime/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.h"

namespace autosp {

// Why idle threads spin only briefly whenever a rank has more than one thread, not only
// when the node looks oversubscribed at start-up:
//  - libgomp's default waiter spins GOMP_SPINCOUNT = 300000 pause loops (milliseconds) at
//    every barrier and after every parallel region before it sleeps; while a rank sits in
//    MPI or in serial code, or its other thread is descheduled, its idle workers burn CPUs
//    that other processes need. It throttles that (to 1000) only when its own threads
//    outnumber its own affinity mask, blind to other ranks and other jobs.
//  - The load that hurts comes and goes during a run: on a 2-CPU machine (Intel Xeon, KVM) a
//    compile starting beside the demo (1 rank, 2 threads) took its step from 0.025 s to 1.25 s
//    mid-run. A start-up check of the load average cannot see that coming; a rank cannot
//    re-exec mid-run, and libgomp reads the policy only when it is loaded.
//  - Sleeping at once (OMP_WAIT_POLICY=passive, autosp's earlier default) pays a futex wake
//    per parallel region, which a virtual machine makes tens of microseconds: on that Xeon the
//    bench model's S = 2048 step (~650 regions) took 0.355-0.372 s passive against 0.33 s
//    spinning, and the demo's step 0.025 s against 0.010 s.
//  - So a waiter spins kSpinCount pause loops, libgomp's own count for oversubscribed teams
//    (tens of microseconds, about what sleeping and waking costs: at most twice the better
//    choice either way), then sleeps. Measured there, the demo's median step: idle 0.012 s
//    (passive 0.025, libgomp's default 0.010); beside one busy loop 0.024 s (passive 0.018,
//    default 0.15 with steps up to 0.61). A user who owns the node sets OMP_WAIT_POLICY=active.
ThreadPlan plan_threads(const ThreadInputs& in) {
  const int node = std::max(in.node_cpus, 1);
  const int ranks = std::max(in.local_ranks, 1);
  const int affinity = std::max(in.affinity_cpus, 1);
  const int share = std::max(node / ranks, 1);
  const int fallback = std::min(affinity, share);
  const auto cpus = [](int n) { return str(n, n == 1 ? " CPU" : " CPUs"); };
  std::string why;
  if (affinity < share) {
    why = cpus(affinity) + " in this process's affinity mask";
  } else if (ranks > 1) {
    why = str(cpus(node), " / ", ranks, " local ranks", in.local_ranks_note, node < ranks ? ": more ranks than CPUs" : "");
  } else {
    why = cpus(node);
  }

  ThreadPlan plan;
  plan.per_rank = ranks > 1;
  plan.threads = in.user_threads ? *in.user_threads : fallback;
  plan.reason = in.user_threads ? str("OMP_NUM_THREADS=", *in.user_threads, ", set by the user; the default here is ",
                                      fallback, ": ", why)
                                : why;
  if (plan.threads > 1) {
    if (!in.user_wait.empty()) {
      plan.wait = in.user_wait + ", set by the user";
    } else {
      plan.wait = str("GOMP_SPINCOUNT=", kSpinCount, ": idle threads sleep after a short spin");
      plan.restart = !in.restarted;
    }
  }
  return plan;
}

std::string ThreadPlan::summary() const {
  return str("threads: ", threads, per_rank ? " per rank" : "", " (", reason, wait.empty() ? "" : "; ", wait, ")");
}

std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Groups "C" or "C(xR)", comma-separated: C tasks on each of the next R nodes.
  const char* p = tasks_per_node.c_str();
  while (*p) {
    char* end = nullptr;
    const long count = std::strtol(p, &end, 10);
    if (end == p || count <= 0) return std::nullopt;
    long repeat = 1;
    p = end;
    if (std::strncmp(p, "(x", 2) == 0) {
      repeat = std::strtol(p + 2, &end, 10);
      if (end == p + 2 || repeat <= 0 || *end != ')') return std::nullopt;
      p = end + 1;
    }
    if (node < repeat) return static_cast<int>(count);
    node -= static_cast<int>(repeat);
    if (*p == ',') ++p;
    else if (*p) return std::nullopt;
  }
  return std::nullopt;
}

namespace {

// Set by configure_threads to its pid before it re-execs: the process with that pid is the
// restart and its GOMP_SPINCOUNT is autosp's, not the user's. A value inherited from another
// process (whatever started this one) is not.
constexpr const char* kRestartedVar = "AUTOSP_RESTARTED_SPIN";

// An integer variable of the launcher, nullopt when unset, malformed or below `least`.
std::optional<int> int_env(const char* var, int least = 1) {
  const char* v = std::getenv(var);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < least || n > (1 << 20)) return std::nullopt;
  return static_cast<int>(n);
}

// OMP_NUM_THREADS as libgomp reads it: the first number of a list ("4,2" nests). Invalid
// values are ignored by libgomp (with a warning), and so here.
std::optional<int> user_thread_count() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v) return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  while (end && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || n <= 0 || n > (1 << 20) || (*end != '\0' && *end != ',')) return std::nullopt;
  return static_cast<int>(n);
}

// With OMP_PROC_BIND (or OMP_PLACES) libgomp has bound this thread to its first place when
// it loaded, and an exec keeps a thread's mask: the new image would see one place's CPUs.
// Give it the places' union back, the mask libgomp built them from.
void unbind_for_exec() {
  const int places = omp_get_num_places();
  if (places <= 0) return;
  std::vector<int> cpus;
  for (int p = 0; p < places; ++p) {
    std::vector<int> ids(static_cast<size_t>(std::max(omp_get_place_num_procs(p), 0)));
    omp_get_place_proc_ids(p, ids.data());
    cpus.insert(cpus.end(), ids.begin(), ids.end());
  }
  if (cpus.empty()) return;
  const int size_cpus = *std::max_element(cpus.begin(), cpus.end()) + 1;
  cpu_set_t* set = CPU_ALLOC(size_cpus);
  if (!set) return;
  const size_t size = CPU_ALLOC_SIZE(size_cpus);
  CPU_ZERO_S(size, set);
  for (int c : cpus)
    if (c >= 0) CPU_SET_S(c, size, set);
  sched_setaffinity(0, size, set);  // on failure the new image runs on the narrower mask, no worse
  CPU_FREE(set);
}

std::string& summary_storage() {
  static std::string summary;
  return summary;
}

}  // namespace

ThreadInputs thread_inputs_from_environment() {
  ThreadInputs in;
  in.node_cpus = std::max(static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)), 1);
  // The CPUs of this process's affinity mask, as libgomp counted them when it loaded: with
  // OMP_PROC_BIND set it has since bound this thread to one place, and sched_getaffinity here
  // would say 1.
  in.affinity_cpus = omp_get_num_procs();
  // The local count from the launcher: Open MPI's mpirun, then MPICH / Intel MPI (hydra),
  // then Slurm's srun. A launcher that says only the world size: all ranks are taken as
  // local, which errs towards fewer threads (the line says so; OMP_NUM_THREADS overrides).
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  const char* slurm_layout = std::getenv("SLURM_STEP_TASKS_PER_NODE");
  const std::optional<int> slurm_node = int_env("SLURM_NODEID", 0);
  if (const auto n = int_env("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    in.local_ranks = *n;
  } else if (const auto m = int_env("MPI_LOCALNRANKS")) {
    in.local_ranks = *m;
  } else if (launched && slurm_layout && slurm_node && slurm_tasks_on_node(slurm_layout, *slurm_node)) {
    in.local_ranks = *slurm_tasks_on_node(slurm_layout, *slurm_node);
  } else if (launched) {
    const int world = int_env("OMPI_COMM_WORLD_SIZE").value_or(int_env("PMI_SIZE").value_or(1));
    in.local_ranks = world;
    if (world > 1) in.local_ranks_note = " (the launcher does not say how many are on this node: all taken as local)";
  }
  in.user_threads = user_thread_count();
  const char* restarted = std::getenv(kRestartedVar);
  in.restarted = restarted && std::string(restarted) == std::to_string(getpid());
  if (!in.restarted) {
    for (const char* var : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
      const char* v = std::getenv(var);
      if (v && *v) {
        in.user_wait = str(var, "=", v);
        break;
      }
    }
  }
  return in;
}

void configure_threads(char** argv) {
  const ThreadInputs in = thread_inputs_from_environment();
  ThreadPlan plan = plan_threads(in);
  unsetenv(kRestartedVar);  // a process this one starts is not the restart
  if (plan.restart) {
    setenv("GOMP_SPINCOUNT", std::to_string(kSpinCount).c_str(), 1);
    setenv(kRestartedVar, std::to_string(getpid()).c_str(), 1);
    std::fflush(nullptr);
    unbind_for_exec();
    execv("/proc/self/exe", argv);
    // Only on failure (no /proc, say): run on as the user started it.
    const int error = errno;
    unsetenv("GOMP_SPINCOUNT");
    unsetenv(kRestartedVar);
    plan.wait = str("idle threads spin: autosp could not restart itself with GOMP_SPINCOUNT=", kSpinCount,
                    " (execv /proc/self/exe: ", std::strerror(error),
                    "); set OMP_WAIT_POLICY=passive if the CPUs are shared");
  }
  // The user's OMP_NUM_THREADS is libgomp's already (it read it when it was loaded).
  if (!in.user_threads) omp_set_num_threads(plan.threads);
  summary_storage() = plan.summary();
}

const std::string& threads_summary() { return summary_storage(); }

}  // namespace autosp

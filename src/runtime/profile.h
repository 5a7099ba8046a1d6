// Where a step's time goes: per op kind and kernel, forward and backward (AUTOSP_PROFILE=1;
// issue 25 on the CPU, issue 42 on the GPU). Off, it costs one pointer test per node.
//
// On, each CpuExecutor made afterwards times every node it runs (a steady_clock read before
// and after each node of run_nodes, runtime/node_loop.h: the kernel, and in heap mode the
// node's allocations) into one process-wide Profile, grouped by (phase, op kind, kernel)
// with the node's FLOPs from its op's cost rule (node_cost). A CudaExecutor made afterwards
// times each node's device work with CUDA events into the same rows (runtime/cuda_executor.h,
// NodeProfiler::add_run), so the table reads alike for both backends. The trainer adds the
// optimizer's time and each step's time; the training loop (train/loop.h) leaves the first
// step out when more follow (it pays one-time costs: the arena's first-touch page faults)
// and `autosp train` prints the table at the end (Profile::report).
//
// Phases: a node is forward when the graph output "loss" depends on it, backward otherwise
// (gradient rules, the recomputation checkpointing adds for them, gradient collectives and
// whatever else runs only for the gradients). A graph without a "loss" output is all
// forward. autodiff keeps the forward nodes and appends the backward ones, and no gradient
// can feed the loss, so on a joint graph this is exactly autodiff's split, and it stays true
// through the passes that reorder (schedule) or copy (checkpoint) nodes.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace autosp {

enum class Phase : uint8_t { forward, backward };
const char* phase_name(Phase phase);

// Per node: its phase (inputs are forward).
std::vector<Phase> node_phases(const Graph& graph);

// AUTOSP_PROFILE=1 in the environment (read once), unless set_profile_enabled overrode it.
bool profile_enabled();
void set_profile_enabled(bool on);

struct ProfileRow {
  Phase phase = Phase::forward;
  std::string op;      // op_name, with " (recompute)" for checkpoint's copies
  std::string kernel;  // the kernel it runs ("cpu.avx512.attention")
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // the calls' FLOPs, from node_cost
  double share = 0;  // of the graph time (every row's seconds): the rows' shares sum to 1
};

class Profile {
 public:
  // The row for (phase, op, kernel), made on first use; stable across reset().
  int row(Phase phase, const std::string& op, const std::string& kernel);
  void add(int row, double seconds, double flops);
  // Time of the step outside the graphs (the optimizer); rows by name.
  void add_outside(const std::string& what, double seconds);
  void add_step(double seconds);
  // An overlapped collective (plan_memory's overlap): the time from its start until the
  // executor found it done (or finished waiting for it), and the part of that the executor
  // spent blocked waiting. The report says which share of the in-flight time compute hid.
  void add_overlap(double in_flight, double blocked);
  struct Overlap {
    int64_t calls = 0;
    double in_flight = 0, blocked = 0;
    double hidden() const { return in_flight > 0 ? 1.0 - blocked / in_flight : 0.0; }
  };
  Overlap overlap() const;
  // Zeroes every count and time (the rows stay, so executors' row ids stay valid).
  void reset();

  // The rows with calls, forward first, each phase by time (largest first), shares filled.
  std::vector<ProfileRow> rows() const;
  int64_t steps() const;
  // The Markdown table autosp train prints: per step when steps were added, else totals.
  std::string report(const std::string& title) const;

 private:
  mutable std::mutex mutex_;
  std::vector<ProfileRow> rows_;
  std::vector<std::pair<std::string, double>> outside_;
  int64_t steps_ = 0;
  double step_seconds_ = 0;
  Overlap overlap_;
};

// The process-wide profile executors record into.
Profile& global_profile();

// What an executor keeps to profile its graph: each node's row and FLOPs. The rows are the
// same for every backend (phase, op, the kernel the graph is lowered to), so one table
// (Profile::report) reads alike for the CPU and the cuda executor.
class NodeProfiler {
 public:
  NodeProfiler(const Graph& graph, int threads, Profile& into);
  void add(NodeId n, double seconds) {
    if (row_[n] >= 0) into_.add(row_[n], seconds, flops_[n]);
  }
  // One run of the graph whose node times are known only after it (the cuda executor reads
  // its events after the step's synchronisation): node n took seconds[n]; every node but the
  // inputs is one call, as run_nodes times them on the CPU (a view, which launches nothing,
  // is a call of 0 s). seconds has one entry per node (InternalError otherwise).
  void add_run(const std::vector<double>& seconds);

 private:
  Profile& into_;
  std::vector<int> row_;  // -1 for inputs: they run nothing
  std::vector<double> flops_;
};

}  // namespace autosp

#include "runtime/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "ops/op.h"
#include "passes/lower.h"
#include "util/error.h"

namespace autosp {

const char* phase_name(Phase phase) { return phase == Phase::forward ? "forward" : "backward"; }

std::vector<Phase> node_phases(const Graph& graph) {
  const auto& nodes = graph.nodes();
  const auto& outputs = graph.outputs();
  const auto loss = std::find_if(outputs.begin(), outputs.end(), [](const GraphOutput& o) { return o.name == "loss"; });
  if (loss == outputs.end()) return std::vector<Phase>(nodes.size(), Phase::forward);
  // The loss's ancestors, walking the (topologically ordered) nodes backwards once.
  std::vector<bool> needed(graph.values().size(), false);
  needed[loss->value] = true;
  std::vector<Phase> phase(nodes.size(), Phase::backward);
  for (NodeId n = static_cast<NodeId>(nodes.size()) - 1; n >= 0; --n) {
    const Node& node = nodes[n];
    const bool feeds_loss = std::any_of(node.outputs.begin(), node.outputs.end(), [&](ValueId v) { return needed[v]; });
    if (!feeds_loss && node.op != OpKind::input) continue;
    phase[n] = Phase::forward;
    for (ValueId v : node.inputs) needed[v] = true;
  }
  return phase;
}

namespace {
std::optional<bool>& enabled_override() {
  static std::optional<bool> on;
  return on;
}
}  // namespace

bool profile_enabled() {
  static const bool from_env = [] {
    const char* v = std::getenv("AUTOSP_PROFILE");
    return v && std::string(v) == "1";
  }();
  return enabled_override().value_or(from_env);
}

void set_profile_enabled(bool on) { enabled_override() = on; }

int Profile::row(Phase phase, const std::string& op, const std::string& kernel) {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].phase == phase && rows_[i].op == op && rows_[i].kernel == kernel) return static_cast<int>(i);
  rows_.push_back({.phase = phase, .op = op, .kernel = kernel});
  return static_cast<int>(rows_.size()) - 1;
}

void Profile::add(int row, double seconds, double flops) {
  std::lock_guard lock(mutex_);
  ProfileRow& r = rows_.at(row);
  ++r.calls;
  r.seconds += seconds;
  r.flops += flops;
}

void Profile::add_outside(const std::string& what, double seconds) {
  std::lock_guard lock(mutex_);
  for (auto& [name, s] : outside_)
    if (name == what) {
      s += seconds;
      return;
    }
  outside_.emplace_back(what, seconds);
}

void Profile::add_step(double seconds) {
  std::lock_guard lock(mutex_);
  ++steps_;
  step_seconds_ += seconds;
}

void Profile::add_overlap(double in_flight, double blocked) {
  std::lock_guard lock(mutex_);
  ++overlap_.calls;
  overlap_.in_flight += in_flight;
  overlap_.blocked += blocked;
}

Profile::Overlap Profile::overlap() const {
  std::lock_guard lock(mutex_);
  return overlap_;
}

void Profile::reset() {
  std::lock_guard lock(mutex_);
  for (ProfileRow& r : rows_) r.calls = 0, r.seconds = r.flops = 0;
  outside_.clear();
  overlap_ = {};
  steps_ = 0;
  step_seconds_ = 0;
}

int64_t Profile::steps() const {
  std::lock_guard lock(mutex_);
  return steps_;
}

std::vector<ProfileRow> Profile::rows() const {
  std::vector<ProfileRow> out;
  {
    std::lock_guard lock(mutex_);
    for (const ProfileRow& r : rows_)
      if (r.calls > 0) out.push_back(r);
  }
  double total = 0;
  for (const ProfileRow& r : out) total += r.seconds;
  for (ProfileRow& r : out) r.share = total > 0 ? r.seconds / total : 1.0 / double(out.size());
  std::stable_sort(out.begin(), out.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.phase != b.phase ? a.phase < b.phase : a.seconds > b.seconds;
  });
  return out;
}

std::string Profile::report(const std::string& title) const {
  const std::vector<ProfileRow> rs = rows();
  int64_t steps;
  double step_seconds;
  std::vector<std::pair<std::string, double>> outside;
  {
    std::lock_guard lock(mutex_);
    steps = steps_, step_seconds = step_seconds_, outside = outside_;
  }
  const double per = steps > 0 ? 1.0 / double(steps) : 1.0;
  const char* unit = steps > 0 ? " per step" : "";
  std::string out;
  char line[512];
  auto emit = [&](auto... args) {
    std::snprintf(line, sizeof line, args...);
    out += line;
  };
  emit("profile (AUTOSP_PROFILE=1), %s: %lld step(s)%s\n", title.c_str(), (long long)steps,
       steps > 0 ? "" : " (no steps counted: totals)");
  emit("| phase | op | kernel | calls%s | ms%s | share of graph | GFLOP/s |\n", unit, unit);
  out += "|---|---|---|---:|---:|---:|---:|\n";
  double phase_s[2] = {0, 0};
  for (const ProfileRow& r : rs) {
    phase_s[int(r.phase)] += r.seconds;
    emit("| %s | %s | %s | %.0f | %.2f | %.3f | %.1f |\n", phase_name(r.phase), r.op.c_str(), r.kernel.c_str(),
         double(r.calls) * per, r.seconds * per * 1e3, r.share, r.seconds > 0 ? r.flops / r.seconds * 1e-9 : 0.0);
  }
  // Where the step's time went: the graphs' phases, then what the trainer timed outside them.
  const double graph_s = phase_s[0] + phase_s[1];
  const double whole = steps > 0 ? step_seconds : graph_s;
  auto pct = [&](double s) { return whole > 0 ? 100.0 * s / whole : 0.0; };
  emit("%s %.3f s: forward %.3f s (%.1f%%), backward %.3f s (%.1f%%)", steps > 0 ? "step" : "graphs",
       whole * per, phase_s[0] * per, pct(phase_s[0]), phase_s[1] * per, pct(phase_s[1]));
  double accounted = graph_s;
  for (const auto& [name, s] : outside) {
    emit(", %s %.3f s (%.1f%%)", name.c_str(), s * per, pct(s));
    accounted += s;
  }
  if (steps > 0) emit(", the rest %.3f s (%.1f%%)", (whole - accounted) * per, pct(whole - accounted));
  out += "\n";
  if (const Overlap o = overlap(); o.calls > 0)
    emit("overlapped collectives: %.0f%s, %.2f ms in flight%s, of which %.2f ms waited for: %.1f%% hidden by compute\n",
         double(o.calls) * per, unit, o.in_flight * per * 1e3, unit, o.blocked * per * 1e3, 100.0 * o.hidden());
  return out;
}

Profile& global_profile() {
  static Profile profile;
  return profile;
}

void NodeProfiler::add_run(const std::vector<double>& seconds) {
  AUTOSP_CHECK(seconds.size() == row_.size(), "a run's node times: ", seconds.size(), " for ", row_.size(), " nodes");
  for (NodeId n = 0; n < static_cast<NodeId>(seconds.size()); ++n) add(n, seconds[n]);
}

NodeProfiler::NodeProfiler(const Graph& graph, int threads, Profile& into)
    : into_(into), row_(graph.nodes().size(), -1), flops_(graph.nodes().size(), 0) {
  const std::vector<Phase> phases = node_phases(graph);
  const bool lowered = lowered_backend(graph).has_value();
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    const Node& node = graph.node(n);
    if (node.op == OpKind::input) continue;
    const std::string kernel = lowered ? lowered_binding(node).kernel : bind_kernel(graph, n, Backend::cpu, threads).kernel;
    // checkpoint's copies of forward nodes, named "recompute:%N", run for the backward.
    const bool recompute = !node.outputs.empty() && graph.value(node.outputs[0]).name.starts_with("recompute:");
    row_[n] = into_.row(phases[n], str(op_name(node.op), recompute ? " (recompute)" : ""), kernel);
    flops_[n] = node_cost(graph, node).flops;
  }
}

}  // namespace autosp

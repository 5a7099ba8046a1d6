#include "passes/plan_memory.h"

#include <algorithm>
#include <map>

#include "ops/op.h"
#include "passes/lower.h"

namespace autosp {

namespace {

int64_t aligned(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

bool owns_memory(const Node& node) { return node.op != OpKind::input && node.op != OpKind::reshape; }

// The last node that reads each value; graph outputs are read after the last node (at
// position N, the node count).
std::vector<NodeId> last_uses(const Graph& g) {
  std::vector<NodeId> last(g.values().size(), -1);
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n)
    for (ValueId v : g.node(n).inputs) last[v] = std::max(last[v], n);
  for (const GraphOutput& o : g.outputs()) last[o.value] = static_cast<NodeId>(g.nodes().size());
  return last;
}

// One range of the arena, live over nodes [begin, end] (both inclusive).
struct Buffer {
  int64_t bytes = 0;  // exact, before alignment
  NodeId begin = 0, end = 0;
  int64_t offset = -1;
};

struct Buffers {
  std::vector<Buffer> buffers;
  std::vector<int> of_value;      // per value: its buffer, -1 outside the arena
  std::vector<int> of_workspace;  // per node: its workspace's buffer, -1 for none
  std::vector<NodeId> wait;       // per node: where an overlapped collective finishes, -1 for none
};

// Lifetimes from the node order. A reshape joins its operand's buffer (extending it to the
// view's last use); an in-place result joins the buffer of an operand that dies at its node.
Buffers find_buffers(const Graph& g, const PlanMemoryOptions& options) {
  const std::vector<NodeId> last = last_uses(g);
  Buffers r;
  r.of_value.assign(g.values().size(), -1);
  r.of_workspace.assign(g.nodes().size(), -1);
  const bool lowered = lowered_backend(g).has_value();
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
    const Node& node = g.node(n);
    if (node.op == OpKind::input) continue;
    if (node.op == OpKind::reshape) {
      const int b = r.of_value[node.inputs[0]];
      r.of_value[node.outputs[0]] = b;
      if (b >= 0) r.buffers[b].end = std::max(r.buffers[b].end, last[node.outputs[0]]);
      continue;
    }
    const KernelBinding kernel = lowered ? lowered_binding(node) : bind_kernel(g, n, options.backend, options.threads);
    std::vector<int> taken;  // operand buffers already reused by a result of this node
    for (ValueId out : node.outputs) {
      const TensorType& t = g.type(out);
      if (t.bytes() == 0) continue;
      int b = -1;
      // An operand's buffer dies here when every value sharing it is last read here: any
      // later reader (a view or in-place result defined later) would be a later reader of
      // a value already in it, so `end` is final once it equals n.
      if (options.inplace && kernel.inplace)
        for (ValueId in : node.inputs) {
          const int c = r.of_value[in];
          if (c >= 0 && r.buffers[c].end == n && r.buffers[c].bytes == t.bytes() &&
              g.type(in).dtype == t.dtype && std::find(taken.begin(), taken.end(), c) == taken.end()) {
            b = c;
            break;
          }
        }
      if (b >= 0) {
        taken.push_back(b);
        r.buffers[b].end = std::max(n, last[out]);
      } else {
        b = static_cast<int>(r.buffers.size());
        r.buffers.push_back({t.bytes(), n, std::max(n, last[out])});
      }
      r.of_value[out] = b;
    }
    if (const int64_t ws = kernel.workspace_bytes; ws > 0) {
      r.of_workspace[n] = static_cast<int>(r.buffers.size());
      r.buffers.push_back({ws, n, n});
    }
  }
  r.wait.assign(g.nodes().size(), -1);
  const std::optional<Backend> backend = lowered ? lowered_backend(g) : std::optional<Backend>(options.backend);
  if (!options.overlap || !backend) return r;
  const NodeId N = static_cast<NodeId>(g.nodes().size());
  for (NodeId n = 0; n < N; ++n) {
    const Node& node = g.node(n);
    if (node.op == OpKind::input) continue;
    if (*backend == Backend::cpu ? !op_def(node.op).cpu_start : !op_def(node.op).cuda.overlappable) continue;
    // The first node after it that computes from a result's buffer (a view shares it).
    std::vector<int> results;
    for (ValueId out : node.outputs)
      if (r.of_value[out] >= 0) results.push_back(r.of_value[out]);
    NodeId w = N;
    for (NodeId m = n + 1; m < N && w == N; ++m) {
      const Node& reader = g.node(m);
      if (reader.op == OpKind::reshape || reader.op == OpKind::input) continue;
      for (ValueId in : reader.inputs)
        if (std::find(results.begin(), results.end(), r.of_value[in]) != results.end()) w = m;
    }
    r.wait[n] = w;
    if (const int ws = r.of_workspace[n]; ws >= 0) r.buffers[ws].end = w;
  }
  return r;
}

// Places buffers one by one in `order`, each into the smallest gap free over its whole
// lifetime (the lowest among equal gaps), else on top of everything live with it. Returns
// the arena size, or, once it passes `limit` (>= 0), that arena at once: the caller has no use
// for a packing above it. The placed buffers are kept sorted by offset, so finding a buffer's gaps
// is one pass over them (no sort per buffer): O(B^2) in all, with a small constant.
int64_t place(std::vector<Buffer>& buffers, const std::vector<int>& order, int64_t limit) {
  struct Placed {
    int64_t offset, top;  // [offset, top) in the arena
    NodeId begin, end;
  };
  std::vector<Placed> placed;  // by offset (buffers at one offset in any order: see below)
  placed.reserve(buffers.size());
  int64_t arena = 0;
  for (int i : order) {
    Buffer& b = buffers[i];
    const int64_t size = aligned(b.bytes);
    // Among buffers live with b, in offset order: the gap below each is its offset less the
    // highest end below it. Of two at one offset the second's gap is negative (every size
    // is at least the alignment), so their order changes nothing.
    int64_t top = 0, best = -1, best_gap = 0;
    for (const Placed& p : placed) {
      if (p.begin > b.end || b.begin > p.end) continue;
      const int64_t gap = p.offset - top;
      if (gap >= size && (best < 0 || gap < best_gap)) {
        best = top;
        best_gap = gap;
      }
      top = std::max(top, p.top);
    }
    b.offset = best >= 0 ? best : top;
    arena = std::max(arena, b.offset + size);
    if (limit >= 0 && arena > limit) return arena;
    const Placed p{b.offset, b.offset + size, b.begin, b.end};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), p,
                                   [](const Placed& x, const Placed& y) { return x.offset < y.offset; }),
                  p);
  }
  return arena;
}

// Best fit in four orders, keeping the smallest arena (ties: the earlier order):
//  - largest first (TFLite's greedy by size, XLA's decreasing-size best-fit heap);
//  - in time order, buffers of a page or more first, then the small ones: forward
//    activations are written in order and freed in reverse by the backward, which time
//    order stacks without holes, as long as small scalars and row statistics placed among
//    them do not split the gaps the large buffers need (they go into leftover holes);
//  - longest-lived first;
//  - time order with buffers of 64 KiB or more first: the attention backward's per-thread
//    head copies (kernels/cpu/attention.cpp) are a workspace of tens of KiB that, placed
//    among the activations, splits the gap a larger buffer needs (tiny Llama, SP 2,
//    S = 1024: 0.6% above the live peak in each of the other orders).
// On the tiny Llama's joint graph at SP 1 and 2 (S = 64 to 16384) the best of these reaches
// the live peak, the bound no packing can beat, where no one order does: largest first is
// up to 3% above it at S >= 1024, time order 7% above at S = 64.
// With `stop_above` >= 0 the result is exact only up to it: a packing known to be larger
// stops there, and a result above stop_above says only that the arena is.
int64_t pack(std::vector<Buffer>& buffers, int64_t stop_above = -1) {
  constexpr int64_t kSmall = 4096, kMedium = 65536;
  std::vector<int> ids(buffers.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  auto sorted = [&](auto&& less) {
    std::vector<int> order = ids;
    std::stable_sort(order.begin(), order.end(), less);
    return order;
  };
  auto size = [&](int i) { return aligned(buffers[i].bytes); };
  auto length = [&](int i) { return buffers[i].end - buffers[i].begin; };
  const std::vector<int> orders[] = {
      sorted([&](int a, int b) { return size(a) > size(b); }),
      sorted([&](int a, int b) {
        const bool small_a = size(a) < kSmall, small_b = size(b) < kSmall;
        return small_a != small_b ? small_b : buffers[a].begin < buffers[b].begin;
      }),
      sorted([&](int a, int b) { return length(a) != length(b) ? length(a) > length(b) : size(a) > size(b); }),
      sorted([&](int a, int b) {
        const bool small_a = size(a) < kMedium, small_b = size(b) < kMedium;
        return small_a != small_b ? small_b : buffers[a].begin < buffers[b].begin;
      }),
  };
  int64_t best = -1, over = -1;
  std::vector<int64_t> best_offsets;
  for (const std::vector<int>& order : orders) {
    if (best == 0) break;  // no buffers
    // An order is kept only below the best so far (and of use only up to stop_above).
    const int64_t limit = best < 0 ? stop_above : stop_above < 0 ? best - 1 : std::min(stop_above, best - 1);
    const int64_t arena = place(buffers, order, limit);
    if (limit >= 0 && arena > limit) {
      if (best < 0) over = arena;
      continue;
    }
    best = arena;
    best_offsets.clear();
    for (const Buffer& b : buffers) best_offsets.push_back(b.offset);
  }
  if (best < 0) return over;  // every order above stop_above
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].offset = best_offsets[i];
  return best;
}

// The attributes without a previous plan's.
Attrs without_plan(const Attrs& attrs) {
  Attrs a;
  for (const auto& [key, value] : attrs.all())
    if (key != "mem_offsets" && key != "mem_workspace" && key != "async_wait") a.set(key, value);
  return a;
}

}  // namespace

Graph plan_memory(const Graph& g, const PlanMemoryOptions& options) {
  AUTOSP_CHECK(options.threads >= 1, "plan_memory needs the executor's thread count, got ", options.threads);
  Buffers r = find_buffers(g, options);
  pack(r.buffers);

  Graph planned;
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
    const Node& node = g.node(n);
    Attrs attrs = without_plan(node.attrs);
    if (owns_memory(node)) {
      std::vector<int64_t> offsets;
      for (ValueId out : node.outputs)
        offsets.push_back(r.of_value[out] >= 0 ? r.buffers[r.of_value[out]].offset : -1);
      attrs.set("mem_offsets", offsets);
      if (const int w = r.of_workspace[n]; w >= 0)
        attrs.set("mem_workspace", std::vector<int64_t>{r.buffers[w].offset, r.buffers[w].bytes});
      if (r.wait[n] >= 0) attrs.set("async_wait", int64_t{r.wait[n]});
    }
    std::vector<TensorType> types;
    for (ValueId out : node.outputs) types.push_back(g.type(out));
    planned.add_node(node.op, node.inputs, std::move(attrs), types);
  }
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    planned.mutable_value(v).name = g.value(v).name;
    planned.mutable_value(v).sharding = g.value(v).sharding;
  }
  for (const GraphOutput& o : g.outputs()) planned.add_output(o.name, o.value);
  return planned;
}

int64_t planned_arena_bytes(const Graph& g, const PlanMemoryOptions& options, int64_t stop_above) {
  AUTOSP_CHECK(options.threads >= 1, "plan_memory needs the executor's thread count, got ", options.threads);
  Buffers r = find_buffers(g, options);
  return pack(r.buffers, stop_above);
}

bool has_memory_plan(const Graph& g) {
  for (const Node& node : g.nodes())
    if (owns_memory(node) && !node.attrs.has("mem_offsets")) return false;
  return true;
}

MemoryPlan read_memory_plan(const Graph& g) {
  const auto N = static_cast<NodeId>(g.nodes().size());
  MemoryPlan plan;
  plan.offsets.assign(g.values().size(), -1);
  plan.workspace_offsets.assign(N, -1);
  plan.workspace_bytes.assign(N, 0);
  auto check_offset = [](int64_t offset, NodeId n, const Node& node) {
    AUTOSP_CHECK(offset >= 0 && offset % kArenaAlignment == 0, "node ", n, " (", op_name(node.op),
                 "): arena offset ", offset, " is not a multiple of ", kArenaAlignment);
  };
  for (NodeId n = 0; n < N; ++n) {
    const Node& node = g.node(n);
    if (!owns_memory(node)) continue;
    AUTOSP_CHECK(node.attrs.has("mem_offsets"), "node ", n, " (", op_name(node.op),
                 ") has no memory plan: plan_memory has not run on this graph");
    const std::vector<int64_t>& offsets = node.attrs.get_ints("mem_offsets");
    AUTOSP_CHECK(offsets.size() == node.outputs.size(), "node ", n, " (", op_name(node.op), ") has ",
                 offsets.size(), " mem_offsets for ", node.outputs.size(), " results");
    for (size_t i = 0; i < offsets.size(); ++i) {
      const int64_t bytes = g.type(node.outputs[i]).bytes();
      if (bytes == 0) {
        AUTOSP_CHECK(offsets[i] == -1, "node ", n, ": an empty result has arena offset ", offsets[i]);
        continue;
      }
      check_offset(offsets[i], n, node);
      plan.offsets[node.outputs[i]] = offsets[i];
      plan.arena_bytes = std::max(plan.arena_bytes, offsets[i] + aligned(bytes));
    }
    if (node.attrs.has("mem_workspace")) {
      const std::vector<int64_t>& ws = node.attrs.get_ints("mem_workspace");
      AUTOSP_CHECK(ws.size() == 2 && ws[1] > 0, "node ", n, ": mem_workspace is [offset, bytes]");
      check_offset(ws[0], n, node);
      plan.workspace_offsets[n] = ws[0];
      plan.workspace_bytes[n] = ws[1];
      plan.arena_bytes = std::max(plan.arena_bytes, ws[0] + aligned(ws[1]));
    }
  }

  // The live peak: at each node, the distinct arena ranges of the buffers live there (an
  // in-place result and the operand it reuses are one range) and the node's workspace.
  const std::vector<NodeId> last = last_uses(g);
  std::vector<ValueId> root(g.values().size());
  std::vector<NodeId> end(g.values().size(), -1);
  for (const Node& node : g.nodes())
    for (ValueId out : node.outputs) root[out] = node.op == OpKind::reshape ? root[node.inputs[0]] : out;
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v)
    end[root[v]] = std::max({end[root[v]], last[v], g.value(v).producer});
  std::vector<std::vector<ValueId>> ending(N + 1);
  std::map<int64_t, int> live;  // offset -> live buffers there
  int64_t live_bytes = 0;
  auto bytes_of = [&](ValueId v) { return aligned(g.type(v).bytes()); };
  for (NodeId n = 0; n < N; ++n) {
    for (ValueId out : g.node(n).outputs) {
      if (root[out] != out || plan.offsets[out] < 0) continue;
      if (live[plan.offsets[out]]++ == 0) live_bytes += bytes_of(out);
      ending[end[out]].push_back(out);
    }
    if (const int64_t here = live_bytes + aligned(plan.workspace_bytes[n]); here > plan.live_peak_bytes || n == 0) {
      plan.live_peak_bytes = here;
      plan.live_peak_node = n;
    }
    for (ValueId v : ending[n])
      if (--live[plan.offsets[v]] == 0) live_bytes -= bytes_of(v);
  }
  const NodeId peak = plan.live_peak_node;
  std::map<int64_t, ValueId> at_peak;  // offset -> the latest value written there by the peak
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v)
    if (root[v] == v && plan.offsets[v] >= 0 && g.value(v).producer <= peak && peak <= end[v]) {
      auto [it, added] = at_peak.emplace(plan.offsets[v], v);
      if (!added && g.value(it->second).producer < g.value(v).producer) it->second = v;
    }
  for (const auto& [offset, v] : at_peak) plan.live_at_peak.push_back(v);
  return plan;
}

}  // namespace autosp

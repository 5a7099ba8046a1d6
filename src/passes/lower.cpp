#include "passes/lower.h"

#include "util/error.h"

namespace autosp {

Graph lower(const Graph& graph, const LowerOptions& options) {
  AUTOSP_CHECK(options.threads >= 1, "lower needs the executor's thread count, got ", options.threads);
  Graph lowered = graph;
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    if (graph.node(n).op == OpKind::input) continue;
    const KernelBinding b = bind_kernel(graph, n, options.backend, options.threads);
    Attrs& attrs = lowered.mutable_attrs(n);
    attrs.set("kernel", b.kernel);
    attrs.erase("workspace");
    attrs.erase("inplace");
    if (b.workspace_bytes > 0) attrs.set("workspace", b.workspace_bytes);
    if (b.inplace) attrs.set("inplace", int64_t{1});
  }
  return lowered;
}

std::optional<Backend> lowered_backend(const Graph& graph) {
  std::optional<Backend> backend;
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    const Node& node = graph.node(n);
    if (node.op == OpKind::input) continue;
    if (!node.attrs.has("kernel")) return std::nullopt;
    const std::string& kernel = node.attrs.get_str("kernel");
    const Backend b = parse_backend(kernel.substr(0, kernel.find('.')));
    AUTOSP_CHECK(!backend || *backend == b, "node ", n, " is lowered for ", backend_name(b), " but an earlier one for ",
                 backend_name(*backend));
    backend = b;
  }
  return backend;
}

KernelBinding lowered_binding(const Node& node) {
  AUTOSP_CHECK(node.attrs.has("kernel"), op_name(node.op), " is not lowered");
  return {node.attrs.get_str("kernel"), node.attrs.get_int("workspace", 0), node.attrs.get_int("inplace", 0) != 0};
}

}  // namespace autosp

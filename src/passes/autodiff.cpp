#include "passes/autodiff.h"

#include "ops/op.h"

namespace autosp {

Graph autodiff(const Graph& forward, const AutodiffOptions& options) {
  Graph g = forward;
  GraphBuilder b(g);
  const ValueId loss = forward.output(options.loss);
  if (!(forward.type(loss) == TensorType{DType::f32, {}}))
    user_error("autodiff: the loss '", options.loss, "' must be f32[], got ",
               type_str(forward.type(loss)));

  // needs[v]: v is floating and depends on a parameter, so a gradient w.r.t. it can reach
  // one.
  const auto num_values = forward.values().size();
  std::vector<bool> needs(num_values, false);
  auto gradient_flows = [](const Node& node, size_t i) {
    return node.op == OpKind::input || !(op_def(node.op).no_gradient_inputs >> i & 1u);
  };
  for (const Node& node : forward.nodes()) {
    bool any = node.op == OpKind::input && forward.role(node.outputs[0]) == Role::parameter;
    for (size_t i = 0; i < node.inputs.size(); ++i) any = any || (needs[node.inputs[i]] && gradient_flows(node, i));
    for (ValueId out : node.outputs) needs[out] = any && is_floating(forward.type(out).dtype);
  }

  std::vector<ValueId> grad(num_values, -1);
  grad[loss] = b.emit1(OpKind::fill, {}, {{"shape", Shape{}}, {"value", 1.0}});

  for (auto n = static_cast<NodeId>(forward.nodes().size()) - 1; n >= 0; --n) {
    const Node& node = forward.node(n);
    if (node.op == OpKind::input) continue;
    GradContext ctx{b, node, {}, {}, {}};
    bool any_dout = false, any_need = false;
    for (ValueId out : node.outputs) {
      ctx.dout.push_back(grad[out]);
      any_dout = any_dout || grad[out] >= 0;
    }
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ctx.needs.push_back(needs[node.inputs[i]] && gradient_flows(node, i));
      any_need = any_need || ctx.needs.back();
    }
    if (!any_dout || !any_need) continue;
    const OpDef& def = op_def(node.op);
    AUTOSP_CHECK(def.grad, "op ", op_name(node.op), " (node ", n,
                 ") has no gradient rule but a parameter's gradient flows through it");
    ctx.din.assign(node.inputs.size(), -1);
    def.grad(ctx);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId in = node.inputs[i];
      AUTOSP_CHECK((ctx.din[i] >= 0) == bool(ctx.needs[i]), "gradient rule of ", op_name(node.op),
                   " (node ", n, ") gave ", ctx.din[i] >= 0 ? "a" : "no", " gradient for operand ",
                   i, ", which ", ctx.needs[i] ? "needs" : "does not need", " one");
      if (ctx.din[i] < 0) continue;
      AUTOSP_CHECK(g.type(ctx.din[i]) == forward.type(in), "gradient rule of ", op_name(node.op),
                   " gave operand ", i, " a gradient of type ", type_str(g.type(ctx.din[i])),
                   " for a value of type ", type_str(forward.type(in)));
      grad[in] = grad[in] < 0 ? ctx.din[i] : b.emit1(OpKind::add, {grad[in], ctx.din[i]});
    }
  }

  for (ValueId p : forward.inputs_with_role(Role::parameter)) {
    ValueId d = grad[p];
    if (d < 0) {
      const DType dtype = forward.type(p).dtype;
      Attrs zeros{{"shape", forward.shape(p)}, {"value", 0.0}};
      if (dtype != DType::f32) zeros.set("dtype", std::string(dtype_name(dtype)));
      d = b.emit1(OpKind::fill, {}, zeros);
    }
    g.add_output(kGradPrefix + forward.value(p).name, d);
  }
  return g;
}

}  // namespace autosp

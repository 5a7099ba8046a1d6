// The op set. Each op is defined in ONE place (a file in src/ops/): its attribute and
// shape checks, its cost, its gradient rule (built from ops) and its kernels per backend.
// The registry (registry.cpp) indexes the definitions by OpKind.
//
// Types (DESIGN.md "Numbers and types": fp32 on CPU, bf16 compute on GPU; the rules accept
// both, so `autosp plan` compiles the graph a GPU run executes):
//  - The floating dtypes are f32 and bf16. All floating operands of one op share one dtype
//    unless the op says otherwise, and its results have that dtype; mixed f32 and bf16 is a
//    shape_error naming both types. `convert` is the one op that changes a dtype.
//  - Statistics a fused kernel keeps for its backward are f32 whatever the operands, as
//    real bf16 kernels keep them: attention's log-sum-exp (FlashAttention's softmax_lse),
//    rms_norm's rstd (apex / FlashAttention fused RMSNorm), and cross_entropy's and
//    linear_cross_entropy's per-token log-sum-exp and loss sum (Liger / FlashAttention
//    cross-entropy: fp32 loss and lse from bf16 logits). Backward ops read them as f32.
//    count_valid is f32. Loss normalisation (div_scalar of two f32 scalars) stays f32, so
//    a bf16 model's loss is f32.
//  - A gradient has the dtype of the value it is the gradient of (autodiff checks it): a
//    bf16 activation gets a bf16 gradient. So does a bf16 parameter: its graph output
//    "grad:<name>" is bf16 (the fp32 loss gradient enters bf16 through the backward ops
//    above). Accumulating it in fp32 happens outside the graph: the runtime adds each
//    step's bf16 gradient into an fp32 gradient buffer beside the fp32 master weights and
//    AdamW moments (DeepSpeed's bf16 optimizer keeps fp32 gradients the same way), and
//    `autosp plan` counts that buffer as model state, not as a graph value.
//  - Integer operands (token ids, labels, positions) are i32. f16 is an IR dtype (the text
//    form reads it) that no op accepts.
//  - CPU kernels are fp32 (and i32): only ops with `cpu_any_dtype` (convert, and layout
//    ops that copy bytes) run on bf16, and lowering for the cpu backend refuses a graph that
//    would hand a bf16 value to any other kernel (passes/lower.h).
//
// Kernels (DESIGN.md "Backends"): an op's definition carries its kernel for each backend,
// both reading the op's attributes and operand types with the same decoder (the op file's
// dims/attribute helpers): `cpu` (and its workspace, in-place and dtype rules) and `cuda`
// (CudaKernelRules). The `lower` pass binds every node to its backend's kernel
// (bind_kernel below) and writes the binding into the graph.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "util/error.h"

namespace autosp {

class Communicator;

struct Cost {
  double flops = 0;
  double bytes = 0;  // bytes read and written (or moved, for collectives)
};

// A shape rule signals a problem with shape_error(...); GraphBuilder::emit turns it into a
// UserError that names the op, its operand types and attributes.
struct ShapeError : UserError {
  using UserError::UserError;
};
template <typename... Args>
[[noreturn]] void shape_error(Args&&... args) {
  throw ShapeError(str(std::forward<Args>(args)...));
}
template <typename... Args>
void require(bool cond, Args&&... args) {
  if (!cond) shape_error(std::forward<Args>(args)...);
}

// Appends ops to a graph, inferring and checking output types with each op's rule.
class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& graph) : graph_(graph) {}

  std::vector<ValueId> emit(OpKind op, std::vector<ValueId> inputs, Attrs attrs = {});
  ValueId emit1(OpKind op, std::vector<ValueId> inputs, Attrs attrs = {});  // single result

  Graph& graph() { return graph_; }
  const TensorType& type(ValueId v) const { return graph_.type(v); }
  const Shape& shape(ValueId v) const { return graph_.shape(v); }

 private:
  Graph& graph_;
};

// What a gradient rule sees and fills. dout[i] is the gradient of output i, or -1 where
// none flows; needs[i] says whether input i wants a gradient. The rule sets din[i] for
// exactly the inputs that need one, building it from ops with `b`.
struct GradContext {
  GraphBuilder& b;
  const Node& node;
  std::vector<ValueId> dout;
  std::vector<bool> needs;
  std::vector<ValueId> din;

  ValueId in(int i) const { return node.inputs.at(i); }
  ValueId out(int i) const { return node.outputs.at(i); }
  const Attrs& attrs() const { return node.attrs; }
};

// What a CPU kernel sees: raw buffers and their types. Kernels overwrite their outputs.
struct KernelArgs {
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::vector<const TensorType*> in_types;
  std::vector<const TensorType*> out_types;
  const Attrs* attrs = nullptr;
  void* workspace = nullptr;
  int threads = 1;
  Communicator* comm = nullptr;  // the group named by a collective's "group" attribute

  template <typename T = float>
  const T* in(int i) const { return static_cast<const T*>(inputs.at(i)); }
  template <typename T = float>
  T* out(int i) const { return static_cast<T*>(outputs.at(i)); }
  const Shape& in_shape(int i) const { return in_types.at(i)->shape; }
  const Shape& out_shape(int i) const { return out_types.at(i)->shape; }
  int64_t in_numel(int i) const { return numel(in_shape(i)); }
  int64_t out_numel(int i) const { return numel(out_shape(i)); }
};

using Types = std::vector<TensorType>;
using Shardings = std::vector<Sharding>;

// What recomputing an op's result in backward costs, for the checkpoint pass: `cheap` ops
// are linear in their result's size (norms, rope, elementwise, layout), `matmul` ops cost
// O(K) FLOPs per result element, and `never` ops are not recomputed by sequence-aware
// checkpointing (attention: O(S) FLOPs per result element; collectives: communication;
// inputs and backward ops).
enum class Recompute : uint8_t { never, cheap, matmul };

// The backends a graph is lowered for (`--backend`): the host's CPU kernels, and the cuda
// backend's (built where nvcc is, AUTOSP_CUDA; planned and lowered for everywhere).
enum class Backend { cpu, cuda };
Backend parse_backend(const std::string& name);  // UserError for another name
const char* backend_name(Backend backend);

struct CudaContext;  // the stream and cuBLAS handle a CUDA kernel runs with (ops/cuda_kernels.h)

// An op's kernel on the cuda backend. Its name, workspace and refusal rules are host code,
// compiled in every build, so a machine without nvcc lowers and plans for cuda exactly as a
// GPU machine does; `run` exists only in builds with the cuda backend (AUTOSP_CUDA_RUN).
struct CudaKernelRules {
  const char* name = nullptr;  // what lower binds, e.g. "attention_forward" (nullptr: no CUDA kernel)
  void (*run)(const KernelArgs& args, const CudaContext& ctx) = nullptr;  // args' buffers: device pointers
  // Device scratch the kernel needs (nullptr: none).
  int64_t (*workspace_bytes)(const Types& inputs, const Types& outputs, const Attrs& attrs) = nullptr;
  // shape_error() for operands the kernel cannot run (e.g. a head dim above its limit).
  void (*check)(const Types& inputs, const Attrs& attrs) = nullptr;
  // As OpDef::cpu_inplace, for the CUDA kernel (kernels/cuda/kernels.h, "In place").
  bool inplace = false;
  // A collective the cuda executor can overlap with the compute after it (the all-to-alls;
  // plan_memory's overlap option): `run` as two parts, `pack` reading the operands on the
  // compute stream and `exchange` communicating and writing the results on the executor's
  // communication stream, which waits for the pack. (The flag is the plan's, in every build.)
  bool overlappable = false;
  void (*pack)(const KernelArgs& args, const CudaContext& ctx) = nullptr;
  void (*exchange)(const KernelArgs& args, const CudaContext& ctx) = nullptr;
};
// Device scratch pieces start at 256-byte boundaries (cudaMalloc's alignment), as cuBLAS's
// fastest kernels want their operands.
inline int64_t cuda_aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
#ifdef AUTOSP_HAVE_CUDA
#define AUTOSP_CUDA_RUN(fn) (fn)
#else
#define AUTOSP_CUDA_RUN(fn) nullptr
#endif

// A kernel started by OpDef::cpu_start: `progress` lets its exchange move (true once it is
// done), `finish` waits for it and writes the results.
struct StartedKernel {
  std::function<bool()> progress;
  std::function<void()> finish;
};

struct OpDef {
  int num_inputs;   // -1: variadic, at least one
  int num_outputs;  // -1: as many as `infer` returns (moe_backward: one per operand)
  // Checks attributes and operand types; returns the result types.
  Types (*infer)(const Types& inputs, const Attrs& attrs);
  // FLOPs; bytes default to operands + results when the rule leaves them 0.
  Cost (*cost)(const Types& inputs, const Types& outputs, const Attrs& attrs);
  // Gradient rule; nullptr for ops nothing differentiates through (integer inputs,
  // backward ops).
  void (*grad)(GradContext& ctx);
  void (*cpu)(const KernelArgs& args);
  // Scratch the CPU kernel needs, allocated by the executor; nullptr for none.
  int64_t (*cpu_workspace_bytes)(const Types& inputs, const Attrs& attrs, int threads) = nullptr;
  // Sequence-sharding rule (used by the autosp pass): the results' shardings given the
  // operands' (each replicated, shard(dim) or partial); shape_error() where the op cannot
  // run on those shardings. nullptr: the op cannot be sequence-sharded.
  Shardings (*shard)(const Shardings& inputs, const Types& types, const Attrs& attrs) = nullptr;
  // The CPU kernel reads every operand element it needs for a block of a result before it
  // writes that block, so a result may share the buffer of an operand of its type (same
  // dtype and size): plan_memory then reuses an operand that dies at this node.
  bool cpu_inplace = false;
  Recompute recompute = Recompute::never;
  // The CPU kernel handles every dtype its rule accepts. Otherwise it reads and writes f32
  // (and i32 integer operands) only, and the executor refuses bf16 operands or results.
  bool cpu_any_dtype = false;
  // The CPU kernel is compiled once per instruction set (kernels/cpu/isa.h) and runs the
  // active set's copy, whose tile shapes (so workspace sizes) are that set's.
  bool cpu_per_isa = false;
  CudaKernelRules cuda = {};
  // A collective whose exchange can overlap compute (plan_memory's `overlap`): starts it (the
  // CPU kernel's work up to the exchange) and returns how it goes on (StartedKernel), which
  // the CPU executor finishes before the first node that reads a result. The workspace stays
  // the kernel's until then (plan_memory keeps it). nullptr: the node runs whole (cpu).
  StartedKernel (*cpu_start)(const KernelArgs& args) = nullptr;
  // Operands read for their shape only (bit i: operand i): no gradient flows to them, and a
  // result depends on a parameter only through the others (autodiff).
  uint32_t no_gradient_inputs = 0;
};

// Sharding shorthands for rules.
inline Sharding replicated() { return {Sharding::Kind::replicated, -1}; }
inline Sharding shard(int dim) { return {Sharding::Kind::shard, dim}; }
inline Sharding partial() { return {Sharding::Kind::partial, -1}; }
inline bool is_replicated(const Sharding& s) { return s.kind == Sharding::Kind::replicated; }
inline bool is_shard(const Sharding& s) { return s.kind == Sharding::Kind::shard; }
inline bool is_partial(const Sharding& s) { return s.kind == Sharding::Kind::partial; }

// The common rules. Row-wise ops (the last dim is the feature dim, every row independent):
// all sharded operands share one sharded dim that is not the last; replicated operands are
// weights. Elementwise ops: all operands share one sharding.
Shardings shard_rowwise(const Shardings& in, const Types& types, const Attrs& attrs);
Shardings shard_elementwise(const Shardings& in, const Types& types, const Attrs& attrs);

// The sums over the rows of dy viewed as [rows, n] (every leading dim a row), as a [n] value:
// 1^T dy, a ones column times dy by matmul (linear's bias gradient, broadcast's gradient).
ValueId column_sums(GraphBuilder& b, ValueId dy, int64_t n);

const OpDef& op_def(OpKind op);

// Cost of one node with default bytes filled in.
Cost node_cost(const Graph& graph, const Node& node);
// Bytes of scratch the node's CPU kernel needs on `threads` threads (0 for none).
int64_t node_workspace_bytes(const Graph& graph, const Node& node, int threads);

// The kernel a node runs with on a backend, as `lower` records it (passes/lower.h).
struct KernelBinding {
  std::string kernel;           // "cpu.avx512.attention", "cpu.linear", "cuda.attention_forward"
  int64_t workspace_bytes = 0;  // its scratch
  bool inplace = false;         // a result may take a dying operand's buffer (plan_memory)
};
// The binding of node `n` (not an input) on `backend`, with `threads` CPU kernel threads.
// UserError naming the backend, the op and node when the backend cannot run it: no kernel,
// a dtype its kernels do not read (bf16 on the CPU), or operands beyond the kernel's limits.
KernelBinding bind_kernel(const Graph& graph, NodeId n, Backend backend, int threads);

// Structure (verify_structure) plus types: every node's recorded result types equal what
// its op's rule infers. Throws InternalError naming the node.
void verify(const Graph& graph);

// Shared shape helpers for rules.
std::string types_str(const Types& types);  // "f32[2, 3], i32[2]"
void require_dtype(const TensorType& t, DType dtype, const char* operand);
bool is_floating(DType dtype);  // f32 or bf16: the dtypes floating operands may have
void require_floating(const TensorType& t, const char* operand);  // f32 or bf16
// Floating operands `b` must have `a`'s dtype (shape_error naming both types).
void require_same_dtype(const TensorType& a, const char* a_name, const TensorType& b,
                        const char* b_name);
// The floating dtype named by string attribute `key` ("f32" or "bf16"); it must be present.
DType dtype_attr(const Attrs& attrs, const char* key);
void require_rank(const TensorType& t, size_t rank, const char* operand);
Shape with_last(Shape shape, int64_t last);  // shape with its last dim replaced

// A tensor viewed as [outer, len, inner] around `dim` (for slab copies along one dim).
struct Slab {
  int64_t outer = 1, len = 1, inner = 1;
};
Slab slab_of(const Shape& shape, int64_t dim);
// The dim named by attribute `key`, checked to be a dim of `t`.
int64_t dim_attr(const Attrs& attrs, const char* key, const TensorType& t);
int64_t rows_of(const Shape& shape);         // product of all but the last dim

}  // namespace autosp

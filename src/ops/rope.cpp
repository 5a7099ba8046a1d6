// Rotary position embedding (rotate-half), positions given as an input tensor.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fused.h"
#include "ops/op.h"
#include "ops/rope.h"
#include "kernels/cuda/limits.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

cpu::RopeScaling rope_scaling(const Attrs& attrs) {
  cpu::RopeScaling s;
  const std::string type = attrs.has("rope_type") ? attrs.get_str("rope_type") : "default";
  if (type == "default" || type == "frequencies") return s;
  s.factor = attrs.get_float("factor");
  if (type == "linear") s.kind = cpu::RopeScaling::linear;
  if (type == "llama3") {
    s.kind = cpu::RopeScaling::llama3;
    s.low_freq_factor = attrs.get_float("low_freq_factor");
    s.high_freq_factor = attrs.get_float("high_freq_factor");
    s.original_max_position_embeddings = attrs.get_float("original_max_position_embeddings");
  }
  if (type == "yarn") {
    s.kind = cpu::RopeScaling::yarn;
    s.original_max_position_embeddings = attrs.get_float("original_max_position_embeddings");
    s.beta_fast = attrs.get_float("beta_fast");
    s.beta_slow = attrs.get_float("beta_slow");
    s.truncate = attrs.get_int("truncate") != 0;
  }
  return s;
}

void rope_frequencies(const Attrs& attrs, int64_t D, double* inv_freq) {
  if (attrs.has("rope_type") && attrs.get_str("rope_type") == "frequencies") {
    const std::vector<double>& table = attrs.get_floats("inv_freq");
    AUTOSP_CHECK(int64_t(table.size()) * 2 == D, "rope: ", table.size(), " frequencies for head dim ", D);
    std::copy(table.begin(), table.end(), inv_freq);
    return;
  }
  cpu::rope_inv_freq(D, attrs.get_float("theta"), rope_scaling(attrs), inv_freq);
}

namespace {
void cuda_rope_check(const Types& in, const Attrs&) {
  const int64_t D = in[0].shape[3];
  require(D <= cuda::kRopeMaxD, "head dim D = ", D, " exceeds the kernel's ", cuda::kRopeMaxD);
}
#ifdef AUTOSP_HAVE_CUDA
// The inverse frequencies are the CPU's (rope_frequencies, from the same attributes), passed to
// the kernel by value.
void cuda_rope(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  const int64_t D = x[3];
  std::vector<double> inv_freq(D / 2);
  rope_frequencies(*a.attrs, D, inv_freq.data());
  cuda::rope_forward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), inv_freq.data(), x[0] * x[1], x[2], D,
                           a.attrs->get_int("inverse", 0) != 0, a.out<void>(0), c.stream,
                           a.attrs->get_int("interleaved", 0) != 0);
}
#endif
}  // namespace

// rope(x[B, S, NH, D], positions i32[B, S]) {theta, inverse, interleaved, rope_type, its params}
// inverse=1 rotates by minus the angle: the transpose, hence the gradient. interleaved=1 rotates
// the pairs (2i, 2i + 1) instead of (i, i + D/2) (GPT-J's layout, kernels/cpu/fused.h). The result has
// x's dtype (f32 or bf16; a bf16 kernel computes the angles in fp32).
// rope_type "frequencies" {inv_freq: D/2 floats, no theta}: the frequencies themselves, for a
// table no theta and scaling give (longrope's per-dimension factors, read from a program).
extern const OpDef rope_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      require_rank(in[0], 4, "x [B, S, NH, D]");
      require_dtype(in[1], DType::i32, "positions");
      require(in[1].shape == Shape{in[0].shape[0], in[0].shape[1]}, "positions must be [B, S] = [",
              in[0].shape[0], ", ", in[0].shape[1], "]");
      require(in[0].shape[3] % 2 == 0, "head dim D must be even, got ", in[0].shape[3]);
      const std::string t = attrs.has("rope_type") ? attrs.get_str("rope_type") : "default";
      require(t == "default" || t == "linear" || t == "llama3" || t == "yarn" || t == "frequencies",
              "unknown rope_type '", t, "'");
      if (t == "frequencies") {
        require(attrs.has("inv_freq"), "rope_type frequencies needs 'inv_freq'");
        const std::vector<double>& f = attrs.get_floats("inv_freq");
        require(int64_t(f.size()) * 2 == in[0].shape[3], "inv_freq has ", f.size(), " frequencies; head dim ",
                in[0].shape[3], " needs ", in[0].shape[3] / 2);
        for (size_t i = 0; i < f.size(); ++i)
          require(f[i] > 0 && std::isfinite(f[i]), "inv_freq[", i, "] = ", f[i], " is not a positive frequency");
        require(!attrs.has("theta"), "rope_type frequencies takes no 'theta'");
      } else {
        require(attrs.has("theta") && attrs.get_float("theta") > 0, "needs a positive 'theta'");
        require(!attrs.has("inv_freq"), "'inv_freq' is rope_type frequencies' only");
      }
      if (t != "default" && t != "frequencies") {
        std::vector<const char*> keys;
        if (t == "linear") keys = {"factor"};
        if (t == "llama3") keys = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
        if (t == "yarn") keys = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"};
        for (const char* k : keys) require(attrs.has(k), "rope_type ", t, " needs '", k, "'");
        require(attrs.get_float("factor") > 0, "needs a positive 'factor'");
      }
      return {in[0]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{3.0 * numel(in[0].shape), 0};
    },
    // y = R(pos) x with R orthogonal, so dx = R(pos)^T dy = R(-pos) dy
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(!c.needs[1], "positions have no gradient");
      Attrs attrs = c.attrs();
      attrs.set("inverse", int64_t{1 - c.attrs().get_int("inverse", 0)});
      c.din[0] = c.b.emit1(OpKind::rope, {c.dout[0], c.in(1)}, attrs);
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      const int64_t D = x[3];
      // Workspace: inv_freq [D/2] doubles, then each thread's cos/sin table.
      double* inv_freq = static_cast<double*>(a.workspace);
      rope_frequencies(*a.attrs, D, inv_freq);
      cpu::rope_forward(a.in(0), a.in<int32_t>(1), inv_freq, x[0] * x[1], x[2], D,
                        a.attrs->get_int("inverse", 0) != 0, a.out(0), reinterpret_cast<float*>(inv_freq + D / 2),
                        a.attrs->get_int("interleaved", 0) != 0);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int threads) -> int64_t {
      const int64_t D = in[0].shape[3];
      return 8 * (D / 2) + 4 * threads * cpu::rope_table_floats(D);
    },
    // rotates each (row, head) by its own position: the positions must be split alike
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(in[0] == in[1] && !is_partial(in[0]) && (!is_shard(in[0]) || in[0].dim < 2),
              "x and positions must be sharded alike on B or S, got ", sharding_str(in[0]), " and ",
              sharding_str(in[1]));
      return {in[0]};
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cpu_per_isa = true,
    .cuda = {.name = "rope_fused", .run = AUTOSP_CUDA_RUN(cuda_rope), .check = cuda_rope_check, .inplace = true},
};

}  // namespace autosp

// Cross-entropy loss, as a sum over labelled tokens; the mean divides it by count_valid
// (kept separate so the autosp pass can all-reduce the count across ranks).
#include "kernels/cpu/fused.h"
#include "ops/op.h"

namespace autosp {

namespace {

constexpr int64_t kDefaultIgnoreIndex = -100;  // as torch.nn.CrossEntropyLoss

void check_labels(const int32_t* labels, int64_t n, int64_t V, int64_t ignore) {
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] != ignore && (labels[i] < 0 || labels[i] >= V))
      user_error("cross_entropy: label ", labels[i], " at position ", i, " is outside [0, ", V,
                 ") and is not the ignore index ", ignore);
}

void check_logits_labels(const TensorType& logits, const TensorType& labels) {
  require_dtype(logits, DType::f32, "logits");
  require_dtype(labels, DType::i32, "labels");
  require(!logits.shape.empty() &&
              labels.shape == Shape(logits.shape.begin(), logits.shape.end() - 1),
          "labels must have logits' shape without the class dim");
}

}  // namespace

// cross_entropy(logits[..., V], labels i32[...]) {ignore_index}
//   -> (loss_sum [], lse [...]),  loss_sum = sum over labelled rows of lse - logit[label]
extern const OpDef cross_entropy_op = {
    .num_inputs = 2,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs&) -> Types {
      check_logits_labels(in[0], in[1]);
      return {{DType::f32, {}}, {DType::f32, in[1].shape}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{4.0 * numel(in[0].shape), 0};
    },
    // d loss_sum / d logits = softmax(logits) - onehot(label), on labelled rows
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(c.dout[1] < 0, "nothing differentiates through the log-sum-exp");
      AUTOSP_CHECK(!c.needs[1], "labels have no gradient");
      c.din[0] = c.b.emit1(OpKind::cross_entropy_backward, {c.dout[0], c.in(0), c.in(1), c.out(1)},
                           c.attrs());
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      const int64_t ignore = a.attrs->get_int("ignore_index", kDefaultIgnoreIndex);
      check_labels(a.in<int32_t>(1), a.in_numel(1), x.back(), ignore);
      cpu::cross_entropy_forward(a.in(0), a.in<int32_t>(1), rows_of(x), x.back(),
                                 static_cast<int32_t>(ignore), a.out(0), a.out(1));
    },
    // rows split alike: each rank's loss_sum is its part of the whole sum
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      Shardings rows = shard_rowwise({in[0]}, {t[0]}, a);
      require(in[1] == rows[0], "labels must be split like the logits' rows");
      return {is_replicated(rows[0]) ? replicated() : partial(), rows[0]};
    },
};

// cross_entropy_backward(dloss_sum [], logits, labels, lse) {ignore_index} -> dlogits
extern const OpDef cross_entropy_backward_op = {
    .num_inputs = 4,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require(in[0] == TensorType{DType::f32, {}}, "dloss must be f32[]");
      check_logits_labels(in[1], in[2]);
      require(in[3] == TensorType{DType::f32, in[2].shape}, "lse must be f32 with labels' shape");
      return {in[1]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{3.0 * numel(in[1].shape), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(1);
      const int64_t ignore = a.attrs->get_int("ignore_index", kDefaultIgnoreIndex);
      check_labels(a.in<int32_t>(2), a.in_numel(2), x.back(), ignore);
      cpu::cross_entropy_backward(a.in(0), a.in(1), a.in<int32_t>(2), a.in(3), rows_of(x), x.back(),
                                  static_cast<int32_t>(ignore), a.out(0));
    },
};

// count_valid(labels i32[...]) {ignore_index} -> f32[]: how many labels are not ignored
extern const OpDef count_valid_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_dtype(in[0], DType::i32, "labels");
      return {{DType::f32, {}}};
    },
    .cost = nullptr,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const int64_t ignore = a.attrs->get_int("ignore_index", kDefaultIgnoreIndex);
      const int32_t* labels = a.in<int32_t>(0);
      int64_t count = 0;
      for (int64_t i = 0; i < a.in_numel(0); ++i) count += labels[i] != ignore;
      a.out(0)[0] = float(count);
    },
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(!is_partial(in[0]), "labels cannot be partial");
      return {is_replicated(in[0]) ? replicated() : partial()};
    },
};

}  // namespace autosp

// The list of op kinds. The IR names ops; their rules and kernels live in src/ops/.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace autosp {

#define AUTOSP_OPS(X)                                                                        \
  X(input) X(fill) X(expand) X(embedding) X(embedding_backward) X(linear) X(matmul) X(add)  \
  X(mul) X(scale) X(sum) X(div_scalar) X(convert) X(silu) X(silu_backward) X(swiglu)       \
  X(swiglu_backward) X(gelu) X(gelu_backward) X(relu) X(relu_backward) X(tanh)              \
  X(tanh_backward) X(xielu) X(xielu_backward) X(rms_norm) X(rms_norm_backward) X(layer_norm) \
  X(layer_norm_backward) X(rope) X(attention) X(clamp) X(clamp_backward)                      \
  X(attention_backward) X(cross_entropy) X(cross_entropy_backward) X(linear_cross_entropy)  \
  X(linear_cross_entropy_backward) X(linear_cross_entropy_with_grad) X(count_valid) X(moe)   \
  X(moe_backward) X(moe_balance) X(moe_balance_backward) X(reshape) X(transpose) X(slice)       \
  X(slice_backward) X(concat) X(all_to_all) X(all_reduce) X(all_gather) X(reduce_scatter) \
  X(broadcast) X(div) X(stop_gradient) X(vector_norm) X(vector_norm_backward)

enum class OpKind : uint8_t {
#define AUTOSP_OP_ENUM(name) name,
  AUTOSP_OPS(AUTOSP_OP_ENUM)
#undef AUTOSP_OP_ENUM
};

#define AUTOSP_OP_COUNT(name) +1
inline constexpr int kNumOps = 0 AUTOSP_OPS(AUTOSP_OP_COUNT);
#undef AUTOSP_OP_COUNT

const char* op_name(OpKind kind);
std::optional<OpKind> parse_op(std::string_view name);

}  // namespace autosp

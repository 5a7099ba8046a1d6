// Element types, shapes and sharding annotations of IR values.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace autosp {

enum class DType : uint8_t { f32, bf16, f16, i32 };

const char* dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);
int64_t dtype_size(DType dtype);

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 16, 32]"

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t bytes() const { return numel(shape) * dtype_size(dtype); }
  bool operator==(const TensorType&) const = default;
};
std::string type_str(const TensorType& type);  // "f32[2, 16, 32]"

// How a value is laid out across the ranks of a sequence-parallel group. Passes fill it;
// `none` means no pass has decided yet.
struct Sharding {
  enum class Kind : uint8_t { none, replicated, shard, partial };
  Kind kind = Kind::none;
  int dim = -1;  // for shard
  bool operator==(const Sharding&) const = default;
};
std::string sharding_str(const Sharding& sharding);  // "", "@replicated", "@shard(1)", "@partial"

// What a graph input stands for; the trainer binds inputs by role.
// documents: per-token document ids of packed samples (i32 [B, S]), for attention.
// gradient: a parameter's gradient summed over earlier micro batches, which the step adds to
// its own before reducing (passes/grad_sync.h).
enum class Role : uint8_t { parameter, tokens, labels, positions, mask, constant, documents, gradient };
const char* role_name(Role role);
std::optional<Role> parse_role(std::string_view name);

}  // namespace autosp

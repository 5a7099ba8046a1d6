// Writing a model directory's weights as save_pretrained does: which tensor goes to which
// shard (huggingface_hub's split, checked against the shards transformers itself wrote for
// tests/fixtures/hf), the index's text, and max_shard_size as transformers reads it.
#include "io/model_weights.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "models/llama.h"
#include "testing/errors.h"
#include "testing/process.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::expect_contains;
using testing::user_error_of;

std::vector<size_t> shard_of(const std::vector<int64_t>& bytes, int64_t max) {
  return io::plan_weight_shards(bytes, max).file_of;
}

TEST(WeightShards, GreedyInOrderAndOversizedTensorsAlone) {
  // Fills in order, a tensor that would pass the limit opening the next shard.
  EXPECT_EQ(shard_of({4, 4, 4, 4}, 8), (std::vector<size_t>{0, 0, 1, 1}));
  EXPECT_EQ(shard_of({4, 5, 3, 8}, 8), (std::vector<size_t>{0, 1, 1, 2}));
  // One larger than the limit gets a shard of its own, listed when met: before the shard
  // being filled (huggingface_hub appends it at once, the open one when it closes).
  EXPECT_EQ(shard_of({3, 20, 3, 3}, 8), (std::vector<size_t>{1, 0, 1, 2}));
  EXPECT_EQ(shard_of({20, 3, 30}, 8), (std::vector<size_t>{0, 2, 1}));
  const io::WeightShards one = io::plan_weight_shards({4, 4}, 8);
  EXPECT_EQ(one.files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(one.indexed());
  const io::WeightShards three = io::plan_weight_shards({20, 3, 30}, 8);
  EXPECT_EQ(three.files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors"}));
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The same model split by the same max_shard_size ("12KB") gives the index transformers 4
// and 5 wrote, byte for byte: the same tensors in the same files, the same metadata.
TEST(WeightShards, ReproduceTheIndexTransformersWrote) {
  for (const char* name : {"llama3_f32_v4", "llama3_f32_v5", "llama3_bf16_v4", "llama3_bf16_v5"}) {
    SCOPED_TRACE(name);
    const std::string dir = testing::source_path(str("tests/fixtures/hf/", name));
    const models::LlamaConfig model = models::load_llama_config(dir + "/config.json");
    const int64_t item = model.torch_dtype == "bfloat16" ? 2 : 4;
    std::vector<int64_t> bytes;
    int64_t total = 0, parameters = 0;
    const auto specs = models::llama_parameters(model);
    const std::vector<size_t> order = models::llama_state_dict_order(model);
    for (size_t i : order) {
      bytes.push_back(numel(specs[i].shape) * item);
      total += bytes.back();
      parameters += numel(specs[i].shape);
    }
    const io::WeightShards plan = io::plan_weight_shards(bytes, io::parse_shard_size("12KB", "test"));
    std::map<std::string, std::string> weight_map;
    for (size_t k = 0; k < order.size(); ++k) weight_map[specs[order[k]].name] = plan.files[plan.file_of[k]];
    EXPECT_GE(plan.files.size(), 4u);
    EXPECT_EQ(io::weights_index_json(weight_map, parameters, total), file_text(dir + "/model.safetensors.index.json"));
  }
}

TEST(ShardSize, ReadAsTransformersReadsIt) {
  EXPECT_EQ(io::parse_shard_size("5GB", "k"), 5'000'000'000);
  EXPECT_EQ(io::parse_shard_size("12KB", "k"), 12'000);
  EXPECT_EQ(io::parse_shard_size("1.5gb", "k"), 1'500'000'000);
  EXPECT_EQ(io::parse_shard_size("500MiB", "k"), 500ll << 20);
  EXPECT_EQ(io::parse_shard_size("2TiB", "k"), 2ll << 40);
  EXPECT_EQ(io::parse_shard_size(" 10 MB", "k"), 10'000'000);
  EXPECT_EQ(io::parse_shard_size(json(4096), "k"), 4096);
  EXPECT_EQ(io::parse_shard_size("50GB", "k"), io::kDefaultMaxShardBytes);
  const std::string what = "ds.json: checkpoint.max_shard_size";
  for (const auto& [bad, fragment] : std::vector<std::pair<json, std::string>>{
           {"5", "has no unit"},
           {"5 GB per file", "has no unit"},
           {"GB", "expected a number before the unit"},
           {"fiveGB", "expected a number before the unit"},
           {"-5GB", "expected a number before the unit"},
           {"1e3MB", "expected a number before the unit"},
           {"nanGB", "expected a number before the unit"},
           {"0GB", "out of range"},
           {"0.0000001KB", "out of range"},
           {"99999999999TB", "out of range"},
           {json(0), "out of range"},
           {json(-1), "out of range"},
           {json(1.5), "expected a size"},
           {json(true), "expected a size"},
           {json::array(), "expected a size"}}) {
    SCOPED_TRACE(bad.dump());
    const std::string message = user_error_of([&] { io::parse_shard_size(bad, what); });
    expect_contains(message, {what, fragment});
  }
}

}  // namespace
}  // namespace autosp

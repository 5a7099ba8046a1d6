// A Hugging Face model directory's weights, as `save_pretrained` writes them and
// `from_pretrained` finds them: one `model.safetensors`, or (above `max_shard_size`) shards
// `model-0000K-of-0000N.safetensors` with `model.safetensors.index.json`, whose "weight_map"
// says which shard holds each tensor.
//
// Whether one file or many, the tensors are read as SafetensorsReader reads one file: every
// header validated up front, then only the bytes of the elements a caller asks for, so a
// rank reads what it keeps and nothing else (no tensor, let alone the model, is read whole
// unless asked for).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/safetensors.h"

namespace autosp::io {

// The weight file of model directory `dir`, in from_pretrained's order: DIR/model.safetensors,
// else DIR/model.safetensors.index.json; "" when the directory holds no weight file at all
// (the caller's random init). Weights autosp cannot read are a UserError that says why and
// how to convert them, never a silent random init: PyTorch pickles (pytorch_model.bin and
// any *.bin that is a torch.save file, *.pt, *.pth, *.ckpt), GGUF, TensorFlow or Flax files,
// and safetensors files that are neither of the two names (shards without their index).
std::string find_model_weights(const std::string& dir);

class ModelWeights {
 public:
  // `path`: a safetensors file, or an index (a name ending in ".index.json") whose shards are
  // opened and checked against it: a shard missing, a tensor the map puts in a shard that
  // lacks it, a shard's tensor that the map does not list (or puts elsewhere), a tensor in
  // two shards, and an index that is not valid JSON or not {"weight_map": {NAME: FILE}} are
  // each a UserError naming the file and the tensor.
  explicit ModelWeights(const std::string& path);

  const std::string& path() const { return path_; }
  size_t num_files() const { return files_.size(); }
  std::vector<std::string> names() const;  // sorted
  // The file tensor `name` is in (the index itself for a tensor in no shard).
  const std::string& file_of(const std::string& name) const;
  // UserError "FILE: missing tensor 'NAME'" or "FILE: tensor 'NAME' has shape [a, b],
  // expected [c, d]", FILE being the shard (or the index, for a tensor in no shard).
  void expect(const std::string& name, const std::vector<int64_t>& shape) const;
  // Elements [begin, begin + n) of tensor `name` (row-major) as fp32.
  void read(const std::string& name, int64_t begin, int64_t n, float* out) const;
  FileDType dtype(const std::string& name) const;  // as stored (internal check: present)

 private:
  std::string path_;
  std::vector<SafetensorsReader> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index into files_
  std::vector<std::string> unlisted_;      // safetensors files beside the index it does not name
};

// Writing a model directory's weights as save_pretrained does.
//
// transformers' default max_shard_size (5.x; 4.x wrote "5GB").
constexpr int64_t kDefaultMaxShardBytes = 50'000'000'000;

// Which file each tensor goes to, given each one's stored size in bytes, in order:
// huggingface_hub's split_state_dict_into_shards, so the same model sharded by the same
// limit gives the same files. Tensors are taken in order; one that would take the current
// shard past `max_shard_bytes` starts a new one, and one larger than the limit by itself
// gets a shard of its own. One shard is "model.safetensors" (no index); N shards are
// "model-0000K-of-0000N.safetensors".
struct WeightShards {
  std::vector<std::string> files;
  std::vector<size_t> file_of;  // tensor -> index into files
  bool indexed() const { return files.size() > 1; }
};
WeightShards plan_weight_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes);

// model.safetensors.index.json as save_pretrained writes it (keys sorted, indent 2):
// {"metadata": {"total_parameters": P, "total_size": BYTES}, "weight_map": {NAME: FILE}}.
std::string weights_index_json(const std::map<std::string, std::string>& weight_map, int64_t total_parameters,
                               int64_t total_bytes);

// A size as transformers' max_shard_size takes it: a number of bytes, or a string with a
// unit, KB/MB/GB/TB (powers of 1000, as huggingface_hub's parse_size_to_int) or
// KiB/MiB/GiB/TiB (powers of 1024), in any case ("5GB", "500MiB", "1.5gb"). Anything else, and
// sizes below one byte or above 2^62, a UserError naming `what`.
int64_t parse_shard_size(const nlohmann::json& value, const std::string& what);

}  // namespace autosp::io

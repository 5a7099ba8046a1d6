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

 private:
  std::string path_;
  std::vector<SafetensorsReader> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index into files_
  std::vector<std::string> unlisted_;      // safetensors files beside the index it does not name
};

}  // namespace autosp::io

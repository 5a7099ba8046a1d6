#include "io/model_weights.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "util/error.h"

namespace autosp::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

std::string convert_hint(const std::string& dir, const std::string& extra_args = "") {
  return str("convert them once where transformers is installed: python -c \"from transformers import "
             "AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('", dir, "'", extra_args,
             ").save_pretrained('OUT', safe_serialization=True)\", then train with --model OUT");
}

// A torch.save file: a zip archive (PyTorch >= 1.6) or a bare pickle (protocol 2 to 5, whose
// next byte is an opcode). As uint32 token ids either start would be a token >= 2^21, more
// than any vocabulary, so a token file named *.bin is not taken for one.
bool is_torch_save_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  unsigned char b[4] = {};
  if (!in.read(reinterpret_cast<char*>(b), 4)) return false;
  if (b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return true;
  return b[0] == 0x80 && b[1] >= 2 && b[1] <= 5 && b[2] >= 0x20;
}

// Reads and validates an index: {"metadata": {...}, "weight_map": {TENSOR: SHARD_FILE}}.
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) user_error(path, ": cannot open: ", std::strerror(errno));
  // The parser keeps the last of duplicate keys; a tensor listed twice (perhaps for two
  // shards) must not silently lose one of its entries.
  std::string top_key, duplicate;
  std::set<std::string> seen;
  json root;
  try {
    root = json::parse(in, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key) {
        const std::string key = parsed.get<std::string>();
        if (depth == 1) top_key = key;
        if (depth == 2 && top_key == "weight_map" && !seen.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    });
  } catch (const json::exception& e) {
    user_error(path, ": not valid JSON: ", e.what());
  }
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
    user_error(path, ": expected a JSON object with a \"weight_map\" object {TENSOR: SHARD_FILE} (as save_pretrained "
               "writes it)");
  if (!duplicate.empty()) user_error(path, ": tensor '", duplicate, "' is listed twice in \"weight_map\"");
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : root["weight_map"].items()) {
    if (!file.is_string())
      user_error(path, ": weight_map: tensor '", name, "': expected a shard file name, got ", file.dump());
    const std::string f = file.get<std::string>();
    // Shards are files beside the index; a path elsewhere would read outside the model. A
    // NUL ends the name the file system sees ("..\u0000x" opens ".."), and JSON can escape one.
    if (f.empty() || f.find_first_of(std::string("/\0", 2)) != std::string::npos || f == "." || f == "..")
      user_error(path, ": weight_map: tensor '", name, "': shard ", file.dump(),
                 " is not a file name in the index's directory");
    map[name] = f;
  }
  if (map.empty()) user_error(path, ": \"weight_map\" lists no tensors");
  return map;
}

}  // namespace

std::string find_model_weights(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / kSingle, ec)) return (d / kSingle).string();
  if (fs::exists(d / kIndex, ec)) return (d / kIndex).string();

  // No weights autosp reads: anything else that holds weights is an error, so that a model
  // is never replaced by a random init without a word.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(d, ec))
    if (entry.is_regular_file(ec)) names.push_back(entry.path().filename().string());
  if (ec) user_error(dir, ": cannot list the model directory: ", ec.message());
  std::sort(names.begin(), names.end());
  auto ends_with = [](const std::string& s, const char* suffix) { return s.ends_with(suffix); };
  for (const std::string& name : names) {
    const fs::path p = d / name;
    if (ends_with(name, ".safetensors"))
      user_error(p.string(), ": safetensors weights, but the directory has neither ", kSingle, " nor ", kIndex,
                 " (the names save_pretrained writes); a sharded model needs its index, which says which shard "
                 "holds each tensor");
    // A Megatron indexed dataset's data file (PREFIX.bin beside PREFIX.idx) is no weight file.
    const bool pickle = ends_with(name, ".pt") || ends_with(name, ".pth") || ends_with(name, ".ckpt") ||
                        name == "pytorch_model.bin.index.json" ||
                        (ends_with(name, ".bin") && !fs::exists(fs::path(p).replace_extension(".idx"), ec) &&
                         is_torch_save_file(p));
    if (pickle)
      user_error(p.string(), ": PyTorch pickle weights, and no safetensors: autosp does not read pickle files, "
                 "because loading one can run any code it contains; ", convert_hint(dir));
    if (ends_with(name, ".gguf"))
      user_error(p.string(), ": GGUF weights (llama.cpp's format), and no safetensors: autosp reads safetensors only; ",
                 convert_hint(dir, str(", gguf_file='", name, "'")));
    if (name == "tf_model.h5" || name == "flax_model.msgpack")
      user_error(p.string(), ": ", name == "tf_model.h5" ? "TensorFlow" : "Flax",
                 " weights, and no safetensors: autosp reads safetensors only; ",
                 convert_hint(dir, name == "tf_model.h5" ? ", from_tf=True" : ", from_flax=True"));
  }
  return "";
}

ModelWeights::ModelWeights(const std::string& path) : path_(path) {
  if (!path.ends_with(".index.json")) {
    files_.emplace_back(path);
    for (const std::string& name : files_[0].names()) file_of_[name] = 0;
    return;
  }
  const std::map<std::string, std::string> map = read_weight_map(path);
  const fs::path dir = fs::path(path).parent_path();
  std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
  std::vector<std::string> shard_names;
  for (const auto& [tensor, file] : map)
    if (shard_index.emplace(file, shard_names.size()).second) shard_names.push_back(file);
  std::sort(shard_names.begin(), shard_names.end());
  for (size_t i = 0; i < shard_names.size(); ++i) {
    shard_index[shard_names[i]] = i;
    const fs::path shard = dir / shard_names[i];
    std::error_code ec;
    if (!fs::exists(shard, ec)) {
      std::string tensors;
      int64_t count = 0;
      for (const auto& [tensor, file] : map)
        if (file == shard_names[i] && count++ < 3) tensors += str(count > 1 ? ", '" : "'", tensor, "'");
      user_error(shard.string(), ": no such shard file, but ", path, " maps ", count > 1 ? "tensors " : "tensor ",
                 tensors, count > 3 ? str(" and ", count - 3, " more") : "", " to it");
    }
    files_.emplace_back(shard.string());
  }
  // Every tensor of every shard: in exactly one shard, and the one the map names.
  std::map<std::string, size_t> found;
  for (size_t i = 0; i < files_.size(); ++i)
    for (const std::string& name : files_[i].names())
      if (auto [it, fresh] = found.emplace(name, i); !fresh)
        user_error(path, ": tensor '", name, "' is in two shards, ", files_[it->second].path(), " and ",
                   files_[i].path(), " (each tensor must be in one)");
  for (size_t i = 0; i < files_.size(); ++i)
    for (const std::string& name : files_[i].names()) {
      auto m = map.find(name);
      if (m == map.end())
        user_error(files_[i].path(), ": tensor '", name, "' is not in ", path,
                   "'s weight_map (the index does not describe this shard)");
      if (shard_index.at(m->second) != i)
        user_error(files_[i].path(), ": tensor '", name, "' is in this shard, but ", path, " maps it to ", m->second);
    }
  // Safetensors files beside the index that it does not name (a stale shard of an earlier
  // save, or a shard the index forgot): named when a tensor is not found.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") && !shard_index.count(name)) unlisted_.push_back(entry.path().string());
  }
  std::sort(unlisted_.begin(), unlisted_.end());
  for (const auto& [name, file] : map) {
    const size_t i = shard_index.at(file);
    if (!found.count(name)) user_error(files_[i].path(), ": missing tensor '", name, "', which ", path, " maps to it");
    file_of_[name] = i;
  }
}

std::vector<std::string> ModelWeights::names() const {
  std::vector<std::string> names;
  for (const auto& [name, i] : file_of_) names.push_back(name);
  return names;
}

const std::string& ModelWeights::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  return it == file_of_.end() ? path_ : files_[it->second].path();
}

void ModelWeights::expect(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    if (!path_.ends_with(".index.json")) user_error(path_, ": missing tensor '", name, "'");
    user_error(path_, ": missing tensor '", name, "' (the weight_map lists it in no shard",
               unlisted_.empty() ? "" : str("; ", unlisted_.size() == 1 ? "" : "among others, ", unlisted_[0],
                                            " is in the directory but not in the weight_map"),
               ")");
  }
  files_[it->second].expect(name, shape);
}

void ModelWeights::read(const std::string& name, int64_t begin, int64_t n, float* out) const {
  auto it = file_of_.find(name);
  AUTOSP_CHECK(it != file_of_.end(), path_, ": no tensor ", name);
  files_[it->second].read(name, begin, n, out);
}

FileDType ModelWeights::dtype(const std::string& name) const {
  auto it = file_of_.find(name);
  AUTOSP_CHECK(it != file_of_.end(), path_, ": no tensor ", name);
  return files_[it->second].dtype(name);
}

WeightShards plan_weight_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes) {
  AUTOSP_CHECK(max_shard_bytes > 0, "max_shard_bytes ", max_shard_bytes);
  std::vector<size_t> shard_of(tensor_bytes.size());
  size_t shards = 0;            // closed shards and tensors of their own, numbered in list order
  std::vector<size_t> open;     // the tensors of the shard being filled (not numbered yet)
  int64_t open_bytes = 0;
  const auto close = [&] {
    for (size_t j : open) shard_of[j] = shards;
    shards += open.empty() ? 0 : 1;
    open.clear();
    open_bytes = 0;
  };
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const int64_t bytes = tensor_bytes[i];
    if (bytes > max_shard_bytes) {  // a shard of its own, listed at once (before the open one)
      shard_of[i] = shards++;
      continue;
    }
    if (open_bytes + bytes > max_shard_bytes) close();
    open.push_back(i);
    open_bytes += bytes;
  }
  close();
  WeightShards plan;
  plan.file_of = shard_of;
  if (shards <= 1) {
    plan.files = {kSingle};
    std::fill(plan.file_of.begin(), plan.file_of.end(), 0);
    return plan;
  }
  for (size_t k = 0; k < shards; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards);
    plan.files.push_back(name);
  }
  return plan;
}

std::string weights_index_json(const std::map<std::string, std::string>& weight_map, int64_t total_parameters,
                               int64_t total_bytes) {
  // nlohmann::json keeps object keys sorted, as json.dumps(sort_keys=True) writes them.
  const json index = {{"metadata", {{"total_parameters", total_parameters}, {"total_size", total_bytes}}},
                      {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

int64_t parse_shard_size(const json& value, const std::string& what) {
  constexpr int64_t kMax = int64_t{1} << 62;
  const auto in_range = [&](double bytes, const std::string& given) {
    if (!(bytes >= 1) || bytes > double(kMax))
      user_error(what, ": ", given, " is out of range (a shard holds at least 1 byte and at most 2^62)");
    return static_cast<int64_t>(bytes);
  };
  if (value.is_number_integer() || value.is_number_unsigned()) {
    if (value.is_number_unsigned() ? value.get<uint64_t>() > uint64_t(kMax) : value.get<int64_t>() < 1)
      in_range(-1, value.dump());
    return value.get<int64_t>();
  }
  if (!value.is_string())
    user_error(what, ": expected a size such as \"5GB\" or \"500MiB\" (or a number of bytes), got ", value.dump());
  const std::string text = value.get<std::string>();
  static const std::pair<const char*, double> kUnits[] = {
      {"kib", 1024.0}, {"mib", 1024.0 * 1024}, {"gib", 1024.0 * 1024 * 1024}, {"tib", 1024.0 * 1024 * 1024 * 1024},
      {"kb", 1e3},     {"mb", 1e6},            {"gb", 1e9},                    {"tb", 1e12}};
  std::string lower;
  for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const auto& [unit, scale] : kUnits) {
    if (!lower.ends_with(unit)) continue;
    const std::string number = lower.substr(0, lower.size() - std::strlen(unit));
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    // Digits only (no "inf", "nan", hex or exponent): a size as a person writes it.
    const bool plain = !number.empty() && number.find_first_not_of("0123456789. ") == std::string::npos;
    if (used == 0 || !plain || number.find_first_not_of(' ', used) != std::string::npos)
      user_error(what, ": \"", text, "\" is not a size: expected a number before the unit, as in \"5GB\"");
    // huggingface_hub truncates value * unit to bytes, as this does.
    return in_range(v * scale, str("\"", text, "\""));
  }
  user_error(what, ": \"", text, "\" has no unit: expected KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB, "
             "as in \"5GB\" (or a JSON number of bytes)");
}

}  // namespace autosp::io

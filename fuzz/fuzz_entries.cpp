#include "fuzz_entries.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "io/indexed_dataset.h"
#include "io/model_weights.h"
#include "frontend/torch_import.h"
#include "io/safetensors.h"
#include "io/tokens.h"
#include "ir/graph.h"
#include "models/llama.h"
#include "ops/op.h"
#include "train/config.h"
#include "train/data.h"
#include "util/error.h"

namespace autosp::fuzz {

namespace {

// The parsers take paths (they stat, size and pread the file as they would a user's), so
// each input becomes the contents of one in-memory file, /proc/self/fd/N: no disk traffic,
// and a regular file to fstat.
class InputFile {
 public:
  InputFile() {
    fd_ = ::memfd_create("autosp-fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

const std::string& as_file(const uint8_t* data, size_t size) {
  static InputFile file;
  return file.write(data, size);
}

// A second file, for inputs that are two (an indexed dataset's .bin beside its .idx).
const std::string& as_second_file(const uint8_t* data, size_t size) {
  static InputFile file;
  return file.write(data, size);
}

// A refusal is the expected outcome for most inputs; its message must say something.
void refused(const UserError& e) {
  if (std::string(e.what()).empty()) internal_error("a UserError with an empty message");
}

}  // namespace

// What data.h promises of a sample a packed (or unpacked) source accepted.
void check_packed_sample(const std::vector<int32_t>& inputs, const std::vector<int32_t>& labels,
                         const std::vector<int32_t>& positions, const std::vector<int32_t>& documents, int32_t vocab,
                         bool packed) {
  const size_t S = inputs.size();
  for (size_t i = 0; i < S; ++i) {
    AUTOSP_CHECK(inputs[i] >= 0 && inputs[i] < vocab, "input ", inputs[i]);
    AUTOSP_CHECK(i > 0 || documents[0] == 0, "first document ", documents[0]);
    const bool starts = i > 0 && documents[i] != documents[i - 1];
    AUTOSP_CHECK(i == 0 || documents[i] == documents[i - 1] || documents[i] == documents[i - 1] + 1, "documents");
    AUTOSP_CHECK(i == 0 || (starts ? positions[i] == 0 : positions[i] == positions[i - 1] + 1), "positions");
    AUTOSP_CHECK(positions[i] >= 0, "position ", positions[i]);
    // A document's last token inside the sample has no label; the others have the next token.
    if (i + 1 < S) AUTOSP_CHECK(labels[i] == (documents[i + 1] != documents[i] ? train::kIgnoreLabel : inputs[i + 1]),
                                "label ", i);
    AUTOSP_CHECK(packed || (positions[i] == static_cast<int32_t>(i) && documents[i] == 0), "unpacked layout");
  }
}

void safetensors(const uint8_t* data, size_t size) {
  try {
    std::map<std::string, std::string> metadata;
    auto tensors = io::read_safetensors(as_file(data, size), &metadata);
    // Accepted: every tensor's data matches its shape.
    for (const auto& [name, t] : tensors) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      AUTOSP_CHECK(static_cast<size_t>(numel) == t.data.size(), "tensor '", name, "'");
    }
  } catch (const UserError& e) {
    refused(e);
  }
}

void model_config(const uint8_t* data, size_t size) {
  try {
    models::LlamaConfig c = models::load_llama_config(as_file(data, size));
    // What the trainer does first with an accepted config.
    (void)models::llama_parameters(c);
    (void)models::llama_num_parameters(c);
    (void)models::llama_config_json(c).dump();
  } catch (const UserError& e) {
    refused(e);
  }
}

void ds_config(const uint8_t* data, size_t size) {
  try {
    std::vector<std::string> warnings;
    train::TrainConfig c = train::load_train_config(as_file(data, size), &warnings);
    for (int dp : {1, 2, 3}) {
      train::TrainConfig resolved = c;
      try {
        train::resolve_batch(resolved, dp, "fuzz");
      } catch (const UserError& e) {
        refused(e);
      }
    }
  } catch (const UserError& e) {
    refused(e);
  }
}

void ir_text(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Graph g;
  try {
    g = parse_graph(text, "fuzz.ir");
  } catch (const UserError& e) {
    refused(e);
    return;
  }
  // The printer is canonical: what it prints parses back to the same text.
  const std::string printed = print_graph(g);
  Graph again;
  try {
    again = parse_graph(printed, "printed.ir");
  } catch (const UserError& e) {
    internal_error("the printed form of a parsed graph does not parse: ", e.what(), "\n", printed);
  }
  AUTOSP_CHECK(print_graph(again) == printed, "print(parse(print(g))) != print(g):\n", printed);
  // Types are taken as written; the verifier checks them against the op rules and reports
  // what is wrong as an InternalError (a graph a pass built wrong), never by crashing.
  try {
    verify(g);
  } catch (const InternalError&) {
  } catch (const UserError& e) {
    refused(e);
  }
}

void tokens(const uint8_t* data, size_t size) {
  try {
    io::TokenFile file(as_file(data, size));
    (void)file.fingerprint();
    // The first input byte picks S and the vocabulary (so both paths, in range and out of
    // range, are reached); every sample of the file is read, as training would.
    const int64_t S = size > 0 ? 1 + data[0] % 7 : 1;
    const int32_t vocab = size > 1 && data[1] % 2 ? 1 << 16 : INT32_MAX;
    std::vector<int32_t> inputs(S), labels(S);
    const int64_t samples = file.num_samples(S);
    for (int64_t k = 0; k < std::max<int64_t>(samples, 1) + 1; ++k) {
      try {
        file.read_sample(k, S, vocab, inputs.data(), labels.data());
      } catch (const UserError& e) {
        refused(e);
      }
    }
    // Packed by an EOS id the third byte picks (ids 0..3 are common in small inputs).
    const int32_t eos = size > 2 ? data[2] % 4 : 0;
    const train::TokenFileSource source(as_file(data, size), vocab, eos);
    std::vector<int32_t> positions(S), documents(S);
    for (int64_t k = 0; k < std::min<int64_t>(std::max<int64_t>(samples, 1), 64) + 1; ++k) {
      try {
        source.read_sample(k, S, inputs.data(), labels.data());
        source.read_layout(k, S, positions.data(), documents.data());
      } catch (const UserError& e) {
        refused(e);
        continue;
      }
      check_packed_sample(inputs, labels, positions, documents, vocab, true);
    }
  } catch (const UserError& e) {
    refused(e);
  }
}

// The input is both files of an indexed dataset: a little-endian u16 n, a byte that picks
// S, the vocabulary and pack, n bytes of .idx, then the .bin (fuzz/corpus/indexed_dataset/
// holds Megatron-layout pairs so). Every sample is read as training would, and an accepted
// sample's layout must be what data.h promises.
void indexed_dataset(const uint8_t* data, size_t size) {
  const size_t head = std::min<size_t>(size, 3);
  const uint8_t knobs = size > 2 ? data[2] : 0;
  const size_t idx_bytes = size >= 2 ? std::min<size_t>(data[0] | data[1] << 8, size - head) : 0;
  const uint8_t* idx = data + head;
  const uint8_t* bin = idx + idx_bytes;
  const size_t bin_bytes = size - head - idx_bytes;
  const int64_t S = 1 + knobs % 7;
  const int32_t vocab = knobs & 8 ? 64 : INT32_MAX;
  const bool pack = !(knobs & 16);
  try {
    train::IndexedDatasetSource source(as_file(idx, idx_bytes), as_second_file(bin, bin_bytes), vocab, pack);
    (void)source.fingerprint();
    (void)source.describe(S);
    const io::IndexedDataset& d = source.dataset();
    const std::vector<int64_t>& starts = d.document_starts();
    AUTOSP_CHECK(static_cast<int64_t>(starts.size()) == d.num_documents() + 1 && starts.front() == 0 &&
                     starts.back() == d.num_tokens() && std::is_sorted(starts.begin(), starts.end()),
                 "document starts");
    std::vector<int32_t> inputs(S), labels(S), positions(S), documents(S);
    const int64_t samples = std::min<int64_t>(source.num_samples(S), 64);
    for (int64_t k = 0; k < std::max<int64_t>(samples, 1) + 1; ++k) {
      try {
        source.read_sample(k, S, inputs.data(), labels.data());
        source.read_layout(k, S, positions.data(), documents.data());
      } catch (const UserError& e) {
        refused(e);
        continue;
      }
      check_packed_sample(inputs, labels, positions, documents, vocab, pack);
    }
  } catch (const UserError& e) {
    refused(e);
  }
}

namespace {

// A directory of this process's own (mkdtemp), removed at exit, for an input that must be
// a model directory (the index opens its shards by name beside it).
class ModelDir {
 public:
  ModelDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "autosp-fuzz-model-index-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ModelDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Leaves the directory holding only `files` (name, contents): nothing of an earlier input.
  void hold(const std::vector<std::pair<std::string, std::string>>& files) const {
    for (const auto& entry : std::filesystem::directory_iterator(path_)) std::filesystem::remove_all(entry.path());
    for (const auto& [name, bytes] : files) {
      FILE* f = std::fopen((std::filesystem::path(path_) / name).c_str(), "wb");
      if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
        std::perror(name.c_str());
        std::abort();
      }
    }
  }

 private:
  std::string path_;
};

// A safetensors file of fixed tensors, as Hugging Face writes one: the header padded with
// spaces to a multiple of 8 bytes. F32 elements 0.5 * k, BF16 elements 1 + k (exact in bf16).
std::string shard_bytes(const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>& tensors) {
  std::string header = "{", body;
  for (const auto& [name, dtype, shape] : tensors) {
    int64_t numel = 1;
    std::string dims;
    for (int64_t d : shape) {
      numel *= d;
      dims += (dims.empty() ? "" : ",") + std::to_string(d);
    }
    const size_t begin = body.size();
    for (int64_t k = 0; k < numel; ++k) {
      if (dtype == "F32") {
        const float v = 0.5f * static_cast<float>(k);
        body.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const float v = 1.0f + static_cast<float>(k);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        body.append(reinterpret_cast<const char*>(&top), 2);
      }
    }
    header += str(header.size() > 1 ? "," : "", "\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":[", dims,
                  "],\"data_offsets\":[", begin, ",", body.size(), "]}");
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(n >> (8 * i) & 0xff);
  return file + header + body;
}

}  // namespace

// The input is a model directory's index, optionally followed by a NUL byte and the bytes
// of its second shard (JSON text holds no NUL, so the split is unambiguous and a seed that is
// only an index stays a plain JSON file). The directory holds the index as
// model.safetensors.index.json beside model-00001-of-00002.safetensors (always the fixed one
// below) and model-00002-of-00002.safetensors (the fixed one, or the input's rest): the
// index's checks against its shards, and each shard's header, are what is fuzzed. An accepted
// index: every tensor's file, and its first, middle and last elements read through
// ModelWeights must be those read_safetensors reads from that file whole.
void model_index(const uint8_t* data, size_t size) {
  static const ModelDir dir;
  static const std::string shard1 = shard_bytes(
      {{"model.embed_tokens.weight", "F32", {3, 2}}, {"model.norm.weight", "BF16", {2}}});
  static const std::string shard2 = shard_bytes(
      {{"lm_head.weight", "BF16", {3, 2}}, {"model.layers.0.input_layernorm.weight", "F32", {2}}});
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t index_bytes = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  const char* text = reinterpret_cast<const char*>(data);
  dir.hold({{"model.safetensors.index.json", std::string(text, index_bytes)},
            {"model-00001-of-00002.safetensors", shard1},
            {"model-00002-of-00002.safetensors",
             nul != nullptr ? std::string(text + index_bytes + 1, size - index_bytes - 1) : shard2}});
  try {
    const std::string path = io::find_model_weights(dir.path());
    AUTOSP_CHECK(path == dir.path() + "/model.safetensors.index.json", "find_model_weights found ", path);
    const io::ModelWeights weights(path);
    const std::vector<std::string> names = weights.names();
    AUTOSP_CHECK(std::is_sorted(names.begin(), names.end()) && !names.empty(), "names");
    std::map<std::string, std::map<std::string, io::HostTensor>> whole;  // file -> its tensors
    for (const std::string& name : names) {
      const std::string& file = weights.file_of(name);
      const std::string shard = std::filesystem::path(file).filename().string();
      AUTOSP_CHECK(std::filesystem::path(file).parent_path() == dir.path() &&
                       (shard == "model-00001-of-00002.safetensors" || shard == "model-00002-of-00002.safetensors"),
                   "tensor '", name, "' in ", nlohmann::json(file).dump());
      if (!whole.count(file)) {
        try {
          whole[file] = io::read_safetensors(file);
        } catch (const UserError& e) {
          internal_error(file, ": opened by ModelWeights, refused by read_safetensors: ", e.what());
        }
      }
      auto t = whole[file].find(name);
      AUTOSP_CHECK(t != whole[file].end(), "tensor '", name, "' is not in ", file);
      const auto numel = static_cast<int64_t>(t->second.data.size());
      for (int64_t k : {int64_t{0}, numel / 2, numel - 1}) {
        if (k < 0 || k >= numel) continue;
        float v;
        weights.read(name, k, 1, &v);
        AUTOSP_CHECK(std::memcmp(&v, &t->second.data[k], 4) == 0, "tensor '", name, "' element ", k);
      }
    }
  } catch (const UserError& e) {
    refused(e);
  }
}

void torch_program(const uint8_t* data, size_t size) {
  try {
    const TorchProgram program = TorchProgram::load(as_file(data, size));
    for (size_t i = 0; i < program.parameters().size(); ++i)
      AUTOSP_CHECK(int64_t(program.read_parameter(i).size()) == numel(program.parameters()[i].shape), "parameter ", i);
    const Graph g = program.forward({.batch = 2, .seq_len = 8});
    verify(g);
  } catch (const UserError& e) {
    refused(e);
  }
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {{"safetensors", safetensors},
                                          {"model_config", model_config},
                                          {"ds_config", ds_config},
                                          {"ir_text", ir_text},
                                          {"tokens", tokens},
                                          {"indexed_dataset", indexed_dataset},
                                          {"model_index", model_index},
                                          {"torch_program", torch_program}};
  return all;
}

}  // namespace autosp::fuzz

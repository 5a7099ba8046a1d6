// The fuzz targets' entry functions: one per parser of untrusted input. Each feeds `data`
// to the parser as the file (or text) a user would give it, then to the next stage that
// consumes the parsed result.
//
// The contract every parser keeps, and each entry checks: an input is either accepted or
// refused with a UserError (a clear message naming the file). Anything else escapes:
// another exception (an InternalError is a bug), and, in the fuzz build (ASan + UBSan),
// any out-of-bounds access, leak or undefined behaviour. libFuzzer drives these from
// fuzz/<target>_fuzz.cpp (`make fuzz`); tests/fuzz/corpus_replay_test.cpp replays every
// file of fuzz/corpus/<target>/ through them in the normal build (`make test`).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace autosp::fuzz {

void safetensors(const uint8_t* data, size_t size);   // io::read_safetensors
void model_config(const uint8_t* data, size_t size);  // models::load_llama_config (config.json)
void ds_config(const uint8_t* data, size_t size);     // train::load_train_config + resolve_batch
void ir_text(const uint8_t* data, size_t size);       // parse_graph, print round trip, verify
// io::TokenFile: open, every sample, fingerprint; train::TokenFileSource packed by an eos_token_id
void tokens(const uint8_t* data, size_t size);
// io::IndexedDataset (.idx and .bin) and train::IndexedDatasetSource: every sample and layout
void indexed_dataset(const uint8_t* data, size_t size);
// io::find_model_weights and io::ModelWeights on model.safetensors.index.json beside two
// shards, the second optionally given by the input: every tensor's file and a few elements
void model_index(const uint8_t* data, size_t size);
// TorchProgram (a .pt2 archive): load, every parameter's values, the graph at B 2, S 8, verified
void torch_program(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // its corpus is fuzz/corpus/<name>/
  void (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace autosp::fuzz

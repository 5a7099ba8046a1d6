// Checkpoints: a directory that Hugging Face can load (config.json + model.safetensors),
// plus autosp's optimizer state (optimizer.safetensors) and trainer_state.json (step,
// seed, sequence length).
//
// Saving never damages the previous checkpoint: the new one is written in full into a
// sibling directory DIR.tmp and swapped in by renames (DIR -> DIR.old, DIR.tmp -> DIR,
// remove DIR.old). A run killed between the two renames leaves DIR.old complete, and
// loading falls back to it.
#pragma once
#include <string>

#include "models/llama.h"
#include "train/trainer.h"

namespace autosp::train {

struct CheckpointInfo {
  int64_t seq_len = 0;
  uint64_t seed = 0;
};

void save_checkpoint(const std::string& dir, const models::LlamaConfig& model,
                     const ModelState& state, const CheckpointInfo& info);

struct LoadedCheckpoint {
  std::string dir;  // where it was found (DIR, or DIR.old after an interrupted save)
  models::LlamaConfig model;
  ModelState state;
  CheckpointInfo info;
};

// Loads everything save_checkpoint wrote; any missing or malformed piece is a UserError
// naming the file.
LoadedCheckpoint load_checkpoint(const std::string& dir);

// Parameters from a model directory's model.safetensors (F32, BF16 or F16), validated
// against the config: a missing or misshaped tensor is a UserError naming it. An
// unexpected extra tensor is an error too (it would be silently ignored otherwise).
std::vector<std::vector<float>> load_weights(const std::string& path, const models::LlamaConfig& model);

}  // namespace autosp::train

// What the trainer needs of a model, whichever frontend made it: its trainable tensors, its
// vocabulary, and its forward graph at a given micro batch. The Llama family (models/llama.h)
// and imported PyTorch programs (frontend/torch_import.h) are both one of these.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/llama.h"

namespace autosp::models {

struct Model {
  std::string name;                     // for messages: "LlamaForCausalLM", "model.pt2"
  std::vector<ParameterSpec> parameters;  // in the order the state and the graph list them
  int64_t vocab_size = 0;
  std::function<Graph(const LlamaTraceOptions&)> forward;
  // Tensors the graph reads that nothing trains: its inputs of role "constant", by name (an
  // imported program's parameters exported with requires_grad=False). The trainer holds each
  // as read_constant gives it (fp32) and never updates it; no gradient is taken of it.
  std::vector<ParameterSpec> constants;
  std::function<std::vector<float>(size_t)> read_constant;
};

inline Model llama_model(const LlamaConfig& config) {
  return {config.architecture, llama_parameters(config), config.vocab_size,
          [config](const LlamaTraceOptions& o) { return llama_forward(config, o); }};
}

}  // namespace autosp::models

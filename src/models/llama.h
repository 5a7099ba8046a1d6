// Llama (Hugging Face LlamaForCausalLM semantics), written once as single-device model
// code in the tracing API. Everything about how it is trained (ranks, sharding, what is
// kept for the backward) is the compiler's business, not this file's.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "frontend/tracer.h"

namespace autosp::models {

struct LlamaConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeOptions rope;  // rope_theta and rope_scaling
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  // config.json's "dtype" (or "torch_dtype"): what the weights were saved as ("" if not
  // given). autosp computes in fp32 on CPU whatever it says.
  std::string torch_dtype;
  // Where the config came from: config.json as given (its JSON text; "" for a config made
  // in code) and the directory it was read from ("" for parse_llama_config), so that what
  // is saved of a trained model can keep the user's keys and the directory's other files.
  std::string hf_config_text, source_dir;
};

// Parses a Hugging Face config.json as transformers 4 and 5 write it: the rope settings in
// `rope_parameters` (5) or as top-level `rope_theta` and `rope_scaling` (4), both given
// being an error where they disagree; the dtype as `dtype` (5) or `torch_dtype` (4). A key
// that changes the maths in a way autosp does not implement (attention_bias true, a rope
// type other than default/llama3, attention_dropout, partial_rotary_factor, ...) is a
// UserError naming `source` and the key. Keys neither autosp nor LlamaForCausalLM reads
// are listed in one message added to `warnings` (when not null); the keys transformers
// always writes (token ids, use_cache, transformers_version, ...) are known, not listed.
LlamaConfig parse_llama_config(const nlohmann::json& json, const std::string& source,
                               std::vector<std::string>* warnings = nullptr);
LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings = nullptr);
// The model as autosp understands it, in config.json's (transformers 4) form: equal for two
// configs exactly when they describe the same model, whichever form and extra keys each has.
nlohmann::json llama_config_json(const LlamaConfig& config);
struct ParameterSpec {
  std::string name;  // Hugging Face tensor name
  Shape shape;
};
// Every trainable tensor, in Hugging Face order (lm_head.weight only when untied).
std::vector<ParameterSpec> llama_parameters(const LlamaConfig& config);
int64_t llama_num_parameters(const LlamaConfig& config);
// LlamaForCausalLM's state_dict order, as indices into llama_parameters: the order in which
// save_pretrained puts tensors into shards.
std::vector<size_t> llama_state_dict_order(const LlamaConfig& config);

// Seeded initialisation as transformers does it: normal(0, initializer_range) for
// embeddings and projections, ones for norm weights. Each tensor's values depend only on
// (seed, its name), not on the order of initialisation.
std::vector<float> llama_init(const LlamaConfig& config, const ParameterSpec& param, uint64_t seed);

struct LlamaTraceOptions {
  int64_t batch = 1, seq_len = 0;
  bool output_loss = true;     // "loss" from a "labels" input
  bool output_logits = false;  // "logits" [B, S, V]
  // The parameters' and activations' dtype: f32 (CPU training), or bf16 (the graph a bf16
  // GPU run executes, for `autosp plan`; the CPU executor refuses it).
  DType dtype = DType::f32;
  // Packed samples: an input "document_ids" (i32 [B, S], each token's document, non-decreasing)
  // keeps attention within documents.
  bool documents = false;
};

// The forward graph of one micro batch: inputs "input_ids", "position_ids", "labels"
// (i32 [B, S]), "document_ids" with options.documents, and the parameters (of options.dtype); output "loss" (mean cross-entropy
// over labelled tokens, f32 whatever the dtype) and/or "logits" (of options.dtype). With
// bf16 every activation is bf16 but what the op rules keep in f32 (norm rstd, attention
// and loss log-sum-exp, the loss sum and count; src/ops/op.h "Types").
Graph llama_forward(const LlamaConfig& config, const LlamaTraceOptions& options);

}  // namespace autosp::models

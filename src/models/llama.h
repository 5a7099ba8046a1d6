// The Llama family of decoders, written once as single-device model code in the tracing API:
// Hugging Face's LlamaForCausalLM and the models that differ from it by a few settings of
// one parameterised decoder layer, each as transformers defines it:
//   Qwen2ForCausalLM    biases on the q, k and v projections
//   Qwen3ForCausalLM    an RMSNorm over each head of q and of k before rope (q_norm, k_norm),
//                       and a head_dim that need not be hidden_size / num_attention_heads
//   MistralForCausalLM  a sliding window: query i attends to keys i - W < j <= i
// config.json's `architectures` says which. Everything about how a model is trained (ranks,
// sharding, what is kept for the backward) is the compiler's business, not this file's: no
// pass knows these names.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "frontend/tracer.h"

namespace autosp::models {

struct LlamaConfig {
  // config.json's architectures[0]: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or
  // MistralForCausalLM. The three settings below follow from it (and from sliding_window).
  std::string architecture = "LlamaForCausalLM";
  bool qkv_bias = false;       // q_proj, k_proj, v_proj have a bias [out-features] (Qwen2)
  bool qk_norm = false;        // q_norm, k_norm [head_dim]: RMSNorm of each q and k head (Qwen3)
  int64_t sliding_window = 0;  // W > 0: query i sees keys i - W < j <= i (Mistral); 0: all keys
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
// being an error where they disagree; the dtype as `dtype` (5) or `torch_dtype` (4). An
// architecture autosp does not train, or a key that changes the maths in a way autosp does
// not implement (attention_bias true, a rope type it lacks, attention_dropout,
// partial_rotary_factor, Qwen2's and Qwen3's use_sliding_window true, ...), is a UserError
// naming `source` and the key. Keys neither autosp nor the architecture's transformers
// class reads are listed in one message added to `warnings` (when not null); the keys
// transformers always writes (token ids, use_cache, transformers_version, ...) are known,
// not listed.
LlamaConfig parse_llama_config(const nlohmann::json& json, const std::string& source,
                               std::vector<std::string>* warnings = nullptr);
LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings = nullptr);
// The model as autosp understands it, in config.json's (transformers 4) form: equal for two
// configs exactly when they describe the same model, whichever form and extra keys each has.
nlohmann::json llama_config_json(const LlamaConfig& config);
struct ParameterSpec {
  std::string name;  // Hugging Face tensor name
  Shape shape;
  bool operator==(const ParameterSpec&) const = default;
};
// Every trainable tensor (lm_head.weight only when untied; the q, k, v biases and q_norm,
// k_norm where the architecture has them), per layer in the order the forward reads them.
std::vector<ParameterSpec> llama_parameters(const LlamaConfig& config);
int64_t llama_num_parameters(const LlamaConfig& config);
// The transformers class's state_dict order, as indices into llama_parameters: the order in
// which save_pretrained puts tensors into shards.
std::vector<size_t> llama_state_dict_order(const LlamaConfig& config);

// Seeded initialisation as transformers does it: normal(0, initializer_range) for
// embeddings and projection weights, zeros for biases, ones for norm weights. Each tensor's
// values depend only on (seed, its name), not on the order of initialisation.
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

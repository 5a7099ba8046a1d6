// The smallest Llama the tests build: vocab 11, hidden 8, F = 12 (differs from every other
// dim, so a value with 12 in its shape is an MLP value), 2 heads sharing 1 kv head of dim 4.
#pragma once
#include "models/llama.h"

namespace autosp::testing {

inline models::LlamaConfig tiny_llama(int layers = 2, int64_t vocab = 11) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  return c;
}

}  // namespace autosp::testing

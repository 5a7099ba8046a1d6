// Importing PyTorch programs: the .pt2 archives torch.export.save writes (a JSON graph of ATen
// ops, its parameters and constants as raw tensors), read in C++ and turned into autosp's IR,
// so a user's PyTorch model trains sequence-parallel without model code written for autosp.
//
// The program is `forward(input_ids, labels) -> loss` as python/autosp/export.py exports it
// (any module with that signature; transformers' causal LMs through the helper's "autosp"
// attention, which puts one `autosp::attention` node where transformers would build a mask).
// Its batch and sequence length may be dynamic: forward() instantiates the graph at any B, S.
//
// What is mapped, and onto what (DESIGN.md's op set; the compiler's passes know these ops, so
// sharding, checkpointing and fusion work on imported graphs as on built ones):
//   - whole subgraphs, matched by their shape in the ATen graph: RMSNorm (pow, mean, add eps,
//     rsqrt, mul by the weight, or by 1 + weight as Gemma writes it) -> rms_norm; rotary
//     embeddings (cos and sin tables from an inv_freq buffer and the positions, rotate_half)
//     -> rope, with theta read back from inv_freq; silu(a) * b -> swiglu; GPT-2's tanh GELU
//     written out elementwise -> gelu; cross_entropy over the logits of a bias-free linear ->
//     linear_cross_entropy (the logits are never held); transformers' label shift
//     (pad(labels, (0, 1), -100)[:, 1:]) -> autosp's labels input, which is already shifted
//     (labels[i] is the token after input i, as autosp's data sources give them);
//   - arange(S) (and its unsqueeze / expand) -> the "position_ids" input, so each SP rank
//     sees its own positions;
//   - one ATen op to one IR op: embedding, linear, addmm (Conv1D), layer_norm, gelu, silu,
//     add, mul, neg, view / reshape, transpose, slice, split / chunk, cat,
//     scaled_dot_product_attention (no mask; is_causal), autosp::attention;
//   - x @ W.T (numpy_T / t of a matrix, Falcon's) and x @ M -> linear; x[..., [i, i+1, ...]]
//     (index by a constant list of consecutive indices) -> slice; add_ / mul_ whose operand
//     nothing reads afterwards (itself or through a view) -> add / mul;
//   - attention written out (GPT-J, CodeGen, nanoGPT): softmax(q @ k^T scaled, masked) @ v ->
//     attention, and scaled_dot_product_attention with a mask tensor, where the mask is the
//     causal one. Masks (additive, masked_fill, where, a bool attn_mask) are evaluated on the
//     host at the sequence length (at most 2048; beyond it, at 2048, and only masks computed
//     from sizes and constants of magnitude <= 64 without a stored tensor, whose form cannot
//     change at a longer length) and checked entry by entry; a mask from the data, a window or
//     any other is refused, naming the first entry that is not causal;
//   - a stored [sin(p f) | cos(p f)] table read at the positions (GPT-J's gather, CodeGen's
//     index), split in halves and repeat_interleave'd onto [B, S, H, D] -> the interleaved rope,
//     its frequencies read back from the table and every row read checked against them;
//   - an autocast block that is off (Nemotron's LayerNorm1P) is its graph in line; one that is
//     on is refused (it would compute in another type than the program);
//   - no-ops: dtype casts to the graph's own float type (the IR ops keep their statistics in
//     f32 themselves), contiguous, alias, clone, detach, dropout with p = 0, metadata asserts.
// Only what the loss depends on is imported: nodes nothing needs (transformers' packed-
// sequence detection, an unused mask) are never looked at. A node that is needed and not
// mapped is a UserError naming the archive, the node, its op and the model's source line
// (the node's stack trace).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "models/llama.h"
#include "models/model.h"

namespace autosp {

class TorchProgram {
 public:
  // Reads and checks the archive's graph, signature and tensor table (not the weights).
  static TorchProgram load(const std::string& path);
  ~TorchProgram();
  TorchProgram(TorchProgram&&) noexcept;
  TorchProgram& operator=(TorchProgram&&) noexcept;

  const std::string& path() const;
  // The trainable parameters in the program's order, by their state-dict names (the export
  // wrapper's "model." prefix removed: Hugging Face's names for a transformers model). A
  // parameter two modules share (a tied head) appears once.
  const std::vector<models::ParameterSpec>& parameters() const;
  // Parameter i's values as fp32 (stored f32, bf16 or f16).
  std::vector<float> read_parameter(size_t i) const;
  // The rest of the model's state dict, which autosp does not train and carries into its
  // checkpoints unchanged: the parameters the loss never reads (a frozen one; a router's
  // correction bias export.py gave the moe op as constants), which PyTorch would leave alone
  // too, and the persistent floating buffers (a router's correction bias), by state-dict names.
  const std::vector<models::ParameterSpec>& frozen() const;
  std::vector<float> read_frozen(size_t i) const;
  // The tensors the forward graph reads that nothing trains: its inputs of role "constant", by
  // these names, of which it takes no gradient. First the frozen parameters the loss reads
  // (exported with requires_grad=False, which PyTorch would not train either; also in frozen()),
  // then the tables the program stores beside its state that the graph reads as tensors (CTRL's
  // sinusoidal positions). Imports a forward if none has been yet.
  const std::vector<models::ParameterSpec>& constants() const;
  std::vector<float> read_constant(size_t k) const;  // fp32
  // The program as the trainer takes it: its parameters, vocabulary, forward and constants.
  // It refers to this program, which must outlive it.
  models::Model model() const;
  // The logits' last dim (the vocabulary), found while importing the loss.
  int64_t vocab_size() const;
  // FNV-1a 64 of the program's graph and signature without the nodes' metadata (stack
  // traces name the exporting machine's paths): the same model exported again hashes alike.
  // A checkpoint records it, so that a resume is given the program it trained.
  uint64_t graph_hash() const;
  // The transformers config.json python/autosp/export.py stores in the archive
  // (extra/config.json), as text; empty when the program has none.
  const std::string& hf_config() const;

  // The forward graph at batch B and sequence length S: inputs "input_ids", "position_ids"
  // where the model uses positions, "document_ids" with options.documents, "labels" (i32
  // [B, S]), the parameters (of options.dtype); output "loss". output_logits is not supported
  // (UserError).
  Graph forward(const models::LlamaTraceOptions& options) const;

  struct Impl;

 private:
  explicit TorchProgram(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The rope whose frequencies, as autosp's kernels compute them, are a rotary embedding's
// inv_freq table (fp32, D / 2 entries for a head dim of D) within fp32's rounding (1e-6 each):
// the default rope of a theta, or its linear, llama3 or yarn scaling, with round parameters
// solved from the table (a model's theta, factor and positions are round). nullopt when none
// is (longrope's per-dimension factors, a non-round theta): the importer then gives the rope op
// the table itself (rope_type "frequencies").
std::optional<RopeOptions> rope_from_inv_freq(const std::vector<float>& inv_freq, int64_t D);

}  // namespace autosp

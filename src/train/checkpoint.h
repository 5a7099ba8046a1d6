// Checkpoints: a directory that Hugging Face can load, as save_pretrained writes it
// (config.json; the weights in the model's dtype, in model.safetensors or, above the
// target's max_shard_bytes, in shards with model.safetensors.index.json; the model
// directory's generation config and tokenizer files, copied; config.json is the given one
// with its keys and JSON types kept), plus autosp's optimizer state (optimizer.safetensors),
// trainer_state.json (step, data position, batch layout, seed, sequence length, the data
// file's fingerprint) and, written last, manifest.json (every other file's size and
// checksum; verified on load).
//
// Whatever the ZeRO stage and world size, the files are consolidated: the weights hold each
// parameter whole under its Hugging Face name, optimizer.safetensors each moment whole
// ("exp_avg.NAME", "exp_avg_sq.NAME", the parameter's shape, F32) and, where the weights
// are 16-bit (a bf16 or f16 model), the fp32 master weights ("master.NAME") that a resume
// reads instead of the rounded weights, so that it is exact. So a
// checkpoint resumes at any world size and stage (each rank reads the byte ranges of the
// elements its new layout keeps), and loads as a plain Hugging Face checkpoint. Neither
// saving nor loading ever holds a whole extra copy of the state on a rank: rank 0 writes
// each file's header up front and receives the shards in bounded rounds (a gather), writing
// each piece at its place; a loading rank reads only its own elements.
//
// A save never costs the user a file, and never damages the previous checkpoint:
//  - `--save DIR` only ever replaces an autosp checkpoint (a directory holding autosp's
//    files and nothing else) or an empty directory, or creates DIR. Anything else is refused
//    by SaveTarget, at start-up, before the first step.
//  - The new checkpoint is written in full into a scratch directory whose name autosp owns
//    and that is unique to the run (`DIR.autosp-tmp.<run>`), then swapped with DIR in one
//    atomic rename (RENAME_EXCHANGE), and the previous checkpoint, now in the scratch
//    directory, is removed. Where the file system cannot exchange, DIR is first renamed to
//    `DIR.autosp-old.<run>`; a run killed between the two renames leaves that complete, and
//    loading falls back to it. A run's scratch directory names its writer (pid, pid
//    namespace, host); scratch directories of other runs are removed only when their writer
//    is provably gone and they cannot be the newest checkpoint (SaveTarget's constructor).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/model_weights.h"
#include "io/tokens.h"
#include "models/llama.h"
#include "train/trainer.h"

namespace autosp::train {

// The batch layout a checkpoint was trained with (its data position is ModelState::
// consumed_samples, which does not depend on it).
struct BatchLayout {
  int64_t micro_batch = 0, grad_accum = 0, dp_size = 0;
  int64_t global() const { return micro_batch * grad_accum * dp_size; }
  bool operator==(const BatchLayout&) const = default;
};

// The order a run read its data in (data.shuffle, data.seed): its consumed samples index
// this order, so a resume must read in the same one (cli resume_data_position). A
// checkpoint without it (written before autosp shuffled) read in file order.
struct DataOrder {
  bool shuffle = false;
  uint64_t seed = 0;  // only meaningful when shuffled
  bool operator==(const DataOrder& o) const { return shuffle == o.shuffle && (!shuffle || seed == o.seed); }
};

// What an imported PyTorch program's checkpoint (frontend/torch_import.h) holds in place of a
// Hugging Face config.json: the program it trained ("autosp_imported_program" in its
// config.json), which a resume must be given again (--model FILE.pt2) and is checked against.
// The weights are under the program's parameter names, in its order.
struct ImportedProgramId {
  std::string file;        // as given to --model, for messages
  uint64_t graph_hash = 0;  // TorchProgram::graph_hash
  std::vector<models::ParameterSpec> parameters;
  // The program's transformers config.json (TorchProgram::hf_config), or empty. With one, the
  // checkpoint's config.json is it (dtype float32) plus "autosp_imported_program": the
  // checkpoint is a model directory transformers loads, the weights under its own names.
  std::string hf_config;
  // The rest of the model's state dict (TorchProgram::frozen): written beside the parameters,
  // unchanged, so that the checkpoint is the model transformers loads; a resume takes them from
  // the program again. read_frozen: the saving run's, frozen tensor i's values, read as each is
  // written (so no copy of them is held beside the run); null when read back from a checkpoint.
  std::vector<models::ParameterSpec> frozen;
  std::function<std::vector<float>(size_t)> read_frozen;
  // The same program: its graph and parameters (wherever its file is, whatever its config).
  bool same_program(const ImportedProgramId& o) const {
    return graph_hash == o.graph_hash && parameters == o.parameters;
  }
};

struct CheckpointInfo {
  int64_t seq_len = 0;
  uint64_t seed = 0;
  BatchLayout layout;
  std::string data_path;                       // as given to --data, for messages
  std::optional<io::DataFingerprint> data;     // none for generated data (the demo)
  DataOrder order;                             // recorded with `data`
  std::optional<ImportedProgramId> program;    // an imported program's checkpoint
};

// The files a checkpoint consists of.
bool is_checkpoint_file(const std::string& name);

// Where `--save` writes, checked when the run starts so that a target that cannot or must
// not take a checkpoint fails before any training is done.
class SaveTarget {
 public:
  // UserError naming `--save dir` when dir is the working directory or one of its parents,
  // a mount point, a symbolic link, a file, a non-empty directory that is not an autosp
  // checkpoint, under a missing or read-only parent, or on another file system than its
  // scratch directory. Creates (and removes) the scratch directory to prove it can.
  // Removes the scratch directories of earlier saves to dir that did not finish where their
  // writer is provably gone (see remove_stale_scratch); `warnings` receives a note for each
  // one removed and for each one left (why, and that it is safe to delete once its run ends).
  // `max_shard_bytes`: the weights are sharded as save_pretrained(max_shard_size=...) shards
  // them (io::plan_weight_shards; the config's checkpoint.max_shard_size).
  SaveTarget(std::string dir, std::vector<std::string>* warnings,
             int64_t max_shard_bytes = io::kDefaultMaxShardBytes);

  const std::string& dir() const { return dir_; }
  int64_t max_shard_bytes() const { return max_shard_bytes_; }

  // save_checkpoint's parts on rank 0: a fresh scratch directory (returned), and after the
  // tensor files, the other files and the swap. Checks again that DIR holds only autosp's
  // files (a file the user put there during training makes the save fail, keeping both).
  std::string begin_save() const;
  void finish_save(const models::LlamaConfig& model, const ModelState& state, const CheckpointInfo& info) const;
  void abandon_save() const;  // removes the scratch directory

 private:
  std::string dir_, tmp_, old_;  // old_: only used where RENAME_EXCHANGE is not supported
  int64_t max_shard_bytes_;
};

struct SaveStats {
  int64_t bytes = 0;  // of the tensor files
  double seconds = 0;
};

// Writes a checkpoint of the state spread over `world` and swaps it in at target->dir(): a
// collective, every rank calls it; `target` is rank 0's (null on the others), `state` this
// rank's ModelState (its specs, step and data position) and `shards` its part of the
// tensors (Trainer::checkpoint_shards). Rank 0 writes every file. Tensors it holds whole it
// writes from where they are; sharded ones reach it in rounds of world x
// shards.round_elements elements (Communicator::gather), each piece written at its place:
// beyond their own state, rank 0 holds one round and the others nothing. A failure on rank
// 0 (a full disk, a directory made read-only) stops every rank at the next round and
// becomes every rank's UserError, saying that the previous checkpoint is untouched.
SaveStats save_checkpoint(const SaveTarget* target, Communicator& world, const models::LlamaConfig& model,
                          const ModelState& state, const StateShards& shards, const CheckpointInfo& info);

struct LoadedCheckpoint {
  std::string dir;  // where it was found (DIR, or DIR.autosp-old.* after an interrupted save)
  bool verified = false;  // against its manifest (false: an older autosp's, without one)
  std::vector<std::string> notes;  // files in it that the manifest does not list
  int64_t verified_bytes = 0;  // read by this rank to verify the files (its share of them)
  models::LlamaConfig model;
  ModelState state;
  CheckpointInfo info;
};

// Loads what save_checkpoint wrote, after verify_checkpoint_files; any missing, damaged or
// malformed piece is a UserError naming the file (and the tensor, with its shape). The
// tensors are not read: state.stored validates both files' headers against the model (every
// tensor present, with its shape, in a dtype autosp reads; no unexpected one in
// model.safetensors) and reads any element range on demand. A collective over `world`:
// the ranks share out the verification (each file is read by one of them) and all end with
// the same result. Every rank must see the same directory, as resuming from what
// save_checkpoint wrote on rank 0 needs anyway. Without `world`, one process checks it all.
LoadedCheckpoint load_checkpoint(const std::string& dir, Communicator& world);
LoadedCheckpoint load_checkpoint(const std::string& dir);

// The step of the autosp checkpoint `dir` names (after an interrupted save: the fallback
// resolve_checkpoint_dir finds), -1 if its step cannot be read, nullopt if it holds none:
// what a --save that does not resume from it would replace.
std::optional<int64_t> existing_checkpoint_step(const std::string& dir);

// The directory a checkpoint named `dir` is in: dir, or after a save interrupted between
// its two renames the complete previous one (DIR.autosp-old.*). UserError if neither.
std::string resolve_checkpoint_dir(const std::string& dir);

// Checks the checkpoint in `dir` against its manifest.json: every file it lists is present
// with its size and FNV-1a 64 checksum. A mismatch is a UserError naming the file and what
// is wrong; so is a missing or malformed manifest where trainer_state.json says there is
// one. Files the manifest does not list (the user's) are named in *notes. Returns false
// (nothing checked) for a checkpoint of an older autosp, written before manifests.
//
// Over `world` (a collective), each listed file is checksummed by one rank (the largest
// files first, each to the rank with the fewest bytes so far), so a resume at any world size
// reads the checkpoint once, not once per rank; *read_bytes is this rank's share. Every
// rank then returns the same result or throws the same UserError: the failure that comes
// first in the order one process checks in (the manifest, then its files in order, then
// the listing), which is the message `autosp verify` gives.
bool verify_checkpoint_files(const std::string& dir, Communicator& world, std::vector<std::string>* notes = nullptr,
                             int64_t* read_bytes = nullptr);
bool verify_checkpoint_files(const std::string& dir, std::vector<std::string>* notes = nullptr);

// The state a run starts from without a checkpoint, not yet read (ModelState::stored, as
// load_checkpoint's): the parameters of `weights` (a model directory's model.safetensors or
// model.safetensors.index.json and its shards, io::find_model_weights; validated as
// load_weights validates them, read by range) or, with `weights` empty, the seeded init
// (each tensor made when a rank reads from it); zero moments. The trainer reads what each
// rank keeps, so under ZeRO-3 no rank ever holds the whole model. `notes` (when not null)
// receives what was skipped (the rotary_emb.inv_freq buffers older exports carry).
ModelState fresh_state(const models::LlamaConfig& model, uint64_t seed, const std::string& weights,
                       std::vector<std::string>* notes = nullptr);

// Parameters from a model directory's model.safetensors, or the shards of an index
// (F32, BF16 or F16), validated against the config: a missing or misshaped tensor is a
// UserError naming it and its file. An unexpected extra tensor is an error too (it would be
// silently ignored otherwise), but for the rotary_emb.inv_freq buffers transformers ignores.
std::vector<std::vector<float>> load_weights(const std::string& path, const models::LlamaConfig& model);

}  // namespace autosp::train

#include "train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <tuple>
#include <system_error>

#include "io/model_weights.h"
#include "io/safetensors.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hash.h"

namespace autosp::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) user_error(path, ": cannot open (", std::strerror(errno), ")");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    user_error(path, ": not valid JSON: ", e.what());
  }
}

constexpr const char* kFormat = "autosp checkpoint";
const char* const kFiles[] = {"config.json",        "model.safetensors", "model.safetensors.index.json",
                              "optimizer.safetensors", "trainer_state.json", "manifest.json"};
constexpr const char* kMasterPrefix = "master.";  // optimizer.safetensors: fp32 weights beside 16-bit ones

// A shard of the weights as save_pretrained names it: model-0000K-of-0000N.safetensors.
bool is_weight_shard(const std::string& name) {
  static const std::regex kShard(R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors)");
  return std::regex_match(name, kShard);
}

// What the weights of `model` are saved as: its config.json's dtype (bfloat16 and float16
// stay 16-bit), float32 otherwise (float64, or none given).
io::FileDType weights_dtype(const models::LlamaConfig& model) {
  if (model.torch_dtype == "bfloat16") return io::FileDType::BF16;
  if (model.torch_dtype == "float16") return io::FileDType::F16;
  return io::FileDType::F32;
}
const char* torch_dtype_name(io::FileDType d) {
  return d == io::FileDType::BF16 ? "bfloat16" : d == io::FileDType::F16 ? "float16" : "float32";
}

// manifest.json: every other file of the checkpoint (any depth) with its size and checksum,
// written last, after the files it lists are complete, inside the scratch directory that
// is then swapped in whole. trainer_state.json's "manifest" key says that one must exist.
constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestFormat = "autosp checkpoint manifest";

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)h);
  return buf;
}
// hex64's text back; anything else is a UserError naming `key` in `path`.
uint64_t parse_hex64(const json& v, const std::string& key, const std::string& path) {
  const std::string hex = v.is_string() ? v.get<std::string>() : v.dump();
  char* end = nullptr;
  const uint64_t h = std::strtoull(hex.c_str(), &end, 16);
  if (!v.is_string() || hex.size() != 16 || end != hex.c_str() + hex.size())
    user_error(path, ": ", key, ": expected 16 hex digits, got ", hex);
  return h;
}

// The files a manifest covers: every regular file under `dir` but the manifest, by path
// relative to `dir`, sorted. Anything that is neither a file nor a directory is named.
std::vector<std::string> manifest_candidates(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = fs::relative(it->path(), dir).string();
    if (it->is_directory()) continue;
    if (!it->is_regular_file() || it->is_symlink())
      user_error((dir / rel).string(), ": not a regular file (a checkpoint holds only files)");
    if (rel != kManifest) files.push_back(rel);
  }
  if (ec) user_error("cannot list '", dir.string(), "': ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

void write_manifest(const fs::path& dir) {
  json files = json::object();
  for (const std::string& rel : manifest_candidates(dir)) {
    int64_t bytes = 0;
    const uint64_t hash = fnv1a_file((dir / rel).string(), &bytes);
    files[rel] = {{"bytes", bytes}, {"fnv1a64", hex64(hash)}};
  }
  const json manifest = {{"format", kManifestFormat}, {"version", 1}, {"files", files}};
  write_file_atomic((dir / kManifest).string(), manifest.dump(2) + "\n");
}

// Scratch directories: DIR.autosp-tmp.<run> and DIR.autosp-old.<run>.
std::string scratch_prefix(const fs::path& dir, const char* kind) {
  return dir.filename().string() + ".autosp-" + kind + ".";
}

// The last file write_file_atomic left behind when killed: `.NAME.tmp.PID.N`.
bool is_atomic_write_leftover(const std::string& name) {
  const size_t tmp = name.find(".tmp.");
  return name.starts_with(".") && tmp != std::string::npos && is_checkpoint_file(name.substr(1, tmp - 1));
}

// The first entry of `dir` that is not one of autosp's checkpoint files ("" if none).
std::string foreign_entry(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!(is_checkpoint_file(name) && entry.is_regular_file()) && !is_atomic_write_leftover(name)) return name;
  }
  if (ec) user_error("cannot list '", dir.string(), "': ", ec.message());
  return "";
}

// trainer_state.json written by autosp: this format, or the one before it (step, seq_len
// and seed only), which had no marker.
bool has_autosp_state(const fs::path& dir) {
  const fs::path p = dir / "trainer_state.json";
  std::ifstream in(p);
  if (!in) return false;
  const json st = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!st.is_object()) return false;
  if (st.contains("format")) return st["format"] == kFormat;
  return st.size() == 3 && st.contains("step") && st.contains("seq_len") && st.contains("seed");
}

// Why `dir` (an existing directory) must not be replaced by a checkpoint, or "" if it may:
// an empty directory, or an autosp checkpoint with nothing else in it.
std::string why_not_replaceable(const fs::path& dir) {
  const std::string foreign = foreign_entry(dir);
  if (!foreign.empty())
    return str("it is a directory holding '", foreign, "', which is not a file of an autosp checkpoint");
  std::error_code ec;
  if (!fs::is_empty(dir, ec) && !has_autosp_state(dir))
    return "it holds checkpoint-like files but no autosp trainer_state.json (a Hugging Face model?)";
  return "";
}

// Who writes a scratch directory, recorded in its name (`<pid>-<hex>-<pid namespace>@<host>`)
// so that a later run can tell whether the writer is gone: the same host, the same pid
// namespace (a container on that host has its own pids) and no such process. Names of an
// older autosp (`<pid>-<hex>`) carry no host, so they are never proven stale.
struct ScratchOwner {
  long pid = 0;
  std::string pid_namespace, host;
};

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// The inode number of this process's pid namespace ("pid:[4026531836]" -> "4026531836").
std::string this_pid_namespace() {
  std::error_code ec;
  const std::string link = fs::read_symlink("/proc/self/ns/pid", ec).string();
  const size_t open = link.find('['), close = link.find(']');
  if (ec || open == std::string::npos || close == std::string::npos || close < open) return "0";
  return link.substr(open + 1, close - open - 1);
}

std::string new_run_id() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%d-%08x-", int(::getpid()), unsigned(rd()));
  return str(buf, this_pid_namespace(), "@", this_host());
}

// The owner a run id names; nullopt for another form (an older autosp's, or not autosp's).
std::optional<ScratchOwner> parse_run_id(const std::string& run) {
  const size_t at = run.find('@');
  if (at == std::string::npos || at + 1 >= run.size()) return std::nullopt;
  const std::string ids = run.substr(0, at);
  const size_t dash1 = ids.find('-'), dash2 = ids.rfind('-');
  if (dash1 == std::string::npos || dash2 == dash1) return std::nullopt;
  ScratchOwner o;
  const std::string pid = ids.substr(0, dash1);
  o.pid_namespace = ids.substr(dash2 + 1);
  o.host = run.substr(at + 1);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos ||
      o.pid_namespace.empty())
    return std::nullopt;
  o.pid = std::stol(pid);
  return o;
}

// Why the owner of a scratch directory may still be alive ("" if it provably is not): a
// process can only be known gone from its own host and pid namespace.
std::string owner_may_be_alive(const std::optional<ScratchOwner>& owner) {
  if (!owner) return "its name does not say which host wrote it (an older autosp's)";
  if (owner->host != this_host()) return str("it was written on host ", owner->host);
  if (owner->pid_namespace != this_pid_namespace())
    return str("it was written by pid ", owner->pid, " in another pid namespace (another container?)");
  if (owner->pid <= 0 || ::kill(static_cast<pid_t>(owner->pid), 0) == 0 || errno != ESRCH)
    return str("its writer, pid ", owner->pid, ", is still running (or its pid was reused)");
  return "";
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename itself succeeded; durability is the file system's
  ::fsync(fd);
  ::close(fd);
}

// The config.json a checkpoint holds: the given one (hf_config_text) with every key and
// each value's JSON type kept, but for what saving changes: the dtype ("dtype" where given,
// and "torch_dtype", which transformers 4 reads) is the one the weights are saved as (the
// input's, but float32 for float64 or none); "architectures" and "model_type" are added where missing (AutoConfig needs them); a
// config with rope settings only in rope_parameters (transformers 5) gets them in the
// transformers-4 keys too (rope_theta, rope_scaling), which transformers 4 reads instead.
// Without hf_config_text, models::llama_config_json.
json saved_config_json(const models::LlamaConfig& c) {
  const char* saved_dtype = torch_dtype_name(weights_dtype(c));
  if (c.hf_config_text.empty()) {
    json j = models::llama_config_json(c);
    j["torch_dtype"] = saved_dtype;
    return j;
  }
  // Parsed before, by parse_llama_config: valid, and the model it describes is c's.
  json j = json::parse(c.hf_config_text);
  // transformers 4 reads only "torch_dtype" (5 reads both): it is written whatever the input
  // spelled, and "dtype" kept where given.
  if (j.contains("dtype")) j["dtype"] = saved_dtype;
  j["torch_dtype"] = saved_dtype;
  // transformers 4 does not read rope_parameters (it would load the model with theta 10000
  // and no scaling, without a word): the rope settings are added in its form too, with the
  // same JSON values, which transformers 5 reads as the same model (parse_llama_config
  // checks that the two forms agree).
  if (const auto p = j.find("rope_parameters"); p != j.end() && p->is_object()) {
    if (p->contains("rope_theta") && !j.contains("rope_theta")) j["rope_theta"] = (*p)["rope_theta"];
    if (c.rope.rope_type != "default" && (!j.contains("rope_scaling") || j["rope_scaling"].is_null())) {
      json scaling = *p;  // the scaling keys, as given
      scaling.erase("rope_theta");
      j["rope_scaling"] = scaling;
    }
  }
  // The names of the architecture parse_llama_config found (from model_type, or Llama).
  const json names = models::llama_config_json(c);
  if (!j.contains("architectures") || j["architectures"].is_null()) j["architectures"] = names["architectures"];
  if (!j.contains("model_type")) j["model_type"] = names["model_type"];
  return j;
}

// The files of a Hugging Face model directory beside config.json and the weights that a
// checkpoint carries over unchanged, so that it is a model directory `pipeline()` or a
// serving engine takes: the generation config and the tokenizer's files.
const std::vector<std::string>& companion_files() {
  static const std::vector<std::string> files = {
      "generation_config.json", "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
      "tokenizer.model",        "added_tokens.json", "chat_template.jinja",  "chat_template.json"};
  return files;
}

// An imported program's config.json: the program, its graph's hash and its parameters.
json imported_config_json(const ImportedProgramId& p) {
  json params = json::array();
  for (const models::ParameterSpec& spec : p.parameters) params.push_back({spec.name, spec.shape});
  json j = p.hf_config.empty() ? json::object() : json::parse(p.hf_config);
  if (j.contains("dtype")) j["dtype"] = "float32";  // transformers 5's key; 4 reads torch_dtype
  j["torch_dtype"] = "float32";
  j["autosp_imported_program"] = {{"file", p.file}, {"graph_hash", hex64(p.graph_hash)}, {"parameters", params}};
  if (!p.frozen.empty()) {
    json frozen = json::array();
    for (const models::ParameterSpec& spec : p.frozen) frozen.push_back({spec.name, spec.shape});
    j["autosp_imported_program"]["frozen"] = frozen;
  }
  return j;
}

ImportedProgramId parse_imported_config(const json& j, const std::string& path) {
  const json& p = j["autosp_imported_program"];
  ImportedProgramId id;
  if (!p.is_object() || !p.contains("file") || !p["file"].is_string())
    user_error(path, ": autosp_imported_program.file: expected the program's path");
  id.file = p["file"];
  id.graph_hash = parse_hex64(p.value("graph_hash", json()), "autosp_imported_program.graph_hash", path);
  if (!p.contains("parameters") || !p["parameters"].is_array() || p["parameters"].empty())
    user_error(path, ": autosp_imported_program.parameters: expected [name, shape] pairs");
  for (const char* key : {"parameters", "frozen"}) {
    if (!p.contains(key)) continue;  // (frozen: absent without any)
    if (!p[key].is_array()) user_error(path, ": autosp_imported_program.", key, ": expected [name, shape] pairs");
    for (const json& e : p[key]) {
      const bool ok = e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_array() &&
                      std::all_of(e[1].begin(), e[1].end(), [](const json& d) { return d.is_number_integer() && d > 0; });
      if (!ok) user_error(path, ": autosp_imported_program.", key, ": expected [name, shape] pairs, got ", e.dump());
      (key == std::string("frozen") ? id.frozen : id.parameters).push_back({e[0].get<std::string>(), e[1].get<Shape>()});
    }
  }
  return id;
}

// The files beside the tensor files, manifest.json last (it vouches for everything).
void write_other_files(const fs::path& dir, const models::LlamaConfig& model, const ModelState& state,
                       const CheckpointInfo& info) {
  write_file_atomic((dir / "config.json").string(),
                    (info.program ? imported_config_json(*info.program) : saved_config_json(model)).dump(2) + "\n");
  // The model directory's generation config and tokenizer, so that the checkpoint is one too.
  if (!model.source_dir.empty())
    for (const std::string& name : companion_files()) {
      const fs::path from = fs::path(model.source_dir) / name;
      std::error_code ec;
      if (!fs::is_regular_file(from, ec)) continue;
      fs::copy_file(from, dir / name, fs::copy_options::overwrite_existing, ec);
      if (ec) user_error("cannot copy ", from.string(), " into the checkpoint: ", ec.message());
    }
  json st = {{"format", kFormat},
             {"version", 1},
             {"step", state.step},
             {"consumed_samples", state.consumed_samples},
             {"seq_len", info.seq_len},
             {"seed", info.seed},
             {"batch",
              {{"train_batch_size", info.layout.global()},
               {"train_micro_batch_size_per_gpu", info.layout.micro_batch},
               {"gradient_accumulation_steps", info.layout.grad_accum},
               {"data_parallel_size", info.layout.dp_size}}}};
  if (info.data) {
    st["data"] = {{"path", info.data_path}, {"bytes", info.data->bytes}, {"hash", hex64(info.data->hash)},
                  {"shuffle", info.order.shuffle}, {"seed", info.order.seed}};
  }
  st["manifest"] = kManifest;
  write_file_atomic((dir / "trainer_state.json").string(), st.dump(2) + "\n");
  write_manifest(dir);  // last: it vouches for everything above
  fsync_dir(dir);
}

// Scratch directories of saves that did not finish (a run killed during a save) are autosp's
// own, and at scale each is as large as a checkpoint. One whose writer is provably gone
// (owner_may_be_alive) is removed, unless it may be the newest complete checkpoint:
//  - DIR.autosp-tmp.<run> holds the new checkpoint being written, or (after the swap) the
//    previous one being removed. It is kept only if it is complete (has its manifest) while
//    DIR holds no checkpoint: a save killed between its two renames (the fallback where
//    RENAME_EXCHANGE is missing) leaves the new checkpoint there and the previous in
//    DIR.autosp-old.<run>.
//  - DIR.autosp-old.<run> holds the previous checkpoint: it is what loading falls back to
//    while DIR is missing, so it is removed only when DIR holds a checkpoint (a newer one).
// Any other is named with why it stays and that it is safe to delete once its writer has
// ended. Never fails the run: a removal that fails is reported the same way.
void remove_stale_scratch(const std::string& dir, const fs::path& parent, const fs::path& target,
                          std::vector<std::string>* warnings) {
  const bool dir_holds_checkpoint = has_autosp_state(target);
  std::error_code ec;
  std::vector<fs::path> scratch;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(scratch_prefix(target, "tmp")) || name.starts_with(scratch_prefix(target, "old")))
      scratch.push_back(entry.path());
  }
  std::sort(scratch.begin(), scratch.end());
  for (const fs::path& path : scratch) {
    const std::string name = path.filename().string();
    const bool is_tmp = name.starts_with(scratch_prefix(target, "tmp"));
    const std::string run = name.substr(scratch_prefix(target, is_tmp ? "tmp" : "old").size());
    std::string why = owner_may_be_alive(parse_run_id(run));
    if (why.empty() && is_tmp && !dir_holds_checkpoint && fs::exists(path / kManifest, ec))
      why = str("it holds a complete checkpoint and ", dir, " holds none, so it may be the newest one");
    if (why.empty() && !is_tmp && !dir_holds_checkpoint)
      why = str("it holds the previous checkpoint, which --resume ", dir, " falls back to while ", dir,
                " holds none");
    if (why.empty()) {
      std::error_code rm;
      fs::remove_all(path, rm);
      if (!rm) {
        if (warnings)
          warnings->push_back(str("--save ", dir, ": removed ", path.string(), ", the scratch directory of a save that "
                                  "did not finish (its writer, pid ", parse_run_id(run)->pid, " on this host, is gone)"));
        continue;
      }
      why = str("removing it failed: ", rm.message());
    }
    if (warnings)
      warnings->push_back(str("--save ", dir, ": ", path.string(), " is the scratch directory of an autosp save that did "
                              "not finish; autosp leaves it alone because ", why, "; it is safe to delete once that "
                              "run has ended", is_tmp ? "" : " and you have a newer checkpoint"));
  }
}

}  // namespace

bool is_checkpoint_file(const std::string& name) {
  const std::vector<std::string>& companions = companion_files();
  return std::find(std::begin(kFiles), std::end(kFiles), name) != std::end(kFiles) || is_weight_shard(name) ||
         std::find(companions.begin(), companions.end(), name) != companions.end();
}

SaveTarget::SaveTarget(std::string dir, std::vector<std::string>* warnings, int64_t max_shard_bytes)
    : max_shard_bytes_(max_shard_bytes) {
  AUTOSP_CHECK(max_shard_bytes > 0, "max_shard_bytes ", max_shard_bytes);
  auto refuse = [&](const auto&... why) { user_error("--save ", dir, ": ", why...); };
  if (dir.empty()) refuse("empty path");
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "ckpt/" is "ckpt"
  const std::string base = target.filename().string();
  if (base.empty() || base == "." || base == ".." || target == target.root_path())
    refuse("names no directory of its own (give a new directory, e.g. ", (fs::path(dir) / "checkpoint").string(), ")");
  std::error_code ec;
  const fs::path absolute = fs::weakly_canonical(fs::absolute(target), ec);
  const fs::path cwd = fs::current_path(ec);
  if (!ec && cwd.string().starts_with(absolute.string()) &&
      (cwd == absolute || cwd.string()[absolute.string().size()] == '/'))
    refuse("it is the working directory or one of its parents");
  const fs::path parent = fs::absolute(target).parent_path();
  if (!fs::is_directory(parent, ec)) refuse("its parent directory ", parent.string(), " does not exist");
  dir_ = target.string();
  const std::string run = new_run_id();
  tmp_ = (parent / (scratch_prefix(target, "tmp") + run)).string();
  old_ = (parent / (scratch_prefix(target, "old") + run)).string();

  struct stat target_st {}, parent_st {};
  const bool exists = ::lstat(dir_.c_str(), &target_st) == 0;
  if (exists) {
    if (S_ISLNK(target_st.st_mode)) refuse("it is a symbolic link (give the directory itself)");
    if (!S_ISDIR(target_st.st_mode)) refuse("it exists and is not a directory");
    if (::stat(parent.c_str(), &parent_st) == 0 && parent_st.st_dev != target_st.st_dev)
      refuse("it is a mount point (a checkpoint directory is replaced by renames; give a directory inside it)");
    const std::string why = why_not_replaceable(dir_);
    if (!why.empty())
      refuse(why, "; autosp only replaces its own checkpoints or an empty directory (give a new one)");
    if (::access(dir_.c_str(), W_OK) != 0) refuse("it is not writable: ", errno_text(errno));
  }
  // Prove the scratch directory can be made beside it, on the same file system.
  if (::mkdir(tmp_.c_str(), 0777) != 0)
    refuse("cannot create its scratch directory ", tmp_, ": ", errno_text(errno));
  struct stat tmp_st {};
  const bool same_fs = ::stat(tmp_.c_str(), &tmp_st) == 0 && (!exists || tmp_st.st_dev == target_st.st_dev);
  ::rmdir(tmp_.c_str());
  if (!same_fs) refuse("its scratch directory ", tmp_, " would be on another file system");

  remove_stale_scratch(dir, parent, target, warnings);
}

std::string SaveTarget::begin_save() const {
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // this run's own, from a save that failed earlier
  if (::mkdir(tmp_.c_str(), 0777) != 0)
    user_error("--save ", dir_, ": cannot create ", tmp_, ": ", errno_text(errno), "; the previous checkpoint is untouched");
  return tmp_;
}

void SaveTarget::abandon_save() const {
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void SaveTarget::finish_save(const models::LlamaConfig& model, const ModelState& state,
                             const CheckpointInfo& info) const {
  try {
    write_other_files(tmp_, model, state, info);
  } catch (const UserError& e) {
    abandon_save();
    user_error(e.what(), "; the previous checkpoint ", dir_, " is untouched");
  }
  std::error_code ec;
  const std::string kept = str("; the new checkpoint is complete in ", tmp_);
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) != 0) {
    if (::rename(tmp_.c_str(), dir_.c_str()) != 0)
      user_error("--save ", dir_, ": cannot rename ", tmp_, " to it: ", errno_text(errno), kept);
  } else {
    const std::string why = S_ISDIR(st.st_mode) ? why_not_replaceable(dir_) : "it is no longer a directory";
    if (!why.empty()) user_error("--save ", dir_, ": ", why, " (changed during training), so it is not replaced", kept);
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp_, ec);  // now the previous checkpoint
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
      if (::rename(dir_.c_str(), old_.c_str()) != 0)
        user_error("--save ", dir_, ": cannot move the previous checkpoint aside to ", old_, ": ", errno_text(errno), kept);
      if (::rename(tmp_.c_str(), dir_.c_str()) != 0)
        user_error("--save ", dir_, ": cannot rename ", tmp_, " to it: ", errno_text(errno),
                   "; the previous checkpoint is in ", old_, kept);
      fs::remove_all(old_, ec);
    } else {
      user_error("--save ", dir_, ": cannot swap in the new checkpoint: ", errno_text(errno), kept);
    }
    if (ec) user_error("--save ", dir_, ": saved, but the previous checkpoint could not be removed: ", ec.message());
  }
  fsync_dir(fs::absolute(dir_).parent_path());
}

namespace {

// Runs `work` on rank 0 unless it has failed already; a UserError becomes its error.
void on_lead_until_failed(bool lead, std::string& error, const std::function<void()>& work) {
  if (!lead || !error.empty()) return;
  try {
    work();
  } catch (const UserError& e) {
    error = e.what();
  }
}

// The tensor files of a checkpoint, as rank 0 writes them: each file's tensors, and where
// each state tensor goes (dests[kind][i]: (file, tensor of it) pairs; a parameter goes to
// the weights, and to the fp32 masters beside 16-bit weights).
struct StateFiles {
  struct File {
    std::string path;
    std::vector<io::TensorToWrite> tensors;
  };
  std::vector<File> files;
  std::vector<std::vector<std::vector<std::pair<size_t, size_t>>>> dests;  // [kind][tensor]
  // An imported program's frozen tensors: (file, tensor in it, frozen tensor), written by rank 0
  // as read_frozen gives them, one at a time.
  std::vector<std::tuple<size_t, size_t, size_t>> frozen;
  std::function<std::vector<float>(size_t)> read_frozen;

  explicit StateFiles(size_t tensors) : dests(kStateKinds.size(), std::vector<std::vector<std::pair<size_t, size_t>>>(tensors)) {}
  void add(size_t file, StateKind kind, size_t i, std::string name, const std::vector<int64_t>& shape, io::FileDType dtype) {
    dests[size_t(kind)][i].emplace_back(file, files[file].tensors.size());
    files[file].tensors.push_back({std::move(name), shape, dtype});
  }
};

// The tensor files of the state, written by rank 0 from what every rank holds, each kind of
// state gathered once whatever the number of files it goes to. A collective: the rounds are
// the same on every rank (they follow the layout, which is the same everywhere, and every
// kind is written; only rank 0's `out` names files), and each begins with rank 0 saying whether it is still writing, so
// that after a failure all ranks stop at the same round.
void write_state_files(Communicator& world, const ModelState& state, const StateShards& shards,
                       const StateFiles& out, std::string& error, int64_t* bytes) {
  const bool lead = world.rank() == 0;
  const int W = world.size();
  const size_t T = state.specs.size();
  std::vector<std::unique_ptr<io::SafetensorsWriter>> writers;
  on_lead_until_failed(lead, error, [&] {
    for (const StateFiles::File& f : out.files)
      writers.push_back(std::make_unique<io::SafetensorsWriter>(
          f.path, f.tensors, std::map<std::string, std::string>{{"format", "pt"}, {"step", std::to_string(state.step)}}));
    for (const auto& [file, index, f] : out.frozen) {
      const std::vector<float> values = out.read_frozen(f);
      const io::TensorToWrite& t = out.files[file].tensors[index];
      AUTOSP_CHECK(int64_t(values.size()) == numel(t.shape), "frozen tensor ", t.name, ": ", values.size(), " values");
      writers[file]->write(index, 0, values.data(), int64_t(values.size()));
    }
  });
  const auto put = [&](size_t kind, size_t i, int64_t e, const float* data, int64_t n) {
    for (const auto& [file, tensor] : out.dests[kind][i]) writers[file]->write(tensor, e, data, n);
  };
  const int64_t round = shards.round_elements;
  std::vector<float> received(lead ? static_cast<size_t>(W * round) : 0);
  for (size_t kind = 0; kind < out.dests.size(); ++kind) {
    if (!shards.whole[kind].empty()) {  // every rank holds these whole: rank 0 writes its own
      on_lead_until_failed(lead, error, [&] {
        for (size_t i = 0; i < T; ++i) put(kind, i, 0, shards.whole[kind][i], numel(state.specs[i].shape));
      });
      continue;
    }
    AUTOSP_CHECK(shards.shards[kind].size() == shards.layout.buckets.size(), "state kind ", kind, ": ",
                 shards.shards[kind].size(), " shards for ", shards.layout.buckets.size(), " buckets");
    for (size_t k = 0; k < shards.layout.buckets.size(); ++k) {
      const ShardLayout::Bucket& b = shards.layout.buckets[k];
      for (int64_t j = 0; j < b.shard; j += round) {
        int32_t writing = error.empty() ? 1 : 0;
        if (W > 1) world.broadcast(&writing, sizeof(writing), 0);
        if (!writing) return;
        const int64_t len = std::min(round, b.shard - j);
        // received[p len + x] = rank p's shard element j + x = bucket position p c + j + x.
        world.gather(shards.shards[kind][k] + j, lead ? received.data() : nullptr, len, 0);
        on_lead_until_failed(lead, error, [&] {
          for (int p = 0; p < W; ++p) {
            const int64_t lo = p * b.shard + j;
            for_each_piece(b.offsets, lo, lo + len, [&](size_t i, int64_t e, int64_t at, int64_t n) {
              put(kind, b.tensors[i], e, received.data() + p * len + (at - lo), n);
            });
          }
        });
      }
    }
  }
  on_lead_until_failed(lead, error, [&] {
    for (auto& w : writers) {
      w->commit();
      *bytes += static_cast<int64_t>(w->file_bytes());
    }
  });
}

// The checkpoint's tensor files in `dir`: the weights in the model's dtype, sharded by
// `max_shard_bytes` as save_pretrained shards them (with their index, when more than one
// file, written here), and optimizer.safetensors with the moments and, beside 16-bit
// weights, the fp32 masters ("master.NAME") that resuming reads instead.
StateFiles checkpoint_files(const fs::path& dir, const models::LlamaConfig& model, const ModelState& state,
                            int64_t max_shard_bytes, const ImportedProgramId* program) {
  const bool imported = program != nullptr;
  const io::FileDType dtype = imported ? io::FileDType::F32 : weights_dtype(model);
  // save_pretrained's order; an imported program's own
  std::vector<size_t> order(state.specs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (!imported) order = models::llama_state_dict_order(model);
  AUTOSP_CHECK(order.size() == state.specs.size(), order.size(), " tensors in state_dict order, ", state.specs.size(),
               " in the state");
  std::vector<int64_t> sizes;
  for (size_t i : order) sizes.push_back(numel(state.specs[i].shape) * int64_t(io::item_size(dtype)));
  // an imported program's frozen tensors after its parameters, in the same shards
  const std::vector<models::ParameterSpec> no_frozen;
  const std::vector<models::ParameterSpec>& frozen = imported ? program->frozen : no_frozen;
  AUTOSP_CHECK(frozen.empty() || program->read_frozen, frozen.size(), " frozen tensors without their values");
  for (const models::ParameterSpec& f : frozen) sizes.push_back(numel(f.shape) * int64_t(io::item_size(dtype)));
  const io::WeightShards plan = io::plan_weight_shards(sizes, max_shard_bytes);
  StateFiles out(state.specs.size());
  if (imported) out.read_frozen = program->read_frozen;
  for (const std::string& name : plan.files) out.files.push_back({(dir / name).string(), {}});
  const size_t optimizer = out.files.size();
  out.files.push_back({(dir / "optimizer.safetensors").string(), {}});
  std::map<std::string, std::string> weight_map;
  int64_t total_bytes = 0, total_parameters = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const models::ParameterSpec& spec = state.specs[order[k]];
    out.add(plan.file_of[k], StateKind::params, order[k], spec.name, spec.shape, dtype);
    weight_map[spec.name] = plan.files[plan.file_of[k]];
    total_bytes += sizes[k];
    total_parameters += numel(spec.shape);
  }
  for (size_t f = 0; f < frozen.size(); ++f) {
    const size_t k = order.size() + f, file = plan.file_of[k];
    out.frozen.emplace_back(file, out.files[file].tensors.size(), f);
    out.files[file].tensors.push_back({frozen[f].name, frozen[f].shape, dtype});
    weight_map[frozen[f].name] = plan.files[file];
    total_bytes += sizes[k];
    total_parameters += numel(frozen[f].shape);
  }
  for (size_t i = 0; i < state.specs.size(); ++i)
    out.add(optimizer, StateKind::exp_avg, i, "exp_avg." + state.specs[i].name, state.specs[i].shape, io::FileDType::F32);
  for (size_t i = 0; i < state.specs.size(); ++i)
    out.add(optimizer, StateKind::exp_avg_sq, i, "exp_avg_sq." + state.specs[i].name, state.specs[i].shape,
            io::FileDType::F32);
  if (dtype != io::FileDType::F32)
    for (size_t i = 0; i < state.specs.size(); ++i)
      out.add(optimizer, StateKind::params, i, kMasterPrefix + state.specs[i].name, state.specs[i].shape,
              io::FileDType::F32);
  if (plan.indexed())
    write_file_atomic((dir / "model.safetensors.index.json").string(),
                      io::weights_index_json(weight_map, total_parameters, total_bytes));
  return out;
}

}  // namespace

SaveStats save_checkpoint(const SaveTarget* target, Communicator& world, const models::LlamaConfig& model,
                          const ModelState& state, const StateShards& shards, const CheckpointInfo& info) {
  const bool lead = world.rank() == 0;
  AUTOSP_CHECK(lead == (target != nullptr), "the save target is rank 0's");
  const auto start = std::chrono::steady_clock::now();
  SaveStats stats;
  std::string error;
  fs::path tmp;
  StateFiles files(state.specs.size());
  on_lead_until_failed(lead, error, [&] {
    tmp = target->begin_save();
    files = checkpoint_files(tmp, model, state, target->max_shard_bytes(), info.program ? &*info.program : nullptr);
  });
  write_state_files(world, state, shards, files, error, &stats.bytes);
  if (lead && !error.empty() && !tmp.empty()) {
    target->abandon_save();
    error += str("; the previous checkpoint ", target->dir(), " is untouched");
  }
  on_lead_until_failed(lead, error, [&] { target->finish_save(model, state, info); });
  error = agreed_error(world, error);  // rank 0's verdict, every rank's
  if (!error.empty()) throw UserError(error);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

namespace {

// Buffers older transformers saved with Llama weights (a layer's rotary inverse
// frequencies): transformers computes them from the config and ignores them when loading,
// and so does autosp.
bool is_ignored_buffer(const std::string& name) {
  static const std::regex kInvFreq(R"(model\.(layers\.[0-9]+\.self_attn\.)?rotary_emb\.inv_freq)");
  return std::regex_match(name, kInvFreq);
}

// The unexpected tensor of a model's files, named as load_weights names it; `file_of`
// names the file a tensor is in. The ignored buffers are counted in one note (when `notes`
// is not null) instead.
void refuse_unexpected_tensors(const std::vector<std::string>& names,
                               const std::function<std::string(const std::string&)>& file_of,
                               const models::LlamaConfig& model, const std::vector<models::ParameterSpec>& specs,
                               std::vector<std::string>* notes) {
  std::set<std::string> expected;
  for (const auto& spec : specs) expected.insert(spec.name);
  int64_t ignored = 0;
  std::string first_ignored;
  for (const std::string& name : names) {
    if (expected.count(name)) continue;
    if (is_ignored_buffer(name)) {
      if (ignored++ == 0) first_ignored = name;
      continue;
    }
    user_error(file_of(name), ": unexpected tensor '", name, "' (",
               model.tie_word_embeddings ? "tie_word_embeddings is true, so there is no lm_head; " : "",
               "is this the model the config describes?)");
  }
  if (ignored > 0 && notes)
    notes->push_back(str(file_of(first_ignored), ": skipped ", ignored, " rotary_emb.inv_freq buffer",
                         ignored > 1 ? "s" : "", " (", first_ignored, ignored > 1 ? ", ..." : "",
                         "): transformers computes them from config.json and ignores them when loading"));
}

void refuse_unexpected_tensors(const io::ModelWeights& file, const models::LlamaConfig& model,
                               const std::vector<models::ParameterSpec>& specs, std::vector<std::string>* notes) {
  refuse_unexpected_tensors(file.names(), [&](const std::string& name) { return file.file_of(name); }, model, specs,
                            notes);
}

// A run's starting state: parameters from a Hugging Face model file, or the seeded init;
// zero moments.
class FreshState final : public StoredState {
 public:
  FreshState(const models::LlamaConfig& model, uint64_t seed, const std::string& weights,
             const std::vector<models::ParameterSpec>& specs, std::vector<std::string>* notes)
      : model_(model), seed_(seed), specs_(specs) {
    if (weights.empty()) return;
    file_.emplace(weights);
    for (const auto& spec : specs) file_->expect(spec.name, spec.shape);
    refuse_unexpected_tensors(*file_, model, specs, notes);
  }

  void read(StateKind kind, size_t index, int64_t begin, int64_t n, float* out) const override {
    if (kind != StateKind::params) {
      std::fill_n(out, n, 0.0f);
      return;
    }
    const models::ParameterSpec& spec = specs_.at(index);
    if (file_) return file_->read(spec.name, begin, n, out);
    // The init makes a tensor whole; a rank reads each tensor in one piece per kind, so this
    // is the transient of one tensor, made again only if asked for again.
    if (made_index_ != index) {
      made_ = models::llama_init(model_, spec, seed_);
      made_index_ = index;
    }
    std::copy_n(made_.begin() + begin, n, out);
  }

 private:
  models::LlamaConfig model_;
  uint64_t seed_;
  std::vector<models::ParameterSpec> specs_;
  std::optional<io::ModelWeights> file_;
  mutable std::vector<float> made_;
  mutable size_t made_index_ = SIZE_MAX;
};

}  // namespace

ModelState fresh_state(const models::LlamaConfig& model, uint64_t seed, const std::string& weights,
                       std::vector<std::string>* notes) {
  ModelState s;
  s.specs = models::llama_parameters(model);
  s.stored = std::make_shared<FreshState>(model, seed, weights, s.specs, notes);
  return s;
}

std::vector<std::vector<float>> load_weights(const std::string& path, const models::LlamaConfig& model) {
  const io::ModelWeights file(path);
  const std::vector<models::ParameterSpec> specs = models::llama_parameters(model);
  std::vector<std::vector<float>> params;
  for (const auto& spec : specs) {
    file.expect(spec.name, spec.shape);
    std::vector<float>& p = params.emplace_back(static_cast<size_t>(numel(spec.shape)));
    file.read(spec.name, 0, numel(spec.shape), p.data());
  }
  refuse_unexpected_tensors(file, model, specs, nullptr);
  return params;
}

namespace {

// A checkpoint's tensor files, open, their headers validated against the model; each rank
// reads the elements it keeps. The parameters are the fp32 masters in optimizer.safetensors
// where the weights are 16-bit (so that a resume is exact), else the weights themselves
// (F32: every checkpoint of a float32 model, and those of autosp before masters).
class StoredCheckpoint final : public StoredState {
 public:
  // frozen: an imported program's tensors beside its parameters (ImportedProgramId::frozen),
  // expected in the weights and not read (a resume takes them from the program).
  StoredCheckpoint(const fs::path& dir, const models::LlamaConfig& model, const std::vector<models::ParameterSpec>& specs,
                   const std::vector<models::ParameterSpec>& frozen)
      : specs_(specs), weights_(weights_path(dir)), moments_((dir / "optimizer.safetensors").string()) {
    size_t masters = 0;
    for (const auto& spec : specs) {
      weights_.expect(spec.name, spec.shape);
      moments_.expect("exp_avg." + spec.name, spec.shape);
      moments_.expect("exp_avg_sq." + spec.name, spec.shape);
      if (moments_.contains(kMasterPrefix + spec.name)) {
        moments_.expect(kMasterPrefix + spec.name, spec.shape);
        ++masters;
      }
    }
    std::vector<models::ParameterSpec> all = specs;
    for (const auto& f : frozen) {
      weights_.expect(f.name, f.shape);
      all.push_back(f);
    }
    refuse_unexpected_tensors(weights_, model, all, nullptr);
    masters_ = masters > 0;
    for (const auto& spec : specs) {
      const std::string master = kMasterPrefix + spec.name;
      if (masters_ && !moments_.contains(master))
        user_error(moments_.path(), ": missing tensor '", master, "' (it holds fp32 master weights for ", masters,
                   " of the ", specs.size(), " parameters)");
      if (!masters_ && weights_.dtype(spec.name) != io::FileDType::F32)
        user_error(weights_.file_of(spec.name), ": tensor '", spec.name, "' is ",
                   io::dtype_name(weights_.dtype(spec.name)), " and ", moments_.path(), " has no fp32 master ('",
                   master, "'): resuming from rounded weights would not continue the run exactly");
    }
  }

  void read(StateKind kind, size_t index, int64_t begin, int64_t n, float* out) const override {
    const std::string& name = specs_.at(index).name;
    if (kind == StateKind::params) {
      if (masters_) return moments_.read(kMasterPrefix + name, begin, n, out);
      return weights_.read(name, begin, n, out);
    }
    moments_.read((kind == StateKind::exp_avg ? "exp_avg." : "exp_avg_sq.") + name, begin, n, out);
  }

 private:
  // The weights as from_pretrained finds them (one file, or the index of the shards).
  static std::string weights_path(const fs::path& dir) {
    const std::string path = io::find_model_weights(dir.string());
    if (path.empty()) user_error(dir.string(), ": no model.safetensors or model.safetensors.index.json");
    return path;
  }

  std::vector<models::ParameterSpec> specs_;
  io::ModelWeights weights_;
  io::SafetensorsReader moments_;
  bool masters_ = false;
};

// A non-negative integer at st[key] (UserError naming the file and key otherwise).
int64_t state_int(const json& st, const std::string& key, const std::string& path, int64_t min = 0) {
  const json* v = &st;
  for (size_t at = 0, dot; at <= key.size(); at = dot + 1) {  // "batch.data_parallel_size"
    dot = std::min(key.find('.', at), key.size());
    const std::string part = key.substr(at, dot - at);
    if (!v->is_object() || !v->contains(part)) user_error(path, ": ", key, ": missing");
    v = &(*v)[part];
  }
  const bool fits = v->is_number_unsigned() ? v->get<uint64_t>() <= uint64_t(INT64_MAX) : v->is_number_integer();
  if (!fits || v->get<int64_t>() < min)
    user_error(path, ": ", key, ": expected an integer >= ", min, ", got ", v->dump());
  return v->get<int64_t>();
}

// After a save interrupted between its two renames, DIR is missing and the previous
// checkpoint is complete in DIR.autosp-old.<run>: the newest such (by step) is used.
std::string interrupted_save_fallback(const fs::path& dir) {
  std::error_code ec;
  std::string best;
  int64_t best_step = -1;
  const fs::path parent = fs::absolute(dir).parent_path();
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    if (!entry.path().filename().string().starts_with(scratch_prefix(dir, "old"))) continue;
    if (!has_autosp_state(entry.path())) continue;
    const json st = read_json((entry.path() / "trainer_state.json").string());
    const int64_t step = st.value("step", int64_t{-1});
    if (step > best_step) best_step = step, best = entry.path().string();
  }
  return best;
}

}  // namespace

namespace {

// One file a manifest lists: its path inside the checkpoint, its size and checksum.
struct ManifestEntry {
  std::string rel;
  uint64_t bytes = 0;
  std::string fnv1a64;
};

// The files manifest.json in `dir` lists, in its order, each entry checked for form; none
// for a checkpoint of an older autosp (written before manifests). UserError for a missing
// manifest that trainer_state.json says exists, or a malformed one.
std::optional<std::vector<ManifestEntry>> read_manifest(const fs::path& d) {
  const std::string manifest_path = (d / kManifest).string();
  std::error_code ec;
  if (!fs::exists(manifest_path, ec)) {
    const fs::path st_path = d / "trainer_state.json";
    std::ifstream in(st_path);
    const json st = in ? json::parse(in, nullptr, /*allow_exceptions=*/false) : json();
    if (st.is_object() && st.contains("manifest"))
      user_error(manifest_path, ": missing, but ", st_path.string(), " says the checkpoint has one: the checkpoint "
                 "is incomplete or was altered (use an earlier checkpoint)");
    return std::nullopt;
  }
  const json m = read_json(manifest_path);
  if (!m.is_object() || m.value("format", "") != kManifestFormat || !m.contains("files") || !m["files"].is_object())
    user_error(manifest_path, ": not an autosp checkpoint manifest (expected {\"format\": \"", kManifestFormat,
               "\", \"files\": {...}})");
  std::vector<ManifestEntry> files;
  for (const auto& [rel, entry] : m["files"].items()) {
    if (rel.empty() || fs::path(rel).is_absolute() || rel.find("..") != std::string::npos)
      user_error(manifest_path, ": lists '", rel, "', which is not a file inside the checkpoint");
    const bool typed = entry.is_object() && entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
                       entry.contains("fnv1a64") && entry["fnv1a64"].is_string();
    if (!typed) user_error(manifest_path, ": entry for ", rel, " is not {\"bytes\": N, \"fnv1a64\": \"HEX\"}");
    files.push_back({rel, entry["bytes"].get<uint64_t>(), entry["fnv1a64"].get<std::string>()});
  }
  return files;
}

// Checks one file against its manifest entry (present, its size, its checksum); UserError
// naming the file and what is wrong. Returns the bytes read.
int64_t verify_file(const fs::path& d, const ManifestEntry& want) {
  const std::string path = (d / want.rel).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    user_error(path, ": missing (the manifest lists it): the checkpoint is incomplete (use an earlier checkpoint)");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) user_error(path, ": cannot read its size: ", ec.message());
  if (size != want.bytes)
    user_error(path, ": ", size, " bytes, but the manifest says ", want.bytes, size < want.bytes ? " (truncated)" : "",
               ": the checkpoint is damaged (use an earlier checkpoint)");
  int64_t read_bytes = 0;
  const std::string hash = hex64(fnv1a_file(path, &read_bytes));
  if (hash != want.fnv1a64)
    user_error(path, ": checksum ", hash, " differs from the manifest's ", want.fnv1a64,
               ": the file was altered or damaged (use an earlier checkpoint)");
  return read_bytes;
}

// The rank that checksums each file: the largest first, each to the rank with the fewest
// bytes so far (the lowest of those), so that no rank reads much more than the largest file
// or its 1/W of the whole. The same on every rank: it depends on the manifest alone.
std::vector<int> share_out(const std::vector<ManifestEntry>& files, int W) {
  std::vector<size_t> by_size(files.size());
  for (size_t i = 0; i < files.size(); ++i) by_size[i] = i;
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return files[a].bytes > files[b].bytes; });
  std::vector<uint64_t> load(static_cast<size_t>(W), 0);
  std::vector<int> owner(files.size(), 0);
  for (size_t i : by_size) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += files[i].bytes;
  }
  return owner;
}

}  // namespace

bool verify_checkpoint_files(const std::string& dir, Communicator& world, std::vector<std::string>* notes,
                             int64_t* read_bytes) {
  const fs::path d(dir);
  // This rank's first failure, and where it lies in the order one process checks in: the
  // manifest (0), file i (1 + i), the listing (1 + files). Every rank reports the earliest
  // of all, so the message is the one a single process gives.
  std::string error;
  int64_t at = 0, bytes = 0;
  std::optional<std::vector<ManifestEntry>> files;
  std::vector<std::string> unlisted;
  try {
    files = read_manifest(d);
    if (files) {
      const std::vector<int> owner = share_out(*files, world.size());
      for (size_t i = 0; i < files->size(); ++i) {
        at = static_cast<int64_t>(1 + i);
        if (owner[i] == world.rank()) bytes += verify_file(d, (*files)[i]);
      }
      at = static_cast<int64_t>(1 + files->size());
      // A file the user added (a model card, notes) is theirs: autosp never reads it, so it
      // does not make the checkpoint invalid (the next --save refuses to replace the directory).
      std::set<std::string> listed;
      for (const ManifestEntry& e : *files) listed.insert(e.rel);
      for (const std::string& rel : manifest_candidates(d))
        if (!listed.count(rel))
          unlisted.push_back(str((d / rel).string(), ": not listed in the checkpoint's manifest (added after the "
                                 "save); autosp does not read it"));
    }
  } catch (const UserError& e) {
    error = e.what();
  }
  error = agreed_error(world, error, at);
  if (!error.empty()) throw UserError(error);
  if (notes) notes->insert(notes->end(), unlisted.begin(), unlisted.end());
  if (read_bytes) *read_bytes = bytes;
  return files.has_value();
}

bool verify_checkpoint_files(const std::string& dir, std::vector<std::string>* notes) {
  const std::unique_ptr<Communicator> one = make_single_communicator();
  return verify_checkpoint_files(dir, *one, notes);
}

std::optional<int64_t> existing_checkpoint_step(const std::string& dir) {
  std::string found;
  try {
    found = resolve_checkpoint_dir(dir);
  } catch (const UserError&) {
    return std::nullopt;
  }
  if (!has_autosp_state(found)) return fs::exists(fs::path(found) / kManifest) ? std::optional<int64_t>(-1) : std::nullopt;
  std::ifstream in(fs::path(found) / "trainer_state.json");
  const json st = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return st.is_object() && st.contains("step") && st["step"].is_number_integer() ? st["step"].get<int64_t>() : -1;
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  fs::path given = fs::path(dir).lexically_normal();
  if (!given.has_filename()) given = given.parent_path();
  std::error_code ec;
  if (fs::exists(given / "trainer_state.json", ec) || fs::exists(given / kManifest, ec)) return dir;
  const std::string found = fs::exists(given, ec) ? "" : interrupted_save_fallback(given);
  if (found.empty())
    user_error(dir, ": not an autosp checkpoint (no trainer_state.json",
               fs::is_directory(given, ec) ? ")" : fs::exists(given, ec) ? "; not a directory)" : "; no such directory)");
  return found;
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  const std::unique_ptr<Communicator> one = make_single_communicator();
  return load_checkpoint(dir, *one);
}

LoadedCheckpoint load_checkpoint(const std::string& dir, Communicator& world) {
  LoadedCheckpoint c;
  c.dir = resolve_checkpoint_dir(dir);
  c.verified = verify_checkpoint_files(c.dir, world, &c.notes, &c.verified_bytes);
  const fs::path d(c.dir);
  const std::string config_path = (d / "config.json").string();
  if (const json config = read_json(config_path); config.is_object() && config.contains("autosp_imported_program")) {
    c.info.program = parse_imported_config(config, config_path);
    c.model.architecture = str("imported PyTorch program ", c.info.program->file);
  } else {
    c.model = models::load_llama_config(config_path);
  }
  const std::string st_path = (d / "trainer_state.json").string();
  const json st = read_json(st_path);
  if (!st.is_object()) user_error(st_path, ": expected a JSON object");
  if (st.contains("format") && st["format"] != kFormat)
    user_error(st_path, ": format: expected \"", kFormat, "\", got ", st["format"].dump());
  c.info.seq_len = state_int(st, "seq_len", st_path, 1);
  c.info.seed = static_cast<uint64_t>(state_int(st, "seed", st_path));
  c.state.step = state_int(st, "step", st_path);
  // Checkpoints of the first format kept only the step: their data position and layout are
  // unknown (consumed_samples -1; the caller decides).
  const bool legacy = !st.contains("format");
  c.state.consumed_samples = legacy ? -1 : state_int(st, "consumed_samples", st_path);
  if (!legacy) {
    c.info.layout = {state_int(st, "batch.train_micro_batch_size_per_gpu", st_path, 1),
                     state_int(st, "batch.gradient_accumulation_steps", st_path, 1),
                     state_int(st, "batch.data_parallel_size", st_path, 1)};
    if (st.contains("data")) {
      const json& data = st["data"];
      io::DataFingerprint f;
      f.bytes = state_int(st, "data.bytes", st_path);
      f.hash = parse_hex64(data.value("hash", json()), "data.hash", st_path);
      c.info.data = f;
      if (data.contains("path") && data["path"].is_string()) c.info.data_path = data["path"];
      if (data.contains("shuffle")) {  // absent: written before autosp shuffled, so file order
        if (!data["shuffle"].is_boolean()) user_error(st_path, ": data.shuffle: expected true or false");
        c.info.order.shuffle = data["shuffle"].get<bool>();
        c.info.order.seed = static_cast<uint64_t>(state_int(st, "data.seed", st_path));
      }
    }
  }

  c.state.specs = c.info.program ? c.info.program->parameters : models::llama_parameters(c.model);
  c.state.stored = std::make_shared<StoredCheckpoint>(d, c.model, c.state.specs,
                                                      c.info.program ? c.info.program->frozen
                                                                     : std::vector<models::ParameterSpec>{});
  return c;
}

}  // namespace autosp::train

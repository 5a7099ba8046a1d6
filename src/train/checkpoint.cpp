#include "train/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace autosp::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_tensors(const std::string& path, const std::vector<std::string>& names,
                   const std::vector<std::vector<float>>& values, const std::vector<Shape>& shapes,
                   int64_t step) {
  std::vector<io::HostTensor> tensors(names.size());
  std::vector<std::pair<std::string, const io::HostTensor*>> list;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors[i].shape = shapes[i];
    tensors[i].data = values[i];
    list.emplace_back(names[i], &tensors[i]);
  }
  io::write_safetensors(path, list, {{"format", "pt"}, {"step", std::to_string(step)}});
}

void remove_all_checked(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return;  // nothing there (or a parent is not a directory: reported later)
  fs::remove_all(p, ec);
  if (ec) user_error("cannot remove '", p.string(), "': ", ec.message());
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) user_error(path, ": cannot open (", std::strerror(errno), ")");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    user_error(path, ": not valid JSON: ", e.what());
  }
}

}  // namespace

void save_checkpoint(const std::string& dir, const models::LlamaConfig& model, const ModelState& state,
                     const CheckpointInfo& info) {
  const fs::path target(dir), tmp(dir + ".tmp"), old(dir + ".old");
  remove_all_checked(tmp);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) user_error("--save ", dir, ": cannot create '", tmp.string(), "': ", ec.message());

  std::vector<std::string> names, moment_names;
  std::vector<Shape> shapes, moment_shapes;
  std::vector<std::vector<float>> moments;
  for (size_t i = 0; i < state.specs.size(); ++i) {
    names.push_back(state.specs[i].name);
    shapes.push_back(state.specs[i].shape);
    moment_names.push_back("exp_avg." + state.specs[i].name);
    moment_names.push_back("exp_avg_sq." + state.specs[i].name);
    moment_shapes.insert(moment_shapes.end(), 2, state.specs[i].shape);
    moments.push_back(state.exp_avg[i]);
    moments.push_back(state.exp_avg_sq[i]);
  }
  write_tensors((tmp / "model.safetensors").string(), names, state.params, shapes, state.step);
  write_tensors((tmp / "optimizer.safetensors").string(), moment_names, moments, moment_shapes, state.step);
  write_file_atomic((tmp / "config.json").string(), models::llama_config_json(model).dump(2) + "\n");
  json trainer_state = {{"step", state.step}, {"seq_len", info.seq_len}, {"seed", info.seed}};
  write_file_atomic((tmp / "trainer_state.json").string(), trainer_state.dump(2) + "\n");

  // Swap it in. Only a fully written checkpoint is ever renamed to DIR.
  remove_all_checked(old);
  if (fs::exists(target)) {
    fs::rename(target, old, ec);
    if (ec) user_error("cannot move the previous checkpoint '", dir, "' aside: ", ec.message());
  }
  fs::rename(tmp, target, ec);
  if (ec) user_error("cannot move the new checkpoint into '", dir, "': ", ec.message());
  remove_all_checked(old);
}

std::vector<std::vector<float>> load_weights(const std::string& path, const models::LlamaConfig& model) {
  auto tensors = io::read_safetensors(path);
  std::vector<std::vector<float>> params;
  for (const auto& spec : models::llama_parameters(model)) {
    const io::HostTensor& t = io::expect_tensor(tensors, spec.name, spec.shape, path);
    params.push_back(t.data);
    tensors.erase(spec.name);
  }
  if (!tensors.empty())
    user_error(path, ": unexpected tensor '", tensors.begin()->first, "' (",
               model.tie_word_embeddings ? "tie_word_embeddings is true, so there is no lm_head; "
                                         : "",
               "is this the model the config describes?)");
  return params;
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  LoadedCheckpoint c;
  c.dir = dir;
  if (!fs::exists(fs::path(dir) / "trainer_state.json")) {
    if (fs::exists(fs::path(dir + ".old") / "trainer_state.json"))
      c.dir = dir + ".old";  // a save was interrupted between its two renames
    else
      user_error("--resume ", dir, ": not an autosp checkpoint (no trainer_state.json)");
  }
  const fs::path d(c.dir);
  c.model = models::load_llama_config((d / "config.json").string());
  const json st = read_json((d / "trainer_state.json").string());
  const std::string st_path = (d / "trainer_state.json").string();
  for (const char* key : {"step", "seq_len", "seed"})
    if (!st.contains(key) || !(st[key].is_number_unsigned() ||
                               (st[key].is_number_integer() && st[key].get<int64_t>() >= 0)))
      user_error(st_path, ": ", key, ": expected a non-negative integer");
  if (st["seq_len"].get<int64_t>() < 1) user_error(st_path, ": seq_len: expected a positive integer");
  c.info.seq_len = st["seq_len"].get<int64_t>();
  c.info.seed = st["seed"].get<uint64_t>();

  c.state.specs = models::llama_parameters(c.model);
  c.state.step = st["step"].get<int64_t>();
  c.state.params = load_weights((d / "model.safetensors").string(), c.model);
  const std::string opt_path = (d / "optimizer.safetensors").string();
  auto moments = io::read_safetensors(opt_path);
  for (const auto& spec : c.state.specs) {
    c.state.exp_avg.push_back(io::expect_tensor(moments, "exp_avg." + spec.name, spec.shape, opt_path).data);
    c.state.exp_avg_sq.push_back(io::expect_tensor(moments, "exp_avg_sq." + spec.name, spec.shape, opt_path).data);
  }
  return c;
}

}  // namespace autosp::train

// Model directories as transformers writes them (tests/fixtures/hf, written by
// tests/fixtures/make_hf_fixtures.py with transformers 4 and 5 themselves): sharded
// safetensors in F32 and BF16, llama3 rope scaling in config.json's transformers-5
// `rope_parameters` and in the older top-level `rope_theta` / `rope_scaling`. autosp's loss
// on the fixture's sample must be transformers' own. And config.json as parse_llama_config
// reads it: which keys agree, which are refused, which are warned about.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/model_weights.h"
#include "io/safetensors.h"
#include "models/llama.h"
#include "testing/compare.h"
#include "testing/errors.h"
#include "testing/hf_venv.h"
#include "testing/process.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::expect_contains;
using testing::transformers_load;
using testing::source_path;
using testing::user_error_of;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return json::parse(in);
}

struct Fixture {
  std::string name, dir;
  json expected;
};

std::vector<Fixture> fixtures() {
  std::vector<Fixture> all;
  for (const char* version : {"v4", "v5"}) {
    const json e = read_json(source_path(str("tests/fixtures/hf/expected_", version, ".json")));
    for (const auto& [name, model] : e["models"].items())
      all.push_back({name, source_path("tests/fixtures/hf/" + name), model});
  }
  return all;
}

// The loss of one micro batch, as the first training step computes it, from the weights in
// `dir` read as `autosp train --model dir` reads them (find_model_weights, fresh_state).
double first_loss(const models::LlamaConfig& model, const std::string& dir, const json& expected) {
  const std::string weights = io::find_model_weights(dir);
  train::TrainConfig config = train::parse_train_config(
      json{{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1}}, "test", nullptr);
  train::resolve_batch(config, 1, "test");
  const int64_t S = expected["seq_len"];
  train::Trainer trainer(model, config, S, train::fresh_state(model, 0, weights));
  const std::vector<int32_t> tokens = expected["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokens.size(), size_t(S + 1));
  std::vector<std::vector<float>> grads;
  return trainer.loss_and_grads(tokens.data(), tokens.data() + 1, grads);
}

TEST(HfModelDir, FirstLossEqualsTransformersOnShardedF32AndBf16InBothConfigForms) {
  const std::vector<Fixture> all = fixtures();
  ASSERT_EQ(all.size(), 4u);  // f32 and bf16, transformers 4 and 5
  for (const Fixture& f : all) {
    SCOPED_TRACE(f.name);
    std::vector<std::string> warnings;
    const models::LlamaConfig model = models::load_llama_config(f.dir + "/config.json", &warnings);
    // Everything transformers writes is known: nothing to warn about.
    EXPECT_TRUE(warnings.empty()) << warnings.front();
    EXPECT_EQ(model.rope.rope_type, "llama3");
    EXPECT_EQ(model.rope.theta, 500000.0);
    EXPECT_EQ(model.torch_dtype, f.expected["dtype"].get<std::string>());
    const std::string weights = io::find_model_weights(f.dir);
    EXPECT_EQ(weights, f.dir + "/model.safetensors.index.json");
    EXPECT_EQ(io::ModelWeights(weights).num_files(), f.expected["shards"].get<size_t>());
    EXPECT_GE(f.expected["shards"].get<int>(), 2);

    const double loss = first_loss(model, f.dir, f.expected);
    const double want = f.expected["loss"], without_rope = f.expected["loss_rope_default"];
    // fp32 forward vs transformers' float64 on the same weights: 1.0e-7 observed on all four.
    EXPECT_NEAR(loss, want, 1e-5);
    // The test would notice a reader that missed the rope keys (the bf16 model's rope
    // matters least: 1.2e-3).
    EXPECT_GT(std::abs(want - without_rope), 100 * 1e-5);
    std::printf("%s: autosp %.9f, transformers %.9f (float64): difference %.2e\n", f.name.c_str(), loss, want,
                loss - want);
  }
}

// Reading a sharded model by ranges is reading each shard whole.
TEST(HfModelDir, ShardedReadsEqualTheShardsThemselves) {
  const Fixture f = fixtures().back();
  const models::LlamaConfig model = models::load_llama_config(f.dir + "/config.json");
  const io::ModelWeights weights(f.dir + "/model.safetensors.index.json");
  const std::vector<std::vector<float>> params = train::load_weights(weights.path(), model);
  const auto specs = models::llama_parameters(model);
  ASSERT_EQ(params.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto shard = io::read_safetensors(weights.file_of(specs[i].name));
    EXPECT_EQ(params[i], shard.at(specs[i].name).data) << specs[i].name;
    // A range in the middle, as a ZeRO-3 rank reads its part.
    const int64_t n = numel(specs[i].shape), begin = n / 3, len = n / 2;
    std::vector<float> part(static_cast<size_t>(len));
    weights.read(specs[i].name, begin, len, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), params[i].begin() + begin)) << specs[i].name;
  }
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A checkpoint is the model directory it was trained from: config.json with every key and
// JSON type kept (the dtype the saved weights', float32, also as transformers 4's
// torch_dtype; the rope settings in the transformers-4 keys too, which transformers 4 reads instead of rope_parameters), the
// generation config and tokenizer files copied, through a resume and a second save.
TEST(HfModelDir, CheckpointKeepsConfigKeysAndCarriesTokenizerAndGenerationConfig) {
  const Fixture f = fixtures().back();  // transformers 5, rope_parameters only
  ASSERT_EQ(f.name, "llama3_f32_v5");
  testing::TempDir tmp("hf_ckpt");
  {
    std::ofstream(tmp / "ds.json") << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})";
    const std::vector<uint32_t> tokens = f.expected["tokens"].get<std::vector<uint32_t>>();
    std::ofstream(tmp / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
  }
  const std::string train = str(AUTOSP_BINARY, " train --config ", tmp / "ds.json", " --data ", tmp / "tokens.bin");
  auto r = testing::run_command(str(train, " --model ", f.dir, " --seq-len 24 --steps 1 --save ", tmp / "ckpt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::run_command(str(train, " --resume ", tmp / "ckpt", " --steps 2 --save ", tmp / "ckpt2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const json given = read_json(f.dir + "/config.json");
  for (const std::string& ckpt : {tmp / "ckpt", tmp / "ckpt2"}) {
    SCOPED_TRACE(ckpt);
    json saved = read_json(ckpt + "/config.json");
    EXPECT_EQ(saved["dtype"], "float32");
    EXPECT_EQ(saved["torch_dtype"], "float32");  // what transformers 4 reads
    EXPECT_EQ(saved["rope_theta"].dump(), given["rope_parameters"]["rope_theta"].dump());
    EXPECT_EQ(saved["rope_scaling"]["original_max_position_embeddings"].dump(), "16");  // not 16.0
    // All else as given, to each value's JSON type (dump tells 16 from 16.0).
    saved.erase("rope_theta");
    saved.erase("rope_scaling");
    saved.erase("torch_dtype");
    json want = given;
    want["dtype"] = "float32";
    EXPECT_EQ(saved.dump(), want.dump());
    for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"})
      EXPECT_EQ(file_text(ckpt + "/" + name), file_text(f.dir + "/" + name)) << name;
    // The same model, read back by autosp.
    EXPECT_EQ(models::llama_config_json(models::load_llama_config(ckpt + "/config.json")),
              models::llama_config_json(models::load_llama_config(f.dir + "/config.json")));
  }
  r = testing::run_command(str(AUTOSP_BINARY, " verify ", tmp / "ckpt2"));  // the manifest covers the copies
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// ------------------------------------------------------------------- what a save writes
// A bf16 model trained on 2 ranks at ZeRO-3 and saved with the fixture's max_shard_size is
// saved as transformers saved it: the same shards (the index byte for byte), BF16, config
// dtype kept; beside them the fp32 masters, of which the weights are the round-to-nearest-
// even rounding; and a resume from it continues the run bitwise.
TEST(HfModelDir, Bf16CheckpointIsShardedAsSavePretrainedWithFp32MastersAndResumesBitwise) {
  const std::vector<Fixture> all = fixtures();
  const auto it = std::find_if(all.begin(), all.end(), [](const Fixture& x) { return x.name == "llama3_bf16_v5"; });
  ASSERT_NE(it, all.end());
  const Fixture& f = *it;
  testing::TempDir tmp("hf_bf16_ckpt");
  std::ofstream(tmp / "ds.json") << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "steps_per_print": 1, "zero_optimization": {"stage": 3}, "checkpoint": {"max_shard_size": "12KB"},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  {
    std::vector<uint32_t> tokens;
    for (uint32_t i = 0; i < 10 * 25; ++i) tokens.push_back((i * 37 + 11) % 64);
    std::ofstream(tmp / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
  }
  const auto mpirun = [&](const std::string& args) {
    const auto r = testing::run_command(str("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
                                            "timeout 120 ", AUTOSP_MPIEXEC, " -np 2 --oversubscribe ", AUTOSP_BINARY,
                                            " train --config ", tmp / "ds.json", " --data ", tmp / "tokens.bin ", args));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r;
  };
  const std::string fresh = str("--model ", f.dir, " --seq-len 24 ");
  mpirun(fresh + str("--steps 4 --metrics ", tmp / "full.jsonl"));
  mpirun(fresh + str("--steps 2 --save ", tmp / "ck"));
  mpirun(str("--resume ", tmp / "ck", " --steps 4 --metrics ", tmp / "resumed.jsonl"));
  const auto full = testing::read_metrics(tmp / "full.jsonl"), resumed = testing::read_metrics(tmp / "resumed.jsonl");
  ASSERT_EQ(full.size(), 4u);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(resumed[i]["loss"].dump(), full[2 + i]["loss"].dump()) << "step " << i + 3;

  const std::string ck = tmp / "ck";
  EXPECT_EQ(file_text(ck + "/model.safetensors.index.json"), file_text(f.dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(ck + "/model.safetensors"));
  EXPECT_EQ(read_json(ck + "/config.json")["dtype"], "bfloat16");
  const models::LlamaConfig model = models::load_llama_config(ck + "/config.json");
  const io::ModelWeights weights(ck + "/model.safetensors.index.json");
  const io::SafetensorsReader optimizer(ck + "/optimizer.safetensors");
  int64_t finer = 0, total = 0;
  for (const auto& spec : models::llama_parameters(model)) {
    SCOPED_TRACE(spec.name);
    EXPECT_EQ(weights.dtype(spec.name), io::FileDType::BF16);
    ASSERT_EQ(optimizer.dtype("master." + spec.name), io::FileDType::F32);
    const int64_t n = numel(spec.shape);
    std::vector<float> w(static_cast<size_t>(n)), master(static_cast<size_t>(n));
    weights.read(spec.name, 0, n, w.data());
    optimizer.read("master." + spec.name, 0, n, master.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(w[i], io::bf16_to_float(io::float_to_bf16(master[i]))) << i;
      finer += w[i] != master[i];
    }
    total += n;
  }
  // Trained at lr 1e-2, the masters have left the bf16 grid: a resume from the weights alone
  // would not be the same run.
  EXPECT_GT(finer, total / 2);
  const auto r = testing::run_command(str(AUTOSP_BINARY, " verify ", ck));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A checkpoint is a model transformers loads as it is: no missing, unexpected or misshaped
// key, the config autosp trained (dtype, rope, token ids), and transformers' loss on the next
// sample is the loss autosp's next step computes (fp32: from the saved weights themselves;
// bf16: from the bf16 weights, autosp's next step running on the fp32 masters instead).
TEST(HfModelDir, TransformersLoadsTheCheckpointAndComputesAutospsNextLoss) {
  for (const char* name : {"llama3_f32_v5", "llama3_f32_v4", "llama3_bf16_v5"}) {
    SCOPED_TRACE(name);
    const std::vector<Fixture> all = fixtures();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Fixture& x) { return x.name == name; });
    ASSERT_NE(it, all.end());
    const Fixture& f = *it;
    testing::TempDir tmp("hf_roundtrip");
    // One sample, so that every step reads it: the next step's loss is on these tokens.
    const std::vector<int32_t> tokens = f.expected["tokens"].get<std::vector<int32_t>>();
    std::ofstream(tmp / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
    std::ofstream(tmp / "ds.json") << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "steps_per_print": 1, "checkpoint": {"max_shard_size": "12KB"}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
    const std::string train = str(AUTOSP_BINARY, " train --config ", tmp / "ds.json", " --data ", tmp / "tokens.bin");
    auto r = testing::run_command(str(train, " --model ", f.dir, " --seq-len 24 --steps 2 --save ", tmp / "ck"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = testing::run_command(str(train, " --resume ", tmp / "ck", " --steps 3 --metrics ", tmp / "next.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto next = testing::read_metrics(tmp / "next.jsonl");
    ASSERT_EQ(next.size(), 1u);

    const json hf = transformers_load(tmp / "ck", tokens);
    ASSERT_TRUE(hf.contains("loss")) << hf.dump();
    EXPECT_EQ(hf["missing_keys"], json::array());
    EXPECT_EQ(hf["unexpected_keys"], json::array());
    EXPECT_EQ(hf["mismatched_keys"], json::array());
    EXPECT_EQ(hf["error_msgs"], json::array());
    EXPECT_EQ(hf["torch_dtype"], f.expected["dtype"]);
    EXPECT_EQ(hf["weight_dtypes"], json::array({f.expected["dtype"]}));
    EXPECT_EQ(hf["rope_theta"], 500000.0);
    EXPECT_EQ(hf["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(hf["bos_token_id"], 1);
    EXPECT_EQ(hf["eos_token_id"], 2);
    const models::LlamaConfig model = models::load_llama_config(tmp / "ck/config.json");
    json sample = f.expected;
    const double autosp_next = next[0]["loss"], from_weights = first_loss(model, tmp / "ck", sample);
    const double loss = hf["loss"];
    if (f.expected["dtype"] == "float32") {
      EXPECT_NEAR(loss, autosp_next, 1e-5);
    }
    EXPECT_NEAR(loss, from_weights, 1e-5);
    std::printf("%s: transformers %.9f, autosp's next step %.9f, autosp on the saved weights %.9f\n", name, loss,
                autosp_next, from_weights);
  }
}

// Qwen2, Qwen3 and Mistral (tests/fixtures/hf_families): a checkpoint keeps the config.json
// transformers wrote (architecture, model_type, its own keys such as Mistral's sliding_window;
// dtype as saved) and holds exactly the tensors transformers' save_pretrained wrote, by name and
// shape; transformers 4.46 (the test venv) loads
// the Qwen2 and Mistral checkpoints without a missing or unexpected key and computes the loss
// autosp's next step computes. (4.46 has no Qwen3: its checkpoint is held to the names, shapes
// and config transformers 4.57 wrote, which loaded it when this test was written; see the
// fixture script.)
TEST(HfModelDir, QwenAndMistralCheckpointsAreModelsTransformersLoads) {
  for (const char* name : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(name);
    const std::string dir = source_path(str("tests/fixtures/hf_families/", name));
    const json expected = read_json(dir + "/expected.json");
    const std::vector<int32_t> tokens = expected["tokens"].get<std::vector<int32_t>>();
    testing::TempDir tmp("hf_family_ckpt");
    std::ofstream(tmp / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
    std::ofstream(tmp / "ds.json") << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
    const std::string train = str(AUTOSP_BINARY, " train --config ", tmp / "ds.json", " --data ", tmp / "tokens.bin");
    auto r = testing::run_command(str(train, " --model ", dir, " --seq-len 30 --steps 2 --save ", tmp / "ck"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = testing::run_command(str(train, " --resume ", tmp / "ck", " --steps 3 --metrics ", tmp / "next.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto next = testing::read_metrics(tmp / "next.jsonl");
    ASSERT_EQ(next.size(), 1u);

    json saved = read_json(tmp / "ck/config.json"), given = read_json(dir + "/config.json");
    EXPECT_EQ(saved["torch_dtype"], "float32");
    saved.erase("torch_dtype");
    EXPECT_EQ(saved.dump(), given.dump());
    const auto ours = io::read_safetensors(tmp / "ck/model.safetensors");
    const auto theirs = io::read_safetensors(dir + "/model.safetensors");
    ASSERT_EQ(ours.size(), theirs.size());
    for (const auto& [tensor, t] : theirs) {
      ASSERT_TRUE(ours.count(tensor)) << tensor;
      EXPECT_EQ(ours.at(tensor).shape, t.shape) << tensor;
    }

    if (std::string(name) == "qwen3") continue;
    const json hf = transformers_load(tmp / "ck", tokens);
    ASSERT_TRUE(hf.contains("loss")) << hf.dump();
    EXPECT_EQ(hf["missing_keys"], json::array());
    EXPECT_EQ(hf["unexpected_keys"], json::array());
    EXPECT_EQ(hf["mismatched_keys"], json::array());
    EXPECT_EQ(hf["error_msgs"], json::array());
    // fp32 weights: transformers (float64) and autosp's next step (fp32) on the same ones,
    // as the Llama checkpoint test above.
    EXPECT_NEAR(hf["loss"].get<double>(), next[0]["loss"].get<double>(), 1e-5);
    std::printf("%s: transformers %.9f, autosp's next step %.9f\n", name, hf["loss"].get<double>(),
                next[0]["loss"].get<double>());
  }
}

// ---------------------------------------------------------------------------- config.json
json v5_config() { return read_json(source_path("tests/fixtures/hf/llama3_f32_v5/config.json")); }
json v4_config() { return read_json(source_path("tests/fixtures/hf/llama3_f32_v4/config.json")); }

TEST(HfConfig, BothFormsDescribeTheSameModel) {
  const models::LlamaConfig a = models::parse_llama_config(v5_config(), "v5");
  const models::LlamaConfig b = models::parse_llama_config(v4_config(), "v4");
  EXPECT_EQ(models::llama_config_json(a), models::llama_config_json(b));
  // Both forms at once (as a config edited by hand, or converted, may hold them): they agree.
  json both = v5_config();
  both["rope_theta"] = 500000;
  both["rope_scaling"] = v4_config()["rope_scaling"];
  both["torch_dtype"] = "float32";
  EXPECT_EQ(models::llama_config_json(models::parse_llama_config(both, "both")), models::llama_config_json(a));
}

// Qwen2, Qwen3 and Mistral configs as transformers 4.57 wrote them (tests/fixtures/hf_families):
// each architecture's settings, its defaults where a key is missing, and what autosp refuses.
json family_config(const char* name) {
  return read_json(source_path(str("tests/fixtures/hf_families/", name, "/config.json")));
}

TEST(HfConfig, QwenAndMistralSettingsDefaultsAndRefusals) {
  std::vector<std::string> warnings;
  for (const char* name : {"qwen2", "qwen3", "mistral"}) {
    models::parse_llama_config(family_config(name), name, &warnings);
    EXPECT_TRUE(warnings.empty()) << name << ": every key transformers wrote is known: " << warnings.front();
  }
  // Mistral: sliding_window null is none; missing is MistralConfig's default, 4096.
  json c = family_config("mistral");
  c["sliding_window"] = nullptr;
  EXPECT_EQ(models::parse_llama_config(c, "cfg.json").sliding_window, 0);
  c.erase("sliding_window");
  EXPECT_EQ(models::parse_llama_config(c, "cfg.json").sliding_window, 4096);
  c["sliding_window"] = 0;
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"cfg.json", "sliding_window", "positive integer"});
  // Qwen3: head_dim missing is Qwen3Config's 128, not hidden_size / heads.
  c = family_config("qwen3");
  c.erase("head_dim");
  EXPECT_EQ(models::parse_llama_config(c, "cfg.json").head_dim, 128);
  c = family_config("qwen3");
  c["attention_bias"] = true;
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"cfg.json", "attention_bias", "Qwen3ForCausalLM"});
  // Qwen2's and Qwen3's window (layers from max_window_layers on) is refused, by key.
  for (const char* name : {"qwen2", "qwen3"}) {
    c = family_config(name);
    c["use_sliding_window"] = true;
    c["sliding_window"] = 8;
    expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                    {"cfg.json", "use_sliding_window", "true is not supported", "full attention"});
    c = family_config(name);
    c["layer_types"][1] = "sliding_attention";
    expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                    {"cfg.json", "layer_types[1]", "sliding_attention", "is not supported"});
  }
  // An architecture autosp does not train, or a model_type that is another's.
  c = family_config("qwen2");
  c["architectures"] = {"Qwen2MoeForCausalLM"};
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"cfg.json", "architectures", "Qwen2MoeForCausalLM", "is not supported", "Qwen3ForCausalLM"});
  c = family_config("qwen2");
  c["model_type"] = "qwen3";
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"cfg.json", "model_type", "\"qwen3\" does not match", "Qwen2ForCausalLM"});
  // Without architectures, model_type says which.
  c = family_config("mistral");
  c.erase("architectures");
  EXPECT_EQ(models::parse_llama_config(c, "cfg.json").architecture, "MistralForCausalLM");
  // Written back in code (llama_config_json), each reads as the same model.
  for (const char* name : {"qwen2", "qwen3", "mistral"}) {
    const models::LlamaConfig m = models::parse_llama_config(family_config(name), name);
    const models::LlamaConfig back = models::parse_llama_config(models::llama_config_json(m), name);
    EXPECT_EQ(models::llama_config_json(back), models::llama_config_json(m)) << name;
    EXPECT_EQ(back.architecture, m.architecture);
    EXPECT_EQ(back.qkv_bias, m.qkv_bias);
    EXPECT_EQ(back.qk_norm, m.qk_norm);
    EXPECT_EQ(back.sliding_window, m.sliding_window);
  }
}

TEST(HfConfig, RopeKeysThatDisagreeAreAnErrorNamingBoth) {
  json c = v5_config();
  c["rope_theta"] = 10000.0;
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"cfg.json", "rope_parameters.rope_theta and rope_theta", "500000.0", "10000.0"});
  c = v5_config();
  c["rope_scaling"] = v4_config()["rope_scaling"];
  c["rope_scaling"]["factor"] = 32.0;
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"rope_parameters.factor and rope_scaling.factor", "8.0", "32.0"});
  c = v5_config();
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  c["rope_scaling"] = v4_config()["rope_scaling"];
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"rope_parameters.rope_type and rope_scaling.rope_type", "\"default\"", "\"llama3\""});
  c = v5_config();
  c["torch_dtype"] = "bfloat16";
  expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }),
                  {"dtype and torch_dtype", "float32", "bfloat16"});
}

TEST(HfConfig, KeysThatChangeTheMathsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::function<void(json&)>>> cases = {
      {"rope_parameters.rope_type", [](json& c) { c["rope_parameters"]["rope_type"] = "longrope"; }},
      {"rope_scaling.rope_type", [](json& c) {
         c.erase("rope_parameters");
         c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
       }},
      {"rope_scaling.factor", [](json& c) {
         c.erase("rope_parameters");
         c["rope_scaling"] = {{"rope_type", "linear"}};
       }},
      {"rope_parameters.truncate", [](json& c) {
         c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"truncate", 1}};
       }},
      {"rope_parameters.partial_rotary_factor", [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; }},
      {"partial_rotary_factor", [](json& c) { c["partial_rotary_factor"] = 0.5; }},
      {"rope_parameters.full_attention", [](json& c) { c["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}}; }},
      {"attention_dropout", [](json& c) { c["attention_dropout"] = 0.1; }},
      {"attention_bias", [](json& c) { c["attention_bias"] = true; }},
      {"mlp_bias", [](json& c) { c["mlp_bias"] = true; }},
      {"hidden_act", [](json& c) { c["hidden_act"] = "gelu"; }},
      {"pretraining_tp", [](json& c) { c["pretraining_tp"] = 2; }},
      {"quantization_config", [](json& c) { c["quantization_config"] = {{"quant_method", "bitsandbytes"}}; }},
      {"rope_parameters.low_freq_factor", [](json& c) { c["rope_parameters"].erase("low_freq_factor"); }},
  };
  for (const auto& [key, edit] : cases) {
    SCOPED_TRACE(key);
    json c = v5_config();
    edit(c);
    expect_contains(user_error_of([&] { models::parse_llama_config(c, "cfg.json"); }), {"cfg.json: " + key});
  }
  // Not every head_dim is hidden / heads (Llama 3.2 1B-style): supported, no error.
  json c = v5_config();
  c["head_dim"] = 16;
  EXPECT_EQ(models::parse_llama_config(c, "cfg.json").head_dim, 16);
}

// yarn as transformers 5 reads it: both forms; the original positions from the top-level key
// where given (else the rope settings', else max_position_embeddings); the factor from their
// ratio where missing; the attention factor from factor, or mscale / mscale_all_dim.
TEST(HfConfig, YarnAsTransformersReadsIt) {
  json c = v5_config();
  c["max_position_embeddings"] = 256;
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0},
                          {"original_max_position_embeddings", 64}, {"beta_fast", 16}};
  models::LlamaConfig m = models::parse_llama_config(c, "cfg.json");
  EXPECT_EQ(m.rope.rope_type, "yarn");
  EXPECT_EQ(m.rope.original_max_position_embeddings, 64);
  EXPECT_EQ(m.rope.beta_fast, 16);
  EXPECT_EQ(m.rope.beta_slow, 1);
  EXPECT_TRUE(m.rope.truncate);
  EXPECT_DOUBLE_EQ(m.rope.attention_factor, 0.1 * std::log(4.0) + 1);
  // The transformers-4 form describes the same model.
  json v4 = c;
  v4.erase("rope_parameters");
  v4["rope_theta"] = 10000.0;
  v4["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}, {"beta_fast", 16}};
  EXPECT_EQ(models::llama_config_json(models::parse_llama_config(v4, "cfg.json")), models::llama_config_json(m));

  json derived = c;  // no factor, no original positions: max_position_embeddings and ratio 1
  derived["rope_parameters"].erase("factor");
  derived["rope_parameters"].erase("original_max_position_embeddings");
  derived["original_max_position_embeddings"] = 32;  // top level (Phi-3 style): taken
  m = models::parse_llama_config(derived, "cfg.json");
  EXPECT_EQ(m.rope.original_max_position_embeddings, 32);
  EXPECT_EQ(m.rope.factor, 256.0 / 32);

  json ms = c;
  ms["rope_parameters"]["mscale"] = 0.707;
  ms["rope_parameters"]["mscale_all_dim"] = 1.0;
  m = models::parse_llama_config(ms, "cfg.json");
  EXPECT_DOUBLE_EQ(m.rope.attention_factor, (0.1 * 0.707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1));
  ms["rope_parameters"]["attention_factor"] = 1.5;  // given: wins
  EXPECT_EQ(models::parse_llama_config(ms, "cfg.json").rope.attention_factor, 1.5);

  json disagree = c;
  disagree["original_max_position_embeddings"] = 128;
  expect_contains(user_error_of([&] { models::parse_llama_config(disagree, "cfg.json"); }),
                  {"cfg.json", "original_max_position_embeddings", "disagree"});
}

TEST(HfConfig, UnknownKeysAreListedInOneWarning) {
  json c = v4_config();
  c["sliding_window"] = 4096;
  c["my_note"] = "x";
  c["rope_scaling"]["beta_fast"] = 32;
  // Keys transformers writes (or older versions did) are known.
  c["_name_or_path"] = "meta-llama/Llama-2-7b-hf";
  c["pad_token_id"] = nullptr;
  c["eos_token_id"] = {128001, 128008, 128009};
  std::vector<std::string> warnings;
  models::parse_llama_config(c, "cfg.json", &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  expect_contains(warnings[0], {"cfg.json", "rope_scaling.beta_fast", "my_note", "sliding_window"});
  EXPECT_EQ(warnings[0].find("_name_or_path"), std::string::npos) << warnings[0];
  EXPECT_EQ(warnings[0].find("eos_token_id"), std::string::npos) << warnings[0];
}

TEST(HfConfig, WrittenConfigKeepsPositionCountsIntegers) {
  const json out = models::llama_config_json(models::parse_llama_config(v5_config(), "v5"));
  EXPECT_TRUE(out["rope_scaling"]["original_max_position_embeddings"].is_number_integer()) << out.dump();
  EXPECT_EQ(out["rope_scaling"]["original_max_position_embeddings"], 16);
}

}  // namespace
}  // namespace autosp

// Checkpoints under ZeRO-3 in bounded memory, under real mpirun (issue 10, item 4): saving
// streams the shards to rank 0 in rounds and loading reads only each rank's byte ranges, so
// neither ever holds a whole extra copy of the model on a rank, measured as the resident
// set's high-water mark (VmHWM) while saving and while reading; and a save that fails on
// rank 0 part-way ends every rank with the error, leaving the previous checkpoint whole.
// (Correctness of the streamed files: tests/sp/zero_sp_test.cpp compares model.safetensors
// of W = 4 stage-3 runs with the float64 reference, and resumes such checkpoints bitwise at
// W = 4 and at W = 2 stage 1.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/safetensors.h"
#include "io/tokens.h"
#include "models/llama.h"
#include "testing/compare.h"
#include "testing/process.h"
#include "testing/tiny_llama.h"
#include "train/checkpoint.h"
#include "util/rss.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::read_metrics;
using testing::run_command;
using testing::TempDir;

const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";
constexpr int kSeqLen = 16;

// The per-rank byte counts autosp prints after `what` ("resident peak while saving, per
// rank: +4.0 MiB +0.0 B ..."), from the last such line.
std::vector<double> per_rank_bytes(const std::string& output, const std::string& what) {
  const size_t at = output.rfind(what);
  if (at == std::string::npos) return {};
  const std::string line = output.substr(at, output.find('\n', at) - at);
  std::vector<double> bytes;
  const std::regex item(R"(\+([0-9.]+) (B|KiB|MiB|GiB))");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), item); it != std::sregex_iterator(); ++it) {
    const std::string unit = (*it)[2];
    const double scale = unit == "B" ? 1 : unit == "KiB" ? 1024 : unit == "MiB" ? 1 << 20 : 1 << 30;
    bytes.push_back(std::stod((*it)[1]) * scale);
  }
  return bytes;
}

// A Llama of 9.84M parameters (39.4 MB in fp32), most of them in the embedding and the
// untied head (V = 16384, H = 256), and a token file for it.
struct BigModel {
  TempDir dir{"zero_ckpt_mem"};
  int64_t params = 0;
  BigModel() {
    const json config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                         {"vocab_size", 16384}, {"hidden_size", 256}, {"intermediate_size", 688},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                         {"head_dim", 64}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                         {"tie_word_embeddings", false}, {"max_position_embeddings", 64},
                         {"hidden_act", "silu"}, {"torch_dtype", "float32"}};
    std::filesystem::create_directories(dir / "model");
    std::ofstream(dir / "model/config.json") << config.dump(2);
    params = models::llama_num_parameters(models::load_llama_config(dir / "model/config.json"));
    std::vector<uint32_t> tokens(64 * (kSeqLen + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t((i * 7919 + 13) % 16384);
    io::write_tokens(dir / "tokens.bin", tokens);
  }
  // ZeRO `zero` over SP 2 x DP `world / 2` (world 2 or 4), global batch 2 either way;
  // allgather_bucket_size: rank 0 receives 1M floats (4 MiB) per round of a save.
  std::string config(int world, int zero) const {
    const json c = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 4 / world},
                    {"train_batch_size", 2}, {"gradient_clipping", 1.0}, {"sequence_parallel_size", 2},
                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}},
                    {"compile", {{"deepcompile", true}, {"passes", {"autosp"}}, {"checkpoint", "none"}}},
                    {"zero_optimization", {{"stage", zero}, {"allgather_bucket_size", 1000000}}}};
    const std::string path = dir / str("z", zero, "_w", world, ".json");
    std::ofstream(path) << c.dump(2);
    return path;
  }
  std::string mpirun(int world, int zero, const std::string& args) const {
    return str(kMpiEnv, "timeout 300 ", AUTOSP_MPIEXEC, " -np ", world, " --oversubscribe ", AUTOSP_BINARY,
               " train --config ", config(world, zero), " --data ", dir / "tokens.bin", " ", args);
  }
};

TEST(ZeroCheckpointMemory, Stage3SaveAndLoadAtW4HoldNoExtraCopyOfTheModelOnAnyRank) {
  BigModel m;
  const double param_bytes = 4.0 * double(m.params);
  ASSERT_GT(param_bytes, 30e6) << "the model must be big enough that one copy stands out of the noise";
  // Bound: a save's rank 0 holds one round (world x round_elements = allgather_bucket_size =
  // 1M floats, 4 MiB) beyond its state, the other ranks nothing; reading fills buffers that
  // exist already, through no copy. A quarter of the parameters (9.8 MB) leaves room for
  // the allocator and MPI's buffers, and is far below what gathering would take: the
  // consolidated parameters and both moments, 3 x 39.4 MB, on every rank.
  const double bound = param_bytes / 4;
  const std::string ck1 = m.dir / "ck1", ck2 = m.dir / "ck2";
  auto first = run_command(m.mpirun(4, 3, str("--model ", m.dir / "model", " --seq-len ", kSeqLen,
                                              " --steps 1 --save ", ck1)));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Resumed (no whole copy of the state was ever in this process), trained, saved again.
  auto second = run_command(m.mpirun(4, 3, str("--resume ", ck1, " --steps 2 --save ", ck2, " --metrics ",
                                               m.dir / "m.jsonl")));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::cout << first.output << second.output;

  for (const auto& [output, what] : {std::pair{&first.output, "resident peak while saving"},
                                     std::pair{&second.output, "resident peak while reading"},
                                     std::pair{&second.output, "resident peak while saving"}}) {
    SCOPED_TRACE(what);
    const std::vector<double> growth = per_rank_bytes(*output, what);
    ASSERT_EQ(growth.size(), 4u) << *output;
    for (size_t r = 0; r < growth.size(); ++r) {
      std::printf("%s: rank %zu +%.2f MiB (parameters %.1f MiB, bound %.1f MiB)\n", what, r, growth[r] / 1048576,
                  param_bytes / 1048576, bound / 1048576);
      EXPECT_LT(growth[r], bound) << "rank " << r;
    }
  }
  // Opening a checkpoint reads no tensor: each rank reads its elements later, in the phase
  // measured above. (Measured here, in this process: loading used to read both files whole.)
  {
    const RssPhase phase;
    const train::LoadedCheckpoint c = train::load_checkpoint(ck2);
    EXPECT_EQ(c.state.step, 2);
    EXPECT_TRUE(c.state.params.empty() && c.state.exp_avg.empty() && c.state.stored != nullptr);
    std::printf("load_checkpoint: +%.2f MiB\n", double(phase.peak_growth()) / 1048576);
    EXPECT_LT(double(phase.peak_growth()), bound);
  }
  // The whole resumed run against its plan. The plan does not count MPI's temporaries for a
  // reduction call, which MpiCommunicator bounds (kMaxReductionCallBytes: at most 3 MiB, on
  // rank 0); 8 MiB, half of the 16 MiB embedding or head bucket, catches a bucket reduced in
  // one call, which put rank 0 at +32.5 MiB and rank 2 at +16.7 MiB above the plan (ranks 1
  // and 3 +0.6) before the calls were bounded.
  const auto metrics = read_metrics(m.dir / "m.jsonl");
  ASSERT_EQ(metrics.size(), 1u);
  const double planned = metrics[0]["planned_peak_bytes"].get<double>();
  for (size_t r = 0; r < 4; ++r) {
    const double measured = metrics[0]["rss_peak_bytes_per_rank"][r].get<double>() -
                            metrics[0]["rss_base_bytes_per_rank"][r].get<double>();
    std::printf("resumed run, rank %zu: resident peak above the start %.1f MiB, planned %.1f MiB\n", r,
                measured / 1048576, planned / 1048576);
    EXPECT_LT(measured, planned + 8 * 1048576.0) << "rank " << r;
  }
  // Both saves are plain Hugging Face checkpoints of the whole model.
  for (const std::string& ck : {ck1, ck2}) {
    const io::SafetensorsReader model(ck + "/model.safetensors");
    model.expect("model.embed_tokens.weight", {16384, 256});
    model.expect("lm_head.weight", {16384, 256});
    model.expect("model.layers.1.mlp.down_proj.weight", {256, 688});
    const io::SafetensorsReader moments(ck + "/optimizer.safetensors");
    moments.expect("exp_avg_sq.lm_head.weight", {16384, 256});
  }
  // ck2 continues at W = 2, stage 1, and at W = 4, stage 3, with the same next loss (fp32
  // reordering between the layouts).
  auto w2 = run_command(m.mpirun(2, 1, str("--resume ", ck2, " --steps 3 --metrics ", m.dir / "w2.jsonl")));
  ASSERT_EQ(w2.exit_code, 0) << w2.output;
  auto w4 = run_command(m.mpirun(4, 3, str("--resume ", ck2, " --steps 3 --metrics ", m.dir / "w4.jsonl")));
  ASSERT_EQ(w4.exit_code, 0) << w4.output;
  const double a = read_metrics(m.dir / "w4.jsonl").at(0)["loss"], b = read_metrics(m.dir / "w2.jsonl").at(0)["loss"];
  EXPECT_NEAR(b, a, 2e-6 * std::abs(a));
}

// `autosp train ARGS` on `world` ranks, after `rank0_setup` (shell) on rank 0. Each rank
// says how autosp ended on it ("rank 2 exited 1"), so that "every rank exited 1" is seen,
// not assumed (the wrapper itself exits 0: mpirun would otherwise kill the other ranks as
// soon as the first one exits non-zero). TCP only: a file-size limit in rank0_setup would
// also stop OpenMPI from sizing its shared-memory segment on rank 0 (it falls back, with a
// warning).
testing::ProcessResult train_on_each_rank(int world, const std::string& rank0_setup, const std::string& args) {
  const std::string rank_cmd = str("trap '' XFSZ; if [ \"$OMPI_COMM_WORLD_RANK\" = 0 ]; then ", rank0_setup,
                                   " :; fi; ", AUTOSP_BINARY, " train ", args,
                                   "; echo \"rank $OMPI_COMM_WORLD_RANK exited $?\"");
  return run_command(str(kMpiEnv, "timeout 120 ", AUTOSP_MPIEXEC, " -np ", world,
                         " --oversubscribe --mca btl self,tcp sh -c '",
                         std::regex_replace(rank_cmd, std::regex("'"), "'\\''"), "'"));
}

// Rank 0 cannot write past a file-size limit (as on a full disk) in the middle of
// model.safetensors, while the others are sending it their shards: every rank ends with
// the error (exit 1 on each, no hang, no abort), and the previous checkpoint is whole.
// What train_on_each_rank printed: every one of `world` ranks ended with `code`.
void expect_every_rank_exited(const testing::ProcessResult& r, int code, int world = 4) {
  for (int rank = 0; rank < world; ++rank)
    EXPECT_NE(r.output.find(str("rank ", rank, " exited ", code)), std::string::npos) << "rank " << rank << "\n"
                                                                                       << r.output;
}

// The reference Llama (tests/reference/llama_reference.py) in `dir`, and its DeepSpeed config
// for one sample per rank and step: micro batch 1, no accumulation, `world` samples a step.
json reference_config(const TempDir& dir, int world, int sp) {
  auto gen = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 1"));
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  json c = json::parse(std::ifstream(dir / "ds_config.json"));
  c["train_micro_batch_size_per_gpu"] = 1;
  c["gradient_accumulation_steps"] = 1;
  c["train_batch_size"] = world / sp;
  c["sequence_parallel_size"] = sp;
  return c;
}

TEST(ZeroCheckpointFailure, ARank0WriteFailureMidSaveStopsEveryRankAndKeepsThePreviousCheckpoint) {
  TempDir dir("zero_ckpt_fail");
  json c = reference_config(dir, 4, 2);
  ASSERT_FALSE(HasFailure());
  c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}};
  // 175 elements per rank and round: model.safetensors (19808 parameters) takes ~30 rounds.
  c["zero_optimization"] = {{"stage", 3}, {"allgather_bucket_size", 700}};
  std::ofstream(dir / "z3.json") << c.dump(2);
  const std::string ck = dir / "ck";
  auto launch = [&](const std::string& rank0_setup, const std::string& args) {
    return train_on_each_rank(4, rank0_setup, str("--config ", dir / "z3.json", " --data ", dir / "tokens.bin ", args));
  };
  auto r = launch("", str("--model ", dir.path(), " --seq-len 16 --steps 1 --save ", ck));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("rank 0 exited 0"), std::string::npos) << r.output;
  const auto model_bytes = std::filesystem::file_size(ck + "/model.safetensors");
  const std::string before = run_command(str("cat ", ck, "/trainer_state.json ", ck, "/manifest.json")).output;

  // ulimit -f counts blocks of 512 or 1024 bytes (by shell): a limit of half the file's
  // size in KiB lands a quarter or half-way into model.safetensors.
  r = launch(str("ulimit -f ", model_bytes / 2048, ";"), str("--resume ", ck, " --steps 2 --save ", ck));
  EXPECT_NE(r.exit_code, 124) << "the job hung\n" << r.output;
  expect_every_rank_exited(r, 1);
  EXPECT_NE(r.output.find("model.safetensors': cannot write temporary file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the previous checkpoint " + ck + " is untouched"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_Abort"), std::string::npos) << "a rank was aborted: not every rank saw the error\n"
                                                           << r.output;
  // The previous checkpoint, as it was, and nothing left beside it.
  auto verify = run_command(str(AUTOSP_BINARY, " verify ", ck));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_EQ(run_command(str("cat ", ck, "/trainer_state.json ", ck, "/manifest.json")).output, before);
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_FALSE(e.path().filename().string().starts_with("ck.autosp-")) << e.path();
  // And the run that could write finishes the job from it.
  r = launch("", str("--resume ", ck, " --steps 2 --save ", ck));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_every_rank_exited(r, 0);
}

// A resume verifies the checkpoint against its manifest once across the world: at W = 4
// each file is checksummed by one rank (the bytes the ranks read add up to the files'
// bytes, not 4 x), and a damaged file that rank 0 does not read ends every rank with exit 1
// and the message one process gives, printed once (the ranks agreed on it: no rank-local
// error, no abort). That every rank holds the same message, whichever rank found it, is
// checked on each rank by comm_mpi_main (tests/comm).
TEST(ZeroCheckpointVerify, AResumeAtW4ReadsEachByteOnceAndADamagedFileStopsEveryRankWithOneMessage) {
  TempDir dir("zero_ckpt_verify");
  std::filesystem::create_directories(dir / "model");
  std::ofstream(dir / "model/config.json") << models::llama_config_json(testing::tiny_llama(2, 11)).dump(2);
  std::vector<uint32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i * 7 % 11);
  io::write_tokens(dir / "tokens.bin", tokens);
  const json c = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1},
                  {"train_batch_size", 4}, {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  std::ofstream(dir / "c.json") << c.dump(2);
  const std::string ck = dir / "ck", common = str("--config ", dir / "c.json", " --data ", dir / "tokens.bin ");
  auto r = train_on_each_rank(4, "", common + str("--model ", dir / "model", " --seq-len 16 --steps 1 --save ", ck));
  expect_every_rank_exited(r, 0);

  // Intact: nothing to train (--steps 1), so the run only loads, and says what each rank read.
  r = train_on_each_rank(4, "", common + str("--resume ", ck, " --steps 1"));
  expect_every_rank_exited(r, 0);
  const std::string what = "bytes checksummed per rank:";
  const size_t at = r.output.find(what);
  ASSERT_NE(at, std::string::npos) << r.output;
  std::istringstream line(r.output.substr(at + what.size(), r.output.find('\n', at) - at - what.size()));
  std::vector<int64_t> read;
  for (int64_t b; line >> b;) read.push_back(b);
  const json manifest = json::parse(std::ifstream(ck + "/manifest.json"));
  int64_t listed = 0;
  for (const auto& [rel, entry] : manifest["files"].items()) listed += entry["bytes"].get<int64_t>();
  ASSERT_EQ(read.size(), 4u) << r.output;
  EXPECT_EQ(read[0] + read[1] + read[2] + read[3], listed) << r.output;
  const auto largest = std::filesystem::file_size(ck + "/optimizer.safetensors");
  for (int rank = 0; rank < 4; ++rank) EXPECT_LE(read[rank], int64_t(largest)) << "rank " << rank;

  // model.safetensors damaged: rank 1 reads it (rank 0 takes the largest file, the moments).
  const std::string model = ck + "/model.safetensors";
  std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(int64_t(std::filesystem::file_size(model)) - 5);
  f.put('\x7f');
  f.close();
  const std::string refusal = run_command(str(AUTOSP_BINARY, " verify ", ck)).output;
  const std::string message = str(model, ": checksum ");
  ASSERT_NE(refusal.find(message), std::string::npos) << refusal;
  const std::string says = refusal.substr(refusal.find(message), refusal.find('\n', refusal.find(message)) - refusal.find(message));
  r = train_on_each_rank(4, "", common + str("--resume ", ck, " --steps 2"));
  expect_every_rank_exited(r, 1);
  EXPECT_NE(r.output.find(str("autosp: error: --resume ", ck, ": ", says)), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(says), r.output.rfind(says)) << "printed more than once\n" << r.output;
  EXPECT_EQ(r.output.find("autosp: rank "), std::string::npos) << "an error only some ranks saw\n" << r.output;
  EXPECT_EQ(r.output.find("MPI_Abort"), std::string::npos) << r.output;
}

// Stages 0 and 1 under mpirun (stages 2 and 3: tests/sp/zero_sp_test.cpp): a checkpoint saved
// at W = 2 (DP 2) after 3 steps resumes with bitwise the uninterrupted run's next steps, so
// the moments streamed from the shards (stage 1: a shard of each gradient bucket of at most
// 700 elements, in rounds of 350) and the parameters rank 0 writes from its own copy are
// exactly the state.
class ZeroCheckpointResume : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCheckpointResume, AtW2ContinuesBitwise) {
  TempDir dir("zero_ckpt_resume");
  json c = reference_config(dir, 2, 1);
  ASSERT_FALSE(HasFailure());
  c["zero_optimization"] = {{"stage", GetParam()}, {"allgather_bucket_size", 700}, {"reduce_bucket_size", 700}};
  std::ofstream(dir / "z.json") << c.dump(2);
  auto run = [&](const std::string& args) {
    auto r = run_command(str(kMpiEnv, "timeout 120 ", AUTOSP_MPIEXEC, " -np 2 --oversubscribe ", AUTOSP_BINARY,
                             " train --config ", dir / "z.json", " --data ", dir / "tokens.bin", " ", args));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  };
  const std::string model = str("--model ", dir.path(), " --seq-len 16");
  run(str(model, " --steps 5 --metrics ", dir / "full.jsonl"));
  run(str(model, " --steps 3 --save ", dir / "ck"));
  run(str("--resume ", dir / "ck", " --steps 5 --metrics ", dir / "resumed.jsonl"));
  ASSERT_FALSE(HasFailure());
  const auto full = read_metrics(dir / "full.jsonl"), resumed = read_metrics(dir / "resumed.jsonl");
  ASSERT_EQ(full.size(), 5u);
  ASSERT_EQ(resumed.size(), 2u);
  for (int t = 3; t < 5; ++t) {
    EXPECT_EQ(resumed[t - 3]["loss"].get<double>(), full[t]["loss"].get<double>()) << "step " << t + 1;
    EXPECT_EQ(resumed[t - 3]["grad_norm"].get<double>(), full[t]["grad_norm"].get<double>()) << "step " << t + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroCheckpointResume, ::testing::Values(0, 1),
                         [](const auto& info) { return str("zero", info.param); });

// The tensor files are untrusted input: opening a checkpoint validates both headers against
// the model, naming the file, the tensor and the shapes (here in a checkpoint without a
// manifest, as an older autosp wrote them, so nothing else stops the damage first).
TEST(ZeroCheckpointLoad, AMisshapedOrMissingTensorIsAnErrorNamingFileTensorAndShape) {
  TempDir dir("zero_ckpt_bad");
  auto gen = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 1"));
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const std::string ck = dir / "ck";
  auto r = run_command(str(AUTOSP_BINARY, " train --config ", dir / "ds_config.json", " --model ", dir.path(),
                           " --data ", dir / "tokens.bin", " --seq-len 16 --steps 1 --save ", ck));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::remove(ck + "/manifest.json");
  json st = json::parse(std::ifstream(ck + "/trainer_state.json"));
  st.erase("manifest");
  std::ofstream(ck + "/trainer_state.json") << st.dump(2);
  ASSERT_EQ(train::load_checkpoint(ck).state.step, 1);  // still a valid checkpoint

  auto moments = io::read_safetensors(ck + "/optimizer.safetensors");
  auto rewrite = [&](const std::map<std::string, io::HostTensor>& tensors) {
    std::vector<std::pair<std::string, const io::HostTensor*>> list;
    for (const auto& [name, t] : tensors) list.emplace_back(name, &t);
    io::write_safetensors(ck + "/optimizer.safetensors", list);
  };
  auto error = [&] {
    try {
      train::load_checkpoint(ck);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto misshaped = moments;
  misshaped["exp_avg_sq.model.norm.weight"] = {{2, 16}, std::vector<float>(32, 0.0f)};
  rewrite(misshaped);
  EXPECT_EQ(error(), ck + "/optimizer.safetensors: tensor 'exp_avg_sq.model.norm.weight' has shape [2, 16], "
                          "expected [32]");
  auto missing = moments;
  missing.erase("exp_avg.model.layers.1.self_attn.k_proj.weight");
  rewrite(missing);
  EXPECT_EQ(error(), ck + "/optimizer.safetensors: missing tensor 'exp_avg.model.layers.1.self_attn.k_proj.weight'");
  // And through the CLI: exit 1, the same message.
  r = run_command(str(AUTOSP_BINARY, " train --config ", dir / "ds_config.json", " --data ", dir / "tokens.bin",
                      " --resume ", ck, " --steps 2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("missing tensor 'exp_avg.model.layers.1.self_attn.k_proj.weight'"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace autosp

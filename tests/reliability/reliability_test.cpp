// Reliability under real processes, real signals and real files (issue 12): preemption by
// SIGTERM/SIGUSR1, a rank that stops answering, checkpoints that are damaged or cut short by
// SIGKILL, and resumes that read exactly the samples an uninterrupted run would.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/tokens.h"
#include "models/llama.h"
#include "testing/background.h"
#include "testing/process.h"
#include "testing/tiny_llama.h"
#include "util/error.h"

namespace autosp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Background;
using testing::run_command;
using testing::TempDir;

// `env`: Background execs the command, and mpirun must be the process it waits for.
const char* kMpiEnv = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

std::vector<json> read_metrics(const std::string& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) lines.push_back(j);  // not a line SIGKILL cut short
  }
  return lines;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A tiny Llama (random init), 4000 random tokens and a DeepSpeed config: a step takes
// milliseconds, so a run is stopped mid-training by waiting for its metrics lines.
struct Tiny {
  TempDir dir{"reliability"};
  Tiny() {
    models::LlamaConfig model = testing::tiny_llama(2, 11);
    model.max_position_embeddings = 64;
    fs::create_directories(dir / "model");
    std::ofstream(dir / "model/config.json") << models::llama_config_json(model).dump(2);
    std::mt19937 rng(7);
    std::vector<uint32_t> tokens(4000);
    for (auto& t : tokens) t = rng() % 11;
    io::write_tokens(dir / "tokens.bin", tokens);
  }
  // micro batch 1; accumulation and SP as given; global batch = accumulation x DP.
  std::string config(const std::string& name, int accum, int sp = 1) const {
    json c = {{"train_micro_batch_size_per_gpu", 1},
              {"gradient_accumulation_steps", accum},
              {"gradient_clipping", 1.0},
              {"steps_per_print", 1000000},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}, {"warmup_max_lr", 1e-2}}}}}};
    if (sp > 1) {
      c["sequence_parallel_size"] = sp;
      c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}};
    }
    std::ofstream(dir / name) << c.dump(2);
    return dir / name;
  }
  std::string train(const std::string& config, const std::string& args) const {
    return str(AUTOSP_BINARY, " train --config ", config, " --data ", dir / "tokens.bin", " ", args);
  }
  std::string fresh(const std::string& config, const std::string& args) const {
    return train(config, str("--model ", dir / "model", " --seq-len 16 ", args));
  }
};

std::string mpirun(int np, const std::string& command, const std::string& mpirun_args = "") {
  return str(kMpiEnv, AUTOSP_MPIEXEC, " -np ", np, " --oversubscribe ", mpirun_args, " ", command);
}

int64_t checkpoint_step(const std::string& dir) { return read_json(dir + "/trainer_state.json")["step"]; }

// The numbers of a step that must not move when a run is stopped and resumed.
void expect_same_curve(const std::vector<json>& got, const std::vector<json>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    for (const char* key : {"step", "loss", "lr", "grad_norm", "consumed_samples", "epoch"})
      EXPECT_EQ(got[i][key], want[i][key]) << key << " at line " << i + 1;
}

// Preempts a 2-rank run after a few steps by `deliver` (SIGTERM to each rank, as SLURM
// does, or SIGUSR1 to mpirun, which forwards it), then resumes it and compares its metrics
// with a run that was never interrupted, over the same steps.
void preempt_and_resume(const Tiny& t, const std::string& config, const std::function<void(Background&)>& deliver,
                        const std::string& signal_name) {
  const std::string ck = t.dir / "ck", metrics = t.dir / "m.jsonl", log = t.dir / "run.log";
  Background run(mpirun(2, t.fresh(config, str("--steps 1000000 --save ", ck, " --metrics ", metrics))), log);
  ASSERT_TRUE(testing::wait_for_lines(metrics, 3, run, 120)) << run.output();
  ASSERT_EQ(run.children("autosp").size(), 2u);
  deliver(run);
  // Bounded: the step in flight, one save of a tiny model.
  const int rc = run.wait_for(60);
  const std::string out = run.output();
  ASSERT_EQ(rc, 0) << out;
  const auto interrupted = read_metrics(metrics);
  const int64_t k = interrupted.back()["step"];
  EXPECT_GE(k, 3);
  EXPECT_NE(out.find(str(signal_name, ": stopped after step ", k, " of 1000000; checkpoint saved to ", ck)),
            std::string::npos) << out;
  EXPECT_EQ(checkpoint_step(ck), k) << "the checkpoint is at the step the run stopped after";
  EXPECT_EQ(read_json(ck + "/trainer_state.json")["consumed_samples"], interrupted.back()["consumed_samples"]);

  // Resume for 3 more steps; the uninterrupted run trains the same k + 3 from scratch.
  auto r = run_command(str("timeout 120 ", mpirun(2, t.train(config, str("--resume ", ck, " --steps ", k + 3,
                                                                          " --metrics ", metrics)))));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(str("timeout 120 ", mpirun(2, t.fresh(config, str("--steps ", k + 3, " --metrics ",
                                                                    t.dir / "reference.jsonl")))));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resumed = read_metrics(metrics), reference = read_metrics(t.dir / "reference.jsonl");
  ASSERT_EQ(reference.size(), size_t(k + 3));
  expect_same_curve(resumed, reference);
}

// Data parallel 2 x accumulation 2 (global batch 4): each rank reads its own samples.
TEST(Preemption, SigtermToEachRankSavesThatStepAndTheResumedCurveIsTheUninterruptedOne) {
  Tiny t;
  preempt_and_resume(t, t.config("dp2_ga2.json", 2), [](Background& run) {
    for (pid_t rank : run.children("autosp")) ::kill(rank, SIGTERM);
  }, "SIGTERM");
}

// Sequence parallel 2 x accumulation 2: both ranks read the same samples, each half of them.
TEST(Preemption, SigusrToMpirunReachesEveryRankAndTheResumedCurveIsTheUninterruptedOne) {
  Tiny t;
  preempt_and_resume(t, t.config("sp2_ga2.json", 2, 2), [](Background& run) { run.signal(SIGUSR1); }, "SIGUSR1");
}

TEST(Preemption, WithoutSaveTheRunSaysNothingWasSavedAndExitsWith128PlusTheSignal) {
  Tiny t;
  const std::string metrics = t.dir / "m.jsonl";
  Background run(t.fresh(t.config("c.json", 1), str("--steps 1000000 --metrics ", metrics)), t.dir / "run.log");
  ASSERT_TRUE(testing::wait_for_lines(metrics, 2, run, 60)) << run.output();
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait_for(60), 128 + SIGTERM) << run.output();
  EXPECT_NE(run.output().find("no --save was given, so no checkpoint was written"), std::string::npos) << run.output();
}

TEST(Preemption, ASecondSignalExitsAtOnce) {
  Tiny t;
  const std::string metrics = t.dir / "m.jsonl";
  Background run(t.fresh(t.config("c.json", 1), str("--steps 1000000 --save-every 1000 --save ", t.dir / "ck",
                                                   " --metrics ", metrics)),
                 t.dir / "run.log");
  ASSERT_TRUE(testing::wait_for_lines(metrics, 2, run, 60)) << run.output();
  // Two different signals, so that both are delivered (two pending SIGTERMs are one).
  run.signal(SIGUSR1);
  run.signal(SIGTERM);
  const int rc = run.wait_for(60);  // 128 + whichever of the two was delivered second
  EXPECT_TRUE(rc == 128 + SIGTERM || rc == 128 + SIGUSR1) << rc << "\n" << run.output();
  EXPECT_EQ(run.output().find("stopped after step"), std::string::npos) << run.output();
  EXPECT_NE(run.output().find("second stop signal: exiting now, without a checkpoint"), std::string::npos)
      << run.output();
}

// One rank stopped (SIGSTOP) mid-training: the other's next collective makes no progress,
// and the job ends within --comm-timeout plus a few seconds, naming the collective.
TEST(HungRank, ASigstoppedRankEndsTheJobWithinTheTimeoutNamingTheCollective) {
  Tiny t;
  const std::string metrics = t.dir / "m.jsonl";
  Background run(mpirun(2, t.fresh(t.config("dp2.json", 1), str("--steps 1000000 --comm-timeout 3 --metrics ", metrics))),
                 t.dir / "run.log");
  ASSERT_TRUE(testing::wait_for_lines(metrics, 2, run, 120)) << run.output();
  const std::vector<pid_t> ranks = run.children("autosp");
  ASSERT_EQ(ranks.size(), 2u);
  pid_t stopped = -1;  // world rank 1, by its environment
  for (pid_t rank : ranks) {
    std::ifstream in(str("/proc/", rank, "/environ"));
    const std::string env(std::istreambuf_iterator<char>(in), {});
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos) stopped = rank;
  }
  ASSERT_NE(stopped, -1);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  const int rc = run.wait_for(30);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(stopped, SIGKILL);  // if mpirun left it behind
  const std::string out = run.output();
  ASSERT_NE(rc, -1) << "the job still runs " << took << " s after a rank was stopped:\n" << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_LT(took, 3 + 10.0) << out;
  EXPECT_GE(took, 3.0) << out;
  EXPECT_NE(out.find("made no progress for 3 s (--comm-timeout) on world rank 0"), std::string::npos) << out;
  EXPECT_NE(out.find("autosp: rank 0: error: MPI_I"), std::string::npos) << out;  // the MPI call
  EXPECT_NE(out.find(") on "), std::string::npos) << out;                          // and the group
}

// Data order: 4 ranks as data parallel 2 x sequence parallel 2, accumulation 2 (global
// batch 4). Stopped at step 3 (--steps) and resumed to step 6, the run reads the samples and
// gets the losses of a run that went to step 6 at once: consumed_samples step by step, and
// the losses bit for bit.
TEST(DataOrder, AStopAndResumeUnderDataTimesSequenceParallelReadsWhatAnUninterruptedRunReads) {
  Tiny t;
  const std::string config = t.config("dp2_sp2_ga2.json", 2, 2), ck = t.dir / "ck", metrics = t.dir / "m.jsonl";
  auto run = [&](const std::string& args) {
    auto r = run_command(str("timeout 180 ", mpirun(4, t.train(config, args))));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r;
  };
  run(str("--model ", t.dir / "model", " --seq-len 16 --steps 3 --save ", ck, " --metrics ", metrics));
  EXPECT_EQ(read_json(ck + "/trainer_state.json")["consumed_samples"], 12);
  const auto resumed = run(str("--resume ", ck, " --steps 6 --metrics ", metrics));
  EXPECT_NE(resumed.output.find("continuing with sample 12"), std::string::npos) << resumed.output;
  run(str("--model ", t.dir / "model", " --seq-len 16 --steps 6 --metrics ", t.dir / "reference.jsonl"));
  const auto got = read_metrics(metrics), want = read_metrics(t.dir / "reference.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(want[i]["consumed_samples"], 4 * (i + 1));
  expect_same_curve(got, want);
}

// --- verified checkpoints -------------------------------------------------------------

void flip_byte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x01));
}

TEST(VerifiedCheckpoint, EveryDamagedVariantIsRefusedByResumeAndVerifyNamingTheFile) {
  Tiny t;
  const std::string config = t.config("c.json", 1), ck = t.dir / "ck", ck1 = t.dir / "ck1";
  ASSERT_EQ(run_command(t.fresh(config, str("--steps 1 --save ", ck1))).exit_code, 0);
  auto r = run_command(t.fresh(config, str("--steps 2 --save ", ck)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(ck + "/manifest.json"));
  r = run_command(str(AUTOSP_BINARY, " verify ", ck));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verified"), std::string::npos) << r.output;
  // The manifest covers every other file.
  const json manifest = read_json(ck + "/manifest.json");
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"})
    EXPECT_TRUE(manifest["files"].contains(f)) << f;

  struct Variant {
    std::string name;
    std::function<void(const std::string&)> damage;
    std::string file, says;  // what the refusal names
  };
  const std::vector<Variant> variants = {
      {"truncated", [](const std::string& d) { fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 7); },
       "model.safetensors", "(truncated)"},
      {"grown", [](const std::string& d) { std::ofstream(d + "/optimizer.safetensors", std::ios::app) << "x"; },
       "optimizer.safetensors", "bytes, but the manifest says"},
      {"flipped_byte_in_data", [](const std::string& d) { flip_byte(d + "/optimizer.safetensors", int64_t(fs::file_size(d + "/optimizer.safetensors")) - 3); },
       "optimizer.safetensors", "differs from the manifest"},
      {"flipped_byte_in_state", [](const std::string& d) { flip_byte(d + "/trainer_state.json", 20); },
       "trainer_state.json", "differs from the manifest"},
      {"missing_file", [](const std::string& d) { fs::remove(d + "/config.json"); }, "config.json", "missing"},
      {"missing_manifest", [](const std::string& d) { fs::remove(d + "/manifest.json"); }, "manifest.json", "missing"},
      {"manifest_of_another_checkpoint", [&](const std::string& d) { fs::copy_file(ck1 + "/manifest.json", d + "/manifest.json", fs::copy_options::overwrite_existing); },
       ".safetensors", "differs from the manifest"},
      {"manifest_not_json", [](const std::string& d) { std::ofstream(d + "/manifest.json") << "{\"format\": "; }, "manifest.json", "JSON"},
  };
  // Not damage: a file the user added (the manifest vouches for autosp's files only).
  std::ofstream(ck + "/notes.txt") << "mine";
  r = run_command(str(AUTOSP_BINARY, " verify ", ck));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("notes.txt: not listed in the checkpoint's manifest"), std::string::npos) << r.output;
  fs::remove(ck + "/notes.txt");

  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    const std::string bad = t.dir / ("bad_" + v.name);
    fs::copy(ck, bad);
    v.damage(bad);
    auto verify = run_command(str(AUTOSP_BINARY, " verify ", bad));
    EXPECT_EQ(verify.exit_code, 1) << verify.output;
    EXPECT_NE(verify.output.find("autosp: error: autosp verify " + bad), std::string::npos) << verify.output;
    EXPECT_NE(verify.output.find(v.file), std::string::npos) << verify.output;
    EXPECT_NE(verify.output.find(v.says), std::string::npos) << verify.output;
    auto resume = run_command(t.train(config, str("--resume ", bad, " --steps 3")));
    EXPECT_EQ(resume.exit_code, 1) << resume.output;
    EXPECT_NE(resume.output.find("autosp: error: --resume " + bad), std::string::npos) << resume.output;
    EXPECT_NE(resume.output.find(v.file), std::string::npos) << resume.output;
    EXPECT_NE(resume.output.find(v.says), std::string::npos) << resume.output;
    EXPECT_EQ(resume.output.find("step 3/3"), std::string::npos) << "trained from a damaged checkpoint";
  }
}

// SIGKILL at a random moment of a run that saves after every step, 20 times, each run
// resuming from what the last one left: every time, the checkpoint verifies, is at the last
// or the one before the last step the run logged, and the next run resumes from it.
TEST(VerifiedCheckpoint, ARunKilledDuringSavesAlwaysLeavesTheLastCompleteCheckpoint) {
  Tiny t;
  const std::string config = t.config("c.json", 1), ck = t.dir / "ck", metrics = t.dir / "m.jsonl";
  std::mt19937 rng(12);
  int mid_save = 0;  // kills that left a save's scratch directory behind
  int64_t last_step = 0;
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(str("kill ", i + 1));
    const std::string from = fs::exists(ck) ? str("--resume ", ck) : str("--model ", t.dir / "model", " --seq-len 16");
    Background run(t.train(config, str(from, " --steps 1000000 --save-every 1 --save ", ck, " --metrics ", metrics)),
                   t.dir / "run.log");
    // Past the first save of this run; a step's metrics line is written just before its
    // save starts, so a kill 0-4 ms after a new line lands at a random point of that save
    // (or, when the save is quicker, of the next step).
    ASSERT_TRUE(testing::wait_for_lines(metrics, int(last_step) + 2, run, 60)) << run.output();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    run.signal(SIGKILL);
    ASSERT_EQ(run.wait_for(30), 128 + SIGKILL);
    for (const auto& e : fs::directory_iterator(t.dir.path()))
      if (e.path().filename().string().starts_with("ck.autosp-")) {
        ++mid_save;
        fs::remove_all(e.path());  // (the next run would remove it, its writer being gone; the test tidies)
        break;
      }
    auto verify = run_command(str(AUTOSP_BINARY, " verify ", ck));
    ASSERT_EQ(verify.exit_code, 0) << verify.output;
    const int64_t step = checkpoint_step(ck);
    const int64_t logged = read_metrics(metrics).back()["step"];
    EXPECT_GE(step, logged - 1);
    EXPECT_LE(step, logged);
    EXPECT_GT(step, last_step) << "each run saved at least one step more";
    last_step = step;
  }
  // The kills did land inside saves (18-19 of 20 when this was written).
  std::cout << "kills that interrupted a save: " << mid_save << " of 20\n";
  EXPECT_GE(mid_save, 10);
  auto r = run_command(t.train(config, str("--resume ", ck, " --steps ", last_step + 1, " --metrics ", metrics)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto m = read_metrics(metrics);
  ASSERT_EQ(m.size(), size_t(last_step + 1));
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["step"], int64_t(i + 1)) << "every step once";
}

// A save that fails part-way (here: the file-size limit, as a full disk would) leaves the
// previous checkpoint whole and says so.
TEST(VerifiedCheckpoint, ASaveThatFailsPartWayLeavesTheLastGoodCheckpointAndSaysSo) {
  Tiny t;
  const std::string config = t.config("c.json", 1), ck = t.dir / "ck";
  auto r = run_command(t.fresh(config, str("--steps 2 --save ", ck)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // A file-size limit (ulimit -f: blocks of 512 or 1024 bytes, by shell) below the size of
  // the optimizer state: some file of the save cannot be written whole.
  const auto limit_blocks = fs::file_size(ck + "/optimizer.safetensors") / 1024;
  r = run_command(str("trap '' XFSZ; ulimit -f ", limit_blocks, "; ", t.train(config, str("--resume ", ck, " --steps 4 --save ", ck))));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(".safetensors': cannot write temporary file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the previous checkpoint " + ck + " is untouched"), std::string::npos) << r.output;
  r = run_command(str(AUTOSP_BINARY, " verify ", ck));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoint_step(ck), 2);
}

}  // namespace
}  // namespace autosp

// Saves that never cost the user a file, and resumes that never silently replay or skip
// data: through the real CLI (under mpirun where the ranks must agree) on real files, and
// in process where the test must see exactly which samples a step read.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/tokens.h"
#include "train/data.h"
#include "testing/process.h"
#include "models/llama.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"
#include "testing/tiny_llama.h"
#include "testing/compare.h"

namespace autosp {
namespace {

using testing::read_metrics;

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The reference setup (tests/reference): model dir with config.json, model.safetensors,
// tokens.bin (13 samples of 16 tokens) and ds_config.json (global batch 4).
struct RunSetup {
  TempDir dir{"save_resume"};
  RunSetup() {
    auto r = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  // A copy of ds_config.json with the given batch layout.
  std::string config(const std::string& name, int micro, int accum, int dp) const {
    std::ifstream in(dir / "ds_config.json");
    json c = json::parse(in);
    c["train_micro_batch_size_per_gpu"] = micro;
    c["gradient_accumulation_steps"] = accum;
    c["train_batch_size"] = micro * accum * dp;
    c["steps_per_print"] = 1;
    std::ofstream(dir / name) << c.dump(2);
    return dir / name;
  }
  std::string train(const std::string& args, const std::string& config = "") const {
    return str(AUTOSP_BINARY, " train --config ", config.empty() ? dir / "ds_config.json" : config, " --data ",
               dir / "tokens.bin", " ", args);
  }
  std::string fresh(const std::string& args, const std::string& config = "") const {
    return train(str("--model ", dir.path(), " --seq-len 16 ", args), config);
  }
};

testing::ProcessResult mpirun(int np, const std::string& command) {
  return run_command(str(kMpiEnv, "timeout 120 ", AUTOSP_MPIEXEC, " -np ", np, " --oversubscribe ", command));
}

// A run refused at start-up: exit 1, one error line naming `fragment`, no step trained.
void expect_refused(const testing::ProcessResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("autosp: error: --save"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained before refusing:\n" << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
}

TEST(SaveTarget, ADirectoryWithAUserFileIsRefusedBeforeStepOneOnEveryRank) {
  RunSetup s;
  const std::string user = s.dir / "userdir";
  fs::create_directories(user + "/sub");
  std::ofstream(user + "/notes.txt") << "my notes";
  const std::string config = s.config("dp2.json", 1, 1, 2);
  auto r = mpirun(2, s.fresh(str("--steps 2 --save ", user), config));
  expect_refused(r, "not a file of an autosp checkpoint");
  EXPECT_EQ(slurp(user + "/notes.txt"), "my notes");
  EXPECT_TRUE(fs::is_directory(user + "/sub"));
  EXPECT_EQ(std::distance(fs::directory_iterator(user), fs::directory_iterator()), 2);
}

TEST(SaveTarget, TheModelDirectoryAFileAndTheWorkingDirectoryAreRefused) {
  RunSetup s;
  const std::string before = slurp(s.dir / "tokens.bin");
  expect_refused(run_command(s.fresh(str("--steps 1 --save ", s.dir.path()))), "tokens.bin");
  EXPECT_EQ(slurp(s.dir / "tokens.bin"), before);
  EXPECT_TRUE(fs::exists(s.dir / "ds_config.json"));

  std::ofstream(s.dir / "afile.txt") << "keep";
  expect_refused(run_command(s.fresh(str("--steps 1 --save ", s.dir / "afile.txt"))), "not a directory");
  EXPECT_EQ(slurp(s.dir / "afile.txt"), "keep");

  const auto entries = std::distance(fs::directory_iterator(s.dir.path()), fs::directory_iterator());
  expect_refused(run_command(str("cd ", s.dir.path(), " && ", s.fresh("--steps 1 --save ."))), "--save .");
  expect_refused(run_command(str("cd ", s.dir.path(), " && ", s.fresh(str("--steps 1 --save ../", fs::path(s.dir.path()).filename().string())))),
                 "working directory");
  // Nothing was left behind (the old code left a `..tmp` checkpoint).
  EXPECT_EQ(std::distance(fs::directory_iterator(s.dir.path()), fs::directory_iterator()), entries);

  // A parent that cannot take the scratch directory fails at start-up too.
  expect_refused(run_command(s.fresh("--steps 1 --save /proc/autosp_ck")), "scratch directory");
}

TEST(SaveTarget, ReplacesOnlyItsOwnCheckpointAndLeavesTheUsersOldAndTmpAlone) {
  RunSetup s;
  const std::string ck = s.dir / "ck";
  for (const char* d : {"ck.old", "ck.tmp"}) {
    fs::create_directories(s.dir / d);
    std::ofstream(s.dir / d + "/mine.txt") << d;
  }
  // Three saves: the first creates ck, the next two replace it.
  auto r = run_command(s.fresh(str("--steps 3 --save-every 1 --save ", ck)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(s.dir / "ck.old/mine.txt"), "ck.old");
  EXPECT_EQ(slurp(s.dir / "ck.tmp/mine.txt"), "ck.tmp");
  EXPECT_EQ(train::load_checkpoint(ck).state.step, 3);
  for (const auto& e : fs::directory_iterator(s.dir.path()))
    EXPECT_FALSE(e.path().filename().string().starts_with("ck.autosp-")) << "scratch left: " << e.path();

  // A user file put into the checkpoint afterwards makes it the user's: not replaced.
  std::ofstream(ck + "/README.md") << "notes";
  expect_refused(run_command(s.train(str("--resume ", ck, " --steps 4 --save ", ck))), "README.md");
  EXPECT_EQ(slurp(ck + "/README.md"), "notes");

  // An empty directory may take a checkpoint.
  fs::create_directories(s.dir / "empty");
  r = run_command(s.fresh(str("--steps 1 --save ", s.dir / "empty")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(train::load_checkpoint(s.dir / "empty").state.step, 1);
}

// The scratch directory a save killed mid-way (kill -9) leaves: the next save to the same DIR
// removes it when its writer is provably gone (this host, this pid namespace, no such
// process) and it cannot hold the newest checkpoint; any other it leaves, saying why and that
// it is autosp's and safe to delete once its run has ended.
TEST(SaveTarget, ScratchOfADeadRunOnThisHostIsRemovedAndAnyOtherIsExplained) {
  TempDir dir("scratch");
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string ns_link = fs::read_symlink("/proc/self/ns/pid").string();  // "pid:[4026531836]"
  const std::string ns = ns_link.substr(ns_link.find('[') + 1, ns_link.find(']') - ns_link.find('[') - 1);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);  // reaped: no process has this pid now
  auto scratch = [&](const std::string& ck, const char* kind, const std::string& run) {
    const std::string path = str(ck, ".autosp-", kind, ".", run);
    fs::create_directories(path + "/sub");
    std::ofstream(path + "/sub/model.safetensors") << "half a save";
    return path;
  };
  auto mentions = [](const std::vector<std::string>& w, const std::string& path, const std::string& what) {
    for (const std::string& line : w)
      if (line.find(path) != std::string::npos && line.find(what) != std::string::npos) return true;
    return false;
  };
  const std::string me = str(dead, "-0000000a-", ns, "@", host);

  // DIR holds a checkpoint (a newer one than any scratch beside it).
  const std::string ck = dir / "ck";
  fs::create_directories(ck);
  std::ofstream(ck + "/trainer_state.json") << R"({"format": "autosp checkpoint", "step": 3})";
  const std::string dead_tmp = scratch(ck, "tmp", me), dead_old = scratch(ck, "old", me),
                    live = scratch(ck, "tmp", str(getpid(), "-0000000b-", ns, "@", host)),
                    elsewhere = scratch(ck, "tmp", str(dead, "-0000000c-", ns, "@not-", host)),
                    container = scratch(ck, "tmp", str(dead, "-0000000d-1@", host)),
                    legacy = scratch(ck, "tmp", str(dead, "-0000000e"));
  std::vector<std::string> w;
  train::SaveTarget target(ck, &w);
  EXPECT_FALSE(fs::exists(dead_tmp));
  EXPECT_FALSE(fs::exists(dead_old));
  EXPECT_TRUE(mentions(w, dead_tmp, "removed")) << ::testing::PrintToString(w);
  EXPECT_TRUE(mentions(w, dead_old, "removed")) << ::testing::PrintToString(w);
  const std::vector<std::pair<std::string, std::string>> kept = {{live, "is still running"},
                                                                 {elsewhere, str("host not-", host)},
                                                                 {container, "another pid namespace"},
                                                                 {legacy, "an older autosp's"}};
  for (const auto& [path, why] : kept) {
    EXPECT_TRUE(fs::exists(path + "/sub/model.safetensors")) << path;
    EXPECT_TRUE(mentions(w, path, why)) << path << "\n" << ::testing::PrintToString(w);
    EXPECT_TRUE(mentions(w, path, "scratch directory of an autosp save")) << path;
    EXPECT_TRUE(mentions(w, path, "safe to delete once that run has ended")) << path;
  }
  EXPECT_EQ(w.size(), 6u) << ::testing::PrintToString(w);
  // This run's own scratch directory names its writer the same way.
  const std::string mine = target.begin_save();
  EXPECT_TRUE(fs::path(mine).filename().string().starts_with(str("ck.autosp-tmp.", getpid(), "-"))) << mine;
  EXPECT_TRUE(mine.ends_with(str("-", ns, "@", host))) << mine;
  target.abandon_save();

  // DIR missing: a dead run's complete new checkpoint (it has its manifest) and the previous
  // one it had moved aside are all there is, so both stay; its incomplete one goes.
  const std::string gone = dir / "gone";
  const std::string complete = scratch(gone, "tmp", me), previous = scratch(gone, "old", me),
                    partial = scratch(gone, "tmp", str(dead, "-0000000f-", ns, "@", host));
  std::ofstream(complete + "/manifest.json") << "{}";
  w.clear();
  train::SaveTarget second(gone, &w);
  EXPECT_TRUE(fs::exists(complete));
  EXPECT_TRUE(fs::exists(previous));
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(mentions(w, complete, "may be the newest one")) << ::testing::PrintToString(w);
  EXPECT_TRUE(mentions(w, previous, "falls back to")) << ::testing::PrintToString(w);
}

// Records which global samples were read, in order.
class RecordingSource final : public train::DataSource {
 public:
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    read.push_back(sample);
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>((sample + i) % 7);
      labels[i] = static_cast<int32_t>((sample + i + 1) % 7);
    }
  }
  std::string describe(int64_t) const override { return "recording"; }
  int64_t num_samples(int64_t) const override { return samples; }
  int64_t samples = 0;  // 0: endless
  mutable std::vector<int64_t> read;
};

// A one-rank config with this batch layout (micro batch x accumulation steps).
train::TrainConfig batch_config(int micro, int accum) {
  train::TrainConfig c;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accum;
  train::resolve_batch(c, 1, "test");
  return c;
}

TEST(Trainer, EachStepReadsTheSamplesAfterTheConsumedOnesWhateverTheBatchLayout) {
  const models::LlamaConfig model = testing::tiny_llama(1, 7);
  RecordingSource data;
  train::Trainer a(model, batch_config(2, 1), 6, train::ModelState::initial(model, 3));
  a.train_step(data);
  a.train_step(data);
  EXPECT_EQ(data.read, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.state().consumed_samples, 4);

  // Resumed with global batch 3 (micro 1 x accumulation 3): samples 4, 5, 6, then 7, 8, 9.
  data.read.clear();
  train::Trainer b(model, batch_config(1, 3), 6, a.state());
  train::StepStats s = b.train_step(data);
  EXPECT_EQ(s.first_sample, 4);
  EXPECT_EQ(s.consumed_samples, 7);
  b.train_step(data);
  EXPECT_EQ(data.read, (std::vector<int64_t>{4, 5, 6, 7, 8, 9}));
}

TEST(Trainer, AShuffledRunReadsEachEpochsPermutationInOrderWhateverTheBatchLayout) {
  const models::LlamaConfig model = testing::tiny_llama(1, 7);
  auto inner = std::make_unique<RecordingSource>();
  inner->samples = 5;
  RecordingSource& file = *inner;
  train::DataConfig order;
  order.seed = 11;
  const std::unique_ptr<train::DataSource> data = train::order_samples(std::move(inner), order);
  // Steps of 2, then of 3 (a resume at another layout): 10 samples, two whole epochs of 5.
  train::Trainer a(model, batch_config(2, 1), 6, train::ModelState::initial(model, 3));
  a.train_step(*data);
  a.train_step(*data);
  train::Trainer b(model, batch_config(1, 3), 6, a.state());
  b.train_step(*data);
  b.train_step(*data);
  std::vector<int64_t> want;
  for (int64_t g = 0; g < 10; ++g) want.push_back(train::shuffled_sample(11, g / 5, 5, g % 5));
  EXPECT_EQ(file.read, want);
  for (int epoch : {0, 1}) {  // each epoch all five samples, once
    std::set<int64_t> seen(file.read.begin() + 5 * epoch, file.read.begin() + 5 * epoch + 5);
    EXPECT_EQ(seen.size(), 5u) << "epoch " << epoch;
  }
  EXPECT_NE(std::vector<int64_t>(want.begin(), want.begin() + 5), std::vector<int64_t>(want.begin() + 5, want.end()));
}

// The shuffled order through the CLI: a run of 8 steps at 2 ranks (data parallel), stopped
// after 3 and resumed at 2 ranks, continues with bitwise the uninterrupted curve; resumed at
// 1 rank (the same global batch 4 as micro 2 x accumulation 2) it reads the same samples
// (the same consumed counts, the loss within float32 reduction order of the 2-rank run's).
// 8 steps of 4 read 32 samples of the 13: three epochs, each its own permutation.
TEST(Resume, AShuffledRunResumedAtAnyWorldSizeReadsTheUninterruptedSequence) {
  RunSetup s;
  auto shuffled = [&](const std::string& name, int micro, int accum, int dp, int seed) {
    const std::string path = s.config(name, micro, accum, dp);
    std::ifstream in(path);
    json c = json::parse(in);
    c["data"] = {{"seed", seed}};  // data.shuffle defaults to true
    std::ofstream(path) << c.dump(2);
    return path;
  };
  const std::string dp2 = shuffled("dp2.json", 1, 2, 2, 11), w1 = shuffled("w1.json", 2, 2, 1, 11);
  const std::string ck = s.dir / "ck";
  auto r = mpirun(2, s.fresh(str("--steps 8 --metrics ", s.dir / "full.jsonl"), dp2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data order: shuffled (seed 11, a new permutation each epoch)"), std::string::npos)
      << r.output;
  r = mpirun(2, s.fresh(str("--steps 3 --save ", ck, " --metrics ", s.dir / "first.jsonl"), dp2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const train::LoadedCheckpoint c = train::load_checkpoint(ck);
  EXPECT_TRUE(c.info.order.shuffle);
  EXPECT_EQ(c.info.order.seed, 11u);
  EXPECT_EQ(c.state.consumed_samples, 12);
  r = mpirun(2, s.train(str("--resume ", ck, " --steps 8 --metrics ", s.dir / "w2.jsonl"), dp2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(s.train(str("--resume ", ck, " --steps 8 --metrics ", s.dir / "w1.jsonl"), w1));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("continuing with sample 12, the first this model has not seen"), std::string::npos)
      << r.output;
  const auto full = read_metrics(s.dir / "full.jsonl"), first = read_metrics(s.dir / "first.jsonl"),
             again = read_metrics(s.dir / "w2.jsonl"), one = read_metrics(s.dir / "w1.jsonl");
  ASSERT_EQ(full.size(), 8u);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(again.size(), 5u);
  ASSERT_EQ(one.size(), 5u);
  for (int t = 0; t < 8; ++t) {
    SCOPED_TRACE(str("step ", t + 1));
    const json& resumed = t < 3 ? first[t] : again[t - 3];
    EXPECT_EQ(resumed["step"], full[t]["step"]);
    EXPECT_EQ(resumed["consumed_samples"], full[t]["consumed_samples"]);
    EXPECT_EQ(resumed["loss"].get<double>(), full[t]["loss"].get<double>());
    EXPECT_EQ(resumed["grad_norm"].get<double>(), full[t]["grad_norm"].get<double>());
    if (t < 3) continue;
    EXPECT_EQ(one[t - 3]["consumed_samples"], full[t]["consumed_samples"]);
    // One rank sums the same rows in another order: observed relative differences at most
    // 3.0e-8. 1e-6 (the Llama reference tests' loss tolerance) leaves 30x for other BLAS
    // blockings and is still far below what another sample's loss would differ by.
    EXPECT_NEAR(one[t - 3]["loss"].get<double>(), full[t]["loss"].get<double>(), 1e-6 * full[t]["loss"].get<double>());
  }
  // Another seed, or file order, on the same data would read the rest of the epoch wrongly:
  // refused, naming both orders, unless --allow-new-data.
  const std::string seed12 = shuffled("seed12.json", 2, 2, 1, 12);
  r = run_command(s.train(str("--resume ", ck, " --steps 4"), seed12));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the checkpoint read its data shuffled with data.seed 11, and " + seed12 +
                          " asks for it shuffled with data.seed 12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--allow-new-data"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 4/"), std::string::npos) << r.output;
  r = run_command(s.train(str("--resume ", ck, " --steps 4"), s.config("in_order.json", 2, 2, 1)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("asks for it in file order (data.shuffle false)"), std::string::npos) << r.output;
  r = run_command(s.train(str("--resume ", ck, " --steps 4 --allow-new-data --metrics ", s.dir / "new.jsonl"), seed12));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--allow-new-data: continuing at sample 12 in the new order"), std::string::npos)
      << r.output;
  const auto m = read_metrics(s.dir / "new.jsonl");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["consumed_samples"], 16);
}

TEST(Resume, ABatchChangeFromTwoReplicasToOneContinuesAtTheNextUnseenSample) {
  RunSetup s;
  const std::string ck = s.dir / "ck";
  // Data parallel 2, global batch 2: steps 1-2 read samples 0-3.
  auto r = mpirun(2, s.fresh(str("--steps 2 --save ", ck, " --metrics ", s.dir / "m.jsonl"),
                             s.config("dp2.json", 1, 1, 2)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(train::load_checkpoint(ck).state.consumed_samples, 4);
  // One process, global batch 1: steps 3-4 read samples 4 and 5.
  r = run_command(s.train(str("--resume ", ck, " --steps 4 --metrics ", s.dir / "m.jsonl"), s.config("b1.json", 1, 1, 1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the batch layout changed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("continuing with sample 4"), std::string::npos) << r.output;
  const auto m = read_metrics(s.dir / "m.jsonl");
  ASSERT_EQ(m.size(), 4u);
  const int64_t consumed[] = {2, 4, 5, 6};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m[i]["step"], i + 1);
    EXPECT_EQ(m[i]["consumed_samples"], consumed[i]) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(m[i]["epoch"].get<double>(), consumed[i] / 13.0);  // 13 samples in tokens.bin
  }
}

TEST(Resume, MetricsHoldEveryStepOnceAfterAKilledRunIsRestarted) {
  RunSetup s;
  const std::string ck = s.dir / "ck", metrics = s.dir / "m.jsonl";
  // As if killed after step 3: the checkpoint is at step 2, the log has steps 1-3 and a
  // line cut short.
  auto r = run_command(s.fresh(str("--steps 2 --save ", ck, " --metrics ", metrics)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(s.train(str("--resume ", ck, " --steps 3 --metrics ", metrics)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto first = read_metrics(metrics);
  ASSERT_EQ(first.size(), 3u);
  std::ofstream(metrics, std::ios::app) << "{\"step\": 4, \"lo";
  // The usual restart: the same command line with --resume.
  r = run_command(s.train(str("--resume ", ck, " --steps 5 --save ", ck, " --metrics ", metrics)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto m = read_metrics(metrics);
  ASSERT_EQ(m.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(m[i]["step"], i + 1);
  EXPECT_EQ(m[0], first[0]);
  EXPECT_EQ(m[1], first[1]);
  // Step 3 again, from the same state on the same samples: the same loss, bit for bit.
  EXPECT_EQ(m[2]["loss"].get<double>(), first[2]["loss"].get<double>());

  // A resume that trains nothing keeps the file as it is.
  r = run_command(s.train(str("--resume ", ck, " --steps 5 --metrics ", metrics)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to train: the checkpoint is at step 5 and --steps is 5"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_metrics(metrics).size(), 5u);
}

TEST(Run, NothingToTrainSaysSoAndStillSaves) {
  RunSetup s;
  auto r = run_command(s.fresh(str("--steps 0 --save ", s.dir / "init")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to train: --steps 0"), std::string::npos) << r.output;
  const train::LoadedCheckpoint c = train::load_checkpoint(s.dir / "init");
  EXPECT_EQ(c.state.step, 0);
  EXPECT_EQ(c.state.consumed_samples, 0);

  r = run_command(s.fresh("--steps 1 --save-every 1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--save-every 1 needs --save"), std::string::npos) << r.output;
}

// Context extension (issue 22): stage 1 trains 2 steps at S = 16 with llama3 rope; stage 2
// resumes it at S = 32 with yarn rope (factor 2 over the 16 original positions) and another
// theta, from a --model whose config.json changes only those, for 3 steps. The uninterrupted
// run of the same stages is one process going from one trainer to the next in memory (the
// state handed over, its data position converted by train::convert_data_position): the
// resumed CLI run equals it bitwise at 1 rank, and within float32 reduction order at SP 2
// and SP 4 (2 KV heads repeated over 4 ranks). 8 samples of 16 tokens are 128 tokens, 4
// samples of 32: stage 2 reads samples 4 and 5 of the first shuffled epoch of 6, then starts
// the second epoch's permutation.
TEST(Resume, AContextExtensionContinuesAsTheUninterruptedStagesAtOneTwoAndFourRanks) {
  RunSetup s;
  fs::create_directories(s.dir / "long");
  json m = json::parse(slurp(s.dir / "config.json"));
  m["rope_theta"] = 40000.0;
  m["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 16}};
  m["max_position_embeddings"] = 32;
  std::ofstream(s.dir / "long/config.json") << m.dump(2);
  auto config = [&](const std::string& name, int sp) {
    json c = json::parse(slurp(s.dir / "ds_config.json"));
    c["data"] = {{"shuffle", true}, {"seed", 5}};
    if (sp > 1) {
      c["sequence_parallel_size"] = sp;
      c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}};
    }
    std::ofstream(s.dir / name) << c.dump(2);
    return s.dir / name;
  };
  const std::string one = config("one.json", 1), sp2 = config("sp2.json", 2), sp4 = config("sp4.json", 4);
  const std::string ck = s.dir / "ck";

  // The uninterrupted stages, in process, set up as `autosp train` sets itself up.
  train::TrainConfig tc = train::load_train_config(one, nullptr);
  train::resolve_batch(tc, 1, one);
  ASSERT_EQ(tc.data.seed, std::optional<uint64_t>(5));
  const models::LlamaConfig short_model = models::load_llama_config(s.dir / "config.json"),
                            long_model = models::load_llama_config(s.dir / "long/config.json");
  ASSERT_EQ(long_model.rope.rope_type, "yarn");
  train::resolve_model_auto(tc, short_model.hidden_size, one, nullptr);
  const std::unique_ptr<train::DataSource> data =
      train::order_samples(train::open_data_source(s.dir / "tokens.bin", int32_t(short_model.vocab_size), tc.data, one),
                           tc.data);
  tc.data.packed = data->packed();
  ASSERT_EQ(data->num_samples(16), 13);
  ASSERT_EQ(data->num_samples(32), 6);
  std::vector<train::StepStats> want;
  train::ModelState handed;
  {
    train::Trainer a(short_model, tc, 16, train::fresh_state(short_model, tc.seed, s.dir / "model.safetensors"));
    for (int t = 0; t < 2; ++t) want.push_back(a.train_step(*data));
    handed = a.state();
  }
  ASSERT_EQ(handed.consumed_samples, 8);
  handed.consumed_samples = train::convert_data_position(8, 16, 13, 32, 6).samples;
  ASSERT_EQ(handed.consumed_samples, 4);
  {
    train::Trainer b(long_model, tc, 32, std::move(handed));
    for (int t = 0; t < 3; ++t) want.push_back(b.train_step(*data));
  }
  EXPECT_EQ(want.back().consumed_samples, 16);  // 6 of the first epoch, 10 of the second

  auto r = run_command(s.fresh(str("--steps 2 --save ", ck, " --metrics ", s.dir / "stage1.jsonl"), one));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto stage1 = read_metrics(s.dir / "stage1.jsonl");
  ASSERT_EQ(stage1.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(stage1[t]["loss"].get<double>(), want[t].loss) << "stage 1, step " << t + 1;
    EXPECT_EQ(stage1[t]["grad_norm"].get<double>(), want[t].grad_norm) << "stage 1, step " << t + 1;
  }
  for (const auto& [np, cfg] : {std::pair{1, one}, std::pair{2, sp2}, std::pair{4, sp4}}) {
    SCOPED_TRACE(str(np, " ranks"));
    const std::string metrics = s.dir / str("stage2_", np, ".jsonl");
    const std::string cmd = s.train(str("--resume ", ck, " --model ", s.dir / "long", " --seq-len 32 --steps 5 ",
                                        "--metrics ", metrics), cfg);
    r = np == 1 ? run_command(cmd) : mpirun(np, cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("context extension: sequence length 16 (checkpoint) -> 32"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("context extension: rope llama3 theta 10000"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("-> rope yarn theta 40000 factor 2 original_max_position_embeddings 16"),
              std::string::npos) << r.output;
    EXPECT_NE(r.output.find("data position 8 samples of 16 tokens -> 4 samples of 32 tokens (epoch 0)"),
              std::string::npos) << r.output;
    EXPECT_NE(r.output.find("continuing with sample 4, the first this model has not seen"), std::string::npos)
        << r.output;
    const auto got = read_metrics(metrics);
    ASSERT_EQ(got.size(), 3u);
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE(str("stage 2, step ", t + 3));
      const train::StepStats& w = want[2 + t];
      EXPECT_EQ(got[t]["step"], w.step);
      EXPECT_EQ(got[t]["consumed_samples"], w.consumed_samples);
      if (np == 1) {
        EXPECT_EQ(got[t]["loss"].get<double>(), w.loss);
        EXPECT_EQ(got[t]["grad_norm"].get<double>(), w.grad_norm);
      } else {
        // Sequence parallelism sums attention's and the loss's rows in another order.
        // Observed (AVX-512): loss within 8.9e-8 of ~4.2 (2.1e-8 relative), grad norm within
        // 9.8e-8 of ~1.5 (6.6e-8 relative). 1e-6 relative, the Llama reference tests' loss
        // tolerance, leaves 15x for other BLAS blockings and is far below what a wrong rope
        // or position gives (1e-3).
        EXPECT_NEAR(got[t]["loss"].get<double>(), w.loss, 1e-6 * w.loss);
        EXPECT_NEAR(got[t]["grad_norm"].get<double>(), w.grad_norm, 1e-6 * w.grad_norm);
      }
    }
  }
}

TEST(Resume, OtherDataIsRefusedUnlessAllowed) {
  RunSetup s;
  const std::string ck = s.dir / "ck";
  auto r = run_command(s.fresh(str("--steps 1 --save ", ck)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<uint32_t> other(16 * 20 + 1, 3);
  io::write_tokens(s.dir / "other.bin", other);
  const std::string resume = str(AUTOSP_BINARY, " train --config ", s.dir / "ds_config.json", " --resume ", ck,
                                 " --data ", s.dir / "other.bin", " --steps 2");
  r = run_command(resume);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not the data the checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--allow-new-data"), std::string::npos) << r.output;
  // Allowed, it starts at the new data's first sample: the checkpoint's position (4) counts
  // samples of other data.
  r = run_command(resume + " --allow-new-data --metrics " + (s.dir / "new.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--allow-new-data: starting at its first sample"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("continuing with sample 0 of the new data"), std::string::npos) << r.output;
  auto m = read_metrics(s.dir / "new.jsonl");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["consumed_samples"], 4) << "step 2 read samples 0-3 of other.bin";
  // The checkpoint of that run records its position in the new data, which a resume on it continues.
  r = run_command(resume + " --allow-new-data --save " + (s.dir / "ck_new") + " && " +
                  str(AUTOSP_BINARY, " train --config ", s.dir / "ds_config.json", " --resume ", s.dir / "ck_new",
                      " --data ", s.dir / "other.bin", " --steps 3"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("continuing with sample 4, the first this model has not seen"), std::string::npos)
      << r.output;
  // --keep-data-position: the old behaviour, the checkpoint's position wrapped onto the new data.
  r = run_command(resume + " --allow-new-data --keep-data-position --metrics " + (s.dir / "kept.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--keep-data-position: continuing at sample 4 of it"), std::string::npos) << r.output;
  m = read_metrics(s.dir / "kept.jsonl");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["consumed_samples"], 8);
}

TEST(Data, WrappingPastTheEndSaysSoOncePerEpoch) {
  RunSetup s;
  io::write_tokens(s.dir / "one.bin", std::vector<uint32_t>(17, 1));  // one sample of 16
  auto r = run_command(str(AUTOSP_BINARY, " train --config ", s.config("b1.json", 1, 1, 1), " --model ", s.dir.path(),
                           " --data ", s.dir / "one.bin", " --seq-len 16 --steps 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("repeats the data (3.00 epochs in all)"), std::string::npos) << r.output;
  for (int epoch : {2, 3}) EXPECT_NE(r.output.find(str("epoch ", epoch, " begins")), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch 4"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace autosp

// Sequence-parallel launches that cannot work end with a clear message from rank 0 and a
// non-zero exit of the whole job (mpirun's status), never a hang; so does a job one of
// whose ranks is killed mid-run. Also: activation memory per rank falls as 1/P.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/tokens.h"
#include "testing/process.h"
#include "util/error.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

struct JobSetup {
  TempDir dir{"sp_errors"};
  JobSetup() {
    auto r = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  std::string config(const std::string& name, int sp, bool autosp_pass, int micro = 2) const {
    std::ifstream in(dir / "ds_config.json");
    json c = json::parse(in);
    c["sequence_parallel_size"] = sp;
    c["train_micro_batch_size_per_gpu"] = micro;
    c.erase("train_batch_size");
    if (autosp_pass) c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}};
    std::ofstream(dir / name) << c.dump(2);
    return dir / name;
  }
  std::string train(const std::string& config, int steps = 2, int seq_len = 16,
                    const std::string& model = "") const {
    return str(AUTOSP_BINARY, " train --config ", config, " --model ", model.empty() ? dir.path() : model,
               " --data ", dir / "tokens.bin", " --seq-len ", seq_len, " --steps ", steps);
  }
};

testing::ProcessResult mpirun(int np, const std::string& command) {
  return run_command(str(kMpiEnv, "timeout 120 ", AUTOSP_MPIEXEC, " -np ", np, " --oversubscribe ", command));
}

// A user error that every rank sees: one line for the whole job, a non-zero exit, and no
// MPI abort (the ranks agreed on the error and finalised MPI).
void expect_job_error(const testing::ProcessResult& r, const std::string& fragment) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
  size_t lines = 0;
  for (size_t at = r.output.find("autosp: error: "); at != std::string::npos;
       at = r.output.find("autosp: error: ", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << r.output;
  EXPECT_EQ(r.output.find("rank 0:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
}

TEST(SequenceParallelErrors, ACommandLineErrorPrintsOnceForTheJob) {
  JobSetup s;
  const auto r = mpirun(2, str(AUTOSP_BINARY, " train --config ", s.dir / "ds_config.json", " --steps x"));
  expect_job_error(r, "(see autosp train --help)");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST(SequenceParallelErrors, ABadSaveTargetStopsEveryRankBeforeTraining) {
  JobSetup s;
  const auto r = mpirun(2, s.train(s.config("sp2.json", 2, true)) + " --save " + s.dir.path());
  expect_job_error(r, "which is not a file of an autosp checkpoint");
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST(SequenceParallelErrors, WorldNotDivisibleBySequenceParallelSize) {
  JobSetup s;
  expect_job_error(mpirun(3, s.train(s.config("sp2.json", 2, true))),
                   "world size 3 is not divisible by sequence_parallel_size 2");
}

// Nothing was read before the refusal: no weights (or random init), no data.
void expect_refused_before_reading(const testing::ProcessResult& r) {
  for (const char* read : {"random init", "loaded ", "data: "})
    EXPECT_EQ(r.output.find(read), std::string::npos) << "read before refusing:\n" << r.output;
}

TEST(SequenceParallelErrors, HeadsNotDivisibleBySequenceParallelSize) {
  JobSetup s;
  // Models (random init: no weights file) whose heads SP cannot share out, refused in the
  // config's words before anything is read (the autosp pass would say it at the first step,
  // as "attention (node N) has NH=6 ...").
  auto model_with = [&](const std::string& name, int heads, int kv_heads) {
    const std::string model = s.dir / name;
    std::filesystem::create_directories(model);
    json c = json::parse(std::ifstream(s.dir / "config.json"));
    c["num_attention_heads"] = heads;
    c["num_key_value_heads"] = kv_heads;
    std::ofstream(model + "/config.json") << c.dump(2);
    return model;
  };
  const std::string six = model_with("six_heads", 6, 6), three_kv = model_with("three_kv", 6, 3);
  auto r = mpirun(4, s.train(s.config("sp4.json", 4, true), 2, 16, six));
  expect_job_error(r, str(six, "/config.json: num_attention_heads 6 is not divisible by sequence_parallel_size 4 (",
                          s.dir / "sp4.json", ")"));
  EXPECT_NE(r.output.find("sequence-parallel sizes this model can use: 1, 2, 3, 6"), std::string::npos) << r.output;
  expect_refused_before_reading(r);
  r = mpirun(2, s.train(s.config("sp2.json", 2, true), 2, 16, three_kv));
  expect_job_error(r, "num_key_value_heads 3 cannot be shared out over sequence_parallel_size 2");
  EXPECT_NE(r.output.find("sequence-parallel sizes this model can use: 1, 3, 6"), std::string::npos) << r.output;
  expect_refused_before_reading(r);
  // The case: the demo (SP = every rank, a model of 4 heads) under mpirun -np 3.
  r = mpirun(3, str(AUTOSP_BINARY, " train --steps 1"));
  expect_job_error(r, "the demo's model: num_attention_heads 4 is not divisible by sequence_parallel_size 3");
}

TEST(SequenceParallelErrors, SequenceParallelWithoutTheAutospPass) {
  JobSetup s;
  const auto r = mpirun(2, s.train(s.config("no_pass.json", 2, false)));
  expect_job_error(r, "no_pass.json: sequence_parallel_size = 2 needs the autosp pass");
  expect_refused_before_reading(r);
}

TEST(SequenceParallelErrors, RanksThatDisagreeOnTheConfig) {
  JobSetup s;
  // MPMD launch: rank 0 and rank 1 are given different configs.
  const std::string a = s.train(s.config("a.json", 2, true)), b = s.train(s.config("b.json", 2, true, 1));
  auto r = run_command(str(kMpiEnv, "timeout 120 ", AUTOSP_MPIEXEC, " --oversubscribe -np 1 ", a, " : -np 1 ", b));
  expect_job_error(r, "ranks disagree on the command line");
}

TEST(SequenceParallelErrors, AKilledRankEndsTheJobWithinSeconds) {
  JobSetup s;
  const std::string marker = s.dir / "die_marker.json";
  const std::string cmd = str(kMpiEnv, AUTOSP_MPIEXEC, " -np 2 --oversubscribe ",
                              s.train(s.config("die_marker.json", 2, true), 1000000), " > ", s.dir / "log", " 2>&1");
  // Start the job, kill one rank with SIGKILL once it is training, and time the rest.
  auto r = run_command(str("sh -c '", cmd, " & M=$!; for i in $(seq 100); do grep -q \"step 3/\" ", s.dir / "log",
                           " && break; sleep 0.1; done; pkill -9 -n -f ", marker,
                           "; t0=$(date +%s); while kill -0 $M 2>/dev/null; do sleep 0.2; ",
                           "[ $(( $(date +%s) - t0 )) -gt 30 ] && { echo HUNG; kill -9 $M; exit 124; }; done; ",
                           "wait $M; rc=$?; echo \"job ended $(( $(date +%s) - t0 ))s after the kill, status $rc\"; ",
                           "exit $rc'"));
  std::printf("%s", r.output.c_str());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_EQ(r.output.find("HUNG"), std::string::npos) << r.output;
}

// Activation memory per rank (the executor's allocator peak) at a fixed sequence length
// falls roughly as 1/P.
TEST(SequenceParallelMemory, ActivationPeakPerRankFallsAsOneOverP) {
  JobSetup s;
  std::vector<uint32_t> tokens(4 * 1024 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t((i * 7919) % 67);
  io::write_tokens(s.dir / "tokens.bin", tokens);  // long enough for S = 1024
  std::vector<double> peak;
  for (int P : {1, 2, 4}) {
    const std::string metrics = s.dir / str("mem", P, ".jsonl");
    const std::string cmd = str(s.train(s.config(str("mem", P, ".json"), P, true, 1), 1, 1024), " --metrics ", metrics);
    auto r = P == 1 ? run_command(cmd) : mpirun(P, cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(metrics);
    std::string line;
    std::getline(in, line);
    peak.push_back(json::parse(line)["activation_peak_bytes"].get<double>());
  }
  std::printf("activation peak per rank at S=1024: P=1 %.0f, P=2 %.0f (%.2fx), P=4 %.0f (%.2fx)\n", peak[0],
              peak[1], peak[1] / peak[0], peak[2], peak[2] / peak[0]);
  // Gradients of the (replicated) parameters are a fixed part, so "roughly": 1/P + slack.
  EXPECT_LT(peak[1], 0.6 * peak[0]);
  EXPECT_LT(peak[2], 0.35 * peak[0]);
}

}  // namespace
}  // namespace autosp

// threads_probe: configure_threads in a real process, as autosp's main calls it (not a gtest
// binary: under mpirun it runs once per rank). tests/runtime/threads_test.cpp starts it.
//
//   [mpirun -np N] threads_probe
//     Each rank prints one line:
//       rank R/N threads T node_cpus C affinity_cpus A local_ranks L spincount S | <start-up line>
//     T: OpenMP's thread count after configure_threads (what the kernels use); C, A, L: the
//     inputs it decided from; S: GOMP_SPINCOUNT as libgomp loaded it (kSpinCount: the re-exec
//     with GOMP_SPINCOUNT=kSpinCount took effect; libgomp's default is 300000). Under mpirun the ranks then
//     start MPI and run a collective, so a re-exec that broke the launch fails the job.
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "comm/mpi_communicator.h"
#include "runtime/threads.h"

namespace {

// libgomp's GOMP_SPINCOUNT, from omp_display_env's report (written to stderr, captured here).
std::string libgomp_spin_count() {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  if (!tmp) return "unknown (tmpfile failed)";
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  omp_display_env(/*verbose=*/1);
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string report;
  std::rewind(tmp);
  for (int c; (c = std::fgetc(tmp)) != EOF;) report += static_cast<char>(c);
  std::fclose(tmp);
  const std::string key = "GOMP_SPINCOUNT = '";
  const size_t at = report.find(key);
  if (at == std::string::npos) return "unknown (not in omp_display_env)";
  const size_t from = at + key.size();
  return report.substr(from, report.find('\'', from) - from);
}

}  // namespace

int main(int argc, char** argv) {
  autosp::configure_threads(argv);
  const autosp::ThreadInputs in = autosp::thread_inputs_from_environment();
  const std::string spin = libgomp_spin_count();
  std::unique_ptr<autosp::MpiRuntime> mpi;
  if (autosp::MpiRuntime::launched_by_mpirun()) {
    mpi = std::make_unique<autosp::MpiRuntime>(&argc, &argv);
    mpi->check_same_on_all_ranks("the probe's name", "threads_probe");
  }
  std::printf("rank %d/%d threads %d node_cpus %d affinity_cpus %d local_ranks %d spincount %s | %s\n",
              mpi ? mpi->world_rank() : 0, mpi ? mpi->world_size() : 1, omp_get_max_threads(), in.node_cpus,
              in.affinity_cpus, in.local_ranks, spin.c_str(), autosp::threads_summary().c_str());
  std::fflush(stdout);
  return 0;
}

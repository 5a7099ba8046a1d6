// hf_families_mpi_main: the training step of one fixture model of tests/fixtures/hf_families
// under real MPI with sequence parallelism over every rank (not a gtest binary: MPI starts
// once per process; tests/sp/hf_families_sp_test.cpp runs it and compares):
//
//   mpirun -np P hf_families_mpi_main FIXTURE_DIR OUT_DIR
//
// For the plain and the packed sample and each checkpoint policy (none, sac, full) it
// compiles the step for SP = P (the autosp pass: sequence split, all-to-all around attention,
// KV heads repeated where fewer than P), runs it once on the whole sample (each rank keeps its
// slice) and rank 0 writes OUT_DIR/<plain|packed>_<policy>.json ({"loss": ...}) and
// .safetensors (grad.<name>: every parameter's gradient, reduced over the ranks). Exit 0, or 1
// with the error on stderr (every rank ends).
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "testing/gradients_file.h"
#include "testing/hf_families.h"

int main(int argc, char** argv) {
  using namespace autosp;
  MpiRuntime mpi(&argc, &argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: mpirun -np P %s FIXTURE_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string fixture = argv[1], out = argv[2];
  try {
    const testing::HfFamilyFixture f(fixture);
    const int P = mpi.world_size();
    ProcessGroups groups = mpi.make_groups(P);
    for (bool packed : {false, true})
      for (const char* policy : {"none", "sac", "full"}) {
        train::ModelState state = train::ModelState::initial(f.model, 0);
        state.params = f.params;
        train::Trainer trainer(f.model, testing::hf_family_train_config(P, policy, packed), f.seq_len(), state,
                               &groups);
        std::vector<std::vector<float>> grads;
        const double loss = trainer.loss_and_grads(f.batch(packed), grads);
        if (mpi.world_rank() != 0) continue;
        const std::string tag = str(out, "/", packed ? "packed" : "plain", "_", policy);
        testing::write_loss_and_gradients(tag, loss, trainer.state().specs, grads);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_families_mpi_main (rank %d): %s\n", mpi.world_rank(), e.what());
    mpi.abort_all(1);
  }
  return 0;
}

// torch_import_mpi_main: the training step of one imported program of tests/fixtures/torch_export
// under real MPI with sequence parallelism over every rank (not a gtest binary: MPI starts once
// per process; tests/sp/torch_import_sp_test.cpp runs it and compares):
//
//   mpirun -np P torch_import_mpi_main FIXTURE_DIR OUT_DIR
//
// For checkpoint policies none and sac it compiles the imported graph's step for SP = P (the
// autosp pass, as for a built model), runs it once on the fixture's batch and rank 0 writes
// OUT_DIR/<policy>.json ({"loss": ...}) and .safetensors (grad.<name>, reduced over the ranks);
// then the same with the batch packed as documents, OUT_DIR/packed.*.
// Exit 0, or 1 with the error on stderr (every rank ends).
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "testing/gradients_file.h"
#include "testing/torch_export.h"

int main(int argc, char** argv) {
  using namespace autosp;
  MpiRuntime mpi(&argc, &argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: mpirun -np P %s FIXTURE_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string fixture = argv[1], out = argv[2];
  try {
    const testing::ExportFixture f(fixture);
    const int P = mpi.world_size();
    ProcessGroups groups = mpi.make_groups(P);
    for (const char* policy : {"none", "sac"}) {
      train::Trainer trainer(f.model(), testing::fixture_config(f.B(), P, policy), f.S(), f.state(), &groups);
      std::vector<std::vector<float>> grads;
      const double loss = trainer.loss_and_grads(f.batch(), grads);
      if (mpi.world_rank() != 0) continue;
      const std::string tag = str(out, "/", policy);
      testing::write_loss_and_gradients(tag, loss, trainer.state().specs, grads);
    }
    // Packed documents (ExportFixture::packed_batch), checkpoint sac: OUT_DIR/packed.*
    train::TrainConfig packed = testing::fixture_config(f.B(), P, "sac");
    packed.data.packed = true;
    train::Trainer trainer(f.model(), packed, f.S(), f.state(), &groups);
    std::vector<std::vector<float>> grads;
    const double loss = trainer.loss_and_grads(f.packed_batch(), grads);
    if (mpi.world_rank() == 0) testing::write_loss_and_gradients(str(out, "/packed"), loss, trainer.state().specs, grads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_import_mpi_main (rank %d): %s\n", mpi.world_rank(), e.what());
    mpi.abort_all(1);
  }
  return 0;
}

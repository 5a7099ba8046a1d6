// What the MPI test drivers (tests/sp/*_mpi_main.cpp) write for their gtest side to compare:
// TAG.json ({"loss": ...}) and TAG.safetensors (grad.<name> of every parameter).
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "models/llama.h"

namespace autosp::testing {

inline void write_loss_and_gradients(const std::string& tag, double loss, const std::vector<models::ParameterSpec>& specs,
                                     const std::vector<std::vector<float>>& grads) {
  std::ofstream(tag + ".json") << nlohmann::json{{"loss", loss}}.dump() << "\n";
  std::vector<io::HostTensor> tensors(grads.size());
  std::vector<std::pair<std::string, const io::HostTensor*>> named;
  for (size_t i = 0; i < grads.size(); ++i) {
    tensors[i] = {specs[i].shape, grads[i]};
    named.emplace_back("grad." + specs[i].name, &tensors[i]);
  }
  io::write_safetensors(tag + ".safetensors", named);
}

}  // namespace autosp::testing

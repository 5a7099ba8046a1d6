// The communicator of a group of one rank: every collective is a copy (or nothing).
//
// It checks what the MPI communicator checks (sizes, roots, non-overlapping buffers), so
// that code tested on one rank does not pass here and fail under MPI.
#include <cstdint>
#include <cstring>
#include <memory>

#include "comm/communicator.h"
#include "util/error.h"

namespace autosp {

namespace {

bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + static_cast<uintptr_t>(b_bytes) && y < x + static_cast<uintptr_t>(a_bytes);
}

// With one rank, send and recv have the same n elements in every collective.
void copy_floats(const char* op, const float* send, float* recv, int64_t n) {
  AUTOSP_CHECK(n >= 0, op, ": count ", n);
  const int64_t bytes = n * int64_t{sizeof(float)};
  AUTOSP_CHECK(!overlaps(send, bytes, recv, bytes), op, ": buffers overlap");
  if (n > 0) std::memcpy(recv, send, static_cast<size_t>(bytes));
}

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t n) override { AUTOSP_CHECK(n >= 0, n); }
  void all_reduce_sum(double*, int64_t n) override { AUTOSP_CHECK(n >= 0, n); }
  void all_to_all(const float* send, float* recv, int64_t chunk) override {
    copy_floats("all_to_all", send, recv, chunk);
  }
  void all_gather(const float* send, float* recv, int64_t n) override {
    copy_floats("all_gather", send, recv, n);
  }
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override {
    copy_floats("reduce_scatter_sum", send, recv, n);
  }
  void broadcast(void*, int64_t bytes, int root) override {
    AUTOSP_CHECK(bytes >= 0, bytes);
    AUTOSP_CHECK(root == 0, "broadcast root ", root, " in a group of one rank");
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace autosp

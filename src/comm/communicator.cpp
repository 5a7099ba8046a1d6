#include "comm/communicator.h"

#include <vector>

#include "util/error.h"

namespace autosp {

namespace {
struct Finished final : PendingCollective {
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::all_to_all_start(const float* send, float* recv, int64_t chunk) {
  all_to_all(send, recv, chunk);
  return std::make_unique<Finished>();
}

std::string agreed_error(Communicator& group, const std::string& error, int64_t order) {
  AUTOSP_CHECK(order >= 0 && order < (int64_t{1} << 53), "order ", order, " is not exact in a double");
  if (group.size() == 1) return error;
  // Every rank's order + 1 (0: no failure), on every rank, so that all pick the same one.
  std::vector<double> orders(static_cast<size_t>(group.size()), 0.0);
  if (!error.empty()) orders[static_cast<size_t>(group.rank())] = double(order) + 1;
  group.all_reduce_sum(orders.data(), static_cast<int64_t>(orders.size()));
  int first = -1;
  for (int r = 0; r < group.size(); ++r)
    if (orders[r] > 0 && (first < 0 || orders[r] < orders[first])) first = r;
  if (first < 0) return "";
  std::string text = group.rank() == first ? error : "";
  int64_t n = static_cast<int64_t>(text.size());
  group.broadcast(&n, sizeof(n), first);
  text.resize(static_cast<size_t>(n));
  group.broadcast(text.data(), n, first);
  return text;
}

}  // namespace autosp

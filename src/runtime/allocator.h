// Where the executor's buffers come from. The counting heap allocator measures live and
// peak bytes; the static planner (plan_memory) will provide an arena allocator behind the
// same interface.
#pragma once
#include <cstdint>

namespace autosp {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* ptr, int64_t bytes) = 0;

  int64_t live_bytes() const { return live_; }
  int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = live_; }

 protected:
  void count_allocate(int64_t bytes) {
    live_ += bytes;
    if (live_ > peak_) peak_ = live_;
  }
  void count_release(int64_t bytes) { live_ -= bytes; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

// 64-byte aligned heap buffers; counts bytes as requested (not rounded).
class HeapAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes) override;
  void release(void* ptr, int64_t bytes) override;
};

}  // namespace autosp

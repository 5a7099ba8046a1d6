// Where the executor's buffers come from, counted: live and peak bytes. In arena mode the
// executor asks for one block, plan_memory's arena, when it is made (so the peak is the
// planned arena); in heap mode for every result and workspace as the step runs.
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
//
// Training runs the same allocations every step. glibc would hand every block over its
// mmap threshold back to the kernel when freed and fault it in again, zeroed, on the next
// step (measured: ~20% of a step at S = 8192). The first HeapAllocator therefore asks
// glibc to serve large blocks from its heap and keep freed memory mapped, so a step reuses
// the previous step's pages; the footprint stays near the peak of live bytes.
class HeapAllocator final : public Allocator {
 public:
  HeapAllocator();
  void* allocate(int64_t bytes) override;
  void release(void* ptr, int64_t bytes) override;
};

}  // namespace autosp

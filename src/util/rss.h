// This process's resident memory as the OS counts it (Linux /proc/self/status): what a
// memory claim is checked against, not the allocator's own count.
#pragma once
#include <cstdint>

namespace autosp {

// VmRSS: resident bytes now. 0 where /proc is not readable.
int64_t rss_bytes();
// VmHWM: the resident high-water mark since the process started (across RssPhase's resets
// of the kernel's mark). 0 where unreadable.
int64_t rss_peak_bytes();

// The resident high-water mark of one phase of the process (writing or reading a
// checkpoint): starting one hands the heap's free pages back to the OS (malloc_trim: the
// training step leaves its freed buffers resident, HeapAllocator, and a phase reusing them
// would not show), then resets the kernel's mark to the resident set now (Linux
// /proc/self/clear_refs "5"; rss_peak_bytes() keeps the peak from before). Where the mark
// cannot be reset, the growth it reports is an upper bound (the peak since the start).
class RssPhase {
 public:
  RssPhase();
  // Bytes by which the resident set's peak during the phase exceeded its size at the start.
  int64_t peak_growth() const;

 private:
  int64_t start_ = 0;
};

}  // namespace autosp

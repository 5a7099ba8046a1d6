// This process's resident memory as the OS counts it (Linux /proc/self/status): what a
// memory claim is checked against, not the allocator's own count.
#pragma once
#include <cstdint>

namespace autosp {

// VmRSS: resident bytes now. 0 where /proc is not readable.
int64_t rss_bytes();
// VmHWM: the resident high-water mark since the process started. 0 where unreadable.
int64_t rss_peak_bytes();

}  // namespace autosp

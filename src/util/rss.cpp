#include "util/rss.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace autosp {
namespace {

// The value of a "Name:   1234 kB" line of /proc/self/status, in bytes.
int64_t status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      std::sscanf(line + n + 1, "%lld", &kib);
      break;
    }
  std::fclose(f);
  return int64_t(kib) * 1024;
}

// The process's peak before the last reset of the kernel's mark.
int64_t peak_before_reset = 0;

}  // namespace

int64_t rss_bytes() { return status_kib("VmRSS"); }
int64_t rss_peak_bytes() { return std::max(peak_before_reset, status_kib("VmHWM")); }

RssPhase::RssPhase() {
  malloc_trim(0);
  peak_before_reset = rss_peak_bytes();
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
  start_ = rss_bytes();
}

int64_t RssPhase::peak_growth() const { return std::max<int64_t>(0, status_kib("VmHWM") - start_); }

}  // namespace autosp

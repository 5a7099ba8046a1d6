#include "util/rss.h"

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

}  // namespace

int64_t rss_bytes() { return status_kib("VmRSS"); }
int64_t rss_peak_bytes() { return status_kib("VmHWM"); }

}  // namespace autosp

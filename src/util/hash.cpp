#include "util/hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <vector>

#include "util/error.h"

namespace autosp {

uint64_t fnv1a_file(const std::string& path, int64_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) user_error(path, ": cannot open: ", std::error_code(errno, std::generic_category()).message());
  std::vector<char> buf(size_t{1} << 20);
  uint64_t h = kFnv1aBasis;
  int64_t total = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      user_error(path, ": cannot read at byte ", total, ": ", std::error_code(err, std::generic_category()).message());
    }
    if (got == 0) break;
    h = fnv1a(std::string_view(buf.data(), static_cast<size_t>(got)), h);
    total += got;
  }
  ::close(fd);
  if (bytes) *bytes = total;
  return h;
}

}  // namespace autosp

#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "util/error.h"

namespace autosp::io {

namespace {
std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }
}  // namespace

ReadOnlyFile::ReadOnlyFile(std::string path, std::string what) : path_(std::move(path)) {
  const std::string of = what.empty() ? "" : " " + what;
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) user_error(path_, ": cannot open", of, ": ", errno_text(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    user_error(path_, ": cannot stat", of, ": ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    user_error(path_, ": ", what.empty() ? "not a regular file" : what + " is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(uint64_t offset, void* out, size_t n) const {
  AUTOSP_CHECK(fd_ >= 0, "read from a moved-from ReadOnlyFile");
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      user_error(path_, ": cannot read ", n, " bytes at offset ", offset, ": ", errno_text(errno));
    }
    if (got == 0)
      user_error(path_, ": unexpected end of file at offset ", offset,
                 " (was the file truncated while being read?)");
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

}  // namespace autosp::io

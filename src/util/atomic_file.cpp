#include "util/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>
#include <utility>

#include "util/error.h"

namespace autosp {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::atomic<unsigned> temp_counter{0};

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : target_(std::move(path)) {
  const std::string& p = target_;
  if (p.empty()) user_error("cannot write a file with an empty path");
  size_t slash = p.rfind('/');
  dir_ = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
  std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (base.empty() || base == "." || base == "..")
    user_error("cannot write '", p, "': the path names a directory, not a file");
  std::string prefix = slash == std::string::npos ? std::string() : p.substr(0, slash + 1);

  // A hidden name unique to this process and call; O_EXCL guards against leftovers. The
  // mode lets the umask decide the final permissions, as a plain open() would.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = str(prefix, ".", base, ".tmp.", ::getpid(), ".", temp_counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt >= 100))
      user_error("cannot write '", p, "': cannot create temporary file '", tmp_, "': ", errno_text(errno));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  // Failure paths only; errors here cannot be reported better than the one in flight.
  if (fd_ >= 0) ::close(fd_);
  if (!renamed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::fail(const std::string& what1, const std::string& name, const char* what2, int err) const {
  user_error("cannot write '", target_, "': ", what1, name, what2, ": ", errno_text(err));
}

void AtomicFileWriter::append(std::string_view bytes) {
  AUTOSP_CHECK(fd_ >= 0, "write after commit");
  while (!bytes.empty()) {
    ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write temporary file '", tmp_, "'", errno);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void AtomicFileWriter::write_at(uint64_t offset, std::string_view bytes) {
  AUTOSP_CHECK(fd_ >= 0, "write after commit");
  while (!bytes.empty()) {
    ssize_t n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write temporary file '", tmp_, "'", errno);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
}

void AtomicFileWriter::commit() {
  AUTOSP_CHECK(fd_ >= 0, "committed twice");
  if (::fsync(fd_) != 0) fail("cannot fsync temporary file '", tmp_, "'", errno);
  int fd = fd_;
  fd_ = -1;
  // close() can report a deferred write error (NFS, quota), so it is checked too.
  if (::close(fd) != 0) fail("cannot close temporary file '", tmp_, "'", errno);
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("cannot rename temporary file '", tmp_, "' over it", errno);
  renamed_ = true;
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("cannot open directory '", dir_, "' to fsync it", errno);
  // Some file systems cannot sync a directory (EINVAL); the rename is then as durable
  // as that file system makes it, which is all we can ask.
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL) fail("cannot fsync directory '", dir_, "'", err);
}

void write_file_atomic_streaming(const std::string& path,
                                 const std::function<void(const ByteSink&)>& produce) {
  AtomicFileWriter file(path);
  produce([&file](std::string_view bytes) { file.append(bytes); });
  file.commit();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic_streaming(path, [bytes](const ByteSink& sink) { sink(bytes); });
}

}  // namespace autosp

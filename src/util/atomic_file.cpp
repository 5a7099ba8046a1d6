#include "util/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>

#include "util/error.h"

namespace autosp {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Owns the temporary until it has been renamed over the target.
class TempFile {
 public:
  TempFile(std::string target, std::string tmp, int fd)
      : target_(std::move(target)), tmp_(std::move(tmp)), fd_(fd) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    // Failure paths only; errors here cannot be reported better than the one in flight.
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(tmp_.c_str());
  }

  void write(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write temporary file '", tmp_, "'", errno);
      }
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  void commit(const std::string& dir) {
    if (::fsync(fd_) != 0) fail("cannot fsync temporary file '", tmp_, "'", errno);
    int fd = fd_;
    fd_ = -1;
    // close() can report a deferred write error (NFS, quota), so it is checked too.
    if (::close(fd) != 0) fail("cannot close temporary file '", tmp_, "'", errno);
    if (::rename(tmp_.c_str(), target_.c_str()) != 0)
      fail("cannot rename temporary file '", tmp_, "' over it", errno);
    renamed_ = true;
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail("cannot open directory '", dir, "' to fsync it", errno);
    // Some file systems cannot sync a directory (EINVAL); the rename is then as durable
    // as that file system makes it, which is all we can ask.
    int rc = ::fsync(dfd);
    int err = errno;
    ::close(dfd);
    if (rc != 0 && err != EINVAL) fail("cannot fsync directory '", dir, "'", err);
  }

 private:
  [[noreturn]] void fail(const std::string& what1, const std::string& name, const char* what2,
                         int err) {
    user_error("cannot write '", target_, "': ", what1, name, what2, ": ", errno_text(err));
  }

  std::string target_;
  std::string tmp_;
  int fd_;
  bool renamed_ = false;
};

std::atomic<unsigned> temp_counter{0};

}  // namespace

void write_file_atomic_streaming(const std::string& path,
                                 const std::function<void(const ByteSink&)>& produce) {
  if (path.empty()) user_error("cannot write a file with an empty path");
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..")
    user_error("cannot write '", path, "': the path names a directory, not a file");
  std::string prefix = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);

  // A hidden name unique to this process and call; O_EXCL guards against leftovers. The
  // mode lets the umask decide the final permissions, as a plain open() would.
  int fd = -1;
  std::string tmp;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = str(prefix, ".", base, ".tmp.", ::getpid(), ".", temp_counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt >= 100))
      user_error("cannot write '", path, "': cannot create temporary file '", tmp,
                 "': ", errno_text(errno));
  }
  TempFile file(path, tmp, fd);
  produce([&file](std::string_view bytes) { file.write(bytes); });
  file.commit(dir);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic_streaming(path, [bytes](const ByteSink& sink) { sink(bytes); });
}

}  // namespace autosp

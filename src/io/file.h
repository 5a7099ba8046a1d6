// A file read in place: opened once, read with pread at any offset, from any thread.
//
// pread rather than mmap: a file truncated while it is being read then gives an error naming
// it instead of a SIGBUS, and nothing of the file is held in memory but what a caller asked
// for. Every failure is a UserError naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace autosp::io {

class ReadOnlyFile {
 public:
  // Opens `path`, which must be a regular file; `what` names it in errors ("token file").
  explicit ReadOnlyFile(std::string path, std::string what = "");
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ~ReadOnlyFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  // Reads exactly `n` bytes at `offset`; a short read means the file shrank under us.
  void read(uint64_t offset, void* out, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace autosp::io

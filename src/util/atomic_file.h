// Writing a file so that readers see either the old contents or the new, never a mix.
//
// The bytes go to a temporary file in the target's directory (same file system, so the
// rename is atomic), which is fsynced, renamed over the target, and the directory is
// fsynced so the rename itself survives a crash. A process killed at any point leaves
// the target whole, old or new (and at worst a stray hidden temporary `.NAME.tmp.PID.N`). On a
// reported failure the temporary is removed; the target is untouched unless the failure
// came after the rename (fsyncing the directory), when it already holds the new bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace autosp {

// A file being written to replace `path`, with bytes at any offsets (a safetensors file
// whose header is known before its data arrive in pieces), then commit(). Destroyed without
// a commit (an error on the way), it removes the temporary: `path` is untouched. Errors are
// UserErrors "cannot write 'PATH': cannot write temporary file 'TMP': <errno text>".
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(std::string_view bytes);                   // after the last append
  void write_at(uint64_t offset, std::string_view bytes);  // pwrite: any offset, any order
  // fsync, rename over the target, fsync its directory.
  void commit();
  const std::string& path() const { return target_; }

 private:
  [[noreturn]] void fail(const std::string& what1, const std::string& name, const char* what2, int err) const;

  std::string target_, tmp_, dir_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Receives the next piece of the file's contents.
using ByteSink = std::function<void(std::string_view)>;

// Replaces `path` with `bytes`. Throws UserError naming the path and what failed.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Replaces `path` with whatever `produce` passes to its sink, in order, without holding
// the whole file in memory. If `produce` throws, the temporary is removed, the target is
// left as it was, and the exception propagates unchanged.
void write_file_atomic_streaming(const std::string& path,
                                 const std::function<void(const ByteSink&)>& produce);

}  // namespace autosp

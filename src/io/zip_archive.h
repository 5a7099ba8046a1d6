// Reading the uncompressed ("stored") zip archives PyTorch writes: torch.save's checkpoints and
// torch.export.save's .pt2 programs (PyTorchFileWriter stores every record uncompressed,
// 64-byte aligned, with zip64 records past 4 GiB).
//
// Archives are untrusted input: the end-of-central-directory record, the central directory
// and each entry's local header are checked against the file's size before anything is read,
// and a compressed or encrypted entry, a truncated file or a duplicate name is a UserError
// naming the archive and the entry. Entry data is read in place (io/file.h), never the whole
// archive.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"

namespace autosp::io {

class ZipArchive {
 public:
  explicit ZipArchive(const std::string& path);

  struct Entry {
    uint64_t offset = 0;  // of the entry's data in the file
    uint64_t size = 0;
  };
  const std::string& path() const { return file_.path(); }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The entry `name`; a missing one is a UserError naming the archive and `name`.
  const Entry& entry(const std::string& name) const;
  std::string read_text(const std::string& name) const;
  // Bytes [begin, begin + n) of entry `name` (checked against its size).
  void read(const std::string& name, uint64_t begin, void* out, size_t n) const;

 private:
  ReadOnlyFile file_;
  std::map<std::string, Entry> entries_;
};

}  // namespace autosp::io

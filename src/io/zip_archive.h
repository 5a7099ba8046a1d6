// Reading the zip archives PyTorch writes: torch.save's checkpoints and torch.export.save's .pt2
// programs (PyTorchFileWriter stores every record uncompressed, 64-byte aligned, with zip64
// records past 4 GiB). An archive repacked with deflate (zip's method 8: `zip -9`, Python's
// ZIP_DEFLATED; the test fixtures are, to keep the repository small) is read too: a deflated
// entry is inflated whole, once, on its first read, and kept; a stored one is read in place.
//
// Archives are untrusted input: the end-of-central-directory record, the central directory
// and each entry's local header are checked against the file's size before anything is read,
// and another method, an encrypted entry, a truncated file, a deflated entry that does not
// inflate to its recorded size, or a duplicate name is a UserError naming the archive and the
// entry. Stored entry data is read in place (io/file.h), never the whole archive.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/file.h"

namespace autosp::io {

class ZipArchive {
 public:
  explicit ZipArchive(const std::string& path);

  struct Entry {
    uint64_t offset = 0;  // of the entry's data in the file
    uint64_t size = 0;    // its bytes, inflated
    uint64_t compressed = 0;  // deflated: its bytes in the file; stored: size
    bool deflated = false;
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
  // A deflated entry's bytes, inflated on its first read.
  const std::vector<uint8_t>& inflated(const std::string& name, const Entry& e) const;

  ReadOnlyFile file_;
  std::map<std::string, Entry> entries_;
  mutable std::map<std::string, std::unique_ptr<std::vector<uint8_t>>> inflated_;
};

}  // namespace autosp::io

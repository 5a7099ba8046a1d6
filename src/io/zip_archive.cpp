#include "io/zip_archive.h"

#include <algorithm>
#include <cstring>

#include <zlib.h>

#include "util/error.h"

namespace autosp::io {
namespace {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50, kZip64EndLocator = 0x07064b50,
                   kZip64End = 0x06064b50, kCentralHeader = 0x02014b50, kLocalHeader = 0x04034b50;

uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t u32(const uint8_t* p) { return uint32_t(u16(p)) | uint32_t(u16(p + 2)) << 16; }
uint64_t u64(const uint8_t* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }

}  // namespace

ZipArchive::ZipArchive(const std::string& path) : file_(path, "zip archive") {
  const uint64_t size = file_.size();
  auto bad = [&](const auto&... what) { user_error(path, ": not a readable zip archive: ", what...); };
  // The end-of-central-directory record: 22 bytes plus a comment of at most 65535.
  const uint64_t tail = std::min<uint64_t>(size, 22 + 65535);
  if (tail < 22) bad("the file is ", size, " bytes, shorter than the smallest archive");
  std::vector<uint8_t> buf(tail);
  file_.read(size - tail, buf.data(), tail);
  int64_t eocd = -1;
  for (int64_t i = int64_t(tail) - 22; i >= 0; --i)
    if (u32(&buf[i]) == kEndOfCentralDirectory && uint64_t(i) + 22 + u16(&buf[i + 20]) == tail) {
      eocd = i;
      break;
    }
  if (eocd < 0) bad("no end-of-central-directory record (a truncated or a different file)");
  const uint8_t* e = &buf[eocd];
  uint64_t count = u16(e + 10), dir_size = u32(e + 12), dir_offset = u32(e + 16);
  if (count == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
    // zip64: its locator sits just before the record and points at the zip64 record.
    const uint64_t locator = size - tail + uint64_t(eocd);
    if (locator < 20) bad("a zip64 archive without its zip64 locator");
    uint8_t loc[20], z[56];
    file_.read(locator - 20, loc, 20);
    if (u32(loc) != kZip64EndLocator) bad("a zip64 archive without its zip64 locator");
    const uint64_t at = u64(loc + 8);
    if (at > size - 56) bad("the zip64 record's offset ", at, " is past the end");
    file_.read(at, z, 56);
    if (u32(z) != kZip64End) bad("no zip64 end-of-central-directory record at ", at);
    count = u64(z + 32), dir_size = u64(z + 40), dir_offset = u64(z + 48);
  }
  if (dir_offset > size || dir_size > size - dir_offset)
    bad("the central directory [", dir_offset, ", +", dir_size, ") is past the end of the file");
  std::vector<uint8_t> dir(dir_size);
  file_.read(dir_offset, dir.data(), dir_size);
  uint64_t at = 0;
  for (uint64_t n = 0; n < count; ++n) {
    if (dir_size - at < 46 || u32(&dir[at]) != kCentralHeader) bad("central directory entry ", n, " is malformed");
    const uint8_t* h = &dir[at];
    const uint16_t flags = u16(h + 8), method = u16(h + 10), name_len = u16(h + 28), extra_len = u16(h + 30),
                   comment_len = u16(h + 32);
    uint64_t compressed = u32(h + 20), uncompressed = u32(h + 24), local = u32(h + 42);
    if (dir_size - at < 46ull + name_len + extra_len + comment_len) bad("central directory entry ", n, " is truncated");
    std::string name(reinterpret_cast<const char*>(h + 46), name_len);
    // zip64 extra field (id 1): the 64-bit values of whichever fields are 0xffffffff, in order.
    for (uint64_t x = 0; x + 4 <= extra_len;) {
      const uint8_t* f = h + 46 + name_len + x;
      const uint16_t id = u16(f), len = u16(f + 2);
      if (x + 4 + len > extra_len) bad(name, ": its extra field is truncated");
      if (id == 1) {
        uint64_t k = 0;
        auto take = [&](uint64_t& v) {
          if (v != 0xffffffff) return;
          if (k + 8 > len) bad(name, ": its zip64 field is truncated");
          v = u64(f + 4 + k);
          k += 8;
        };
        take(uncompressed), take(compressed), take(local);
      }
      x += 4 + uint64_t(len);
    }
    if (flags & 1) user_error(path, ": entry ", name, " is encrypted; autosp reads unencrypted archives only");
    if (method != 0 && method != 8)
      user_error(path, ": entry ", name, " is compressed by method ", method,
                 "; autosp reads stored entries (torch.save's and torch.export.save's) and deflated ones (method 8)");
    if (method == 0 && compressed != uncompressed)
      bad(name, ": stored, but its sizes differ (", compressed, " and ", uncompressed, ")");
    if (local > size - std::min<uint64_t>(size, 30)) bad(name, ": its local header offset ", local, " is past the end");
    uint8_t lh[30];
    file_.read(local, lh, 30);
    if (u32(lh) != kLocalHeader) bad(name, ": no local header at ", local);
    const uint64_t data = local + 30 + u16(lh + 26) + u16(lh + 28);
    if (data > size || compressed > size - data)
      bad(name, ": its ", compressed, " bytes at ", data, " run past the end of the file (", size, " bytes)");
    if (!entries_.emplace(name, Entry{data, uncompressed, compressed, method == 8}).second)
      bad("the entry ", name, " appears twice");
    at += 46ull + name_len + extra_len + comment_len;
  }
}

const ZipArchive::Entry& ZipArchive::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) user_error(path(), ": the archive has no entry ", name);
  return it->second;
}

const std::vector<uint8_t>& ZipArchive::inflated(const std::string& name, const Entry& e) const {
  std::unique_ptr<std::vector<uint8_t>>& slot = inflated_[name];
  if (slot) return *slot;
  std::vector<uint8_t> in(e.compressed);
  file_.read(e.offset, in.data(), in.size());
  // (one byte more than recorded: inflate may need room to see the stream's end, and data past the
  // recorded size is an error)
  auto out = std::make_unique<std::vector<uint8_t>>(e.size + 1);
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) user_error(path(), ": entry ", name, ": zlib could not start inflating");
  // (zlib's counts are 32-bit: fed and drained in pieces)
  constexpr uint64_t kPiece = uint64_t(1) << 30;
  uint64_t fed = 0, got = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (z.avail_in == 0 && fed < in.size()) {
      z.next_in = in.data() + fed;
      z.avail_in = static_cast<uInt>(std::min(kPiece, in.size() - fed));
      fed += z.avail_in;
    }
    if (z.avail_out == 0) {
      if (got == out->size()) break;  // full: more than the recorded size
      z.next_out = out->data() + got;
      z.avail_out = static_cast<uInt>(std::min(kPiece, out->size() - got));
      got += z.avail_out;
    }
    rc = inflate(&z, Z_NO_FLUSH);
  }
  const uint64_t produced = got - z.avail_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != e.size)
    user_error(path(), ": entry ", name, " does not inflate to its ", e.size, " bytes (zlib: ",
               rc == Z_STREAM_END ? std::string("ended after ") + std::to_string(produced) + " bytes"
                                  : std::string(z.msg ? z.msg : "truncated or malformed data"),
               "): a damaged archive");
  out->resize(e.size);
  slot = std::move(out);
  return *slot;
}

std::string ZipArchive::read_text(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.deflated) {
    const std::vector<uint8_t>& bytes = inflated(name, e);
    return std::string(bytes.begin(), bytes.end());
  }
  std::string text(e.size, '\0');
  file_.read(e.offset, text.data(), e.size);
  return text;
}

void ZipArchive::read(const std::string& name, uint64_t begin, void* out, size_t n) const {
  const Entry& e = entry(name);
  if (begin > e.size || n > e.size - begin)
    user_error(path(), ": entry ", name, " has ", e.size, " bytes; [", begin, ", ", begin + n, ") was asked for");
  if (e.deflated) {
    std::memcpy(out, inflated(name, e).data() + begin, n);
    return;
  }
  file_.read(e.offset + begin, out, n);
}

}  // namespace autosp::io

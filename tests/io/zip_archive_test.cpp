// The zip reader (io/zip_archive.h) on archives written here byte by byte: stored entries, as
// torch.save and torch.export.save write them, and deflated ones, as `zip -9` and Python's
// ZIP_DEFLATED do (the test fixtures' .pt2 are). Damaged or unsupported entries are errors naming
// the archive and the entry.
#include "io/zip_archive.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "testing/errors.h"
#include "testing/process.h"

namespace autosp {
namespace {

struct ZipEntry {
  std::string name, data;
  uint16_t method = 0;       // 0 stored, 8 deflated, or another (written stored, labelled so)
  int64_t recorded = -1;     // the uncompressed size written in the headers (-1: the true one)
  bool damage = false;       // deflated: flip bytes in the middle of the compressed data
};

std::string deflate_raw(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(data.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void put16(std::string& s, uint16_t v) { s.push_back(char(v & 0xff)), s.push_back(char(v >> 8)); }
void put32(std::string& s, uint32_t v) { put16(s, uint16_t(v & 0xffff)), put16(s, uint16_t(v >> 16)); }

// A zip archive of the entries (no zip64), written to `path`.
void write_zip(const std::string& path, const std::vector<ZipEntry>& entries) {
  std::string file, central;
  for (const ZipEntry& e : entries) {
    std::string body = e.method == 8 ? deflate_raw(e.data) : e.data;
    if (e.damage)
      for (size_t i = body.size() / 3; i < body.size() / 3 + 8 && i < body.size(); ++i) body[i] = char(~body[i]);
    const uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(e.data.data()), uInt(e.data.size())));
    const uint32_t size = uint32_t(e.recorded >= 0 ? e.recorded : int64_t(e.data.size()));
    const uint32_t offset = uint32_t(file.size());
    put32(file, 0x04034b50), put16(file, 20), put16(file, 0), put16(file, e.method), put16(file, 0), put16(file, 0);
    put32(file, crc), put32(file, uint32_t(body.size())), put32(file, size), put16(file, uint16_t(e.name.size()));
    put16(file, 0);
    file += e.name + body;
    put32(central, 0x02014b50), put16(central, 20), put16(central, 20), put16(central, 0), put16(central, e.method);
    put16(central, 0), put16(central, 0), put32(central, crc), put32(central, uint32_t(body.size()));
    put32(central, size), put16(central, uint16_t(e.name.size())), put16(central, 0), put16(central, 0);
    put16(central, 0), put16(central, 0), put32(central, 0), put32(central, offset);
    central += e.name;
  }
  const uint32_t at = uint32_t(file.size());
  file += central;
  put32(file, 0x06054b50), put16(file, 0), put16(file, 0), put16(file, uint16_t(entries.size()));
  put16(file, uint16_t(entries.size())), put32(file, uint32_t(central.size())), put32(file, at), put16(file, 0);
  std::ofstream(path, std::ios::binary) << file;
}

std::string numbers(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += std::to_string(i * 7 % 1000) + (i % 16 == 15 ? "\n" : " ");
  return s;
}

// Stored and deflated entries read alike: whole, and any range of them.
TEST(ZipArchive, DeflatedEntriesReadAsTheStoredOnes) {
  testing::TempDir dir("zip");
  const std::string path = dir.path() + "/a.zip", text = numbers(5000), empty;
  write_zip(path, {{"stored.txt", text, 0}, {"deflated.txt", text, 8}, {"empty", empty, 8}});
  io::ZipArchive z(path);
  EXPECT_FALSE(z.entry("stored.txt").deflated);
  EXPECT_TRUE(z.entry("deflated.txt").deflated);
  EXPECT_LT(z.entry("deflated.txt").compressed, text.size() / 2);
  EXPECT_EQ(z.read_text("deflated.txt"), text);
  EXPECT_EQ(z.read_text("stored.txt"), text);
  EXPECT_EQ(z.read_text("empty"), "");
  for (uint64_t begin : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, uint64_t{text.size() - 5}}) {
    std::string a(5, '\0'), b(5, '\0');
    z.read("deflated.txt", begin, a.data(), 5);
    z.read("stored.txt", begin, b.data(), 5);
    EXPECT_EQ(a, text.substr(begin, 5));
    EXPECT_EQ(b, a);
  }
  EXPECT_NE(testing::user_error_of([&] {
              char c;
              z.read("deflated.txt", text.size(), &c, 1);
            }).find("deflated.txt has " + std::to_string(text.size()) + " bytes"),
            std::string::npos);
}

// A damaged deflated entry, one that inflates to more or fewer bytes than recorded, and another
// method are errors naming the archive and the entry; the archive's other entries still read.
TEST(ZipArchive, DamagedOrUnsupportedEntriesAreNamedErrors) {
  testing::TempDir dir("zip");
  const std::string text = numbers(3000), path = dir.path() + "/b.zip";
  write_zip(path, {{"good", text, 8},
                   {"damaged", text, 8, -1, true},
                   {"longer", text, 8, int64_t(text.size()) - 10},
                   {"shorter", text, 8, int64_t(text.size()) + 10}});
  io::ZipArchive z(path);
  EXPECT_EQ(z.read_text("good"), text);
  for (const char* name : {"damaged", "longer", "shorter"}) {
    const std::string e = testing::user_error_of([&] { z.read_text(name); });
    SCOPED_TRACE(e);
    EXPECT_NE(e.find(path), std::string::npos);
    EXPECT_NE(e.find(std::string("entry ") + name + " does not inflate to its"), std::string::npos);
  }
  const std::string bzip2 = dir.path() + "/c.zip";
  write_zip(bzip2, {{"model/data.pkl", text, 12}});
  const std::string e = testing::user_error_of([&] { io::ZipArchive c(bzip2); });
  EXPECT_NE(e.find(bzip2 + ": entry model/data.pkl is compressed by method 12"), std::string::npos) << e;
}

}  // namespace
}  // namespace autosp

// FNV-1a, 64-bit: stable across processes, builds and platforms (unlike std::hash), for
// comparing values between ranks, seeding, and fingerprinting files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace autosp {

inline constexpr uint64_t kFnv1aBasis = 14695981039346656037ull;

// Continues a hash `h` over `bytes` (start from kFnv1aBasis).
constexpr uint64_t fnv1a(std::string_view bytes, uint64_t h = kFnv1aBasis) {
  for (unsigned char ch : bytes) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// FNV-1a over the whole file at `path`, read in bounded chunks; its size in *bytes. A file
// that cannot be opened or read is a UserError naming it. (Byte-serial: about 1 GB/s, the
// same cost as reading a checkpoint back once from the page cache.)
uint64_t fnv1a_file(const std::string& path, int64_t* bytes);

}  // namespace autosp

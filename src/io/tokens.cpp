#include "io/tokens.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <system_error>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hash.h"

namespace autosp::io {

// Token ids are copied straight from the file into host integers.
static_assert(std::endian::native == std::endian::little,
              "token files assume a little-endian host");

namespace {
std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }
}  // namespace

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  // pread per sample rather than mmap: a file truncated while training then gives an
  // error naming it instead of a SIGBUS, and a sample is one small sequential read.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) user_error(path_, ": cannot open token file: ", errno_text(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    user_error(path_, ": cannot stat token file: ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    user_error(path_, ": token file is not a regular file");
  }
  if (st.st_size % 4 != 0) {
    ::close(fd_);
    user_error(path_, ": token file is ", st.st_size,
               " bytes, not a multiple of 4 (expected little-endian uint32 token ids)");
  }
  num_tokens_ = st.st_size / 4;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), num_tokens_(other.num_tokens_) {
  other.fd_ = -1;
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    num_tokens_ = other.num_tokens_;
    other.fd_ = -1;
  }
  return *this;
}

int64_t TokenFile::num_samples(int64_t S) const {
  AUTOSP_CHECK(S > 0, "sequence length ", S);
  return num_tokens_ < 1 ? 0 : (num_tokens_ - 1) / S;
}

void TokenFile::read_sample(int64_t k, int64_t S, int32_t vocab_size, int32_t* inputs,
                            int32_t* labels) const {
  AUTOSP_CHECK(fd_ >= 0, "read from a moved-from TokenFile");
  AUTOSP_CHECK(k >= 0 && S > 0 && vocab_size > 0, "k=", k, " S=", S, " vocab_size=", vocab_size);
  int64_t samples = num_samples(S);
  if (samples == 0)
    user_error(path_, ": token file has ", num_tokens_,
               " tokens, but one sample of sequence length S=", S, " needs S + 1 = ", S + 1);
  int64_t first = (k % samples) * S;

  std::vector<uint32_t> tokens(static_cast<size_t>(S + 1));
  read_tokens(first, S + 1, tokens.data());
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= static_cast<uint32_t>(vocab_size))
      user_error(path_, ": token id ", tokens[i], " at byte offset ",
                 (first + static_cast<int64_t>(i)) * 4, " is out of range for vocab_size ",
                 vocab_size);
  for (int64_t i = 0; i < S; ++i) {
    inputs[i] = static_cast<int32_t>(tokens[i]);
    labels[i] = static_cast<int32_t>(tokens[i + 1]);
  }
}

void TokenFile::read_tokens(int64_t first, int64_t n, uint32_t* out) const {
  AUTOSP_CHECK(fd_ >= 0, "read from a moved-from TokenFile");
  AUTOSP_CHECK(first >= 0 && n >= 0 && first <= num_tokens_ - n, "tokens [", first, ", +", n, ") of ", num_tokens_);
  auto* p = reinterpret_cast<char*>(out);
  size_t left = static_cast<size_t>(n) * 4;
  off_t at = static_cast<off_t>(first * 4);
  while (left > 0) {
    ssize_t got = ::pread(fd_, p, left, at);
    if (got < 0) {
      if (errno == EINTR) continue;
      user_error(path_, ": cannot read token file at byte offset ", at, ": ", errno_text(errno));
    }
    if (got == 0)
      user_error(path_, ": unexpected end of token file at byte offset ", at,
                 " (was it truncated while training?)");
    p += got;
    left -= static_cast<size_t>(got);
    at += got;
  }
}

void TokenFile::validate(int32_t vocab_size, const ValidationProgress& progress) const {
  AUTOSP_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  constexpr int64_t kBlock = kValidationBlockBytes / 4;
  std::vector<uint32_t> block(static_cast<size_t>(std::min(kBlock, std::max<int64_t>(num_tokens_, 1))));
  const auto limit = static_cast<uint32_t>(vocab_size);
  for (int64_t first = 0; first < num_tokens_; first += kBlock) {
    const int64_t n = std::min(kBlock, num_tokens_ - first);
    read_tokens(first, n, block.data());
    uint32_t top = 0;  // a max the compiler vectorises; the rare bad block is searched again
    for (int64_t i = 0; i < n; ++i) top = std::max(top, block[static_cast<size_t>(i)]);
    if (top >= limit) {
      const int64_t i = std::find_if(block.begin(), block.begin() + n, [&](uint32_t t) { return t >= limit; }) -
                        block.begin();
      user_error(path_, ": token id ", block[static_cast<size_t>(i)], " at byte offset ", (first + i) * 4,
                 " is out of range for vocab_size ", vocab_size, " (every id of --data is checked at start-up)");
    }
    if (progress) progress((first + n) * 4, num_tokens_ * 4);
  }
}

DataFingerprint TokenFile::fingerprint() const {
  AUTOSP_CHECK(fd_ >= 0, "fingerprint of a moved-from TokenFile");
  DataFingerprint f{num_tokens_ * 4, kFnv1aBasis};
  const int64_t block = std::min(kFingerprintBlock, f.bytes);
  std::string buf(static_cast<size_t>(block), '\0');
  for (int64_t at : {int64_t{0}, f.bytes - block}) {
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t got = ::pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(at + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        user_error(path_, ": cannot read token file at byte offset ", at + int64_t(done), ": ",
                   got == 0 ? "unexpected end of file" : errno_text(errno));
      done += static_cast<size_t>(got);
    }
    f.hash = fnv1a(buf, f.hash);
  }
  return f;
}

void write_tokens(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_file_atomic(path, {reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4});
}

}  // namespace autosp::io

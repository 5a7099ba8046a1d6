#include "train/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>

#include "util/error.h"

namespace autosp::train {

void DataSource::read_layout(int64_t /*sample*/, int64_t S, int32_t* positions, int32_t* documents) const {
  for (int64_t i = 0; i < S; ++i) {
    positions[i] = static_cast<int32_t>(i);
    documents[i] = 0;
  }
}

// ---------------------------------------------------------------------------- documents

DocumentStarts::DocumentStarts(std::vector<int64_t> starts) : starts_(std::move(starts)) {
  AUTOSP_CHECK(!starts_.empty() && starts_[0] == 0, "document starts must begin with 0");
  for (size_t d = 1; d < starts_.size(); ++d)
    AUTOSP_CHECK(starts_[d] > starts_[d - 1], "document starts not increasing at ", d);
}

void DocumentStarts::mask_labels(int64_t first, int64_t S, int32_t* labels) const {
  // Token first + i ends its document when first + i + 1 is a start, for starts in
  // (first, first + S].
  for (auto it = std::upper_bound(starts_.begin(), starts_.end(), first); it != starts_.end() && *it <= first + S;
       ++it)
    labels[*it - first - 1] = kIgnoreLabel;
}

void DocumentStarts::layout(int64_t first, int64_t S, int32_t* positions, int32_t* documents) const {
  AUTOSP_CHECK(!starts_.empty(), "layout of a stream without documents");
  auto next = std::upper_bound(starts_.begin(), starts_.end(), first);  // the first start after `first`
  int64_t start = *(next - 1);  // of token first's document, which may begin before the sample
  int32_t document = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t t = first + i;
    if (next != starts_.end() && *next == t) {
      start = t;
      ++document;
      ++next;
    }
    // A document cut by the sample's start continues its count, so a position can exceed S.
    const int64_t position = t - start;
    if (position > INT32_MAX)
      user_error("stream token ", t, " is ", position, " tokens into its document: position ids are int32");
    positions[i] = static_cast<int32_t>(position);
    documents[i] = document;
  }
}

// ---------------------------------------------------------------------------- token file

namespace {

// Where each document of a flat token file starts: after every EOS token but the last one.
std::vector<int64_t> eos_document_starts(const io::TokenFile& file, uint32_t eos) {
  std::vector<int64_t> starts{0};
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<uint32_t> tokens(static_cast<size_t>(std::min(kChunk, file.num_tokens())));
  for (int64_t first = 0; first < file.num_tokens(); first += kChunk) {
    const int64_t n = std::min(kChunk, file.num_tokens() - first);
    file.read_tokens(first, n, tokens.data());
    for (int64_t i = 0; i < n; ++i)
      if (tokens[static_cast<size_t>(i)] == eos && first + i + 1 < file.num_tokens()) starts.push_back(first + i + 1);
  }
  return starts;
}

}  // namespace

TokenFileSource::TokenFileSource(const std::string& path, int32_t vocab_size, std::optional<int32_t> eos_token_id,
                                 const io::ValidationProgress& progress)
    : file_(path), vocab_size_(vocab_size), eos_token_id_(eos_token_id) {
  // Before the EOS scan, which then reads the file from the page cache.
  file_.validate(vocab_size_, progress);
  if (eos_token_id_) {
    AUTOSP_CHECK(*eos_token_id_ >= 0 && *eos_token_id_ < vocab_size_, "eos_token_id ", *eos_token_id_);
    documents_ = DocumentStarts(eos_document_starts(file_, static_cast<uint32_t>(*eos_token_id_)));
  }
}

void TokenFileSource::read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const {
  file_.read_sample(sample, S, vocab_size_, inputs, labels);
  if (eos_token_id_) documents_.mask_labels((sample % file_.num_samples(S)) * S, S, labels);
}

void TokenFileSource::read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const {
  if (!eos_token_id_) return DataSource::read_layout(sample, S, positions, documents);
  const int64_t samples = file_.num_samples(S);
  if (samples == 0)
    user_error(file_.path(), ": token file has ", file_.num_tokens(), " tokens, but one sample of sequence length S=",
               S, " needs S + 1 = ", S + 1);
  documents_.layout((sample % samples) * S, S, positions, documents);
}

std::string TokenFileSource::describe(int64_t S) const {
  std::string text = str(file_.path(), ": ", file_.num_tokens(), " tokens, ");
  if (eos_token_id_)
    text += str(documents_.count(), " documents (each ending at eos_token_id ", *eos_token_id_, ", packed), ");
  return text + str(file_.num_samples(S), " samples of ", S, " tokens");
}

// ---------------------------------------------------------------------------- indexed dataset

namespace {

// Megatron's document starts without the empty documents (and without the end), as the
// strictly increasing starts DocumentStarts takes.
std::vector<int64_t> nonempty_document_starts(const io::IndexedDataset& dataset) {
  std::vector<int64_t> starts;
  for (int64_t s : dataset.document_starts())
    if (s < dataset.num_tokens() && (starts.empty() || s > starts.back())) starts.push_back(s);
  if (starts.empty()) starts.push_back(0);  // no tokens at all: no sample reads it
  return starts;
}

}  // namespace

IndexedDatasetSource::IndexedDatasetSource(const std::string& idx_path, const std::string& bin_path,
                                           int32_t vocab_size, bool pack, const io::ValidationProgress& progress)
    : dataset_(idx_path, bin_path), vocab_size_(vocab_size), pack_(pack) {
  dataset_.validate(vocab_size_, progress);
  if (pack_) documents_ = DocumentStarts(nonempty_document_starts(dataset_));
}

int64_t IndexedDatasetSource::num_samples(int64_t S) const {
  AUTOSP_CHECK(S > 0, "sequence length ", S);
  return dataset_.num_tokens() < 1 ? 0 : (dataset_.num_tokens() - 1) / S;
}

int64_t IndexedDatasetSource::first_token(int64_t sample, int64_t S) const {
  AUTOSP_CHECK(sample >= 0 && S > 0, "sample ", sample, " S=", S);
  const int64_t samples = num_samples(S);
  if (samples == 0)
    user_error(dataset_.bin_path(), ": the indexed dataset has ", dataset_.num_tokens(),
               " tokens, but one sample of sequence length S=", S, " needs S + 1 = ", S + 1);
  return (sample % samples) * S;
}

void IndexedDatasetSource::read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const {
  const int64_t first = first_token(sample, S);
  std::vector<int32_t> tokens(static_cast<size_t>(S + 1));
  dataset_.read_tokens(first, S + 1, vocab_size_, tokens.data());
  std::copy(tokens.begin(), tokens.end() - 1, inputs);
  std::copy(tokens.begin() + 1, tokens.end(), labels);
  if (pack_) documents_.mask_labels(first, S, labels);
}

void IndexedDatasetSource::read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const {
  if (!pack_) return DataSource::read_layout(sample, S, positions, documents);
  documents_.layout(first_token(sample, S), S, positions, documents);
}

std::string IndexedDatasetSource::describe(int64_t S) const {
  const int64_t empty = dataset_.num_documents() - (dataset_.num_tokens() > 0 ? documents_.count() : 0);
  const std::string& bin = dataset_.bin_path();
  const std::string name = bin.size() > 4 && bin.compare(bin.size() - 4, 4, ".bin") == 0
                               ? bin.substr(0, bin.size() - 4) + ".{bin,idx}"
                               : bin + " + " + dataset_.idx_path();
  std::string text = str(name, ": Megatron indexed dataset of ", dataset_.dtype_name(),
                         " ids, ", dataset_.num_documents(), " documents");
  if (pack_ && empty > 0) text += str(" (", empty, " empty)");
  text += str(" in ", dataset_.num_sequences(), " sequences, ", dataset_.num_tokens(), " tokens, ", num_samples(S),
              " samples of ", S, " tokens");
  return text + (pack_ ? ", packed" : ", not packed (data.pack false: one token stream)");
}

// ---------------------------------------------------------------------------- sample order

namespace {

// splitmix64's finaliser: a bijection of uint64 whose output bits each depend on all input bits.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr int kFeistelRounds = 6;  // 4 already make a pseudorandom permutation (Luby-Rackoff)

}  // namespace

int64_t shuffled_sample(uint64_t seed, int64_t epoch, int64_t n, int64_t i) {
  AUTOSP_CHECK(n >= 1 && n <= (int64_t{1} << 62) && i >= 0 && i < n && epoch >= 0, "shuffled_sample: n=", n,
               " i=", i, " epoch=", epoch);
  int half = 1;  // bits of each Feistel half: the smallest h >= 1 with 4^h >= n
  while ((uint64_t{1} << (2 * half)) < static_cast<uint64_t>(n)) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  // Round keys from (seed, epoch); the golden-ratio steps keep the rounds' keys distinct.
  uint64_t keys[kFeistelRounds];
  const uint64_t epoch_key = mix64(mix64(seed ^ 0x5deece66dULL) + static_cast<uint64_t>(epoch));
  for (int r = 0; r < kFeistelRounds; ++r) keys[r] = mix64(epoch_key + uint64_t(r + 1) * 0x9e3779b97f4a7c15ULL);
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle-walking: x's cycle of the 4^h-permutation contains i < n, so this ends
    uint64_t left = x >> half, right = x & mask;
    for (int r = 0; r < kFeistelRounds; ++r) {
      // (L, R) -> (R, L xor F(R)): invertible whatever F is.
      const uint64_t next = left ^ (mix64(keys[r] ^ right) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

int64_t ShuffledSource::file_sample(int64_t g, int64_t S) const {
  AUTOSP_CHECK(g >= 0, "sample ", g);
  const int64_t n = inner_->num_samples(S);
  if (n == 0) return g;  // generated (or shorter than a sample: the inner source says so when read)
  return shuffled_sample(seed_, g / n, n, g % n);
}

std::unique_ptr<DataSource> order_samples(std::unique_ptr<DataSource> source, const DataConfig& config) {
  if (!config.shuffle) return source;
  AUTOSP_CHECK(config.seed.has_value(), "data.seed not resolved before the data is ordered");
  return std::make_unique<ShuffledSource>(std::move(source), *config.seed);
}

std::string describe_data_order(const DataConfig& config) {
  if (!config.shuffle) return "data order: file order (data.shuffle false)";
  AUTOSP_CHECK(config.seed.has_value(), "data.seed not resolved");
  return str("data order: shuffled (seed ", *config.seed, ", a new permutation each epoch)");
}

// ---------------------------------------------------------------------------- --data

namespace {

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

namespace {

// Reports a validation pass over `name`: nothing for a file under kQuietBytes (it takes
// well under a second), a line every kEvery, and the total with its rate at the end.
class ValidationReport {
 public:
  ValidationReport(std::string name, const std::function<void(const std::string&)>& say)
      : name_(std::move(name)), say_(say), start_(Clock::now()), last_(start_) {}

  void operator()(int64_t done, int64_t total) {
    if (!say_ || total < kQuietBytes) return;
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? double(done) / seconds / 1e9 : 0.0;
    if (done == total) {
      say_(str("validated ", name_, ": every token id of ", fixed(double(total) / 1e9, 2), " GB in ",
               fixed(seconds, 1), " s (", fixed(rate, 2), " GB/s)"));
    } else if (now - last_ >= kEvery) {
      last_ = now;
      say_(str("validating ", name_, ": ", fixed(double(done) / 1e9, 2), " of ", fixed(double(total) / 1e9, 2),
               " GB (", fixed(rate, 2), " GB/s)"));
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kQuietBytes = int64_t{256} << 20;
  static constexpr std::chrono::seconds kEvery{5};
  static std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
  }
  std::string name_;
  const std::function<void(const std::string&)>& say_;
  Clock::time_point start_, last_;
};

}  // namespace

std::unique_ptr<DataSource> open_data_source(const std::string& path, int32_t vocab_size, const DataConfig& config,
                                             const std::string& config_source, std::vector<std::string>* warnings,
                                             const std::function<void(const std::string&)>& progress) {
  auto warn = [&](const std::string& what) {
    if (warnings) warnings->push_back(str(config_source, ": ", what));
  };
  if (config.eos_token_id && *config.eos_token_id >= vocab_size)
    user_error(config_source, ": data.eos_token_id: ", *config.eos_token_id, " is not a token of the model, whose "
               "vocab_size is ", vocab_size);

  // Which files `path` names.
  std::string prefix;
  if (!is_file(path) && (exists(path + ".bin") || exists(path + ".idx"))) {
    prefix = path;
  } else if (ends_with(path, ".idx")) {
    prefix = path.substr(0, path.size() - 4);
  } else if (ends_with(path, ".bin") && exists(path.substr(0, path.size() - 4) + ".idx")) {
    prefix = path.substr(0, path.size() - 4);
  }
  if (!prefix.empty()) {
    for (const char* ext : {".idx", ".bin"})
      if (!exists(prefix + ext))
        user_error(path, ": an indexed dataset is PREFIX.bin + PREFIX.idx, and ", prefix, ext, " does not exist");
    if (config.eos_token_id)
      warn("data.eos_token_id: ignored: the documents of an indexed dataset are those of its .idx");
    ValidationReport report(prefix + ".bin", progress);
    return std::make_unique<IndexedDatasetSource>(prefix + ".idx", prefix + ".bin", vocab_size,
                                                  config.pack.value_or(true), std::ref(report));
  }
  if (!exists(path))
    user_error(path, ": no such file (--data takes a flat token file, or the PREFIX of an indexed dataset's "
               "PREFIX.bin and PREFIX.idx)");
  if (config.pack == true && !config.eos_token_id)
    user_error(config_source, ": data.pack: true, but ", path, " is a flat token file, whose documents end at "
               "data.eos_token_id: give data.eos_token_id (or use an indexed dataset)");
  if (config.pack == false && config.eos_token_id)
    warn("data.eos_token_id: ignored: data.pack is false, so the token file is one stream");
  std::optional<int32_t> eos;
  if (config.eos_token_id && config.pack != false) eos = static_cast<int32_t>(*config.eos_token_id);
  ValidationReport report(path, progress);
  return std::make_unique<TokenFileSource>(path, vocab_size, eos, std::ref(report));
}

ConvertedPosition convert_data_position(int64_t consumed, int64_t old_S, int64_t old_N, int64_t new_S,
                                        int64_t new_N) {
  AUTOSP_CHECK(consumed >= 0 && old_S > 0 && new_S > 0 && old_N >= 0 && new_N >= 0 && (old_N == 0) == (new_N == 0),
               "convert_data_position(", consumed, ", ", old_S, ", ", old_N, ", ", new_S, ", ", new_N, ")");
  ConvertedPosition p;
  p.epoch = old_N > 0 ? consumed / old_N : 0;
  const int64_t tokens = (old_N > 0 ? consumed % old_N : consumed) * old_S;  // read of this epoch
  int64_t k = (tokens + new_S - 1) / new_S;
  p.skipped_tokens = k * new_S - tokens;
  if (new_N > 0 && k >= new_N) {  // no whole sample left in the epoch: the next one
    p.skipped_tokens = std::max<int64_t>(0, new_N * new_S - tokens);
    ++p.epoch;
    k = 0;
  }
  p.samples = p.epoch * new_N + k;
  return p;
}

}  // namespace autosp::train

#include "train/passkey.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace autosp::train {
namespace {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// splitmix64 keyed by (seed, sample): the stream of one sample depends on nothing else, so
// samples can be generated in any order and on any rank.
class SampleStream {
 public:
  SampleStream(uint64_t seed, int64_t sample)
      : state_(mix64(mix64(seed + kGamma) ^ static_cast<uint64_t>(sample))) {}
  uint64_t next() { return mix64(state_ += kGamma); }
  // Uniform in [0, n); the modulo bias is below n / 2^64.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
  uint64_t state_;
};

// Sample `sample` as S + 1 tokens t[0..S] (see passkey.h for the layout).
std::vector<int32_t> passkey_tokens(const PasskeySpec& spec, int64_t sample, int64_t S) {
  const int64_t L = spec.key_length;
  SampleStream rng(spec.seed, sample);
  // The key block t[p..p+L] must end in the first half: p + L <= S/2 - 1.
  const int64_t p = 1 + rng.below(S / 2 - L - 1);
  std::vector<int32_t> digits(L);
  for (auto& d : digits) d = PasskeyTask::kDigit0 + static_cast<int32_t>(rng.below(10));

  std::vector<int32_t> t(S + 1);
  for (auto& token : t)
    token = PasskeyTask::kFirstFiller + static_cast<int32_t>(rng.below(spec.filler_words));
  t[0] = PasskeyTask::kBos;
  t[p] = PasskeyTask::kKey;
  t[S - L] = PasskeyTask::kQuery;
  for (int64_t j = 0; j < L; ++j) t[p + 1 + j] = t[S - L + 1 + j] = digits[j];
  return t;
}

char symbol(int32_t token) {
  if (token == PasskeyTask::kBos) return '^';
  if (token == PasskeyTask::kKey) return 'k';
  if (token == PasskeyTask::kQuery) return '?';
  if (token < PasskeyTask::kFirstFiller) return static_cast<char>('0' + token - PasskeyTask::kDigit0);
  return '.';
}

// "^ ..[37 filler].. k 4 7 ..[212 filler].. ? 4 7": one symbol per token, runs of more than
// six filler tokens shortened to their count.
std::string render(const std::vector<int32_t>& t) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (!out.empty()) out += ' ';
    if (symbol(t[i]) != '.') {
      out += symbol(t[i++]);
      continue;
    }
    size_t end = i;
    while (end < t.size() && symbol(t[end]) == '.') ++end;
    const size_t n = end - i;
    out += n <= 6 ? std::string(n, '.') : str("..[", n, " filler]..");
    i = end;
  }
  return out;
}

}  // namespace

PasskeyTask::PasskeyTask(PasskeySpec spec) : spec_(spec) {
  if (spec_.key_length < 1 || spec_.key_length > 9)
    user_error("passkey task: key_length ", spec_.key_length, " must be in 1..9");
  if (spec_.filler_words < 2)
    user_error("passkey task: filler_words ", spec_.filler_words,
               " must be at least 2 (the filler has to vary)");
}

int64_t PasskeyTask::min_seq_len() const {
  return std::max<int64_t>(32, 4 * (spec_.key_length + 2));
}

void PasskeyTask::check_seq_len(int64_t S) const {
  if (S < min_seq_len())
    user_error("passkey task: seq_len ", S, " is too short; it needs at least ", min_seq_len(),
               " tokens (a ", spec_.key_length,
               "-digit key in the first half, the question at the end)");
}

void PasskeyTask::read_sample(int64_t sample, int64_t S, int32_t* inputs,
                              int32_t* labels) const {
  check_seq_len(S);
  AUTOSP_CHECK(sample >= 0, "passkey sample index ", sample);
  const std::vector<int32_t> t = passkey_tokens(spec_, sample, S);
  const int64_t first_answer = S - spec_.key_length;  // the QUERY position
  for (int64_t i = 0; i < S; ++i) {
    inputs[i] = t[i];
    labels[i] = i >= first_answer ? t[i + 1] : kIgnoreLabel;
  }
}

double PasskeyTask::chance_accuracy() const { return std::pow(10.0, -spec_.key_length); }

std::string PasskeyTask::describe(int64_t S) const {
  check_seq_len(S);
  const int L = spec_.key_length;
  std::ostringstream out;
  out << "passkey retrieval (built-in task, seed " << spec_.seed << "): each sequence of " << S
      << " tokens is random filler words with a " << L
      << "-digit key hidden in its first half after a KEY marker; it ends with a QUERY marker, "
         "after which the model must reproduce the key. Loss and accuracy count only the "
      << L << " answer digits, and the key is at least " << S / 2 - L + 1
      << " tokens before the question, so no short window can solve it. Vocabulary "
      << vocab_size() << " (BOS, KEY, QUERY, 10 digits, " << spec_.filler_words
      << " filler words). Accuracy is the fraction of held-out sequences with every key digit "
         "right; chance is 1 in "
      << static_cast<int64_t>(std::llround(1.0 / chance_accuracy())) << " ("
      << 100.0 * chance_accuracy() << "%).\n"
      << "  example (^ BOS, k KEY, ? QUERY, . filler; the digits after ? are the answer): "
      << render(passkey_tokens(spec_, 0, S));
  return out.str();
}

double PasskeyTask::accuracy(
    const std::function<void(const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax)>&
        predict,
    int64_t S, int64_t num_samples, int64_t batch) const {
  check_seq_len(S);
  if (num_samples < 1) user_error("passkey accuracy: num_samples ", num_samples, " must be >= 1");
  if (batch < 1) user_error("passkey accuracy: batch ", batch, " must be >= 1");
  const int64_t rows = std::min(batch, num_samples);
  std::vector<int32_t> inputs(rows * S), labels(rows * S), argmax(rows * S);
  int64_t correct = 0;
  for (int64_t first = 0; first < num_samples; first += rows) {
    const int64_t B = std::min(rows, num_samples - first);
    for (int64_t b = 0; b < B; ++b)
      read_sample(kEvalOffset + first + b, S, &inputs[b * S], &labels[b * S]);
    std::fill(argmax.begin(), argmax.end(), -1);  // a row predict leaves unset scores wrong
    predict(inputs.data(), B, S, argmax.data());
    for (int64_t b = 0; b < B; ++b) {
      bool all = true;
      for (int64_t i = S - spec_.key_length; i < S; ++i)
        all = all && argmax[b * S + i] == labels[b * S + i];
      correct += all;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(num_samples);
}

}  // namespace autosp::train

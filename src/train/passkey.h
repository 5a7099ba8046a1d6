// The built-in long-context task for `autosp train` with no arguments: passkey retrieval.
//
// A random key of `key_length` digits sits early in a long stretch of random filler words;
// at the very end the model is asked for it back. No window shorter than about S/2 tokens
// contains both the key and the question, so only a model that attends far back solves it.
//
// Vocabulary (V = 13 + filler_words, 64 by default):
//   0 BOS   1 KEY   2 QUERY   3..12 the digits 0..9   13..V-1 filler words
// Filler never contains a digit, KEY or QUERY, so the only digits before the question are
// the key's (a tiny model learns to copy them quickly), but it is uniformly random so the
// only way to the key is to look back at it.
//
// Sample k is a sequence t[0..S] of S + 1 tokens (inputs t[0..S), labels t[1..S], as in a
// token file), with L = key_length:
//   t[0]            BOS
//   t[p]            KEY, p uniform in [1, S/2 - L - 1]: the key block ends in the first half
//   t[p+1..p+L]     the key digits, each uniform in 0..9
//   t[S-L]          QUERY
//   t[S-L+1..S]     the key digits again (the last one is only a label)
//   everything else filler
// labels[i] = t[i+1] for i in [S-L, S-1] (the positions whose next token is an answer
// digit) and kIgnoreLabel elsewhere, so the loss is only on reproducing the key.
// Every token is a pure function of (seed, k, S): a counter-based splitmix64 stream keyed
// by (seed, k), so samples can be read in any order, on any rank, independently.
//
// Key length: 2 digits by default, so chance is 1 in 100, low enough that accuracy well
// above it means real retrieval, while a 2-layer model only has to learn "copy the digit
// after KEY, then the one after that". 1 digit (chance 10%) is too easy to tell apart from
// luck; 3+ digits lengthen learning for little extra evidence.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "train/data.h"

namespace autosp::train {

struct PasskeySpec {
  uint64_t seed = 1234;
  int key_length = 2;     // digits in the key, 1..9; chance accuracy is 10^-key_length
  int filler_words = 51;  // distinct filler tokens, >= 2; vocab_size() = 13 + filler_words
};

class PasskeyTask final : public DataSource {
 public:
  static constexpr int32_t kBos = 0;
  static constexpr int32_t kKey = 1;
  static constexpr int32_t kQuery = 2;
  static constexpr int32_t kDigit0 = 3;  // digit d is token kDigit0 + d
  static constexpr int32_t kFirstFiller = 13;
  // Held-out samples are k + kEvalOffset; training never reads an index that large.
  static constexpr int64_t kEvalOffset = int64_t{1} << 40;

  // A key_length outside 1..9 or filler_words < 2 is a UserError.
  explicit PasskeyTask(PasskeySpec spec = {});

  const PasskeySpec& spec() const { return spec_; }
  int32_t vocab_size() const { return kFirstFiller + spec_.filler_words; }
  // The shortest sequence the task fits in: max(32, 4 * (key_length + 2)).
  int64_t min_seq_len() const;

  // Sample `sample` (>= 0) at sequence length S; S < min_seq_len() is a UserError naming
  // seq_len.
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override;

  // What the task is, the chance level, and one rendered example (filler runs elided):
  //   ^ BOS, k KEY, ? QUERY, 0-9 digits, . filler.
  std::string describe(int64_t S) const override;

  // Fraction of held-out samples kEvalOffset + [0, num_samples) whose every key digit is
  // predicted exactly. Samples go to `predict` in batches of up to `batch` rows; predict
  // fills argmax[B*S] with the predicted next token at every position of inputs[B*S]
  // (teacher forcing: the answer digits before each position are in the inputs).
  double accuracy(
      const std::function<void(const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax)>&
          predict,
      int64_t S, int64_t num_samples, int64_t batch) const;

  // The accuracy of guessing: 10^-key_length.
  double chance_accuracy() const;

 private:
  void check_seq_len(int64_t S) const;

  PasskeySpec spec_;
};

}  // namespace autosp::train

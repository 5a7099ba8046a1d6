// The built-in passkey task: samples are a pure function of (seed, k, S), the layout is the
// one passkey.h documents, the answer can be found from the inputs alone by looking back but
// not by looking only at a short window, and accuracy() scores oracles and guessers right.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "train/passkey.h"
#include "util/error.h"

namespace autosp::train {
namespace {

struct Sample {
  std::vector<int32_t> inputs, labels;
};

Sample read(const PasskeyTask& task, int64_t k, int64_t S) {
  Sample s{std::vector<int32_t>(S), std::vector<int32_t>(S)};
  task.read_sample(k, S, s.inputs.data(), s.labels.data());
  return s;
}

bool is_digit(int32_t t) { return t >= PasskeyTask::kDigit0 && t < PasskeyTask::kDigit0 + 10; }

// Position of the KEY marker in `inputs`, or -1 if `from..to` holds none.
int64_t find_key(const int32_t* inputs, int64_t from, int64_t to) {
  for (int64_t i = std::max<int64_t>(from, 0); i < to; ++i)
    if (inputs[i] == PasskeyTask::kKey) return i;
  return -1;
}

// Retrieval as the model should learn it, looking back at most `window` tokens from each
// position (window = S: unlimited). Answers digit 0 when the key is out of sight.
auto retriever(int64_t window, int key_length) {
  return [=](const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax) {
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* x = inputs + b * S;
      for (int64_t i = 0; i < S; ++i) {
        argmax[b * S + i] = PasskeyTask::kFirstFiller;
        const int64_t answer = i - (S - key_length);  // which key digit comes next
        if (answer < 0) continue;
        const int64_t key = find_key(x, i - window + 1, i + 1);
        const int64_t pos = key + 1 + answer;
        argmax[b * S + i] = key >= 0 && pos > i - window ? x[pos] : PasskeyTask::kDigit0;
      }
    }
  };
}

TEST(PasskeyTask, VocabularyAndChance) {
  PasskeyTask task;
  EXPECT_EQ(task.spec().key_length, 2);
  EXPECT_EQ(task.vocab_size(), 64);
  EXPECT_DOUBLE_EQ(task.chance_accuracy(), 0.01);
  EXPECT_DOUBLE_EQ(PasskeyTask({.key_length = 3}).chance_accuracy(), 0.001);
  EXPECT_EQ(PasskeyTask({.filler_words = 10}).vocab_size(), 23);
}

TEST(PasskeyTask, DeterministicPerSampleAndSeed) {
  const int64_t S = 128;
  PasskeyTask a, b;
  // Same (seed, k): same sample, whatever was read before.
  const Sample first = read(a, 5, S);
  read(a, 6, S);
  read(b, 1000, S);
  EXPECT_EQ(read(a, 5, S).inputs, first.inputs);
  EXPECT_EQ(read(b, 5, S).inputs, first.inputs);
  EXPECT_EQ(read(b, 5, S).labels, first.labels);
  // Different samples and different seeds differ.
  EXPECT_NE(read(a, 6, S).inputs, first.inputs);
  PasskeyTask other({.seed = 99});
  int same = 0;
  for (int64_t k = 0; k < 50; ++k) same += read(other, k, S).inputs == read(a, k, S).inputs;
  EXPECT_EQ(same, 0);
}

TEST(PasskeyTask, Layout) {
  for (int L : {1, 2, 4}) {
    PasskeyTask task({.seed = 7, .key_length = L});
    for (int64_t S : {task.min_seq_len(), int64_t{64}, int64_t{256}, int64_t{257}}) {
      for (int64_t k = 0; k < 200; ++k) {
        SCOPED_TRACE(testing::Message() << "L " << L << " S " << S << " k " << k);
        const Sample s = read(task, k, S);
        ASSERT_EQ(s.inputs[0], PasskeyTask::kBos);
        // Exactly one KEY, its block in the first half; exactly one QUERY, at S - L.
        const int64_t key = find_key(s.inputs.data(), 0, S);
        ASSERT_GE(key, 1);
        EXPECT_LE(key + L, S / 2 - 1);
        EXPECT_EQ(std::count(s.inputs.begin(), s.inputs.end(), PasskeyTask::kKey), 1);
        EXPECT_EQ(std::count(s.inputs.begin(), s.inputs.end(), PasskeyTask::kQuery), 1);
        EXPECT_EQ(s.inputs[S - L], PasskeyTask::kQuery);
        // The answer: the key digits after QUERY (the last one only as a label).
        for (int64_t j = 0; j < L; ++j) {
          ASSERT_TRUE(is_digit(s.inputs[key + 1 + j]));
          EXPECT_EQ(s.labels[S - L + j], s.inputs[key + 1 + j]);
          if (j + 1 < L) {
            EXPECT_EQ(s.inputs[S - L + 1 + j], s.inputs[key + 1 + j]);
          }
        }
        // Labels are next tokens at the answer positions and ignored everywhere else.
        for (int64_t i = 0; i < S; ++i) {
          if (i >= S - L) {
            if (i + 1 < S) {
              EXPECT_EQ(s.labels[i], s.inputs[i + 1]);
            }
          } else {
            EXPECT_EQ(s.labels[i], kIgnoreLabel) << "at " << i;
          }
        }
        // Everything else is filler: no digits, markers or BOS.
        for (int64_t i = 1; i < S; ++i) {
          const bool in_key = i >= key && i <= key + L;
          const bool in_answer = i >= S - L;
          if (!in_key && !in_answer) {
            ASSERT_GE(s.inputs[i], PasskeyTask::kFirstFiller) << "at " << i;
            ASSERT_LT(s.inputs[i], task.vocab_size()) << "at " << i;
          }
        }
      }
    }
  }
}

// Key digits, key positions and filler all vary: no shortcut but looking back at the key.
TEST(PasskeyTask, KeysPositionsAndFillerVary) {
  PasskeyTask task;
  const int64_t S = 256;
  std::set<int32_t> first_digits, keys, filler;
  std::set<int64_t> positions;
  for (int64_t k = 0; k < 2000; ++k) {
    const Sample s = read(task, k, S);
    const int64_t key = find_key(s.inputs.data(), 0, S);
    positions.insert(key);
    first_digits.insert(s.inputs[key + 1]);
    keys.insert(10 * (s.inputs[key + 1] - PasskeyTask::kDigit0) + s.inputs[key + 2] -
                PasskeyTask::kDigit0);
    for (int64_t i = key + 3; i < S - 2; ++i) filler.insert(s.inputs[i]);
  }
  EXPECT_EQ(first_digits.size(), 10u);
  EXPECT_GE(keys.size(), 95u);             // 2000 draws of 100 keys miss ~0 of them
  EXPECT_GE(positions.size(), 120u);       // p in [1, 125]
  EXPECT_EQ(filler.size(), 51u);
}

TEST(PasskeyTask, EvalSamplesAreDisjointFromTraining) {
  PasskeyTask task;
  const int64_t S = 64;
  // Training reads small indices; evaluation reads k + kEvalOffset, far beyond any run.
  EXPECT_GE(PasskeyTask::kEvalOffset, int64_t{1} << 40);
  std::set<std::vector<int32_t>> train;
  for (int64_t k = 0; k < 500; ++k) train.insert(read(task, k, S).inputs);
  int seen = 0;
  for (int64_t k = 0; k < 500; ++k)
    seen += train.count(read(task, PasskeyTask::kEvalOffset + k, S).inputs);
  EXPECT_EQ(seen, 0);

  // accuracy() reads exactly the samples kEvalOffset + [0, n).
  std::vector<int32_t> expected;
  for (int64_t k = 0; k < 7; ++k) {
    const Sample s = read(task, PasskeyTask::kEvalOffset + k, S);
    expected.insert(expected.end(), s.inputs.begin(), s.inputs.end());
  }
  std::vector<int32_t> got;
  std::vector<int64_t> batch_sizes;
  task.accuracy(
      [&](const int32_t* inputs, int64_t B, int64_t S_, int32_t* argmax) {
        EXPECT_EQ(S_, S);
        batch_sizes.push_back(B);
        got.insert(got.end(), inputs, inputs + B * S_);
        std::fill(argmax, argmax + B * S_, 0);
      },
      S, 7, 3);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(batch_sizes, (std::vector<int64_t>{3, 3, 1}));
}

TEST(PasskeyTask, AccuracyOfOracleAndGuessers) {
  for (int L : {1, 2, 3}) {
    PasskeyTask task({.key_length = L});
    const int64_t S = 256;
    SCOPED_TRACE(testing::Message() << "L " << L);
    // Looking back as far as needed finds every key from the inputs alone.
    EXPECT_EQ(task.accuracy(retriever(S, L), S, 300, 32), 1.0);
    // A window that just misses the closest possible key (S/2 - L + 1 tokens back) is
    // reduced to guessing digit 0: right only when the key is all zeros.
    const double windowed = task.accuracy(retriever(S / 2 - L + 1, L), S, 4000, 64);
    // Binomial(4000, 10^-L): mean 400 / 40 / 4, 4 standard deviations either side.
    const double n = 4000, p = task.chance_accuracy();
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(windowed * n, n * p, 4 * sd + 1) << "windowed accuracy " << windowed;
  }
  PasskeyTask task;
  // A predictor that fills nothing scores 0; one that predicts filler scores 0.
  EXPECT_EQ(task.accuracy([](const int32_t*, int64_t, int64_t, int32_t*) {}, 64, 50, 8), 0.0);
  EXPECT_EQ(task.accuracy(
                [](const int32_t*, int64_t B, int64_t S, int32_t* argmax) {
                  std::fill(argmax, argmax + B * S, PasskeyTask::kFirstFiller);
                },
                64, 50, 8),
            0.0);
  // One wrong digit fails the sample: get only the first digit right.
  auto first_only = [&](const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax) {
    retriever(S, 2)(inputs, B, S, argmax);
    for (int64_t b = 0; b < B; ++b) argmax[b * S + S - 1] = PasskeyTask::kFirstFiller;
  };
  EXPECT_EQ(task.accuracy(first_only, 64, 50, 8), 0.0);
}

TEST(PasskeyTask, DescribeNamesTheTaskAndChance) {
  PasskeyTask task;
  const std::string text = task.describe(256);
  for (const char* part : {"passkey", "256", "2-digit", "chance is 1 in 100 (1%)", "seed 1234",
                           "Vocabulary 64", "example", " k ", " ? ", "filler]"})
    EXPECT_NE(text.find(part), std::string::npos) << "missing: " << part << "\n" << text;
  // The example is sample 0: its key digits appear after both k and ?.
  const Sample s = read(task, 0, 256);
  const int64_t key = find_key(s.inputs.data(), 0, 256);
  const std::string digits = {char('0' + s.inputs[key + 1] - PasskeyTask::kDigit0), ' ',
                              char('0' + s.inputs[key + 2] - PasskeyTask::kDigit0)};
  EXPECT_NE(text.find("k " + digits), std::string::npos) << text;
  EXPECT_NE(text.find("? " + digits), std::string::npos) << text;
  EXPECT_NE(PasskeyTask({.key_length = 3}).describe(64).find("(0.1%)"), std::string::npos);
}

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(PasskeyTask, RejectsShortSequencesAndBadSpecs) {
  PasskeyTask task;
  EXPECT_EQ(task.min_seq_len(), 32);
  EXPECT_EQ(PasskeyTask({.key_length = 9}).min_seq_len(), 44);
  std::vector<int32_t> inputs(31), labels(31);
  const std::string message =
      user_error_of([&] { task.read_sample(0, 31, inputs.data(), labels.data()); });
  EXPECT_NE(message.find("seq_len 31"), std::string::npos) << message;
  EXPECT_NE(message.find("at least 32"), std::string::npos) << message;
  EXPECT_NE(user_error_of([&] { task.describe(16); }).find("seq_len 16"), std::string::npos);
  EXPECT_NE(user_error_of([&] {
              task.accuracy([](const int32_t*, int64_t, int64_t, int32_t*) {}, 8, 1, 1);
            }).find("seq_len 8"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { PasskeyTask({.key_length = 0}); }).find("key_length 0"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { PasskeyTask({.key_length = 10}); }).find("key_length 10"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { PasskeyTask({.filler_words = 1}); }).find("filler_words 1"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              task.accuracy([](const int32_t*, int64_t, int64_t, int32_t*) {}, 64, 0, 1);
            }).find("num_samples 0"),
            std::string::npos);
  // A short sequence is fine at the minimum.
  std::vector<int32_t> in32(32), lab32(32);
  task.read_sample(0, 32, in32.data(), lab32.data());
}

}  // namespace
}  // namespace autosp::train

// Packing means nothing leaks between documents: the training step on one packed sample
// (position ids restarting at each document, attention within documents, no label on a
// document's last token) has the same summed loss and the same summed parameter gradients
// as the step run on each of its documents alone, unpacked, over the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "models/llama.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"
#include "testing/gradcheck.h"

namespace autosp {
namespace {

models::LlamaConfig tiny_llama() {
  models::LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.rope.theta = 500.0;  // short wavelengths, so a wrong position changes the numbers
  return c;
}

struct Sums {
  double loss = 0;  // sum of the labelled tokens' losses
  std::map<std::string, std::vector<double>> grads;  // gradients of that sum
};

// One forward + backward of llama_forward over inputs [1, S]; the graph's loss is the mean
// over labelled tokens, so the sums are loss * count and grad * count.
// max |a - b| / max |b|
double normalised_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs(a.at(i) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / std::max(scale, 1e-30);
}

void add_step(const models::LlamaConfig& c, const std::vector<int32_t>& inputs, const std::vector<int32_t>& labels,
              const std::vector<int32_t>& positions, const std::vector<int32_t>* documents, Sums& sums) {
  const int64_t S = static_cast<int64_t>(inputs.size());
  Graph joint = autodiff(models::llama_forward(c, {.batch = 1, .seq_len = S, .documents = documents != nullptr}));
  testing::Feed feed;
  for (const models::ParameterSpec& p : models::llama_parameters(c)) feed.f[p.name] = models::llama_init(c, p, 7);
  feed.i["input_ids"] = inputs;
  feed.i["labels"] = labels;
  feed.i["position_ids"] = positions;
  if (documents) feed.i["document_ids"] = *documents;
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();
  int64_t count = 0;
  for (int32_t l : labels) count += l != -100;
  sums.loss += double(ex.output("loss")[0]) * double(count);
  for (const models::ParameterSpec& p : models::llama_parameters(c)) {
    std::vector<float> g = ex.output_vector(kGradPrefix + p.name);
    std::vector<double>& acc = sums.grads[p.name];
    acc.resize(g.size(), 0.0);
    for (size_t e = 0; e < g.size(); ++e) acc[e] += double(g[e]) * double(count);
  }
}

TEST(Packing, PackedSampleEqualsItsDocumentsTrainedSeparately) {
  const models::LlamaConfig c = tiny_llama();
  // Boundaries inside the sample; documents of 2 and 1 tokens (the last has no label at
  // all, so alone it adds nothing); the first document is cut by the sample's start and
  // continues its own positions from 3.
  const std::vector<int64_t> lengths = {6, 2, 9, 1, 7, 5};
  const int32_t first_position = 3;
  const int64_t S = 30;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, int32_t(c.vocab_size) - 1);

  std::vector<int32_t> inputs, labels, positions, documents;
  Sums packed, separate;
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> doc(lengths[d]);
    for (int32_t& t : doc) t = token(rng);
    const int32_t pos0 = d == 0 ? first_position : 0;
    std::vector<int32_t> in(doc), lab, pos;
    for (int64_t i = 0; i < lengths[d]; ++i) {
      lab.push_back(i + 1 < lengths[d] ? doc[i + 1] : -100);  // no label crosses the document
      pos.push_back(pos0 + int32_t(i));
    }
    inputs.insert(inputs.end(), in.begin(), in.end());
    labels.insert(labels.end(), lab.begin(), lab.end());
    positions.insert(positions.end(), pos.begin(), pos.end());
    documents.insert(documents.end(), lengths[d], int32_t(d));
    if (lengths[d] > 1) add_step(c, in, lab, pos, nullptr, separate);
  }
  ASSERT_EQ(static_cast<int64_t>(inputs.size()), S);
  add_step(c, inputs, labels, positions, &documents, packed);

  EXPECT_NEAR(packed.loss, separate.loss, 1e-5 * std::abs(separate.loss));
  for (const auto& [name, g] : separate.grads)
    EXPECT_LT(normalised_error(packed.grads.at(name), g), 1e-5) << name;

  // And the check can fail: the same tokens without document ids attend across documents.
  Sums unmasked;
  add_step(c, inputs, labels, positions, nullptr, unmasked);
  EXPECT_GT(std::abs(unmasked.loss - separate.loss), 1e-3 * std::abs(separate.loss));
}

}  // namespace
}  // namespace autosp

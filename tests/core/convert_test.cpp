// convert (f32 <-> bf16): the CPU kernel's round-to-nearest-even against a reference, the
// op and its gradient run exactly through the executor, and the executor refusing bf16
// values for fp32 kernels with the op and type named.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "frontend/tracer.h"
#include "kernels/cpu/basic.h"
#include "models/llama.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"

namespace autosp {
namespace {

// Reference rounding, by value: of the two bf16 neighbours of x (truncation and the next
// one up in magnitude), the nearer in exact (double) arithmetic; on a tie the one with an
// even last bit. Not for NaNs.
uint16_t reference_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const auto lo = static_cast<uint16_t>(bits >> 16), hi = static_cast<uint16_t>(lo + 1);
  if ((lo & 0x7f80u) == 0x7f80u) return lo;  // +-inf
  auto value = [](uint16_t b) { return double(std::bit_cast<float>(uint32_t(b) << 16)); };
  const double dlo = std::abs(double(x) - value(lo));
  // hi may be inf (0x7f80): the rounding boundary is then where the next binade would be.
  const double vhi = (hi & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), double(x)) : value(hi);
  const double dhi = std::abs(double(x) - vhi);
  if (dlo != dhi) return dlo < dhi ? lo : hi;
  return (lo & 1u) ? hi : lo;
}

uint16_t kernel_bf16(float x) {
  uint16_t y;
  cpu::f32_to_bf16(&x, 1, &y);
  return y;
}

float bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(Convert, RoundsToNearestEven) {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1 is exact"},
      {0x3f808000u, 0x3f80, "1 + 2^-8: a tie, to the even 1"},
      {0x3f818000u, 0x3f82, "1 + 3 * 2^-8: a tie, to the even 1 + 2^-6"},
      {0x3f808001u, 0x3f81, "just above the tie rounds up"},
      {0x3f807fffu, 0x3f80, "just below the tie rounds down"},
      {0xbf818000u, 0xbf82, "negative ties go to even too"},
      {0x7f7fffffu, 0x7f80, "the largest float rounds to inf"},
      {0x7f7f7fffu, 0x7f7f, "just below the overflow tie stays finite"},
      {0x7f800000u, 0x7f80, "inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x80000000u, 0x8000, "-0"},
      {0x00000001u, 0x0000, "the smallest subnormal rounds to 0"},
      {0x00018000u, 0x0002, "a subnormal tie goes to even"},
      {0x007fffffu, 0x0080, "the largest subnormal rounds up to the smallest normal"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(kernel_bf16(bits(c.in)), c.out) << c.what;
    EXPECT_EQ(reference_bf16(bits(c.in)), c.out) << "reference: " << c.what;
  }
  // NaNs stay NaNs (quiet, same sign), even those whose payload is only in the low bits.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t y = kernel_bf16(bits(nan));
    EXPECT_TRUE(std::isnan(bits(uint32_t(y) << 16))) << std::hex << nan;
    EXPECT_EQ(y & 0x8000u, (nan >> 16) & 0x8000u) << std::hex << nan;
  }
}

TEST(Convert, MatchesTheReferenceOnRandomBitPatterns) {
  std::mt19937 rng(7);
  std::vector<float> x;
  while (x.size() < 200000) {
    const float v = bits(rng());
    if (!std::isnan(v)) x.push_back(v);
  }
  // and every tie and near-tie around a few values
  for (uint32_t base : {0x3f800000u, 0x00010000u, 0x7f7f0000u, 0xc2280000u})
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x17fffu, 0x18000u, 0x18001u})
      if (!std::isnan(bits(base + low))) x.push_back(bits(base + low));
  std::vector<uint16_t> y(x.size());
  cpu::f32_to_bf16(x.data(), int64_t(x.size()), y.data());
  std::vector<float> back(x.size());
  cpu::bf16_to_f32(y.data(), int64_t(y.size()), back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], reference_bf16(x[i])) << "x bits " << std::hex << std::bit_cast<uint32_t>(x[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), uint32_t(y[i]) << 16);  // widening is exact
  }
}

// y0 = f32(reshape(transpose(bf16(x)))): the bf16 values run through the byte-moving
// kernels, and the gradient (convert back, transposed) is the bf16 rounding of the probe,
// exactly.
TEST(Convert, OpAndGradientRunExactlyOnTheCpu) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::f32, {2, 3}}, "x");
  ValueId r = g.add_input(Role::constant, {DType::f32, {6}}, "r");
  ValueId h = b.emit1(OpKind::convert, {x}, {{"dtype", std::string("bf16")}});
  ValueId t = b.emit1(OpKind::transpose, {h}, {{"perm", Shape{1, 0}}});
  ValueId flat = b.emit1(OpKind::reshape, {t}, {{"shape", Shape{6}}});
  ValueId y = b.emit1(OpKind::convert, {flat}, {{"dtype", std::string("f32")}});
  g.add_output("y0", y);
  g.add_output("loss", b.emit1(OpKind::sum, {b.emit1(OpKind::mul, {y, r})}));
  Graph joint = autodiff(g);
  verify(joint);
  // the gradient path: convert to bf16, reshape, transpose, convert to f32
  const Node& dx = joint.node(joint.value(joint.output("grad:x")).producer);
  EXPECT_EQ(dx.op, OpKind::convert);
  EXPECT_EQ(joint.type(dx.inputs[0]).dtype, DType::bf16);

  const std::vector<float> xs = {1.0f, bits(0x3f808000u), bits(0x3f818000u), -3.14159265f, 1e-30f, 65504.7f};
  const std::vector<float> rs = {bits(0x40408000u), 0.1f, -7.0f, bits(0x3f818001u), 2.5f, 1e20f};
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  ex.bind("x", xs.data());
  ex.bind("r", rs.data());
  ex.run();
  const std::vector<float> y0 = ex.output_vector("y0"), gx = ex.output_vector("grad:x");
  auto rounded = [](float v) { return bits(uint32_t(reference_bf16(v)) << 16); };
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      // y0[j * 2 + i] = x[i, j], rounded; dx[i, j] = r[j * 2 + i], rounded
      EXPECT_EQ(std::bit_cast<uint32_t>(y0[j * 2 + i]), std::bit_cast<uint32_t>(rounded(xs[i * 3 + j])));
      EXPECT_EQ(std::bit_cast<uint32_t>(gx[i * 3 + j]), std::bit_cast<uint32_t>(rounded(rs[j * 2 + i])));
    }
}

// Every other CPU kernel reads its buffers as float: a bf16 value reaching one is refused
// when the executor is made, before any buffer is read, naming the op and the type.
TEST(Convert, TheCpuExecutorRefusesBf16ForFp32Kernels) {
  auto expect_refused = [](const Graph& g, std::initializer_list<const char*> fragments) {
    HeapAllocator alloc;
    try {
      CpuExecutor ex(g, alloc);
      ADD_FAILURE() << "the CPU executor accepted a bf16 graph";
    } catch (const UserError& e) {
      for (const char* f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "lacks '" << f << "': " << e.what();
    }
    EXPECT_EQ(alloc.live_bytes(), 0);
  };
  {
    Tracer t;
    Tensor x = t.convert(t.parameter("x", {4}), DType::bf16);
    t.output("y", t.silu(x));
    expect_refused(t.finish(), {"cpu backend: silu (node 2) has operand 0 of type bf16[4]",
                                "CPU kernels are fp32", "dtype f32"});
  }
  {
    Tracer t;
    t.output("y", t.convert(t.sum(t.convert(t.parameter("x", {4}), DType::bf16)), DType::f32));
    expect_refused(t.finish(), {"sum (node 2) has operand 0 of type bf16[4]"});
  }
  {
    Graph g;
    GraphBuilder b(g);
    g.add_output("zeros", b.emit1(OpKind::fill, {}, {{"shape", Shape{3}}, {"value", 0.0}, {"dtype", std::string("bf16")}}));
    expect_refused(g, {"fill (node 0) has result 0 of type bf16[3]"});
  }
  models::LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  const Graph llama = models::llama_forward(c, {.batch = 1, .seq_len = 4, .dtype = DType::bf16});
  expect_refused(llama, {"embedding (node ", "operand 0 of type bf16[11, 8]"});
  expect_refused(autodiff(llama), {"embedding (node "});
}

}  // namespace
}  // namespace autosp

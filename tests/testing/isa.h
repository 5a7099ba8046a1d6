// Tests whose expectations depend on the CPU kernels' instruction set (a golden memory plan
// holds the attention kernels' workspace sizes, which follow each copy's register tile):
// run them once per built set, each against its own expectation, rather than against
// whichever set the CPU happens to pick (kernels/cpu/isa.h).
#pragma once
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "kernels/cpu/isa.h"

namespace autosp::testing {

// Makes `isa` the active set for one scope and restores the previous one after.
class ScopedIsa {
 public:
  explicit ScopedIsa(cpu::Isa isa) : before_(cpu::active_isa()) { cpu::set_active_isa(isa); }
  ~ScopedIsa() { cpu::set_active_isa(before_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  cpu::Isa before_;
};

// gtest's parameter name for a set ("avx2", "avx512").
inline std::string isa_param_name(const ::testing::TestParamInfo<cpu::Isa>& info) {
  return cpu::isa_name(info.param);
}

}  // namespace autosp::testing

namespace autosp::cpu {
// So that gtest names the set in a failure ("GetParam() = avx2"), not its bytes.
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace autosp::cpu

// Skips (visibly: ctest lists the test as skipped, with the reason) a case for a set this
// CPU cannot run; its expectation is checked on a machine that runs it.
#define AUTOSP_SKIP_UNLESS_CPU_RUNS(isa)                                                            \
  if (!::autosp::cpu::cpu_supports(isa))                                                            \
  GTEST_SKIP() << "this CPU cannot run the " << ::autosp::cpu::isa_name(isa)                       \
               << " kernels; their expectation is checked on a CPU that can (" << ::autosp::cpu::kernels_summary() \
               << ")"

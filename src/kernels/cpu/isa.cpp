#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <utility>

#include "util/error.h"

namespace autosp::cpu {
namespace {

// -1 until chosen; then the Isa's value. Reads after the first are one relaxed load.
std::atomic<int> g_active{-1};

// __builtin_cpu_supports takes only a string literal.
#define AUTOSP_CPU_HAS(feature) (__builtin_cpu_init(), __builtin_cpu_supports(feature))

}  // namespace

const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : "avx2"; }

std::vector<Isa> built_isas() { return {Isa::avx2, Isa::avx512}; }

bool cpu_supports(Isa isa) {
  if (!cpu_runs_baseline()) return false;
  switch (isa) {
    case Isa::avx2:
      return true;
    case Isa::avx512:  // what -march=x86-64-v4 may use
      return AUTOSP_CPU_HAS("avx512f") && AUTOSP_CPU_HAS("avx512bw") && AUTOSP_CPU_HAS("avx512dq") &&
             AUTOSP_CPU_HAS("avx512vl") && AUTOSP_CPU_HAS("avx512cd");
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : built_isas())
    if (cpu_supports(isa)) out.push_back(isa);
  return out;
}

Isa parse_isa(const std::string& name, const std::string& what) {
  for (Isa isa : built_isas())
    if (name == isa_name(isa)) return isa;
  user_error(what, "=", name, ": unknown instruction set; expected avx2 or avx512");
}

void set_active_isa(Isa isa) {
  if (!cpu_supports(isa))
    user_error("the ", isa_name(isa), " kernels need instructions this CPU does not have (it runs: ",
               kernels_summary(), ")");
  g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
}

Isa active_isa() {
  const int v = g_active.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<Isa>(v);
  Isa chosen = Isa::avx2;
  if (const char* env = std::getenv("AUTOSP_ISA"); env && *env) {
    chosen = parse_isa(env, "AUTOSP_ISA");
    if (!cpu_supports(chosen))
      user_error("AUTOSP_ISA=", env, ": this CPU cannot run the ", env, " kernels");
  } else {
    for (Isa isa : supported_isas()) chosen = isa;  // the widest
  }
  g_active.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

bool cpu_runs_baseline(std::string* missing) {
  // x86-64-v3 also has F16C, MOVBE and LZCNT, which every CPU with these three has (and
  // which clang's __builtin_cpu_supports cannot query).
  std::string lacks;
  const std::pair<bool, const char*> needs[] = {{AUTOSP_CPU_HAS("avx2"), "avx2"},
                                                {AUTOSP_CPU_HAS("fma"), "fma"},
                                                {AUTOSP_CPU_HAS("bmi2"), "bmi2"}};
  for (const auto& [present, name] : needs)
    if (!present) lacks += (lacks.empty() ? "" : ", ") + std::string(name);
  if (missing) *missing = lacks;
  return lacks.empty();
}

std::string kernels_summary() {
  std::string cpu;
  for (Isa isa : supported_isas()) cpu += std::string(cpu.empty() ? "" : " ") + isa_name(isa);
  return str("cpu kernels: ", isa_name(active_isa()), " (this CPU runs: ", cpu.empty() ? "none" : cpu,
             "; AUTOSP_ISA=avx2|avx512 chooses)");
}

}  // namespace autosp::cpu

// The instruction sets the CPU kernels are built for, and the one they run with.
//
// The SIMD kernels (attention.cpp, fused.cpp, gemm.cpp) are compiled once per instruction
// set, each copy into its own namespace (autosp::cpu::avx2, autosp::cpu::avx512) with that
// set's compiler flags, tile shapes and vector width; everything else is built for the
// baseline, x86-64-v3 (AVX2 + FMA), so one binary runs on any such machine. The public
// functions of attention.h and fused.h, and cpu::gemm (basic.h), call the copy of the active
// instruction set (dispatch.cpp).
//
// The active set is chosen once, on first use: the AUTOSP_ISA environment variable if set
// ("avx2" or "avx512"; one this CPU lacks is an error), otherwise the widest this CPU has.
// Results differ between instruction sets only by fp32 summation order (the gemm's not at
// all: gemm.h).
#pragma once
#include <string>
#include <vector>

namespace autosp::cpu {

enum class Isa { avx2, avx512 };

const char* isa_name(Isa isa);
// The instruction sets autosp was built with, narrowest first.
std::vector<Isa> built_isas();
// Whether this CPU can run the kernels built for `isa`.
bool cpu_supports(Isa isa);
// built_isas() this CPU can run, narrowest first (empty on a CPU below the baseline).
std::vector<Isa> supported_isas();

// The active instruction set (chosen on first call; UserError for a bad AUTOSP_ISA).
Isa active_isa();
// Makes `isa` the active set (tests, benchmarks). UserError if this CPU cannot run it.
void set_active_isa(Isa isa);
// "avx2" or "avx512" -> the set; UserError naming `what` (e.g. "AUTOSP_ISA") otherwise.
Isa parse_isa(const std::string& name, const std::string& what);

// Whether this CPU has what the baseline build needs (AVX2, FMA, BMI2), and a
// one-line description of what it lacks otherwise.
bool cpu_runs_baseline(std::string* missing = nullptr);

// One line for `autosp --version` and the start-up banner, e.g.
// "cpu kernels: avx512 (this CPU: avx2 avx512; AUTOSP_ISA chooses)".
std::string kernels_summary();

}  // namespace autosp::cpu

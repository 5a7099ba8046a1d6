# The two entry points (see README.md). Everything else is CMake's job.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps deps-fuzz build demo test build-asan-cli test-asan test-sanitize fuzz bench clean

all: build

deps:
	@./scripts/install_deps.sh

deps-fuzz:
	@./scripts/install_deps.sh --fuzz

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The built-in default on 2 local MPI ranks, sequence-parallel (SP = 2); each rank takes its
# share of the CPUs (src/runtime/threads.h: one thread each on 2 cores).
MPIRUN = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
         mpirun -np 2 --oversubscribe
# Only the CLI: the test binaries are most of a full build's time (issue 20: 11 min 54 s on
# a fresh machine, now a few minutes), and the demo runs none of them.
demo: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --target autosp -j $(JOBS)
	$(MPIRUN) $(BUILD)/autosp train

# The ASan build of the CLI (build-asan-cli) compiles at nice 19 while ctest runs, in the time
# the cores would idle (the MPI tests' ranks wait on each other: ctest keeps 2 cores 82% busy);
# its log is printed if it fails. Then its error cases run (test-asan).
test: deps build
	@nice -n 19 $(MAKE) --no-print-directory build-asan-cli > $(BUILD)/build-asan-cli.log 2>&1 & asan=$$!; \
	  (cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600); rc=$$?; \
	  if ! wait $$asan; then cat $(BUILD)/build-asan-cli.log; echo "make test: the ASan build failed"; exit 1; fi; \
	  exit $$rc
	$(MAKE) test-asan

build-asan-cli:
	cmake -S . -B build-asan -DAUTOSP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan --target autosp -j $(JOBS)

# The CLI error cases again, under AddressSanitizer and UndefinedBehaviorSanitizer: a
# sanitizer report exits 86/87 instead of the expected 1, so it fails the case.
test-asan: deps build-asan-cli
	ASAN_OPTIONS=exitcode=86 UBSAN_OPTIONS=halt_on_error=1:exitcode=87 OMP_NUM_THREADS=2 OMPI_MCA_pml=ob1 \
	  bash tests/cli/cli_errors.sh build-asan/autosp

# The whole unit suite (autosp_tests, and the autosp it starts under mpirun) under ASan and
# UBSan, in build-asan: not in `make test` (about 20 minutes on 2 cores at -O0). A UBSan
# finding stops the process, so it fails its test. Leak checking is off: Open MPI's plugins
# leave allocations at exit that LeakSanitizer reports from unloaded modules (no frame of
# autosp's). Left out: the three tests that hold the resident peak to the plan, since ASan's
# shadow memory and quarantine are resident too.
SANITIZE_SKIP = MemoryPlan.MeasuredResidentPeakIsWithinFivePercentOfThePlan:MemoryPlan.ABudgetIsMetOrRefusedBeforeTheFirstStep:ZeroCheckpointMemory.Stage3SaveAndLoadAtW4HoldNoExtraCopyOfTheModelOnAnyRank
test-sanitize: deps
	cmake -S . -B build-asan -DAUTOSP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan --target autosp autosp_tests -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0:exitcode=86 UBSAN_OPTIONS=halt_on_error=1:exitcode=87 \
	  OMP_NUM_THREADS=2 build-asan/autosp_tests --gtest_brief=1 --gtest_filter='-$(SANITIZE_SKIP)'

# Fuzzing (fuzz/): every parser of untrusted input under libFuzzer with ASan and UBSan, in a
# clang build of its own (build-fuzz), each target for FUZZ_SECONDS from its seed corpus.
# `make test` replays the corpora without fuzzing (tests/fuzz/corpus_replay_test.cpp).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps-fuzz
	cmake -S . -B build-fuzz -DAUTOSP_FUZZ=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++-14
	cmake --build build-fuzz --target fuzz_targets -j $(JOBS)
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./scripts/fuzz.sh build-fuzz $(FUZZ_TARGETS)

# Benchmarks: ratios against baselines measured in the same run: sgemm, memcpy and each
# instruction set's FMA peak for the kernels; PyTorch for the training step (and for a
# mixture-of-experts model's, bench/bench_moe.py: Mixtral's layout); sgemm for the
# step's achieved FLOP/s; checkpoint policy none for sac and full. The kernel table and the
# training section `isa` run once per kernel set this CPU supports (avx2, and avx512 where
# present). Tables on stdout, JSON in $(BUILD)/bench/.
#   KERNEL_ARGS="--isa avx2" runs the kernel table for one set; KERNEL_ARGS="--only
#   sgemm,attention" the named parts (sgemm linear memcpy fma_peak attention softcap rms_norm rope
#   swiglu cross_entropy embedding; a part's baselines run with it).
#   BENCH_ARGS=--quick for a training subset of under 10 minutes; BENCH_ARGS=--sections=isa
#   (or sweep,cap,sp,policies,policy-cap) for some parts; BENCH_ARGS="--isas avx2" for one
#   set in the isa section. docs/PERFORMANCE.md has the latest.
# The training step's main peer is torch 2.x with SDPA (transformers' LlamaForCausalLM), from
# the venv scripts/install_bench_venv.sh keeps outside the tree (a 4 GB download the first
# time); Debian's torch 1.13 (eager attention) is the second column.
bench: deps build
	cmake --build $(BUILD) --target bench_kernels -j $(JOBS)
	mkdir -p $(BUILD)/bench
	$(BUILD)/bench_kernels $(KERNEL_ARGS) $(BUILD)/bench/bench_kernels.json
	torch2=$$(./scripts/install_bench_venv.sh) && \
	/usr/bin/python3 bench/bench_train.py --autosp $(BUILD)/autosp \
	  --bench-kernels $(BUILD)/bench_kernels --out $(BUILD)/bench/bench_train.json \
	  --torch2-python "$$torch2" $(BENCH_ARGS) && \
	"$$torch2" bench/bench_moe.py --autosp $(BUILD)/autosp --out $(BUILD)/bench/bench_moe.json && \
	"$$torch2" bench/bench_lora.py --autosp $(BUILD)/autosp --out $(BUILD)/bench/bench_lora.json

clean:
	rm -rf $(BUILD) build-asan build-fuzz

# kiln — one Makefile for the library, the trainers, the tests, the data and the benchmarks.
#
#   make                 library + trainers + tests (CPU; CUDA kernels run on the emulator); first
#                        names any missing Debian package and the command that installs it
#   make run             set-up in one command: packages, MNIST, build, train the latest chapter
#   make test            all tests          make test T='[conv]'   a subset (Catch2 tags)
#   make test SAN=1      the same under AddressSanitizer + UndefinedBehaviorSanitizer
#   make EXERCISE=1 ...  warnings stay warnings (not errors): for an exercise you are halfway through
#   make data            fetch and verify MNIST, CIFAR-10 and Moby-Dick (make lesson-NN fetches what it needs)
#   make lesson-02       build and run chapter 02's trainer (ARGS='--epochs 1' passes flags)
#   make bench           speed figures, one line each: "bench <name>: <value> <unit>"
#   make lab             the kernel lab (cuda/lab/): every version of each kernel checked against the
#                        CPU on the emulator; with CUDA=1, on a GPU, then timed against cuBLAS/cuDNN
#   make CUDA=1 kernel-report   every CUDA kernel's registers, spills, shared memory and occupancy
#   make accuracy        train every chapter fully and check its accuracy (long; LESSONS_TO_CHECK='01 03')
#   make check-docs      run again the quick commands whose figures the READMEs quote, and compare
#   make CUDA=1          the same with nvcc for a real GPU
#   make gpu-check-prepare   the CUDA binaries, MNIST and the check in gpu-check/, for a GPU machine
#   make gpu-check       on that machine: runs them (no build there)
#   make fuzz            the file readers under libFuzzer (clang), FUZZ_SECONDS (60) per harness
#   make clang-check     every engine source through clang++ -std=c++17 too (syntax only)
#   make gpu-check-dry   the same steps here, on the emulator build (checks the script)
#
# Objects go to build/ (build-san/ with SAN=1, build-cuda/ with CUDA=1, build-gpucheck/ for the
# GPU check, build-fuzz/ for make fuzz).

# Every build runs on all the cores, make run's first one included; a -j on the command line
# (make -j1) wins. Goals given together run together too: `make clean all` is two commands.
# Only the make you type adds the -j: a make that a recipe starts ($(MAKE), MAKELEVEL 1 and up)
# shares its parent's job slots, or runs one job at a time under make -j1.
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc)
endif

CXX      ?= g++
NVCC     ?= /usr/local/cuda/bin/nvcc
SAN      ?= 0
CUDA     ?= 0
T        ?=
ARGS     ?=

WARN     := -Wall -Wextra -Werror
# EXERCISE=1: a half-written exercise (an unused variable, a parameter not read yet) still
# compiles; the warnings are printed, not fatal. The project itself builds with -Werror.
EXERCISE ?= 0
ifeq ($(EXERCISE),1)
  WARN   := -Wall -Wextra
endif
# -fno-trapping-math: kiln never reads the floating-point exception flags, and with them GCC
# will not vectorize a loop that compares floats (GELU's clamps: 4× slower); clang's default.
CXXFLAGS := -std=c++17 -fopenmp -fno-trapping-math $(WARN) -Isrc -Icuda -isystem /usr/local/cuda/include -MMD -MP
LDLIBS   := -lz -fopenmp -lpthread

ifeq ($(SAN),1)
  BUILD    := build-san
  CXXFLAGS += -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDLIBS   += -fsanitize=address,undefined
  # The MPI tests: Open MPI keeps allocations until the process ends, in its libraries and
  # plug-ins; LeakSanitizer is told so (tests/mpi/lsan.supp), with full stacks to match them
  # and the plug-ins kept loaded so their frames have names. The whole test run gets it too:
  # kiln_tests starts lesson-12 (an MPI program) to read its --help. Its summary of what it
  # suppressed is not printed: the tests compare the trainers' output between runs.
  MPI_TEST_ENV := env ASAN_OPTIONS=fast_unwind_on_malloc=0 \
                  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/mpi/lsan.supp:print_suppressions=0 \
                  OMPI_MCA_mca_component_disable_dlclose=1
else ifeq ($(CUDA),1)
  BUILD    := build-cuda
  CXXFLAGS += -O2 -march=native -DKILN_CUDA=1 -I/usr/local/cuda/include
  LDLIBS   += -L/usr/local/cuda/lib64 -lcudart
else
  BUILD    := build
  CXXFLAGS += -O2 -march=native
endif

# Machine code (SASS) for sm_80 and sm_90, and sm_90's PTX, which the driver of a newer GPU compiles.
NV_SM80 := -gencode arch=compute_80,code=sm_80
NV_PTX  := -gencode arch=compute_90,code=compute_90
# -MMD -MP: a .d file of the headers each object includes, as g++'s, so that an edited .cuh
# rebuilds the kernels that include it.
NVFLAGS := -std=c++17 -O2 -Isrc -Icuda -DKILN_CUDA=1 -MMD -MP --Werror all-warnings \
           -Xcompiler -Wall,-Wextra,-Werror,-fopenmp \
           $(NV_SM80) -gencode arch=compute_90,code=sm_90 $(NV_PTX)
comma := ,
ifeq ($(EXERCISE),1)
  NVFLAGS := $(subst -Werror$(comma),,$(filter-out --Werror all-warnings,$(NVFLAGS)))
endif

# make gpu-check-prepare (scripts/gpu-check-prepare.sh) builds with CUDA=1 GPUCHECK=1 the binaries
# that travel to a GPU machine which is not this one and has no compiler step to run. They go to
# their own folder, build-gpucheck/, so that build-cuda/ keeps this CPU's -march=native: their
# host code is for any x86-64 with AVX2 (-march=x86-64-v3), their kernels carry -lineinfo (so
# compute-sanitizer names the source line) and are compressed for size (5x smaller than nvcc's
# default: each binary holds all of libkiln's kernels, and a device call carries 64 MiB), as
# sm_90's SASS only (the GPU is an H200: no sm_80 code, and no PTX to carry for a newer one), and
# what that machine may lack is linked statically:
# the C++ and gcc runtimes, OpenMP's libgomp (--as-needed drops the shared one -fopenmp adds),
# zlib where libz.a is installed, and the CUDA runtime. cuBLAS and cuDNN (the lab) stay shared.
ifeq ($(GPUCHECK),1)
  BUILD    := build-gpucheck
  CXXFLAGS := $(filter-out -march=native,$(CXXFLAGS)) -march=x86-64-v3
  NVFLAGS  := $(subst $(NV_SM80),,$(subst $(NV_PTX),,$(NVFLAGS))) -lineinfo --compress-mode=size
  LIBZ_A   := $(shell $(CXX) -print-file-name=libz.a)
  LDLIBS   := $(filter-out -lz -fopenmp -lcudart,$(LDLIBS)) -Wl,--as-needed \
              $(shell $(CXX) -print-file-name=libgomp.a) $(if $(filter /%,$(LIBZ_A)),$(LIBZ_A),-lz) \
              -lcudart_static -ldl -lrt -static-libstdc++ -static-libgcc
endif

# MPI (chapter 12): only src/mpi/ includes <mpi.h>; it becomes its own library, libkiln_mpi.a,
# linked into the programs that use MPI (lessons 12 and 14, and the tests in tests/mpi/) and no
# others. `make lesson-12` runs its trainer under mpirun; lesson-14 is one process unless started
# by mpirun (its --zero: lessons/14-attention/README.md).
# (Its headers as system headers, without the C++ bindings kiln does not use: they do not compile
# warning-free.)
MPI_CFLAGS := $(patsubst -I%,-isystem %,$(shell mpicxx --showme:compile 2>/dev/null)) -DOMPI_SKIP_MPICXX
MPI_LIBS   := $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link 2>/dev/null))
MPI_LESSONS := 12 14
MPIRUN_LESSONS := 12
# How make test and make lesson-12 start MPI programs: 2 ranks; as root Open MPI wants --allow-run-as-root, and on a
# machine reporting fewer cores than ranks, --oversubscribe.
MPIRUN     ?= mpirun --allow-run-as-root --oversubscribe -np 2

# --- sources -----------------------------------------------------------------------------
LIB_SRCS  := $(shell find src -name '*.cpp' -not -path 'src/mpi/*' | sort)
MPI_SRCS  := $(sort $(wildcard src/mpi/*.cpp))
# The NCCL communicator (src/mpi/nccl_comm.cpp) needs a GPU build: CUDA=1 compiles it into
# libkiln_mpi.a and links NCCL (libnccl.so.2, in the toolkit's lib64) wherever Open MPI is linked.
ifeq ($(CUDA),1)
  MPI_LIBS += -lnccl
else
  MPI_SRCS := $(filter-out src/mpi/nccl_comm.cpp,$(MPI_SRCS))
endif
# The lab's teaching versions of engine kernels (cuda/lab/versions/: GEMM versions 1, 2, 3, 5) are
# compiled into libkiln.a, each file its own object: the tests and the lab call them, and a trainer,
# which never does, does not link them.
CU_SRCS   := $(shell find cuda -name '*.cu' -not -path 'cuda/lab/*' | sort) $(sort $(wildcard cuda/lab/versions/*.cu))
EMU_SRCS  := $(shell find cuda/emu -name '*.cpp' 2>/dev/null | sort)
TEST_SRCS := $(shell find tests -name '*.cpp' -not -path 'tests/mpi/*' | sort)
MPI_TEST_SRCS := $(sort $(wildcard tests/mpi/*.cpp))
LESSONS   := $(sort $(wildcard lessons/[0-9][0-9]-*/train.cpp))
BENCH_SRCS:= $(shell find bench -name '*.cpp' | sort)

LIB_OBJS  := $(LIB_SRCS:%.cpp=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
ifneq ($(CUDA),1)
  LIB_OBJS += $(EMU_SRCS:%.cpp=$(BUILD)/%.o)
endif
TEST_OBJS := $(TEST_SRCS:%.cpp=$(BUILD)/%.o)
LIB       := $(BUILD)/libkiln.a
MPI_LIB   := $(BUILD)/libkiln_mpi.a
TEST_BIN  := $(BUILD)/tests/kiln_tests
MPI_TEST_BIN := $(BUILD)/tests/kiln_mpi_tests
# lessons/02-backprop/train.cpp -> build/bin/lesson-02
lesson_num = $(shell echo $(1) | sed -E 's|lessons/([0-9]+)-.*|\1|')
lesson_bin = $(BUILD)/bin/lesson-$(call lesson_num,$(1))
LESSON_BINS := $(foreach l,$(LESSONS),$(call lesson_bin,$(l)))
BENCH_BINS  := $(BENCH_SRCS:bench/%.cpp=$(BUILD)/bench/%)
# cuda/lab/gemm.cu -> build/lab/gemm
LAB_SRCS    := $(sort $(wildcard cuda/lab/*.cu))
LAB_BINS    := $(LAB_SRCS:cuda/lab/%.cu=$(BUILD)/lab/%)
# A chapter's other programs: lessons/13-capstone/resnet50.cpp -> build/bin/lesson-13-resnet50
# (make lesson-13-resnet50 runs it).
EXTRAS    := $(filter-out %/train.cpp,$(sort $(wildcard lessons/[0-9][0-9]-*/*.cpp)))
extra_name = lesson-$(call lesson_num,$(1))-$(basename $(notdir $(1)))
EXTRA_NAMES := $(foreach l,$(EXTRAS),$(call extra_name,$(l)))
EXTRA_BINS  := $(EXTRA_NAMES:%=$(BUILD)/bin/%)
# The chapters that have a trainer: 01 02 ... (make lesson-NN runs one).
LESSON_NUMS := $(patsubst $(BUILD)/bin/lesson-%,%,$(LESSON_BINS))

.SECONDARY:
.PHONY: all test data run bench lab lab-build kernel-report accuracy check-docs gpu-check gpu-check-prepare gpu-check-dry fuzz clang-check clean $(addprefix lesson-,$(LESSON_NUMS)) $(EXTRA_NAMES)
all: $(LIB) $(LESSON_BINS) $(EXTRA_BINS) $(TEST_BIN) $(MPI_TEST_BIN)

# --- packages ----------------------------------------------------------------------------
# Before the first compile, scripts/setup.sh --check names any missing Debian package and the
# command that installs it (instead of a compiler error about a missing header). The stamp
# keeps it from running again until setup.sh changes.
PACKAGES_OK := $(BUILD)/.packages-ok
$(PACKAGES_OK): scripts/setup.sh
	@bash scripts/setup.sh --check
	@mkdir -p $(dir $@) && touch $@

# --- compile -----------------------------------------------------------------------------
$(BUILD)/%.o: %.cpp | $(PACKAGES_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

ifeq ($(CUDA),1)
# ptxas's report of each kernel (registers, spills, shared memory) is kept beside the object as
# OBJECT.ptxas for make kernel-report; shown only when the compile fails.
$(BUILD)/%.cu.o: %.cu | $(PACKAGES_OK)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) --resource-usage -c $< -o $@ >$@.ptxas 2>&1 || { cat $@.ptxas; rm -f $@; exit 1; }
else
# Without a GPU the same .cu source is plain C++ run by the kernel emulator (cuda/emu/).
$(BUILD)/%.cu.o: %.cu | $(PACKAGES_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -x c++ -c $< -o $@
endif

# Traced objects, for the emulator's memory counts (requests, sectors, bank conflicts: cuda/emu/
# traffic.cpp). clang compiles the kernels to be measured with AddressSanitizer's instrumentation
# alone: every load and store first calls kiln's __kiln_trace_* callbacks (no shadow memory, no
# runtime library), at -O0, so that each access the source writes stays one access of its own
# width (a float4 one of 16 bytes, as on a GPU). The lab links these copies of cuda/*.cu (make lab
# prints each version's counts), and tests/test_emu_traffic.cpp, which checks the counts, is
# compiled so. The emulator's builds only: nvcc builds count nothing.
TRACE_CXX   ?= clang++
TRACE_FLAGS := -std=c++17 -fno-trapping-math $(WARN) -Isrc -Icuda -isystem /usr/local/cuda/include -MMD -MP -O0 \
               -fsanitize=address -mllvm -asan-instrumentation-with-call-threshold=0 \
               -mllvm -asan-memory-access-callback-prefix=__kiln_trace_ -mllvm -asan-opt=0 \
               -mllvm -asan-stack=0 -mllvm -asan-globals=0 -mllvm -asan-use-after-return=never
TRACED_CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/traced/%.cu.o)
$(BUILD)/traced/%.cu.o: %.cu | $(PACKAGES_OK)
	@mkdir -p $(dir $@)
	$(TRACE_CXX) $(TRACE_FLAGS) -x c++ -c $< -o $@
ifneq ($(CUDA),1)
$(BUILD)/tests/test_emu_traffic.o: tests/test_emu_traffic.cpp | $(PACKAGES_OK)
	@mkdir -p $(dir $@)
	$(TRACE_CXX) $(TRACE_FLAGS) -c $< -o $@
endif

$(BUILD)/src/mpi/%.o $(BUILD)/tests/mpi/%.o: CXXFLAGS += $(MPI_CFLAGS)

# stb_image, in src/data/image_decode.cpp alone, overflows a signed int on a crafted JPEG
# (nothings/stb#1533): in that file the overflow wraps, and UBSan does not stop on it.
STB_CXXFLAGS := -fwrapv -fno-sanitize=signed-integer-overflow
$(BUILD)/src/data/image_decode.o: CXXFLAGS += $(STB_CXXFLAGS)

# Catch2's own main trips g++ 12's -Wmaybe-uninitialized at -O1 (SAN=1): a false positive
# inside the library's std::function use, not in kiln's code.
$(BUILD)/tests/main.o $(BUILD)/tests/mpi/main.o: CXXFLAGS += -Wno-maybe-uninitialized

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(MPI_LIB): $(MPI_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TEST_BIN): $(TEST_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(TEST_OBJS) $(LIB) -o $@ $(LDLIBS)

$(MPI_TEST_BIN): $(MPI_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(MPI_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(filter %.o,$^) $(MPI_LIB) $(LIB) -o $@ $(LDLIBS) $(MPI_LIBS)

# A chapter in MPI_LESSONS links libkiln_mpi.a and Open MPI too.
lesson_libs = $(if $(filter $(1),$(MPI_LESSONS)),$(MPI_LIB) $(LIB),$(LIB))
lesson_mpi  = $(if $(filter $(1),$(MPI_LESSONS)),$(MPI_LIBS))
define LESSON_RULE
$(call lesson_bin,$(1)): $(BUILD)/$(1:.cpp=.o) $(call lesson_libs,$(call lesson_num,$(1)))
	@mkdir -p $$(dir $$@)
	$(CXX) $(CXXFLAGS) $$< $(call lesson_libs,$(call lesson_num,$(1))) -o $$@ $(LDLIBS) $(call lesson_mpi,$(call lesson_num,$(1)))
endef
$(foreach l,$(LESSONS),$(eval $(call LESSON_RULE,$(l))))

define EXTRA_RULE
$(BUILD)/bin/$(call extra_name,$(1)): $(BUILD)/$(1:.cpp=.o) $(LIB)
	@mkdir -p $$(dir $$@)
	$(CXX) $(CXXFLAGS) $$< $(LIB) -o $$@ $(LDLIBS)
endef
$(foreach l,$(EXTRAS),$(eval $(call EXTRA_RULE,$(l))))

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $< $(LIB) -o $@ $(LDLIBS) $(BENCH_LIBS_$*)

# The GEMM benchmark compares with OpenBLAS; OpenBLAS is linked into that benchmark only.
BENCH_LIBS_bench_gemm := -lopenblas

# The kernel lab: each cuda/lab/*.cu linked with the engine. Its references on a GPU, cuBLAS
# and cuDNN, are linked into these binaries only, never into libkiln.a.
# On the emulator they link the traced copies of the kernels (above), so that every version's run
# also prints its memory counts.
ifeq ($(CUDA),1)
  LAB_LIBS := -lcublas -lcudnn
$(BUILD)/lab/%: $(BUILD)/cuda/lab/%.cu.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $< $(LIB) -o $@ $(LDLIBS) $(LAB_LIBS)
else
$(BUILD)/lab/%: $(BUILD)/traced/cuda/lab/%.cu.o $(TRACED_CU_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $< $(TRACED_CU_OBJS) $(LIB) -o $@ $(LDLIBS)
endif

# --- multi-call programs (the GPU check) ---------------------------------------------------
# Every program linked with libkiln.a holds all of its GPU kernels, and a device call carries
# 64 MiB, so the GPU check links its programs into two binaries: each program's object has its
# main renamed (-Dmain=kiln_main_NAME) and its other global definitions made local
# (scripts/multi-localize.sh), and scripts/multi_main.cpp runs `BINARY NAME ARGS...` as program
# NAME runs `ARGS...`:
#   bin/kiln-gpu   the tests (`kiln-gpu tests '[cuda]'`: tests/main.cpp renamed, the test files
#                  as they are), the trainers that take --device cuda (lesson-04 ... lesson-11 and
#                  lesson-13; lessons 12 and 14 link Open MPI and stay out) and bench_train
#   lab/kiln-lab   the kernel lab's pages: gemm, conv, ... (with cuBLAS and cuDNN on a GPU)
# (Inline functions and class types stay shared: two programs that define one of the same name
# must define it alike, as C++'s one-definition rule asks; an anonymous namespace keeps a
# program's own apart.)
# multi_name: lessons/04-cuda-kernels/train.cpp -> lesson_04, bench/bench_train.cpp -> bench_train,
# cuda/lab/gemm.cu -> gemm
multi_name = $(if $(filter lessons/%,$(1)),lesson_$(call lesson_num,$(1)),$(if $(filter tests/main.cpp,$(1)),tests,$(basename $(basename $(notdir $(1))))))
KILN_GPU_SRCS := tests/main.cpp $(filter-out lessons/01-% lessons/02-% lessons/03-% $(MPI_LESSONS:%=lessons/%-%),$(LESSONS)) \
                 bench/bench_train.cpp
KILN_LAB_SRCS := $(LAB_SRCS)
multi_obj  = $(BUILD)/multi/$(call multi_name,$(1)).o
ifeq ($(CUDA),1)
  multi_cc = $(if $(filter %.cu,$(1)),$(NVCC) $(NVFLAGS),$(CXX) $(CXXFLAGS))
else
  multi_cc = $(CXX) $(CXXFLAGS)$(if $(filter %.cu,$(1)), -x c++)
endif
# (The tests' main.cpp keeps its globals: they are Catch2's, which the test files call.)
define MULTI_RULE
$(call multi_obj,$(1)): $(1) | $(PACKAGES_OK)
	@mkdir -p $$(dir $$@)
	$(call multi_cc,$(1)) -Dmain=kiln_main_$(call multi_name,$(1)) -c $$< -o $$@
	$(if $(filter tests/main.cpp,$(1)),,bash scripts/multi-localize.sh $$@ kiln_main_$(call multi_name,$(1)))
endef
$(foreach f,$(KILN_GPU_SRCS) $(KILN_LAB_SRCS),$(eval $(call MULTI_RULE,$(f))))
# The dispatcher of binary $(1) (kiln-gpu, kiln-lab), for the programs of sources $(2) (listed
# here, so it is rebuilt when the Makefile changes).
define MULTI_MAIN_RULE
$(BUILD)/multi/$(1)-main.o: scripts/multi_main.cpp Makefile | $(PACKAGES_OK)
	@mkdir -p $$(dir $$@)
	$(CXX) $(CXXFLAGS) -DKILN_MAINS="$(foreach f,$(2),KILN_MAIN($(call multi_name,$(f))))" -c $$< -o $$@
endef
$(eval $(call MULTI_MAIN_RULE,kiln-gpu,$(KILN_GPU_SRCS)))
$(eval $(call MULTI_MAIN_RULE,kiln-lab,$(KILN_LAB_SRCS)))
$(BUILD)/bin/kiln-gpu: $(BUILD)/multi/kiln-gpu-main.o $(foreach f,$(KILN_GPU_SRCS),$(call multi_obj,$(f))) \
                       $(filter-out $(BUILD)/tests/main.o,$(TEST_OBJS)) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(filter %.o,$^) $(LIB) -o $@ $(LDLIBS)
$(BUILD)/lab/kiln-lab: $(BUILD)/multi/kiln-lab-main.o $(foreach f,$(KILN_LAB_SRCS),$(call multi_obj,$(f))) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(filter %.o,$^) $(LIB) -o $@ $(LDLIBS) $(LAB_LIBS)

# --- run ---------------------------------------------------------------------------------
# The tests read the real MNIST (pinned first losses); CIFAR-10 only in hidden [data-real] cases.
# The MPI tests (tests/mpi/) run as 2 ranks under mpirun, after the others; one summary line for both.
# T is one Catch2 filter, passed as one word: a test's name keeps its spaces and its *.
# The trainers are built first: tests/test_trainer_flags.cpp runs them. First of all, the folders'
# order (scripts/check-includes.sh, src/README.md): no folder includes one after it. The data:
# MNIST, and Moby-Dick for chapter 14's pinned first losses.
test: $(TEST_BIN) $(MPI_TEST_BIN) $(LESSON_BINS) $(EXTRA_BINS)
	@bash scripts/check-includes.sh
	@bash data/fetch.sh mnist moby-dick
	@$(MPI_TEST_ENV) MPIRUN="$(strip $(MPI_TEST_ENV) $(MPIRUN))" bash tests/run.sh $(TEST_BIN) $(MPI_TEST_BIN) $(if $(T),'$(T)')

data:
	@bash data/fetch.sh mnist cifar10 moby-dick

# The chapters that train on CIFAR-10; the others need only MNIST.
# One explicit rule per chapter: a pattern rule (lesson-%) would never run, because make looks
# for no implicit rule for a .PHONY target. scripts/check-make.sh checks that each one runs.
# Chapter 13 aims at 94%, and trains on the lossless copy from npm (data/README.md); chapter 14
# on Moby-Dick's text.
CIFAR_LESSONS := 06 07 08 09
lesson_data = $(if $(filter 13,$(1)),cifar10-png,$(if $(filter 14,$(1)),moby-dick,$(if $(filter $(1),$(CIFAR_LESSONS)),cifar10,mnist)))
# Chapter 15's planner reads no data set (its measured steps train on random tokens).
NO_DATA_LESSONS := 15
define LESSON_RUN_RULE
lesson-$(1):
	$(if $(filter $(1),$(NO_DATA_LESSONS)),,@bash data/fetch.sh $(call lesson_data,$(1)))
	@$$(MAKE) --no-print-directory $(BUILD)/bin/lesson-$(1)
	$(if $(filter $(1),$(MPIRUN_LESSONS)),$(MPIRUN) )$(BUILD)/bin/lesson-$(1) $$(ARGS)
endef
$(foreach n,$(LESSON_NUMS),$(eval $(call LESSON_RUN_RULE,$(n))))

# A chapter's other programs run the same way, with the chapter's data (but those that train on
# random images).
RANDOM_DATA_PROGRAMS := lesson-13-resnet50
define EXTRA_RUN_RULE
$(call extra_name,$(1)):
	$(if $(filter $(call extra_name,$(1)),$(RANDOM_DATA_PROGRAMS)),,@bash data/fetch.sh $(call lesson_data,$(call lesson_num,$(1))))
	@$$(MAKE) --no-print-directory $(BUILD)/bin/$(call extra_name,$(1))
	$(BUILD)/bin/$(call extra_name,$(1)) $$(ARGS)
endef
$(foreach l,$(EXTRAS),$(eval $(call EXTRA_RUN_RULE,$(l))))

# The latest finished chapter whose trainer runs on MNIST.
RUN_LESSON := 04
run:
	@bash scripts/setup.sh
	@bash data/fetch.sh mnist
	@$(MAKE) --no-print-directory all
	$(BUILD)/bin/lesson-$(RUN_LESSON) $(ARGS)

# OpenBLAS and PyTorch are installed first: the GEMM benchmark links OpenBLAS. Of the data,
# only bench/torch_lenet.py reads any (MNIST); the others train on random inputs.
bench:
	@bash scripts/setup.sh --bench
	@$(MAKE) --no-print-directory $(BENCH_BINS)
	@bash data/fetch.sh mnist
	@bash bench/run.sh $(BUILD)

# Every CUDA kernel's registers, spills, static shared memory and theoretical occupancy on sm_80 and
# sm_90, from ptxas's reports of the CUDA build (scripts/kernel-report.sh); no GPU needed.
ifeq ($(CUDA),1)
kernel-report: $(CU_SRCS:%.cu=$(BUILD)/%.cu.o) $(LAB_SRCS:%.cu=$(BUILD)/%.cu.o)
	@bash scripts/kernel-report.sh $(BUILD)
else
kernel-report:
	@echo "make kernel-report reads nvcc's ptxas reports: run make CUDA=1 kernel-report"; exit 1
endif

# Every lab binary in turn (each validates, then times on a GPU); fails if any version disagrees.
lab: $(LAB_BINS)
	@status=0; for b in $(LAB_BINS); do echo "=== $$b"; $$b || status=1; done; exit $$status
lab-build: $(LAB_BINS)

# The full training runs, each checked against its chapter's target accuracy (long).
accuracy: $(LESSON_BINS)
	@bash data/fetch.sh mnist cifar10 cifar10-png
	@MPIRUN="$(MPIRUN)" bash scripts/accuracy.sh $(BUILD) $(LESSONS_TO_CHECK)

# Every figure a README quotes from a quick run (a --limit run, --mem-report, --find-batch-size,
# a memory plan) is re-run and compared (scripts/check-docs.sh says how a README marks them).
check-docs: $(LESSON_BINS) $(EXTRA_BINS)
	@bash data/fetch.sh mnist cifar10 moby-dick
	@bash scripts/check-docs.sh

# The GPU check in two halves, for a GPU machine that builds nothing (scripts/gpu-check.sh says
# how the device tool runs it). gpu-check-prepare, here: the CUDA binaries the check runs, built
# into build-gpucheck/ (GPUCHECK above), gathered with MNIST, CIFAR-10 and the scripts into
# gpu-check/, under the 64 MiB a device call carries, with the emulator's memory counts of the
# lab's launches (the traced lab, build/lab/). gpu-check, there: runs them (the tests,
# every CUDA trainer, their throughput beside PyTorch's, per-kernel times, Nsight Compute, the
# lab against cuBLAS/cuDNN, compute-sanitizer), no make and no compiler. The tests, the trainers
# 04-11 and 13, and the lab's pages are two multi-call binaries (above); lesson 12 links Open MPI
# and is apart.
# gpu-check-dry: the same script on this machine's emulator build, to check its steps.
GPU_CHECK_BINS := bin/kiln-gpu lab/kiln-lab bin/lesson-12
gpu-check-prepare:
	@bash data/fetch.sh mnist cifar10
	@$(MAKE) --no-print-directory CUDA=0 GPUCHECK=0 SAN=0 lab-build
	@$(MAKE) --no-print-directory CUDA=1 GPUCHECK=1 $(addprefix build-gpucheck/,$(GPU_CHECK_BINS))
	@LAB_PAGES="$(LAB_SRCS:cuda/lab/%.cu=%)" bash scripts/gpu-check-prepare.sh build-gpucheck $(GPU_CHECK_BINS)

gpu-check:
	@bash scripts/gpu-check.sh

gpu-check-dry:
	@bash data/fetch.sh mnist cifar10
	@$(MAKE) --no-print-directory $(addprefix build/,$(GPU_CHECK_BINS))
	@GPU_CHECK_DRY=1 bash scripts/gpu-check.sh

# --- fuzzing -------------------------------------------------------------------------------
# The harnesses in fuzz/ feed libFuzzer's inputs to the file readers: safetensors (checkpoints),
# IDX (MNIST), gzip and tar, CIFAR-10 archives, and JPEG/PNG images. Built with clang under
# AddressSanitizer and UBSan into build-fuzz/, from the readers' sources and the few files they
# link with (not the whole engine: a short build); the seeds are small valid files that the
# tests write (kiln_tests '[fuzz-seeds]'). scripts/fuzz.sh runs each harness FUZZ_SECONDS
# seconds and stops at the first finding, its input kept as build-fuzz/crash-<harness>-*;
# build-fuzz/corpus/ keeps what the fuzzers found from one run to the next.
FUZZ_CXX      ?= clang++
FUZZ_SECONDS  ?= 60
FUZZ_DIR      := build-fuzz
FUZZ_HARNESSES := safetensors idx archive cifar image
# (-Wno-pass-failed: an "omp simd" loop that the sanitizers' checks keep from vectorizing is not an error.)
FUZZ_CXXFLAGS := -std=c++17 -g -O1 -fno-omit-frame-pointer -fopenmp -Wall -Wextra -Werror -Wno-pass-failed -Isrc \
                 -Icuda -isystem /usr/local/cuda/include -MMD -MP -fsanitize=address,undefined -fno-sanitize-recover=undefined
# The readers, and what a link of them needs (a tensor's conversions and copies, the kernel emulator
# they dispatch to): a link error naming a symbol means another file to add here.
FUZZ_LIB_SRCS := src/io/safetensors.cpp src/io/archive.cpp src/data/idx.cpp src/data/cifar.cpp \
                 src/data/image_decode.cpp src/core/tensor.cpp src/core/dtype.cpp src/core/allocator.cpp \
                 src/core/pool_allocator.cpp src/core/bump_allocator.cpp \
                 src/core/parallel.cpp src/core/cpu_features.cpp src/ops/cpu/convert_simd.cpp \
                 src/ops/cpu/elementwise.cpp cuda/memory.cu cuda/elementwise.cu cuda/kernel_times.cu $(EMU_SRCS)
FUZZ_OBJS     := $(FUZZ_LIB_SRCS:%=$(FUZZ_DIR)/%.o)
FUZZ_BINS     := $(FUZZ_HARNESSES:%=$(FUZZ_DIR)/fuzz_%)

$(FUZZ_DIR)/%.cpp.o: %.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_DIR)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer-no-link -x c++ -c $< -o $@
$(FUZZ_DIR)/src/data/image_decode.cpp.o: FUZZ_CXXFLAGS += $(STB_CXXFLAGS)
$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/fuzz/%.cpp.o $(FUZZ_OBJS)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer $^ -o $@ -lz -lpthread

# The engine is standard C++17: clang++ compiles every source of libkiln too (syntax only, each
# file its own job). GCC's "#pragma GCC target" (the CPU kernels' instruction sets) is ignored.
CLANG_CHECK_SRCS := $(LIB_SRCS) $(CU_SRCS) $(EMU_SRCS)
clang-check:
	@bash scripts/setup.sh --fuzz
	@$(MAKE) --no-print-directory $(CLANG_CHECK_SRCS:%=clang-check/%)
clang-check/%:
	@$(FUZZ_CXX) -std=c++17 -fsyntax-only -fopenmp -fno-trapping-math $(WARN) -Wno-unknown-pragmas -Isrc -Icuda \
	    -isystem /usr/local/cuda/include -march=native $(if $(filter %.cu,$*),-x c++) $*

fuzz:
	@bash scripts/setup.sh --fuzz
	@$(MAKE) --no-print-directory $(FUZZ_BINS) $(TEST_BIN)
	@rm -rf $(FUZZ_DIR)/seeds && KILN_FUZZ_SEEDS=$(FUZZ_DIR)/seeds $(TEST_BIN) '[fuzz-seeds]' >$(FUZZ_DIR)/seeds.log \
	    || { cat $(FUZZ_DIR)/seeds.log; exit 1; }
	@bash scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

clean:
	rm -rf build build-san build-cuda build-gpucheck build-fuzz gpu-check

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
ifneq ($(filter fuzz build-fuzz/%,$(MAKECMDGOALS)),)
-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)
endif

# dspark — build, test, bench.
#
#   make deps       install the Debian packages the build needs
#   make            build/dspark (CLI), build/libdspark.a, tests, benchmarks
#   make models     the Q8_0 target made from the committed F16 one
#   make run        the main job: speculative generation on the shipped pair
#   make test       every unit test + CLI tests, then the suites in
#                   tests/SAN_SUITES again under ASan/UBSan (make test-san)
#   make bench      bench/ (medians and ratios, JSON under bench/results/)
#
# Floating point: -ffp-contract=off everywhere and never -ffast-math. The
# exactness contract depends on the compiler not fusing a*b+c into an FMA in
# one kernel and not in its twin; kernels that want FMA ask for it explicitly
# and identically in decode and canonical.

# `make` alone builds everything, also when the CUDA section below (which
# comes first) defines targets of its own
.DEFAULT_GOAL := all

CC      ?= cc
OPT     ?= -O3
SAN     ?=
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
FPFLAGS := -ffp-contract=off -fno-fast-math
PCRE_CFLAGS  := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE_LIBS    := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)
CJSON_CFLAGS := $(shell pkg-config --cflags libcjson 2>/dev/null)
CJSON_LIBS   := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson)
CFLAGS  += $(SAN) $(CSTD) $(OPT) -g $(WARN) $(FPFLAGS) -pthread -Iinclude -Isrc $(PCRE_CFLAGS) $(CJSON_CFLAGS)
LDLIBS  += $(SAN) $(PCRE_LIBS) $(CJSON_LIBS) -lm -pthread

BUILD    ?= build
LIB_SRC  := $(filter-out src/main.c,$(sort $(wildcard src/*.c src/kernels/*.c src/kernels/cpu/*.c src/diag/*.c)))
TOOL_SRC := $(sort $(wildcard tools/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC:= $(sort $(wildcard bench/*.c))
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
HEADERS  := $(wildcard src/*.h src/*/*.h src/*/*/*.h include/*.h tools/*.h)

# ---- the CUDA backend (issue 9) --------------------------------------------------
# Built when nvcc is on PATH (or with CUDA=1); CUDA=0 forces the CPU-only
# build, which is then exactly what it is without a CUDA toolkit. Device code
# follows the same floating-point rules as the C code: no fused a*b+c unless
# written (-fmad=false), IEEE division and square root, subnormals kept.
NVCC ?= nvcc
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
endif
ifeq ($(CUDA),1)
CUDA_HOME ?= $(abspath $(dir $(shell command -v $(NVCC)))..)
NVCCFLAGS := -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
             -O3 -g -fmad=false -prec-div=true -prec-sqrt=true -ftz=false -Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-ffp-contract=off,-fno-fast-math \
             -Isrc -DDS_HAVE_CUDA
CUDA_SRC := src/backend_cuda.cu $(sort $(wildcard src/kernels/cuda/*.cu))
LIB_OBJ  += $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CFLAGS   += -DDS_HAVE_CUDA
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++

$(BUILD)/%.o: %.cu $(HEADERS) $(wildcard src/kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# the kernel harness (tests/cuda/test_cuda_ops.c), run by tests/cuda/run.sh;
# `make bench-cuda`: its kernel benchmark (--bench)
CUDA_TESTS := $(BUILD)/tests/cuda/test_cuda_ops
$(BUILD)/tests/cuda/%: tests/cuda/%.c $(BUILD)/libdspark.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Itests $< $(BUILD)/libdspark.a -o $@ $(LDLIBS)
bench-cuda: $(CUDA_TESTS)
	@$(BUILD)/tests/cuda/test_cuda_ops --bench
endif

test-cuda: all $(CUDA_TESTS)
	@BUILD=$(BUILD) sh tests/cuda/run.sh

.PHONY: all test test-san test-cuda bench-cuda bench clean deps run models

all: $(BUILD)/dspark $(TEST_BIN) $(BENCH_BIN)
# the device harness for the heads' ops, built here so it keeps compiling (run it with a GPU)
all: $(BUILD)/tests/cuda/test_heads

# The comparator must be exact IEEE-754 whatever the project flags are.
$(BUILD)/src/diag/%.o: CFLAGS += -fno-finite-math-only -fsignaling-nans

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libdspark.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dspark: $(BUILD)/src/main.o $(TOOL_SRC:%.c=$(BUILD)/%.o) $(BUILD)/libdspark.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdspark.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libdspark.a -o $@ $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libdspark.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/libdspark.a -o $@ $(LDLIBS)

# Debian packages the build and tests need (PCRE2 for the gpt2 pre-tokenizer,
# cJSON for `dspark convert`, xz for the validation data). Idempotent; uses
# sudo when not root.
APT_PKGS := gcc make pkg-config libpcre2-dev libcjson-dev xz-utils python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
deps:
	@dpkg -s $(APT_PKGS) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(APT_PKGS); }

# The shipped pair (models/README.md): a trained 15.7M-parameter Qwen3 target
# (F16, committed) and its DSpark drafter (F16, committed). The Q8_0 target is
# made from the F16 one at build time with `dspark quantize`.
TARGET_F16 := models/dspark-tiny-f16.gguf
TARGET_Q8  := models/dspark-tiny-q8_0.gguf
DRAFTER    := models/dspark-tiny-drafter-f16.gguf
models: $(TARGET_Q8)
$(TARGET_Q8): $(TARGET_F16) $(BUILD)/dspark
	$(BUILD)/dspark quantize $(TARGET_F16) $@ q8_0

# The main job: speculative generation on the shipped pair (stats line on
# stderr), then the same prompt decoded plainly, and a byte comparison.
PROMPT ?= It is a truth universally acknowledged, that
N ?= 128
run: all $(TARGET_Q8)
	@echo "== speculative (canonical kernels, direct commit) =="
	@$(BUILD)/dspark generate -m $(TARGET_Q8) -md $(DRAFTER) -p "$(PROMPT)" -n $(N) -t 2 | tee $(BUILD)/run-spec.txt
	@echo "== plain greedy decoding =="
	@$(BUILD)/dspark generate -m $(TARGET_Q8) -p "$(PROMPT)" -n $(N) -t 2 | tee $(BUILD)/run-plain.txt
	@cmp -s $(BUILD)/run-spec.txt $(BUILD)/run-plain.txt && echo "identical bytes: yes" || { echo "identical bytes: NO"; exit 1; }

test: all $(TARGET_Q8)
	@BUILD=$(BUILD) sh tests/run.sh
	@$(MAKE) --no-print-directory test-san

# Sanitizer build in its own tree so objects never mix.
test-san: $(TARGET_Q8)
	@$(MAKE) --no-print-directory BUILD=build-san OPT=-O1 CUDA=0 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" all
	@BUILD=build-san DSPARK_SAN=1 sh tests/run.sh

bench: all $(TARGET_Q8)
	@BUILD=$(BUILD) sh bench/run.sh
	@BUILD=$(BUILD) sh bench/bench_spec.sh

clean:
	rm -rf build build-san $(TARGET_Q8)

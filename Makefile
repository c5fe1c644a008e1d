# dspark — build, test, bench.
#
#   make deps       install the Debian packages the build needs (and the
#                   AArch64 cross toolchain + qemu-user for tests/cli_aarch64.sh)
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
# -Wno-psabi: GCC's note that the ABI for passing 64-byte vectors changed in
# GCC 4.6 is noise here (no vector crosses a library boundary); without it
# the sanitizer build prints it four times.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-psabi
FPFLAGS := -ffp-contract=off -fno-fast-math
PCRE_CFLAGS  := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE_LIBS    := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)
CJSON_CFLAGS := $(shell pkg-config --cflags libcjson 2>/dev/null)
CJSON_LIBS   := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson)
CFLAGS  += $(SAN) $(CSTD) $(OPT) -g $(WARN) $(FPFLAGS) -pthread -Iinclude -Isrc $(PCRE_CFLAGS) $(CJSON_CFLAGS)
LDLIBS  += $(SAN) $(PCRE_LIBS) $(CJSON_LIBS) -lm -pthread -ldl

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
# The backend is a module, $(BUILD)/libdspark-cuda.so, that libdspark and the
# CLI load with dlopen when --device cuda is asked for (src/backend.c): they
# link no CUDA library, so a CPU run maps none and starts on a machine
# without CUDA. The module carries the device code, the CUDA runtime and
# cuBLAS; pkg/libdspark-cuda.map exports its entry points only.
CUDA_SRC := src/backend_cuda.cu $(sort $(wildcard src/kernels/cuda/*.cu))
CUDA_PIC := $(CUDA_SRC:%.cu=$(BUILD)/pic/%.o)
CUDA_MODULE := $(BUILD)/libdspark-cuda.so
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ -lm
CFLAGS   += -DDS_HAVE_CUDA

$(BUILD)/pic/%.o: %.cu $(HEADERS) $(wildcard src/kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -c $< -o $@

$(CUDA_MODULE): $(CUDA_PIC) pkg/libdspark-cuda.map
	$(CC) -shared -Wl,-soname,libdspark-cuda.so -Wl,--version-script=pkg/libdspark-cuda.map -Wl,--no-undefined \
	  $(CUDA_PIC) -o $@ $(CUDA_LIBS)
all: $(CUDA_MODULE)

# the kernel harness (tests/cuda/test_cuda_ops.c), run by tests/cuda/run.sh;
# `make bench-cuda`: its kernel benchmark (--bench). It is linked with the
# module itself (it calls the backend's test hooks).
CUDA_TESTS := $(BUILD)/tests/cuda/test_cuda_ops
$(BUILD)/tests/cuda/%: tests/cuda/%.c $(BUILD)/libdspark.a $(CUDA_MODULE) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Itests $< $(BUILD)/libdspark.a -o $@ -L$(BUILD) -ldspark-cuda \
	  -Wl,-rpath,$(abspath $(BUILD)) $(LDLIBS) $(CUDA_LIBS)
bench-cuda: $(CUDA_TESTS)
	@$(BUILD)/tests/cuda/test_cuda_ops --bench
# matmul_kq.cu's lane, layout and embed logic run on the host against the CPU
# (no GPU needed): `make test-kq-lanes`; test-cuda runs it too
CUDA_TESTS += $(BUILD)/tests/cuda/test_kq_lanes
all: $(BUILD)/tests/cuda/test_kq_lanes
$(BUILD)/tests/cuda/test_kq_lanes.o: tests/cuda/test_kq_lanes.cu src/kernels/cuda/matmul_kq.cu $(HEADERS) $(wildcard src/kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/tests/cuda/test_kq_lanes: $(BUILD)/tests/cuda/test_kq_lanes.o $(BUILD)/libdspark.a
	$(CC) $(CFLAGS) $< $(BUILD)/libdspark.a -o $@ $(LDLIBS) $(CUDA_LIBS)
test-kq-lanes: $(BUILD)/tests/cuda/test_kq_lanes
	@$(BUILD)/tests/cuda/test_kq_lanes
# the Q8_0 GEMVs at M = 1..8 on the 8B shapes, old (q8v) against new (q8w)
# and its configurations: bits (memcmp) and times, on a GPU: `make bench-gemv`
all: $(BUILD)/tests/cuda/bench_gemv
$(BUILD)/tests/cuda/bench_gemv.o: tests/cuda/bench_gemv.cu tests/cuda/bench_common.cuh src/kernels/cuda/matmul_q8_0.cu src/kernels/cuda/matmul_q8_0_mma.cu $(HEADERS) $(wildcard src/kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/tests/cuda/bench_gemv: $(BUILD)/tests/cuda/bench_gemv.o $(BUILD)/libdspark.a
	$(CC) $(CFLAGS) $< $(BUILD)/libdspark.a -o $@ $(LDLIBS) $(CUDA_LIBS)
bench-gemv: $(BUILD)/tests/cuda/bench_gemv
	@$(BUILD)/tests/cuda/bench_gemv
# canonical prefill attention on the 8B shape: the tile path against the
# split-KV path and fast, bits (memcmp, the CPU on sampled rows) and times:
# `make bench-attn` on a GPU
all: $(BUILD)/tests/cuda/bench_attn
$(BUILD)/tests/cuda/bench_attn.o: tests/cuda/bench_attn.cu tests/cuda/bench_common.cuh src/kernels/cuda/attention.cu $(HEADERS) $(wildcard src/kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/tests/cuda/bench_attn: $(BUILD)/tests/cuda/bench_attn.o $(BUILD)/libdspark.a
	$(CC) $(CFLAGS) $< $(BUILD)/libdspark.a -o $@ $(LDLIBS) $(CUDA_LIBS)
bench-attn: $(BUILD)/tests/cuda/bench_attn
	@$(BUILD)/tests/cuda/bench_attn
endif

# ---- NCCL: tensor parallelism across GPUs (issue 25, docs/TP.md) -------------------
# make CUDA=1 NCCL=1: src/comm_nccl.c (the NCCL communicator: nccl.h and
# libnccl.so.2 of the toolkit's NCCL package, under NCCL_HOME, by default
# CUDA_HOME) built into libdspark, which every binary then links with libnccl
# and the CUDA runtime — why it is not the default (a CPU run of the default
# build maps no CUDA library). `make CUDA=1 NCCL=1 test-nccl`: the collectives
# on this host's GPUs against the CPU fake (tests/cuda/test_nccl.c).
NCCL ?= 0
ifeq ($(NCCL),1)
ifneq ($(CUDA),1)
$(error NCCL=1 needs the CUDA build (CUDA=1 and nvcc))
endif
NCCL_HOME ?= $(CUDA_HOME)
CFLAGS += -DDS_HAVE_NCCL -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
LDLIBS += -L$(NCCL_HOME)/lib -L$(NCCL_HOME)/lib64 -Wl,-rpath,$(NCCL_HOME)/lib -lnccl \
          -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
all: $(BUILD)/tests/cuda/test_nccl
$(BUILD)/tests/cuda/test_nccl: tests/cuda/test_nccl.c $(BUILD)/libdspark.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libdspark.a -o $@ $(LDLIBS)
test-nccl: $(BUILD)/tests/cuda/test_nccl
	@$(BUILD)/tests/cuda/test_nccl
endif
.PHONY: test-nccl

# the shipped Q8_0 target: the golden outputs and the CLI diagnostics run on it
test-cuda: all $(CUDA_TESTS)
	@BUILD=$(BUILD) sh tests/cuda/run.sh

.PHONY: all test test-san test-cuda test-kq-lanes bench-cuda bench-gemv bench-attn bench clean deps run models

all: $(BUILD)/dspark $(TEST_BIN) $(BENCH_BIN)
# the device harness for the heads' ops, built here so it keeps compiling (run it with a GPU)
all: $(BUILD)/tests/cuda/test_heads
# attention's prefill tile kernel (src/kernels/cuda/attention_tile.cuh) run
# on the host, its threads as fibers: no GPU and no nvcc needed, so
# tests/run.sh runs it on every machine (tests/cuda/test_tile_emu.cc)
all: $(BUILD)/tests/test_tile_emu
$(BUILD)/tests/test_tile_emu: tests/cuda/test_tile_emu.cc src/kernels/cuda/attention_tile.cuh $(BUILD)/libdspark.a $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -std=c++17 $(OPT) -g $(WARN) -Wno-unknown-pragmas $(FPFLAGS) -pthread -Iinclude -Isrc $< \
	  $(BUILD)/libdspark.a -o $@ $(LDLIBS)

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

# ==== libdspark.so, make install, dspark serve (issue 13) ===================
# The public API (include/dspark.h, src/api.c) as a versioned shared library
# built from position-independent objects in their own tree ($(BUILD)/pic);
# pkg/libdspark.map exports dspark_* and dsd_* only. `dspark serve` links GNU
# libmicrohttpd. `make install PREFIX=... [DESTDIR=...]` installs the binary,
# the library, both public headers and lib/pkgconfig/dspark.pc.
VERSION  := 0.1.0
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))
PREFIX   ?= /usr/local
MHD_CFLAGS := $(shell pkg-config --cflags libmicrohttpd 2>/dev/null)
MHD_LIBS   := $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
PIC_OBJ  := $(LIB_SRC:%.c=$(BUILD)/pic/%.o)
SO_REAL  := $(BUILD)/libdspark.so.$(VERSION)

$(BUILD)/src/api.o $(BUILD)/pic/src/api.o $(BUILD)/src/backend.o $(BUILD)/pic/src/backend.o: CFLAGS += -DDSPARK_VERSION_STRING=\"$(VERSION)\"
$(BUILD)/pic/src/backend_cuda.o: NVCCFLAGS += -DDSPARK_VERSION_STRING=\"$(VERSION)\"
$(BUILD)/pic/src/diag/%.o: CFLAGS += -fno-finite-math-only -fsignaling-nans
$(BUILD)/tools/cmd_serve.o: CFLAGS += $(MHD_CFLAGS)
$(BUILD)/dspark: LDLIBS += $(MHD_LIBS)
$(BUILD)/tests/test_serve_req: tools/serve_req.c tools/serve_chat.c tools/serve_schema.c tools/jinja.c tools/serve.h tools/jinja.h tests/jinja_cases.h   # compiles the server's OpenAI layer in

$(BUILD)/pic/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

# libdspark.so links no CUDA library: CUDA builds load the backend module
# ($(BUILD)/libdspark-cuda.so, installed beside it) when a device is asked for.

$(SO_REAL): $(PIC_OBJ) pkg/libdspark.map
	$(CC) $(CFLAGS) -shared -Wl,-soname,libdspark.so.$(SOMAJOR) -Wl,--version-script=pkg/libdspark.map \
	  -Wl,--no-undefined $(PIC_OBJ) -o $@ $(LDLIBS)

$(BUILD)/libdspark.so: $(SO_REAL)
	ln -sf libdspark.so.$(VERSION) $(BUILD)/libdspark.so.$(SOMAJOR)
	ln -sf libdspark.so.$(SOMAJOR) $@

.PHONY: install
install: $(BUILD)/dspark $(BUILD)/libdspark.so $(if $(filter 1,$(CUDA)),$(CUDA_MODULE))
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/dspark $(DESTDIR)$(PREFIX)/bin/dspark
	install -m 755 $(SO_REAL) $(DESTDIR)$(PREFIX)/lib/libdspark.so.$(VERSION)
	$(if $(filter 1,$(CUDA)),install -m 755 $(CUDA_MODULE) $(DESTDIR)$(PREFIX)/lib/libdspark-cuda.so)
	ln -sf libdspark.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libdspark.so.$(SOMAJOR)
	ln -sf libdspark.so.$(SOMAJOR) $(DESTDIR)$(PREFIX)/lib/libdspark.so
	install -m 644 include/dspark.h include/dspark_diag.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' pkg/dspark.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dspark.pc

# The shared library is part of `all` except in sanitizer trees (test-san
# links the static archive only, and the PIC objects would double its build).
all: $(if $(SAN),,$(BUILD)/libdspark.so)

APT_PKGS_SERVE := libmicrohttpd-dev curl python3-prometheus-client
# ==== end of issue 13 section ================================================

# ==== the same bytes with every C library (issue 24 item 4, issue 22 item 6) ====
# tests/cli_libm.sh runs the golden outputs with tests/libm/libm_shim.so
# preloaded (libm's transcendental functions moved by one ulp) and checks
# with tests/libm/libm_probe that the shim is in effect. Not in sanitizer
# trees (ASan must come first in the preload order).
LIBM_SHIM := $(BUILD)/tests/libm/libm_shim.so $(BUILD)/tests/libm/libm_probe
all: $(if $(SAN),,$(LIBM_SHIM))
$(BUILD)/tests/libm/libm_shim.so: tests/libm/libm_shim.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared $< -o $@ -ldl -lm
$(BUILD)/tests/libm/libm_probe: tests/libm/libm_probe.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror $< -o $@ -lm
# ==== end of the libm section =================================================

# Debian packages the build and tests need (PCRE2 for the gpt2 pre-tokenizer,
# cJSON for `dspark convert`, xz for the validation data). Idempotent; uses
# sudo when not root.
# g++: tests/cli_pretok.sh builds llama.cpp's own splitter (its unicode.cpp) as the reference
APT_PKGS := gcc g++ make pkg-config libpcre2-dev libcjson-dev xz-utils python3 $(APT_PKGS_SERVE)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# tests/cli_aarch64.sh (issue 24): the AArch64 cross build run under qemu-user,
# linked against Debian's arm64 libraries (multiarch: `dpkg --add-architecture
# arm64`). Installed apart from the rest: where the arm64 archive cannot be
# had, deps says so on one line and that test prints SKIP.
APT_PKGS_AARCH64 := gcc-aarch64-linux-gnu qemu-user libc6-dev:arm64 libpcre2-dev:arm64 libcjson-dev:arm64 \
                    libmicrohttpd-dev:arm64
deps:
	@dpkg -s $(APT_PKGS) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(APT_PKGS); }
	@dpkg -s $(APT_PKGS_AARCH64) >/dev/null 2>&1 || { \
	  { dpkg --print-foreign-architectures | grep -qx arm64 || $(SUDO) dpkg --add-architecture arm64; } && \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS_AARCH64); } || \
	  echo "deps: the AArch64 cross toolchain / qemu-user / arm64 libraries could not be installed; tests/cli_aarch64.sh will SKIP"

# The shipped pair (models/README.md): a trained 15.7M-parameter Qwen3 target
# (F16, committed) and its DSpark drafter (F16, committed). The Q8_0 target is
# made from the F16 one at build time with `dspark quantize`, and so is the
# Q8_0 drafter `make run` and bench/ use by default (same acceptance as the
# F16 one on the held-out prompts, a drafting round about half the cost:
# models/README.md). Tests keep the committed F16 drafter.
TARGET_F16 := models/dspark-tiny-f16.gguf
TARGET_Q8  := models/dspark-tiny-q8_0.gguf
DRAFTER_F16:= models/dspark-tiny-drafter-f16.gguf
DRAFTER    := models/dspark-tiny-drafter-q8_0.gguf
models: $(TARGET_Q8) $(DRAFTER)
# (here, not on test-cuda's own line above: a prerequisite is expanded where
# the rule is read, and TARGET_Q8 was still empty there)
test-cuda: $(TARGET_Q8)
$(TARGET_Q8): $(TARGET_F16) $(BUILD)/dspark
	$(BUILD)/dspark quantize $(TARGET_F16) $@ q8_0
$(DRAFTER): $(DRAFTER_F16) $(BUILD)/dspark
	$(BUILD)/dspark quantize $(DRAFTER_F16) $@ q8_0

# The main job: speculative generation on the shipped pair (stats line on
# stderr), then the same prompt decoded plainly, and a byte comparison.
# On the CPU the rounds are scheduled by the measured cost model (--draft-sched
# auto): where this machine's verify and drafting cost more than the accepted
# tokens save (the tiny pair is compute-bound; an AVX2-only CPU verifies 8 rows
# at ~2.8 decode steps), it takes plain steps and says so in one
# draft_sched=auto fallback=plain line, so speculative is never the slower line.
# CUDA keeps the fixed-width rounds queued on the device (the H200's 2.47x).
PROMPT ?= It is a truth universally acknowledged, that
N ?= 128
DEVICE ?= cpu
RUN_SCHED ?= $(if $(filter cuda,$(DEVICE)),none,auto)
run: all $(TARGET_Q8) $(DRAFTER)
	@echo "== speculative (canonical kernels, direct commit, device $(DEVICE)) =="
	@$(BUILD)/dspark generate -m $(TARGET_Q8) -md $(DRAFTER) --draft-sched $(RUN_SCHED) -p "$(PROMPT)" -n $(N) -t 2 --device $(DEVICE) | tee $(BUILD)/run-spec.txt
	@echo "== plain greedy decoding (device $(DEVICE)) =="
	@$(BUILD)/dspark generate -m $(TARGET_Q8) -p "$(PROMPT)" -n $(N) -t 2 --device $(DEVICE) | tee $(BUILD)/run-plain.txt
	@cmp -s $(BUILD)/run-spec.txt $(BUILD)/run-plain.txt && echo "identical bytes: yes" || { echo "identical bytes: NO"; exit 1; }

test: all $(TARGET_Q8)
	@BUILD=$(BUILD) sh tests/run.sh
	@$(MAKE) --no-print-directory test-san

# Sanitizer build in its own tree so objects never mix. float-cast-overflow
# is not in UBSan's default set (an out-of-range double -> int cast, e.g.
# from a config.json number, is undefined behaviour); GCC supports it, so no
# second compiler is needed.
SAN_FLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
test-san: $(TARGET_Q8)
	@$(MAKE) --no-print-directory BUILD=build-san OPT=-O1 CUDA=0 SAN="$(SAN_FLAGS)" all
	@BUILD=build-san DSPARK_SAN=1 sh tests/run.sh

bench: all $(TARGET_Q8) $(DRAFTER)
	@BUILD=$(BUILD) sh bench/run.sh
	@BUILD=$(BUILD) sh bench/bench_spec.sh

clean:
	rm -rf build build-san $(TARGET_Q8) $(DRAFTER)

# dspark — build, test, bench.
#
#   make            build/dspark (CLI) and build/libdspark.a
#   make test       every unit test + CLI error tests + the sanitizer suite
#   make test-san   the malformed-input and exactness suites under ASan/UBSan
#   make bench      bench/ (medians and ratios, JSON under bench/results/)
#
# Floating point: -ffp-contract=off everywhere and never -ffast-math. The
# exactness contract depends on the compiler not fusing a*b+c into an FMA in
# one kernel and not in its twin; kernels that want FMA call fmaf() explicitly.

CC      ?= cc
OPT     ?= -O3
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
FPFLAGS := -ffp-contract=off -fno-fast-math
PCRE_CFLAGS := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE_LIBS   := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)
CJSON_CFLAGS := $(shell pkg-config --cflags libcjson 2>/dev/null)
CJSON_LIBS   := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson)
SAN     ?=
CFLAGS  += $(SAN) $(CSTD) $(OPT) -g $(WARN) $(FPFLAGS) -pthread -Iinclude -Isrc $(PCRE_CFLAGS) $(CJSON_CFLAGS)
LDLIBS  += $(SAN) $(PCRE_LIBS) $(CJSON_LIBS) -lm -pthread

BUILD   ?= build
LIB_SRC := $(sort $(wildcard src/*.c src/kernels/*.c src/kernels/cpu/*.c src/diag/*.c src/tokenizer/*.c src/drafter/*.c src/spec/*.c))
LIB_SRC := $(filter-out src/main.c,$(LIB_SRC))
TOOL_SRC:= $(sort $(wildcard tools/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC:= $(sort $(wildcard tests/test_*.c))
TEST_BIN:= $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC:= $(sort $(wildcard bench/*.c))
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# The comparator must be exact IEEE-754 whatever the project flags are.
$(BUILD)/src/diag/%.o: CFLAGS += -fno-finite-math-only -fsignaling-nans

.PHONY: all test test-san bench clean deps run default-model

# Debian packages the build and tests need (PCRE2 for the gpt2 pre-tokenizer,
# cJSON for `dspark convert`). Idempotent; uses sudo when not root.
APT_PKGS := gcc make pkg-config libpcre2-dev libcjson-dev xz-utils python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
deps:
	@dpkg -s $(APT_PKGS) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(APT_PKGS); }

# The default model: generated deterministically at build time.
DEFAULT_MODEL := models/default.gguf
default-model: $(DEFAULT_MODEL)
$(DEFAULT_MODEL): $(BUILD)/dspark
	$(BUILD)/dspark make-model -o $@ --type q8_0 --n-embd 256 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 768 --n-vocab 512 --seed 1

# The main job on the default model.
PROMPT ?= The speculative decoder drafts a block of tokens, and
run: all $(DEFAULT_MODEL)
	$(BUILD)/dspark generate -m $(DEFAULT_MODEL) -p "$(PROMPT)" -n 64 -v
all: $(BUILD)/dspark $(TEST_BIN) $(BENCH_BIN)

$(BUILD)/%.o: %.c $(wildcard src/*.h src/*/*.h src/*/*/*.h include/*.h)
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

test: all
	@BUILD=$(BUILD) sh tests/run.sh
	@$(MAKE) --no-print-directory test-san

# Sanitizer build in its own tree so objects never mix.
test-san:
	@$(MAKE) --no-print-directory BUILD=build-san OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" all
	@BUILD=build-san DSPARK_SAN=1 sh tests/run.sh

bench: all
	@sh bench/run.sh

clean:
	rm -rf build build-san

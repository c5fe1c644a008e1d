/* fuzz_gguf.c — libFuzzer entry point for the GGUF reader.
 *
 * Not named test_*.c on purpose: the Makefile builds every tests/test_*.c as
 * a unit test, and this file needs clang's libFuzzer runtime. Build and run:
 *
 *   clang -std=c11 -D_GNU_SOURCE -O1 -g -Isrc -Iinclude \
 *         -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
 *         src/gguf.c tests/fuzz_gguf.c -o /tmp/fuzz_gguf -lm
 *   mkdir -p /tmp/gguf_corpus && cp some_small_model.gguf /tmp/gguf_corpus/
 *   /tmp/fuzz_gguf -max_len=65536 -max_total_time=300 /tmp/gguf_corpus
 *
 * Any valid .gguf (e.g. one written by tests/test_gguf) is a good seed. The
 * deterministic mutation loop in tests/test_gguf.c covers the same ground in
 * every `make test-san`; this target is for longer, coverage-guided runs. */
#include "gguf.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[DS_ERRLEN];
    gguf_ctx *g = gguf_open_mem(data, size, err, sizeof err);
    if (!g) {
        /* the contract: a failure always explains itself in one line */
        if (!err[0] || strchr(err, '\n')) abort();
        return 0;
    }
    const uint8_t *end = data + size;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (p < data || p > end || t->nbytes > (uint64_t)(end - p)) abort();
        if (gguf_find_tensor(g, t->name) != t) abort();
    }
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        gguf_str s;
        int64_t iv;
        float fv;
        for (uint64_t j = 0; j < kv->arr_n && j < 256; j++) {
            if (gguf_arr_str(kv, j, &s) == 0 && s.len &&
                ((const uint8_t *)s.ptr < data || (uint64_t)(end - (const uint8_t *)s.ptr) < s.len))
                abort();
            (void)gguf_arr_i64(kv, j, &iv);
            (void)gguf_arr_f32(kv, j, &fv);
        }
    }
    gguf_close(g);
    return 0;
}

/* simple.c — the smallest complete program on libdspark: load a target
 * (and optionally its drafter), generate from a prompt with the tokens
 * streamed to stdout as they come, then print the request's statistics.
 *
 *   cc simple.c $(pkg-config --cflags --libs dspark) -o simple
 *   ./simple models/dspark-tiny-q8_0.gguf models/dspark-tiny-drafter-f16.gguf "The river" 64
 *
 * Pass "-" as the drafter for plain decoding: the text is the same. */
#include <dspark.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_token(void *user, int32_t token, const char *bytes, size_t n) {
    (void)user; (void)token;
    fwrite(bytes, 1, n, stdout);
    fflush(stdout);
    return 0;                                   /* nonzero would stop here */
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TARGET.gguf DRAFTER.gguf|- PROMPT [N]\n", argv[0]);
        return 2;
    }
    dspark_error err;
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = argv[1];
    mp.drafter_path = strcmp(argv[2], "-") ? argv[2] : NULL;
    dspark_model *model = dspark_model_load(&mp, &err);
    if (!model) { fprintf(stderr, "error: %s\n", err.message); return 1; }

    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);             /* n_ctx from the model, 2 threads, canonical kernels */
    dspark_ctx *ctx = dspark_ctx_new(model, &cp, &err);
    if (!ctx) { fprintf(stderr, "error: %s\n", err.message); dspark_model_free(model); return 1; }

    int32_t prompt[512];
    int n = dspark_tokenize(model, argv[3], strlen(argv[3]), -1, 1, prompt, 512, &err);
    if (n < 0 || n > 512) {
        fprintf(stderr, "error: %s\n", n < 0 ? err.message : "prompt too long for this example");
        dspark_ctx_free(ctx);
        dspark_model_free(model);
        return 1;
    }

    dspark_gen_params gp;
    dspark_gen_params_default(&gp);             /* greedy, speculative when a drafter is loaded */
    gp.max_tokens = argc > 4 ? atoi(argv[4]) : 64;
    gp.on_token = print_token;
    dspark_stats st;
    dspark_status rc = dspark_generate(ctx, prompt, n, &gp, NULL, &st, &err);
    if (rc == DSPARK_OK) {
        printf("\n");
        fprintf(stderr, "dspark %s: n_prompt=%d n_gen=%d stop=%s tok_s=%.1f speculative=%d rounds=%d accepted=%ld/%ld "
                        "mean_accepted_len=%.3f kernels=%s\n",
                dspark_version(), st.n_prompt, st.n_generated, st.stop, st.tok_s, st.speculative, st.rounds, st.accepted,
                st.drafted, st.mean_accepted_len, dspark_ctx_kernels(ctx));
    } else {
        fprintf(stderr, "error (%s): %s\n", dspark_status_name(rc), err.message);
    }
    dspark_ctx_free(ctx);
    dspark_model_free(model);
    return rc == DSPARK_OK ? 0 : 1;
}

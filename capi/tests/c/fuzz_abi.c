/*
 * Hostile calls through the C ABI: `fuzz_abi MODEL OOM_MODEL SCRATCH_DIR`.
 *
 * MODEL takes `x: f32[s0, 24]`, `w1: f32[48, 24]`, `b1: f32[48]`, `w2: f32[10, 48]` and
 * returns two f32 outputs; OOM_MODEL takes `x: f32[s0, 1]` and returns a `[s0, 1 << 20]`
 * tensor (4 TiB for s0 = 2^20). Every hostile argument must come back as its typed status
 * (never MINDUCTOR_ERR_PANIC, never a crash), output buffers must stay unwritten on every
 * error, and a good call must still give the first call's bits afterwards. Corrupt artifacts
 * (truncated, byte-flipped) are written into SCRATCH_DIR and loaded. Prints `ok` at the end.
 */
#include "minductor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(call)                                                                          \
    do {                                                                                     \
        minductor_status status_ = (call);                                                   \
        if (status_ != MINDUCTOR_OK) {                                                       \
            fprintf(stderr, "line %d: %s failed: %s: %s\n", __LINE__, #call,                 \
                    minductor_status_name(status_), minductor_last_error());                 \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* Expects `call` to return `expected`; prints the case and the message. */
#define EXPECT(name, call, expected)                                                         \
    do {                                                                                     \
        minductor_status status_ = (call);                                                   \
        if (status_ != (expected)) {                                                         \
            fprintf(stderr, "line %d: %s: %s returned %s (%s), expected %s\n", __LINE__,     \
                    name, #call, minductor_status_name(status_), minductor_last_error(),     \
                    minductor_status_name(expected));                                        \
            failures++;                                                                      \
        } else {                                                                             \
            printf("case %s: %s: %s\n", name, minductor_status_name(status_),                \
                   minductor_last_error());                                                  \
        }                                                                                    \
    } while (0)

#define N_IN 4
#define N_OUT 2
#define BATCH 5
#define SENTINEL 0xA5

/* One call's worth of buffers for MODEL, each data block with spare room after it. */
typedef struct {
    minductor_tensor in[N_IN];
    int64_t in_shape[N_IN][2];
    minductor_output out[N_OUT];
    int64_t out_shape[N_OUT][2];
    unsigned char *in_data[N_IN];
    unsigned char *out_data[N_OUT];
    size_t out_bytes[N_OUT];
} call_t;

static const int64_t IN_SHAPES[N_IN][2] = {{BATCH, 24}, {48, 24}, {48, 1}, {10, 48}};
static const size_t IN_RANKS[N_IN] = {2, 2, 1, 2};

/* Fills a call; `misalign` offsets every data pointer by that many bytes. */
static void make_call(call_t *c, size_t misalign) {
    for (size_t i = 0; i < N_IN; i++) {
        size_t numel = 1;
        for (size_t d = 0; d < IN_RANKS[i]; d++) {
            c->in_shape[i][d] = IN_SHAPES[i][d];
            numel *= (size_t)IN_SHAPES[i][d];
        }
        c->in_data[i] = malloc(numel * sizeof(float) + 16);
        float values[1];
        for (size_t k = 0; k < numel; k++) {
            values[0] = (float)((i * 7 + k * 13) % 23) / 11.0f - 1.0f;
            memcpy(c->in_data[i] + misalign + k * sizeof(float), values, sizeof(float));
        }
        c->in[i].dtype = MINDUCTOR_F32;
        c->in[i].rank = IN_RANKS[i];
        c->in[i].shape = c->in_shape[i];
        c->in[i].data = c->in_data[i] + misalign;
        c->in[i].bytes = numel * sizeof(float);
    }
    size_t out_numel[N_OUT] = {BATCH * 10, BATCH};
    size_t out_rank[N_OUT] = {2, 1};
    for (size_t o = 0; o < N_OUT; o++) {
        c->out_bytes[o] = out_numel[o] * sizeof(float);
        c->out_data[o] = malloc(c->out_bytes[o] + 16);
        memset(c->out_data[o], SENTINEL, c->out_bytes[o] + 16);
        c->out[o].dtype = MINDUCTOR_F32;
        c->out[o].rank = out_rank[o];
        c->out[o].shape = c->out_shape[o];
        c->out[o].data = c->out_data[o] + misalign;
        c->out[o].bytes = c->out_bytes[o];
    }
}

static void free_call(call_t *c) {
    for (size_t i = 0; i < N_IN; i++) free(c->in_data[i]);
    for (size_t o = 0; o < N_OUT; o++) free(c->out_data[o]);
}

/* Every output byte still holds the sentinel (after a failed call). */
static int unwritten(const call_t *c, const char *name) {
    for (size_t o = 0; o < N_OUT; o++) {
        for (size_t k = 0; k < c->out_bytes[o] + 16; k++) {
            if (c->out_data[o][k] != SENTINEL) {
                fprintf(stderr, "%s: output %zu byte %zu was written by a failed call\n", name, o,
                        k);
                failures++;
                return 0;
            }
        }
    }
    return 1;
}

/* Runs `c` expecting `expected`; on an error, checks no output byte was written. */
static void expect_run(const char *name, minductor_model *m, call_t *c, minductor_status expected) {
    EXPECT(name, minductor_run(m, c->in, N_IN, c->out, N_OUT), expected);
    if (expected != MINDUCTOR_OK) unwritten(c, name);
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc((size_t)n + 1);
    if (fread(bytes, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(bytes);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return bytes;
}

static void write_file(const char *path, const unsigned char *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

/* A deterministic generator (xorshift64*), so a failure repeats. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

/* Loads a corrupted artifact: any typed status but PANIC; if it loads, a run must not panic. */
static void load_corrupt(const char *name, const char *path, int *loaded) {
    minductor_model *m = (minductor_model *)8;
    minductor_status s = minductor_load(path, &m);
    if (s == MINDUCTOR_ERR_PANIC || (s != MINDUCTOR_OK && m != NULL) ||
        (s == MINDUCTOR_OK && m == NULL)) {
        fprintf(stderr, "%s: load returned %s (%s), model %p\n", name, minductor_status_name(s),
                minductor_last_error(), (void *)m);
        failures++;
        return;
    }
    if (s != MINDUCTOR_OK) return;
    (*loaded)++;
    /* A model that loads after a flip is still a model: run it with whatever it asks for. */
    size_t n_in = 0, n_out = 0;
    CHECK(minductor_num_inputs(m, &n_in));
    CHECK(minductor_num_outputs(m, &n_out));
    call_t c;
    make_call(&c, 0);
    minductor_status r = minductor_run(m, c.in, n_in, c.out, n_out);
    if (r == MINDUCTOR_ERR_PANIC) {
        fprintf(stderr, "%s: run panicked: %s\n", name, minductor_last_error());
        failures++;
    }
    free_call(&c);
    minductor_free(m);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL OOM_MODEL SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    minductor_model *model = NULL;
    CHECK(minductor_load(path, &model));
    size_t n_in = 0, n_out = 0;
    CHECK(minductor_num_inputs(model, &n_in));
    CHECK(minductor_num_outputs(model, &n_out));
    if (n_in != N_IN || n_out != N_OUT) {
        fprintf(stderr, "the model has %zu inputs and %zu outputs\n", n_in, n_out);
        return 1;
    }

    /* The reference run. */
    call_t good;
    make_call(&good, 0);
    CHECK(minductor_run(model, good.in, N_IN, good.out, N_OUT));

    call_t c;
    make_call(&c, 0);

    /* NULL pointers. */
    EXPECT("null model", minductor_run(NULL, c.in, N_IN, c.out, N_OUT),
           MINDUCTOR_ERR_NULL_ARGUMENT);
    EXPECT("null inputs", minductor_run(model, NULL, N_IN, c.out, N_OUT),
           MINDUCTOR_ERR_NULL_ARGUMENT);
    unwritten(&c, "null inputs");
    EXPECT("null outputs", minductor_run(model, c.in, N_IN, NULL, N_OUT),
           MINDUCTOR_ERR_NULL_ARGUMENT);
    c.in[0].data = NULL;
    expect_run("null input data", model, &c, MINDUCTOR_ERR_NULL_ARGUMENT);
    c.in[0].data = c.in_data[0];
    c.in[1].shape = NULL;
    expect_run("null input shape", model, &c, MINDUCTOR_ERR_NULL_ARGUMENT);
    c.in[1].shape = c.in_shape[1];
    c.out[1].data = NULL;
    expect_run("null output data", model, &c, MINDUCTOR_ERR_NULL_ARGUMENT);
    c.out[1].data = c.out_data[1];
    c.out[0].shape = NULL;
    expect_run("null output shape", model, &c, MINDUCTOR_ERR_NULL_ARGUMENT);
    c.out[0].shape = c.out_shape[0];
    EXPECT("null num_inputs model", minductor_num_inputs(NULL, &n_in),
           MINDUCTOR_ERR_NULL_ARGUMENT);
    EXPECT("null info model", minductor_input_info(NULL, 0, NULL, NULL, NULL, NULL),
           MINDUCTOR_ERR_NULL_ARGUMENT);
    EXPECT("null load path", minductor_load(NULL, &model), MINDUCTOR_ERR_NULL_ARGUMENT);
    /* The failed load above set `model` to NULL, as the header says; load it again. */
    if (model != NULL) {
        fprintf(stderr, "a failed load left a model pointer\n");
        failures++;
    }
    CHECK(minductor_load(path, &model));
    EXPECT("null load out", minductor_load(path, NULL), MINDUCTOR_ERR_NULL_ARGUMENT);

    /* Wrong counts: too few, too many, SIZE_MAX (with arrays of the right length only). */
    EXPECT("one input short", minductor_run(model, c.in, N_IN - 1, c.out, N_OUT),
           MINDUCTOR_ERR_ARITY);
    EXPECT("SIZE_MAX inputs", minductor_run(model, c.in, SIZE_MAX, c.out, N_OUT),
           MINDUCTOR_ERR_ARITY);
    EXPECT("SIZE_MAX outputs", minductor_run(model, c.in, N_IN, c.out, SIZE_MAX),
           MINDUCTOR_ERR_ARITY);
    EXPECT("no outputs", minductor_run(model, c.in, N_IN, NULL, 0), MINDUCTOR_ERR_ARITY);
    unwritten(&c, "wrong counts");

    /* Ranks larger than the model's, over 2-entry shape arrays: refused before the shape is read. */
    c.in[0].rank = 1000000;
    expect_run("input rank 1000000", model, &c, MINDUCTOR_ERR_SHAPE);
    c.in[0].rank = SIZE_MAX;
    expect_run("input rank SIZE_MAX", model, &c, MINDUCTOR_ERR_SHAPE);
    c.in[0].rank = 3;
    expect_run("input rank 3", model, &c, MINDUCTOR_ERR_SHAPE);
    c.in[0].rank = 1;
    expect_run("input rank 1", model, &c, MINDUCTOR_ERR_SHAPE);
    c.in[0].rank = 2;
    c.out[1].rank = 1000000;
    expect_run("output rank 1000000", model, &c, MINDUCTOR_ERR_SHAPE);
    c.out[1].rank = 0;
    expect_run("output rank 0", model, &c, MINDUCTOR_ERR_SHAPE);
    c.out[1].rank = 1;

    /* Bad dtype codes, and a dtype that is not the model's. */
    const minductor_dtype bad_codes[] = {99, -1, INT32_MIN, INT32_MAX, 6};
    for (size_t k = 0; k < sizeof bad_codes / sizeof bad_codes[0]; k++) {
        c.in[2].dtype = bad_codes[k];
        expect_run("bad input dtype code", model, &c, MINDUCTOR_ERR_INVALID_ARGUMENT);
        c.in[2].dtype = MINDUCTOR_F32;
        c.out[0].dtype = bad_codes[k];
        expect_run("bad output dtype code", model, &c, MINDUCTOR_ERR_INVALID_ARGUMENT);
        c.out[0].dtype = MINDUCTOR_F32;
    }
    c.in[0].dtype = MINDUCTOR_F64; /* the bytes would fit f64[5, 12] */
    expect_run("f64 for f32", model, &c, MINDUCTOR_ERR_DTYPE);
    c.in[0].dtype = MINDUCTOR_F32;
    c.out[0].dtype = MINDUCTOR_I64;
    expect_run("i64 output for f32", model, &c, MINDUCTOR_ERR_DTYPE);
    c.out[0].dtype = MINDUCTOR_F32;

    /* Negative, huge and overflowing sizes. */
    const int64_t bad_sizes[] = {-1, INT64_MIN, (int64_t)1 << 40, INT64_MAX, 0};
    const minductor_status bad_size_status[] = {MINDUCTOR_ERR_SHAPE, MINDUCTOR_ERR_SHAPE,
                                                MINDUCTOR_ERR_BUFFER_SIZE, MINDUCTOR_ERR_SHAPE,
                                                MINDUCTOR_ERR_BUFFER_SIZE};
    for (size_t k = 0; k < sizeof bad_sizes / sizeof bad_sizes[0]; k++) {
        c.in_shape[0][0] = bad_sizes[k];
        expect_run("bad symbolic size", model, &c, bad_size_status[k]);
        c.in_shape[0][0] = BATCH;
        c.in_shape[1][1] = bad_sizes[k];
        expect_run("bad static size", model, &c, bad_size_status[k]);
        c.in_shape[1][1] = 24;
    }
    /* A size that fits the bytes but not the model's guards. */
    c.in_shape[0][0] = BATCH * 2;
    c.in_shape[0][1] = 12;
    expect_run("guard-failing shape", model, &c, MINDUCTOR_ERR_SHAPE);
    c.in_shape[0][0] = BATCH;
    c.in_shape[0][1] = 24;

    /* Short and oversized input buffers, short output buffers (which stay unwritten). */
    c.in[3].bytes -= 1;
    expect_run("input one byte short", model, &c, MINDUCTOR_ERR_BUFFER_SIZE);
    c.in[3].bytes += 2;
    expect_run("input one byte long", model, &c, MINDUCTOR_ERR_BUFFER_SIZE);
    c.in[3].bytes -= 1;
    c.in[3].bytes = SIZE_MAX;
    expect_run("input SIZE_MAX bytes", model, &c, MINDUCTOR_ERR_BUFFER_SIZE);
    c.in[3].bytes = 10 * 48 * sizeof(float);
    c.out[1].bytes -= 1;
    expect_run("output one byte short", model, &c, MINDUCTOR_ERR_BUFFER_SIZE);
    c.out[1].bytes = 0;
    expect_run("output 0 bytes", model, &c, MINDUCTOR_ERR_BUFFER_SIZE);
    c.out[1].bytes = c.out_bytes[1];

    /* Bad info indices. */
    EXPECT("input info 4", minductor_input_info(model, 4, NULL, NULL, NULL, NULL),
           MINDUCTOR_ERR_INVALID_ARGUMENT);
    EXPECT("input info SIZE_MAX", minductor_input_info(model, SIZE_MAX, NULL, NULL, NULL, NULL),
           MINDUCTOR_ERR_INVALID_ARGUMENT);
    EXPECT("output info 2", minductor_output_info(model, 2, NULL, NULL, NULL),
           MINDUCTOR_ERR_INVALID_ARGUMENT);
    if (strcmp(minductor_status_name(-1), "unknown status") != 0 ||
        strcmp(minductor_status_name(1000), "unknown status") != 0) {
        fprintf(stderr, "unknown status codes have names\n");
        failures++;
    }

    /* After all that, the model still runs, with data, arrays and shapes misaligned too. */
    call_t odd;
    make_call(&odd, 1);
    minductor_tensor *odd_in = malloc(sizeof odd.in + 1);
    minductor_output *odd_out = malloc(sizeof odd.out + 1);
    unsigned char *odd_shapes = malloc(N_OUT * 2 * sizeof(int64_t) + 1);
    memcpy((unsigned char *)odd_in + 1, odd.in, sizeof odd.in);
    odd.out[0].shape = (int64_t *)(odd_shapes + 1);
    odd.out[1].shape = (int64_t *)(odd_shapes + 1 + 2 * sizeof(int64_t));
    memcpy((unsigned char *)odd_out + 1, odd.out, sizeof odd.out);
    EXPECT("misaligned everything",
           minductor_run(model, (minductor_tensor *)((unsigned char *)odd_in + 1), N_IN,
                         (minductor_output *)((unsigned char *)odd_out + 1), N_OUT),
           MINDUCTOR_OK);
    for (size_t o = 0; o < N_OUT; o++) {
        if (memcmp(good.out_data[o], odd.out_data[o] + 1, good.out_bytes[o]) != 0) {
            fprintf(stderr, "misaligned run: output %zu differs from the aligned run\n", o);
            failures++;
        }
    }
    int64_t shape0[2];
    memcpy(shape0, odd_shapes + 1, sizeof shape0);
    if (shape0[0] != BATCH || shape0[1] != 10) {
        fprintf(stderr, "misaligned run: output 0 shape [%lld, %lld]\n", (long long)shape0[0],
                (long long)shape0[1]);
        failures++;
    }
    free(odd_in);
    free(odd_out);
    free(odd_shapes);
    free_call(&odd);
    make_call(&odd, 0);
    EXPECT("good call after hostile ones", minductor_run(model, odd.in, N_IN, odd.out, N_OUT),
           MINDUCTOR_OK);
    for (size_t o = 0; o < N_OUT; o++) {
        if (memcmp(good.out_data[o], odd.out_data[o], good.out_bytes[o]) != 0) {
            fprintf(stderr, "output %zu differs from the first run\n", o);
            failures++;
        }
    }
    free_call(&odd);

    /* Out of memory: a 4 TiB output is a typed error, and the same model then runs. */
    minductor_model *big = NULL;
    CHECK(minductor_load(argv[2], &big));
    {
        int64_t shape[2] = {(int64_t)1 << 20, 1};
        float *x = calloc((size_t)1 << 20, sizeof(float));
        minductor_tensor in = {MINDUCTOR_F32, 2, shape, x, ((size_t)1 << 20) * sizeof(float)};
        int64_t out_shape[2] = {0, 0};
        float out_data[8];
        minductor_output out = {MINDUCTOR_F32, 2, out_shape, out_data, sizeof out_data};
        EXPECT("4 TiB output", minductor_run(big, &in, 1, &out, 1), MINDUCTOR_ERR_OUT_OF_MEMORY);
        shape[0] = 2;
        in.bytes = 2 * sizeof(float);
        EXPECT("2 x 2^20 output, 8 bytes given", minductor_run(big, &in, 1, &out, 1),
               MINDUCTOR_ERR_BUFFER_SIZE);
        float *small = malloc(((size_t)2 << 20) * sizeof(float));
        out.data = small;
        out.bytes = ((size_t)2 << 20) * sizeof(float);
        x[0] = 1.0f;
        EXPECT("2 x 2^20 output", minductor_run(big, &in, 1, &out, 1), MINDUCTOR_OK);
        /* exp(1) is 2.71828175 in f32; the polynomial may differ in the last bit. */
        if (out_shape[0] != 2 || out_shape[1] != 1 << 20 || !(small[0] > 2.7182815f) ||
            !(small[0] < 2.7182820f) || small[(1 << 20) + 1] != 1.0f) {
            fprintf(stderr, "after out-of-memory: shape [%lld, %lld], values %g %g\n",
                    (long long)out_shape[0], (long long)out_shape[1], small[0],
                    small[(1 << 20) + 1]);
            failures++;
        }
        free(small);
        free(x);
    }
    minductor_free(big);

    /* Truncated artifacts and random byte flips. */
    size_t len = 0;
    unsigned char *bytes = read_file(path, &len);
    if (!bytes) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    char corrupt[4096];
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.mind", argv[3]);
    int loaded = 0;
    const size_t cuts[] = {0, 1, 7, 8, 16, 64, len / 3, len / 2, len - 9, len - 8, len - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        write_file(corrupt, bytes, cuts[k]);
        EXPECT("truncated artifact", minductor_load(corrupt, &big), MINDUCTOR_ERR_BAD_ARTIFACT);
    }
    int flips = 200;
    for (int k = 0; k < flips; k++) {
        unsigned char *copy = malloc(len);
        memcpy(copy, bytes, len);
        int n_flips = 1 + (int)(next_random() % 4);
        for (int f = 0; f < n_flips; f++) {
            copy[next_random() % len] ^= (unsigned char)(1u << (next_random() % 8));
        }
        write_file(corrupt, copy, len);
        load_corrupt("byte flip", corrupt, &loaded);
        free(copy);
    }
    printf("case byte flips: %d artifacts, %d loaded\n", flips, loaded);
    free(bytes);

    free_call(&c);
    free_call(&good);
    minductor_free(model);
    minductor_free(NULL);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}

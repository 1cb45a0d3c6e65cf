/*
 * Runs a saved minductor model through the C ABI: `run_model ARTIFACT BATCH`.
 *
 * Prints each input's and output's description, fills every f32 input with a fixed pattern
 * (symbolic sizes become BATCH), runs the model, prints each output's shape and values
 * (`%.9g`: f32 values read back exactly), then checks that bad calls are typed errors.
 */
#include "minductor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        minductor_status status_ = (call);                                                   \
        if (status_ != MINDUCTOR_OK) {                                                       \
            fprintf(stderr, "%s failed: %s: %s\n", #call, minductor_status_name(status_),   \
                    minductor_last_error());                                                 \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

/* Expects `call` to fail with `expected`; prints the message. */
#define EXPECT(call, expected)                                                               \
    do {                                                                                     \
        minductor_status status_ = (call);                                                   \
        if (status_ != (expected)) {                                                         \
            fprintf(stderr, "%s returned %s, expected %s\n", #call,                          \
                    minductor_status_name(status_), minductor_status_name(expected));        \
            return 1;                                                                        \
        }                                                                                    \
        printf("expected error %s: %s\n", minductor_status_name(status_),                    \
               minductor_last_error());                                                      \
    } while (0)

#define MAX_TENSORS 8
#define MAX_RANK 8

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ARTIFACT BATCH\n", argv[0]);
        return 2;
    }
    int64_t batch = atoll(argv[2]);
    minductor_model *model = NULL;
    CHECK(minductor_load(argv[1], &model));

    size_t n_in = 0, n_out = 0;
    CHECK(minductor_num_inputs(model, &n_in));
    CHECK(minductor_num_outputs(model, &n_out));
    if (n_in > MAX_TENSORS || n_out > MAX_TENSORS) {
        fprintf(stderr, "too many tensors\n");
        return 1;
    }

    minductor_tensor inputs[MAX_TENSORS];
    int64_t in_shapes[MAX_TENSORS][MAX_RANK];
    for (size_t i = 0; i < n_in; i++) {
        const char *name;
        minductor_dtype dtype;
        size_t rank;
        const int64_t *shape;
        CHECK(minductor_input_info(model, i, &name, &dtype, &rank, &shape));
        if (dtype != MINDUCTOR_F32 || rank > MAX_RANK) {
            fprintf(stderr, "input %s: only f32 inputs of rank <= %d here\n", name, MAX_RANK);
            return 1;
        }
        size_t numel = 1;
        printf("input %zu %s f32[", i, name);
        for (size_t d = 0; d < rank; d++) {
            in_shapes[i][d] = shape[d] < 0 ? batch : shape[d];
            numel *= (size_t)in_shapes[i][d];
            printf("%s%lld", d ? ", " : "", (long long)shape[d]);
        }
        printf("]\n");
        float *data = malloc(numel * sizeof(float) + 1);
        for (size_t k = 0; k < numel; k++) {
            /* Exact in binary floating point, in C and in Rust alike. */
            data[k] = (float)((i * 7 + k * 13) % 23) / 11.0f - 1.0f;
        }
        inputs[i].dtype = MINDUCTOR_F32;
        inputs[i].rank = rank;
        inputs[i].shape = in_shapes[i];
        inputs[i].data = data;
        inputs[i].bytes = numel * sizeof(float);
    }

    minductor_output outputs[MAX_TENSORS];
    int64_t out_shapes[MAX_TENSORS][MAX_RANK];
    for (size_t o = 0; o < n_out; o++) {
        minductor_dtype dtype;
        size_t rank;
        const int64_t *shape;
        CHECK(minductor_output_info(model, o, &dtype, &rank, &shape));
        size_t numel = 1;
        printf("output %zu dtype %d [", o, (int)dtype);
        for (size_t d = 0; d < rank; d++) {
            numel *= (size_t)(shape[d] < 0 ? batch : shape[d]);
            printf("%s%lld", d ? ", " : "", (long long)shape[d]);
        }
        printf("]\n");
        outputs[o].dtype = dtype;
        outputs[o].rank = rank;
        outputs[o].shape = out_shapes[o];
        outputs[o].data = malloc(numel * sizeof(float) + 1);
        outputs[o].bytes = numel * sizeof(float);
    }

    CHECK(minductor_run(model, inputs, n_in, outputs, n_out));
    for (size_t o = 0; o < n_out; o++) {
        size_t numel = 1;
        printf("out%zu shape", o);
        for (size_t d = 0; d < outputs[o].rank; d++) {
            numel *= (size_t)out_shapes[o][d];
            printf(" %lld", (long long)out_shapes[o][d]);
        }
        printf(" values");
        const float *values = outputs[o].data;
        for (size_t k = 0; k < numel; k++) {
            printf(" %.9g", values[k]);
        }
        printf("\n");
    }

    /* Bad calls are typed errors, and the model still runs afterwards. */
    EXPECT(minductor_run(NULL, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_NULL_ARGUMENT);
    EXPECT(minductor_run(model, inputs, n_in - 1, outputs, n_out), MINDUCTOR_ERR_ARITY);
    /* A byte count that does not fit the shape. */
    inputs[0].bytes -= sizeof(float);
    EXPECT(minductor_run(model, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_BUFFER_SIZE);
    inputs[0].bytes += sizeof(float);
    /* The same bytes seen as [rows * cols, 1]: the guards refuse the shape. */
    int64_t rows = in_shapes[0][0], cols = in_shapes[0][1];
    in_shapes[0][0] = rows * cols;
    in_shapes[0][1] = 1;
    EXPECT(minductor_run(model, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_SHAPE);
    in_shapes[0][0] = rows;
    in_shapes[0][1] = cols;
    /* An output buffer one byte short. */
    outputs[0].bytes -= 1;
    EXPECT(minductor_run(model, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_BUFFER_SIZE);
    outputs[0].bytes += 1;
    /* An unknown dtype code, then a dtype that is not the model's (f16: half the bytes). */
    inputs[0].dtype = 42;
    EXPECT(minductor_run(model, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_INVALID_ARGUMENT);
    inputs[0].dtype = MINDUCTOR_F16;
    inputs[0].bytes /= 2;
    EXPECT(minductor_run(model, inputs, n_in, outputs, n_out), MINDUCTOR_ERR_DTYPE);
    inputs[0].bytes *= 2;
    inputs[0].dtype = MINDUCTOR_F32;
    EXPECT(minductor_input_info(model, 99, NULL, NULL, NULL, NULL),
           MINDUCTOR_ERR_INVALID_ARGUMENT);
    CHECK(minductor_run(model, inputs, n_in, outputs, n_out));

    minductor_model *missing = (minductor_model *)1;
    EXPECT(minductor_load("/nonexistent/model.mind", &missing), MINDUCTOR_ERR_IO);
    if (missing != NULL) {
        fprintf(stderr, "a failed load left a model pointer\n");
        return 1;
    }
    EXPECT(minductor_load(argv[0], &missing), MINDUCTOR_ERR_BAD_ARTIFACT);

    minductor_free(model);
    minductor_free(NULL);
    for (size_t i = 0; i < n_in; i++) free((void *)inputs[i].data);
    for (size_t o = 0; o < n_out; o++) free(outputs[o].data);
    printf("ok\n");
    return 0;
}

/*
 * Runs a saved minductor model on tensors read from a file and writes its outputs to another:
 * `run_tensors ARTIFACT INPUTS OUTPUTS`.
 *
 * Nothing about the model is known in advance: the artifact (for a frozen model, one file that
 * carries its weights) says how many inputs it takes and of which dtypes and ranks, the inputs
 * file gives their sizes and data, and the run gives the outputs' sizes.
 *
 * Both files hold a list of tensors, every number little-endian:
 *
 *     "MTENSORS"                   8 bytes
 *     count                        u64
 *     then per tensor:
 *       dtype                      i32 (the MINDUCTOR_F32 ... MINDUCTOR_BOOL codes)
 *       rank                       u32
 *       shape[rank]                i64 each
 *       bytes                      u64
 *       data                       `bytes` bytes, row-major
 *
 * A symbolic output size is known only after the run: the program allocates each output for
 * its static sizes with every symbolic one taken as the largest input size, and doubles the
 * buffers while the run answers MINDUCTOR_ERR_BUFFER_SIZE.
 */
#include "minductor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TENSORS 64
#define MAX_RANK 16

#define CHECK(call)                                                                          \
    do {                                                                                     \
        minductor_status status_ = (call);                                                   \
        if (status_ != MINDUCTOR_OK) {                                                       \
            fprintf(stderr, "%s failed: %s: %s\n", #call, minductor_status_name(status_),   \
                    minductor_last_error());                                                 \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static size_t element_size(minductor_dtype dtype) {
    switch (dtype) {
    case MINDUCTOR_F32: return 4;
    case MINDUCTOR_F64: return 8;
    case MINDUCTOR_F16: return 2;
    case MINDUCTOR_BF16: return 2;
    case MINDUCTOR_I64: return 8;
    case MINDUCTOR_BOOL: return 1;
    default: return 0;
    }
}

typedef struct {
    minductor_dtype dtype;
    size_t rank;
    int64_t shape[MAX_RANK];
    void *data;
    size_t bytes;
} tensor;

static int read_exact(FILE *f, void *into, size_t bytes) {
    return fread(into, 1, bytes, f) == bytes ? 0 : -1;
}

/* Reads the tensor list at `path` into `tensors`; returns the count, or -1 (with a message). */
static long read_tensors(const char *path, tensor *tensors) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    char magic[8];
    uint64_t count = 0;
    if (read_exact(f, magic, 8) || memcmp(magic, "MTENSORS", 8) || read_exact(f, &count, 8) ||
        count > MAX_TENSORS) {
        fprintf(stderr, "%s: not a tensor list of at most %d tensors\n", path, MAX_TENSORS);
        fclose(f);
        return -1;
    }
    for (uint64_t i = 0; i < count; i++) {
        tensor *t = &tensors[i];
        int32_t dtype;
        uint32_t rank;
        uint64_t bytes;
        if (read_exact(f, &dtype, 4) || read_exact(f, &rank, 4) || rank > MAX_RANK ||
            read_exact(f, t->shape, 8 * (size_t)rank) || read_exact(f, &bytes, 8)) {
            fprintf(stderr, "%s: tensor %llu: a malformed description\n", path,
                    (unsigned long long)i);
            fclose(f);
            return -1;
        }
        t->dtype = dtype;
        t->rank = rank;
        t->bytes = (size_t)bytes;
        t->data = malloc(t->bytes + 1);
        if (!t->data || read_exact(f, t->data, t->bytes)) {
            fprintf(stderr, "%s: tensor %llu: the data is short\n", path, (unsigned long long)i);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return (long)count;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ARTIFACT INPUTS OUTPUTS\n", argv[0]);
        return 2;
    }
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {
        fprintf(stderr, "the tensor files are little-endian; this CPU is not\n");
        return 1;
    }
    minductor_model *model = NULL;
    CHECK(minductor_load(argv[1], &model));
    size_t n_in = 0, n_out = 0;
    CHECK(minductor_num_inputs(model, &n_in));
    CHECK(minductor_num_outputs(model, &n_out));
    if (n_out > MAX_TENSORS) {
        fprintf(stderr, "%zu outputs: at most %d here\n", n_out, MAX_TENSORS);
        return 1;
    }

    static tensor given[MAX_TENSORS];
    long count = read_tensors(argv[2], given);
    if (count < 0) return 1;
    if ((size_t)count != n_in) {
        fprintf(stderr, "the model takes %zu inputs, the file holds %ld\n", n_in, count);
        return 1;
    }
    minductor_tensor inputs[MAX_TENSORS];
    int64_t largest = 1;
    for (size_t i = 0; i < n_in; i++) {
        const char *name;
        CHECK(minductor_input_info(model, i, &name, NULL, NULL, NULL));
        printf("input %zu %s dtype %d [", i, name, (int)given[i].dtype);
        for (size_t d = 0; d < given[i].rank; d++) {
            printf("%s%lld", d ? ", " : "", (long long)given[i].shape[d]);
            if (given[i].shape[d] > largest) largest = given[i].shape[d];
        }
        printf("]\n");
        inputs[i].dtype = given[i].dtype;
        inputs[i].rank = given[i].rank;
        inputs[i].shape = given[i].shape;
        inputs[i].data = given[i].data;
        inputs[i].bytes = given[i].bytes;
    }

    minductor_output outputs[MAX_TENSORS];
    int64_t out_shapes[MAX_TENSORS][MAX_RANK];
    for (size_t o = 0; o < n_out; o++) {
        minductor_dtype dtype;
        size_t rank;
        const int64_t *shape;
        CHECK(minductor_output_info(model, o, &dtype, &rank, &shape));
        if (rank > MAX_RANK || element_size(dtype) == 0) {
            fprintf(stderr, "output %zu: dtype %d, rank %zu: not handled here\n", o, (int)dtype,
                    rank);
            return 1;
        }
        size_t numel = 1;
        for (size_t d = 0; d < rank; d++) numel *= (size_t)(shape[d] < 0 ? largest : shape[d]);
        outputs[o].dtype = dtype;
        outputs[o].rank = rank;
        outputs[o].shape = out_shapes[o];
        outputs[o].bytes = numel * element_size(dtype);
        outputs[o].data = malloc(outputs[o].bytes + 1);
    }

    minductor_status status;
    for (int attempt = 0;; attempt++) {
        status = minductor_run(model, inputs, n_in, outputs, n_out);
        if (status != MINDUCTOR_ERR_BUFFER_SIZE || attempt == 20) break;
        printf("retrying with larger output buffers: %s\n", minductor_last_error());
        for (size_t o = 0; o < n_out; o++) {
            outputs[o].bytes *= 2;
            free(outputs[o].data);
            outputs[o].data = malloc(outputs[o].bytes + 1);
        }
    }
    if (status != MINDUCTOR_OK) {
        fprintf(stderr, "minductor_run failed: %s: %s\n", minductor_status_name(status),
                minductor_last_error());
        return 1;
    }

    FILE *f = fopen(argv[3], "wb");
    if (!f) {
        fprintf(stderr, "%s: cannot create\n", argv[3]);
        return 1;
    }
    uint64_t n = n_out;
    fwrite("MTENSORS", 1, 8, f);
    fwrite(&n, 8, 1, f);
    for (size_t o = 0; o < n_out; o++) {
        size_t numel = 1;
        printf("output %zu dtype %d [", o, (int)outputs[o].dtype);
        for (size_t d = 0; d < outputs[o].rank; d++) {
            numel *= (size_t)out_shapes[o][d];
            printf("%s%lld", d ? ", " : "", (long long)out_shapes[o][d]);
        }
        printf("]\n");
        int32_t dtype = outputs[o].dtype;
        uint32_t rank = (uint32_t)outputs[o].rank;
        uint64_t bytes = numel * element_size(outputs[o].dtype);
        fwrite(&dtype, 4, 1, f);
        fwrite(&rank, 4, 1, f);
        fwrite(out_shapes[o], 8, rank, f);
        fwrite(&bytes, 8, 1, f);
        fwrite(outputs[o].data, 1, (size_t)bytes, f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", argv[3]);
        return 1;
    }

    minductor_free(model);
    for (size_t i = 0; i < n_in; i++) free(given[i].data);
    for (size_t o = 0; o < n_out; o++) free(outputs[o].data);
    printf("ok\n");
    return 0;
}

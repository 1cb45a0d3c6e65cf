/*
 * minductor.h: the C ABI of minductor artifacts (libminductor_capi).
 *
 * Load an artifact written by `Compiled::save` (Rust) or `minductor pt2 compile` (a PyTorch
 * program saved by torch.export, its weights inside the artifact), ask for its inputs and
 * outputs, run it on buffers the caller owns, free it. Every function returns a status (0 = MINDUCTOR_OK);
 * on failure, minductor_last_error() describes what went wrong, on the calling thread.
 * No Rust panic crosses this boundary: one becomes MINDUCTOR_ERR_PANIC.
 *
 *     minductor_model *model = NULL;
 *     if (minductor_load("model.mind", &model) != MINDUCTOR_OK) {
 *         fprintf(stderr, "%s\n", minductor_last_error());
 *         return 1;
 *     }
 *     ...
 *     minductor_run(model, inputs, n_inputs, outputs, n_outputs);
 *     minductor_free(model);
 *
 * Threads: a loaded model may be run from several threads at once (each call uses its own
 * scratch memory). minductor_free must not race with a run of the same model.
 */
#ifndef MINDUCTOR_H
#define MINDUCTOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
typedef int32_t minductor_status;
#define MINDUCTOR_OK 0
#define MINDUCTOR_ERR_NULL_ARGUMENT 1    /* a required pointer was NULL */
#define MINDUCTOR_ERR_INVALID_ARGUMENT 2 /* an unknown dtype code, an index out of range, ... */
#define MINDUCTOR_ERR_IO 3               /* the artifact file cannot be read */
#define MINDUCTOR_ERR_BAD_ARTIFACT 4     /* not an artifact, truncated, corrupted, or invalid */
#define MINDUCTOR_ERR_VERSION 5          /* another artifact format or minductor version */
#define MINDUCTOR_ERR_CPU 6              /* made for another architecture or CPU features */
#define MINDUCTOR_ERR_CODEGEN 7          /* code generation failed */
#define MINDUCTOR_ERR_ARITY 8            /* wrong number of inputs or outputs */
#define MINDUCTOR_ERR_DTYPE 9            /* an input's or output's dtype is not the model's */
#define MINDUCTOR_ERR_SHAPE 10           /* an input's rank or sizes fail the model's guards */
#define MINDUCTOR_ERR_BUFFER_SIZE 11     /* a buffer's byte size does not fit its shape */
#define MINDUCTOR_ERR_RUNTIME 12         /* the run failed (e.g. an index out of range) */
#define MINDUCTOR_ERR_PANIC 13           /* an internal error (a bug): please report it */
#define MINDUCTOR_ERR_OUT_OF_MEMORY 14   /* an allocation failed or passed the memory limit;
                                          * nothing was written, the next call may succeed */

/* Element types. Data is row-major and contiguous; bool is one byte, 0 or 1. */
typedef int32_t minductor_dtype;
#define MINDUCTOR_F32 0
#define MINDUCTOR_F64 1
#define MINDUCTOR_F16 2
#define MINDUCTOR_BF16 3
#define MINDUCTOR_I64 4
#define MINDUCTOR_BOOL 5

/* A loaded model. Opaque. */
typedef struct minductor_model minductor_model;

/* An input: `data` points to `bytes` readable bytes, which must equal the product of
 * `shape[0..rank]` times the element size. The data is copied; any alignment is fine. */
typedef struct {
    minductor_dtype dtype;
    size_t rank;
    const int64_t *shape; /* `rank` sizes; may be NULL when rank is 0 */
    const void *data;
    size_t bytes;
} minductor_tensor;

/* An output: the caller gives the dtype and rank it expects, a `shape` array of `rank`
 * entries that the run fills in, and `bytes` writable bytes at `data`, at least what the
 * result needs (query the sizes with minductor_output_info; a symbolic size is only known
 * after the run, so allocate for the largest you pass). */
typedef struct {
    minductor_dtype dtype;
    size_t rank;
    int64_t *shape;
    void *data;
    size_t bytes;
} minductor_output;

/* Loads the artifact at `path` (a NUL-terminated UTF-8 path): checks its format, version,
 * checksum and CPU, verifies its program, checks the frozen weights it carries (if any)
 * against the types the program declares, and generates its code. The file is the whole
 * model: a frozen model's weights are fed by the library, so its inputs are the user inputs
 * only. On success `*model` owns the model (free it with minductor_free); on failure
 * `*model` is set to NULL. */
minductor_status minductor_load(const char *path, minductor_model **model);

/* Frees a model. NULL is ignored. The model must not be used afterwards. */
void minductor_free(minductor_model *model);

/* How many inputs the caller passes to minductor_run, and how many outputs it returns. */
minductor_status minductor_num_inputs(const minductor_model *model, size_t *count);
minductor_status minductor_num_outputs(const minductor_model *model, size_t *count);

/* Input `index`: its name, dtype, rank and sizes (-1 for a symbolic size: any size, the same
 * wherever the same symbol appears). The returned pointers live as long as the model. Any of
 * the out pointers may be NULL when not wanted. */
minductor_status minductor_input_info(const minductor_model *model, size_t index,
                                      const char **name, minductor_dtype *dtype, size_t *rank,
                                      const int64_t **shape);

/* Output `index`: its dtype, rank and sizes (-1 for a symbolic size). */
minductor_status minductor_output_info(const minductor_model *model, size_t index,
                                       minductor_dtype *dtype, size_t *rank,
                                       const int64_t **shape);

/* Runs the model on `inputs[0..n_inputs]` and writes `outputs[0..n_outputs]` (data and
 * shape). Every count is compared with the model's before the array it counts is read:
 * `n_inputs` and `n_outputs` before `inputs` and `outputs`, each `rank` (and dtype) before
 * its `shape`. Inputs are then checked against the model's guards (sizes, byte sizes) and
 * outputs against the results (capacity) before anything is written; on an error no output
 * buffer has been written. Arrays and data need no particular alignment. */
minductor_status minductor_run(const minductor_model *model, const minductor_tensor *inputs,
                               size_t n_inputs, minductor_output *outputs, size_t n_outputs);

/* The message of the last failed call on this thread ("" if it succeeded). Valid until the
 * next minductor call on this thread. Never NULL. */
const char *minductor_last_error(void);

/* The name of a status code ("MINDUCTOR_ERR_SHAPE", ...), or "unknown status". */
const char *minductor_status_name(minductor_status status);

#ifdef __cplusplus
}
#endif

#endif /* MINDUCTOR_H */

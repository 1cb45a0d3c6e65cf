//! The C ABI of minductor artifacts: `include/minductor.h` is its contract, this file its
//! implementation.
//!
//! Every entry point runs its body inside `catch_unwind`, so no panic crosses into C (one
//! becomes `MINDUCTOR_ERR_PANIC`), and reports failures as a status code plus a thread-local
//! message (`minductor_last_error`). Raw pointers are read in one place each, after a null
//! check; what the caller promises about them (valid for the sizes it states, models from
//! `minductor_load` not yet freed) is stated in the header and at each `unsafe` block.

#![allow(non_camel_case_types)]

use minductor::{ArtifactError, Compiled, DType, RuntimeError, Tensor};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub type minductor_status = i32;
pub type minductor_dtype = i32;

pub const MINDUCTOR_OK: minductor_status = 0;
pub const MINDUCTOR_ERR_NULL_ARGUMENT: minductor_status = 1;
pub const MINDUCTOR_ERR_INVALID_ARGUMENT: minductor_status = 2;
pub const MINDUCTOR_ERR_IO: minductor_status = 3;
pub const MINDUCTOR_ERR_BAD_ARTIFACT: minductor_status = 4;
pub const MINDUCTOR_ERR_VERSION: minductor_status = 5;
pub const MINDUCTOR_ERR_CPU: minductor_status = 6;
pub const MINDUCTOR_ERR_CODEGEN: minductor_status = 7;
pub const MINDUCTOR_ERR_ARITY: minductor_status = 8;
pub const MINDUCTOR_ERR_DTYPE: minductor_status = 9;
pub const MINDUCTOR_ERR_SHAPE: minductor_status = 10;
pub const MINDUCTOR_ERR_BUFFER_SIZE: minductor_status = 11;
pub const MINDUCTOR_ERR_RUNTIME: minductor_status = 12;
pub const MINDUCTOR_ERR_PANIC: minductor_status = 13;
pub const MINDUCTOR_ERR_OUT_OF_MEMORY: minductor_status = 14;

const STATUS_NAMES: [&CStr; 15] = [
    c"MINDUCTOR_OK",
    c"MINDUCTOR_ERR_NULL_ARGUMENT",
    c"MINDUCTOR_ERR_INVALID_ARGUMENT",
    c"MINDUCTOR_ERR_IO",
    c"MINDUCTOR_ERR_BAD_ARTIFACT",
    c"MINDUCTOR_ERR_VERSION",
    c"MINDUCTOR_ERR_CPU",
    c"MINDUCTOR_ERR_CODEGEN",
    c"MINDUCTOR_ERR_ARITY",
    c"MINDUCTOR_ERR_DTYPE",
    c"MINDUCTOR_ERR_SHAPE",
    c"MINDUCTOR_ERR_BUFFER_SIZE",
    c"MINDUCTOR_ERR_RUNTIME",
    c"MINDUCTOR_ERR_PANIC",
    c"MINDUCTOR_ERR_OUT_OF_MEMORY",
];

/// The dtype codes of the header, in order.
const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::Bool,
];

fn dtype_code(dtype: DType) -> minductor_dtype {
    DTYPES.iter().position(|&d| d == dtype).unwrap_or(0) as minductor_dtype
}

fn dtype_of(code: minductor_dtype) -> Result<DType, Error> {
    usize::try_from(code)
        .ok()
        .and_then(|c| DTYPES.get(c).copied())
        .ok_or_else(|| {
            Error::new(
                MINDUCTOR_ERR_INVALID_ARGUMENT,
                format!("unknown dtype code {code}"),
            )
        })
}

/// A failure: the status returned and the message kept for `minductor_last_error`.
struct Error {
    status: minductor_status,
    message: String,
}

impl Error {
    fn new(status: minductor_status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }

    fn null(what: &str) -> Self {
        Error::new(MINDUCTOR_ERR_NULL_ARGUMENT, format!("`{what}` is NULL"))
    }
}

impl From<ArtifactError> for Error {
    fn from(e: ArtifactError) -> Self {
        let status = match &e {
            ArtifactError::Io { .. } => MINDUCTOR_ERR_IO,
            ArtifactError::ForeignFormat { .. } | ArtifactError::ForeignVersion { .. } => {
                MINDUCTOR_ERR_VERSION
            }
            ArtifactError::UnsupportedCpu { .. } => MINDUCTOR_ERR_CPU,
            ArtifactError::Codegen(_) => MINDUCTOR_ERR_CODEGEN,
            _ => MINDUCTOR_ERR_BAD_ARTIFACT,
        };
        Error::new(status, e.to_string())
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Self {
        let status = match &e {
            RuntimeError::Arity { .. } => MINDUCTOR_ERR_ARITY,
            RuntimeError::DType { .. } => MINDUCTOR_ERR_DTYPE,
            RuntimeError::Rank { .. } | RuntimeError::Shape { .. } => MINDUCTOR_ERR_SHAPE,
            RuntimeError::OutOfMemory { .. } => MINDUCTOR_ERR_OUT_OF_MEMORY,
            _ => MINDUCTOR_ERR_RUNTIME,
        };
        Error::new(status, e.to_string())
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with a NUL byte is cut there rather than lost.
    let bytes: Vec<u8> = message.bytes().take_while(|&b| b != 0).collect();
    let message = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
}

/// Runs one entry point's body: no panic escapes, the status and last error are set.
fn entry(body: impl FnOnce() -> Result<(), Error>) -> minductor_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            MINDUCTOR_OK
        }
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(&format!("internal error (please report it): {what}"));
            MINDUCTOR_ERR_PANIC
        }
    }
}

/// A loaded model and what `*_info` hands out (kept alive as long as the model).
pub struct minductor_model {
    compiled: Compiled,
    input_names: Vec<CString>,
    inputs: Vec<(DType, Vec<i64>)>,
    outputs: Vec<(DType, Vec<i64>)>,
}

fn sizes(shape: &[minductor::Dim]) -> Vec<i64> {
    shape
        .iter()
        .map(|d| d.as_static().map_or(-1, |n| n as i64))
        .collect()
}

impl minductor_model {
    fn new(compiled: Compiled) -> Result<Self, Error> {
        let graph = compiled.graph();
        // A frozen artifact feeds its constants (the graph's last inputs) itself: the caller
        // passes the others.
        let count = graph.inputs().len() - compiled.frozen_constants().len();
        let inputs = graph.inputs()[..count]
            .iter()
            .map(|&i| (graph.ty(i).dtype, sizes(&graph.ty(i).shape)))
            .collect();
        let input_names = (0..count)
            .map(|i| {
                CString::new(graph.input_name(i)).map_err(|_| {
                    Error::new(MINDUCTOR_ERR_BAD_ARTIFACT, "an input name holds a NUL byte")
                })
            })
            .collect::<Result<_, _>>()?;
        let program = compiled
            .artifacts()
            .program
            .as_ref()
            .ok_or_else(|| Error::new(MINDUCTOR_ERR_BAD_ARTIFACT, "no kernel program"))?;
        let outputs = program
            .outputs
            .iter()
            .map(|&o| {
                let b = program.buffer(o);
                (b.dtype, sizes(&b.shape))
            })
            .collect();
        Ok(minductor_model {
            input_names,
            inputs,
            outputs,
            compiled,
        })
    }
}

/// The model behind `model`, or a NULL-argument error.
///
/// # Safety
/// `model` is NULL or a pointer `minductor_load` returned that has not been freed.
unsafe fn model_ref<'a>(model: *const minductor_model) -> Result<&'a minductor_model, Error> {
    // SAFETY: the caller's promise above; NULL is checked.
    unsafe { model.as_ref() }.ok_or_else(|| Error::null("model"))
}

/// Writes `value` through `out` when it is not NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: the caller's promise above.
        unsafe { out.write(value) };
    }
}

/// # Safety
/// `path` is a NUL-terminated string; `model` is valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn minductor_load(
    path: *const c_char,
    model: *mut *mut minductor_model,
) -> minductor_status {
    entry(|| {
        if model.is_null() {
            return Err(Error::null("model"));
        }
        // SAFETY: `model` is valid for a write (the caller's promise), checked non-NULL.
        unsafe { model.write(std::ptr::null_mut()) };
        if path.is_null() {
            return Err(Error::null("path"));
        }
        // SAFETY: `path` is a NUL-terminated string (the caller's promise), checked non-NULL.
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| Error::new(MINDUCTOR_ERR_INVALID_ARGUMENT, "the path is not UTF-8"))?;
        let loaded = minductor_model::new(minductor::load(path)?)?;
        // SAFETY: as above.
        unsafe { model.write(Box::into_raw(Box::new(loaded))) };
        Ok(())
    })
}

/// # Safety
/// `model` is NULL or a pointer `minductor_load` returned, not freed before and not in use.
#[no_mangle]
pub unsafe extern "C" fn minductor_free(model: *mut minductor_model) {
    entry(|| {
        if !model.is_null() {
            // SAFETY: it came from `Box::into_raw` in `minductor_load` and is freed once (the
            // caller's promise).
            drop(unsafe { Box::from_raw(model) });
        }
        Ok(())
    });
}

/// # Safety
/// `model` as for `minductor_free` (not freed); `count` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn minductor_num_inputs(
    model: *const minductor_model,
    count: *mut usize,
) -> minductor_status {
    entry(|| {
        // SAFETY: the caller's promises above.
        let m = unsafe { model_ref(model) }?;
        // SAFETY: `count` is NULL or valid for a write (the caller's promise above).
        unsafe { put(count, m.inputs.len()) };
        Ok(())
    })
}

/// # Safety
/// As for `minductor_num_inputs`.
#[no_mangle]
pub unsafe extern "C" fn minductor_num_outputs(
    model: *const minductor_model,
    count: *mut usize,
) -> minductor_status {
    entry(|| {
        // SAFETY: the caller's promises above.
        let m = unsafe { model_ref(model) }?;
        // SAFETY: `count` is NULL or valid for a write (the caller's promise above).
        unsafe { put(count, m.outputs.len()) };
        Ok(())
    })
}

fn out_of_range(what: &str, index: usize, count: usize) -> Error {
    Error::new(
        MINDUCTOR_ERR_INVALID_ARGUMENT,
        format!("{what} {index} does not exist (the model has {count})"),
    )
}

/// # Safety
/// `model` as for `minductor_num_inputs`; each out pointer NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn minductor_input_info(
    model: *const minductor_model,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut minductor_dtype,
    rank: *mut usize,
    shape: *mut *const i64,
) -> minductor_status {
    entry(|| {
        // SAFETY: the caller's promises above.
        let m = unsafe { model_ref(model) }?;
        let (d, s) = m
            .inputs
            .get(index)
            .ok_or_else(|| out_of_range("input", index, m.inputs.len()))?;
        // SAFETY: the caller's promises above; the pointers handed out live in the model.
        unsafe {
            put(name, m.input_names[index].as_ptr());
            put(dtype, dtype_code(*d));
            put(rank, s.len());
            put(shape, s.as_ptr());
        }
        Ok(())
    })
}

/// # Safety
/// As for `minductor_input_info`.
#[no_mangle]
pub unsafe extern "C" fn minductor_output_info(
    model: *const minductor_model,
    index: usize,
    dtype: *mut minductor_dtype,
    rank: *mut usize,
    shape: *mut *const i64,
) -> minductor_status {
    entry(|| {
        // SAFETY: the caller's promises above.
        let m = unsafe { model_ref(model) }?;
        let (d, s) = m
            .outputs
            .get(index)
            .ok_or_else(|| out_of_range("output", index, m.outputs.len()))?;
        // SAFETY: as above.
        unsafe {
            put(dtype, dtype_code(*d));
            put(rank, s.len());
            put(shape, s.as_ptr());
        }
        Ok(())
    })
}

/// The header's input struct.
#[repr(C)]
pub struct minductor_tensor {
    pub dtype: minductor_dtype,
    pub rank: usize,
    pub shape: *const i64,
    pub data: *const c_void,
    pub bytes: usize,
}

/// The header's output struct.
#[repr(C)]
pub struct minductor_output {
    pub dtype: minductor_dtype,
    pub rank: usize,
    pub shape: *mut i64,
    pub data: *mut c_void,
    pub bytes: usize,
}

/// `count` items at `items`, copied out one by one with unaligned reads (empty when `count`
/// is 0, whatever the pointer), so a caller's array need not be aligned.
///
/// # Safety
/// When `count > 0`, `items` is NULL or valid for reads of `count` items.
unsafe fn read_array<T>(items: *const T, count: usize, what: &str) -> Result<Vec<T>, Error> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if items.is_null() {
        return Err(Error::null(what));
    }
    let mut read = Vec::new();
    read.try_reserve_exact(count).map_err(|_| {
        Error::new(
            MINDUCTOR_ERR_OUT_OF_MEMORY,
            format!("no memory for {count} entries of `{what}`"),
        )
    })?;
    for i in 0..count {
        // SAFETY: the caller's promise above, checked non-NULL; `read_unaligned` asks for no
        // alignment.
        read.push(unsafe { items.add(i).read_unaligned() });
    }
    Ok(read)
}

/// The first failure of a caller's description against what the model expects: checked
/// before the arrays it describes are read, so a `rank` larger than the caller's `shape`
/// array is refused without reading past it.
fn check_description(
    what: &str,
    index: usize,
    code: minductor_dtype,
    rank: usize,
    expected: &(DType, Vec<i64>),
) -> Result<DType, Error> {
    let dtype = dtype_of(code)?;
    let (want_dtype, want_shape) = expected;
    if dtype != *want_dtype {
        return Err(Error::new(
            MINDUCTOR_ERR_DTYPE,
            format!("{what} {index}: {dtype} given, the model's is {want_dtype}"),
        ));
    }
    if rank != want_shape.len() {
        return Err(Error::new(
            MINDUCTOR_ERR_SHAPE,
            format!(
                "{what} {index}: rank {rank} given, the model's is {} (shape {want_shape:?}, -1 \
                 for a symbolic size)",
                want_shape.len()
            ),
        ));
    }
    Ok(dtype)
}

/// Copies one caller input into a tensor, checking its description first.
///
/// # Safety
/// `t.shape` valid for `t.rank` reads and `t.data` for `t.bytes` reads (when non-NULL).
unsafe fn input_tensor(
    index: usize,
    t: &minductor_tensor,
    expected: &(DType, Vec<i64>),
) -> Result<Tensor, Error> {
    let dtype = check_description("input", index, t.dtype, t.rank, expected)?;
    // SAFETY: the caller's promise above; `rank` is the model's, so small.
    let shape = unsafe { read_array(t.shape, t.rank, "inputs[i].shape") }?;
    let shape: Vec<usize> = shape
        .iter()
        .map(|&n| usize::try_from(n))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            Error::new(
                MINDUCTOR_ERR_SHAPE,
                format!("input {index}: negative size in {shape:?}"),
            )
        })?;
    let expected = shape
        .iter()
        .try_fold(dtype.size_bytes(), |acc, &n| acc.checked_mul(n))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::new(
                MINDUCTOR_ERR_SHAPE,
                format!("input {index}: {shape:?} overflows"),
            )
        })?;
    if t.bytes != expected {
        return Err(Error::new(
            MINDUCTOR_ERR_BUFFER_SIZE,
            format!(
                "input {index}: {} bytes, but {dtype}{shape:?} takes {expected}",
                t.bytes
            ),
        ));
    }
    let data: &[u8] = if t.bytes == 0 {
        &[]
    } else if t.data.is_null() {
        return Err(Error::null("inputs[i].data"));
    } else {
        // SAFETY: `data` is valid for `bytes` reads (the caller's promise), checked non-NULL;
        // bytes need no alignment and `bytes <= isize::MAX` (checked above).
        unsafe { std::slice::from_raw_parts(t.data as *const u8, t.bytes) }
    };
    Ok(Tensor::from_bytes(dtype, &shape, data)?)
}

/// # Safety
/// `model` as for `minductor_num_inputs`; `inputs` valid for `n_inputs` reads and `outputs`
/// for `n_outputs` reads (when the counts are non-zero); within each, `shape` valid for
/// `rank` reads (inputs) or writes (outputs), `data` for `bytes` reads (inputs) or writes
/// (outputs), output data not overlapping anything else passed.
#[no_mangle]
pub unsafe extern "C" fn minductor_run(
    model: *const minductor_model,
    inputs: *const minductor_tensor,
    n_inputs: usize,
    outputs: *mut minductor_output,
    n_outputs: usize,
) -> minductor_status {
    entry(|| {
        // SAFETY: the caller's promises above.
        let m = unsafe { model_ref(model) }?;
        // Every count is compared with the model's before the array it counts is read.
        if n_inputs != m.inputs.len() || n_outputs != m.outputs.len() {
            return Err(Error::new(
                MINDUCTOR_ERR_ARITY,
                format!(
                    "{n_inputs} inputs and {n_outputs} outputs given; the model takes {} and returns {}",
                    m.inputs.len(),
                    m.outputs.len()
                ),
            ));
        }
        // SAFETY: the caller's promises above; the counts are the model's.
        let given = unsafe { read_array(inputs, n_inputs, "inputs") }?;
        // SAFETY: as above.
        let wanted =
            unsafe { read_array(outputs as *const minductor_output, n_outputs, "outputs") }?;
        // Outputs are checked against the model before anything runs: dtype, rank, pointers.
        for (i, (out, expected)) in wanted.iter().zip(&m.outputs).enumerate() {
            check_description("output", i, out.dtype, out.rank, expected)?;
            if out.shape.is_null() && out.rank > 0 {
                return Err(Error::null(&format!("outputs[{i}].shape")));
            }
        }
        let tensors = given
            .iter()
            .zip(&m.inputs)
            .enumerate()
            // SAFETY: the caller's promises above.
            .map(|(i, (t, expected))| unsafe { input_tensor(i, t, expected) })
            .collect::<Result<Vec<_>, _>>()?;
        let results = m.compiled.call(&tensors)?;
        // Check every output before writing any.
        let mut contiguous = Vec::with_capacity(results.len());
        for (i, (out, result)) in wanted.iter().zip(&results).enumerate() {
            let fail =
                |status, what: String| Err(Error::new(status, format!("output {i}: {what}")));
            if dtype_of(out.dtype)? != result.dtype() || out.rank != result.rank() {
                return fail(
                    MINDUCTOR_ERR_PANIC,
                    format!(
                        "the result is {}{:?}, not the model's output type",
                        result.dtype(),
                        result.shape()
                    ),
                );
            }
            let needed = result.numel() * result.dtype().size_bytes();
            if out.bytes < needed {
                return fail(
                    MINDUCTOR_ERR_BUFFER_SIZE,
                    format!(
                        "{} bytes given, the result ({}{:?}) needs {needed}",
                        out.bytes,
                        result.dtype(),
                        result.shape()
                    ),
                );
            }
            if out.data.is_null() && needed > 0 {
                return Err(Error::null(&format!("outputs[{i}].data")));
            }
            contiguous.push(result.try_contiguous()?);
        }
        for (out, result) in wanted.iter().zip(&contiguous) {
            let bytes = result.numel() * result.dtype().size_bytes();
            // SAFETY: `data` is valid for `out.bytes >= bytes` writes and `shape` for `rank`
            // writes (the caller's promise, checked non-NULL above), and they do not overlap
            // the result, which this library allocated and which is contiguous with `bytes`
            // bytes from `data_ptr`. The writes ask for no alignment.
            unsafe {
                if bytes > 0 {
                    std::ptr::copy_nonoverlapping(result.data_ptr(), out.data as *mut u8, bytes);
                }
                for (d, &n) in result.shape().iter().enumerate() {
                    out.shape.add(d).write_unaligned(n as i64);
                }
            }
        }
        Ok(())
    })
}

/// The last error message of this thread; never NULL.
#[no_mangle]
pub extern "C" fn minductor_last_error() -> *const c_char {
    // The pointer stays valid until the next call on this thread replaces the message.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The name of a status code.
#[no_mangle]
pub extern "C" fn minductor_status_name(status: minductor_status) -> *const c_char {
    usize::try_from(status)
        .ok()
        .and_then(|s| STATUS_NAMES.get(s))
        .map_or(c"unknown status".as_ptr(), |n| n.as_ptr())
}

//! Out of memory is a typed error, never an abort (issue 22): a call whose output or
//! intermediates cannot be allocated returns `RuntimeError::OutOfMemory` on every backend,
//! through `compile`, `jit` and `TrainStep`, and the process goes on to serve the next call.
//! A memory limit (`CompileOptions::memory_limit`, `MINDUCTOR_MEMORY_LIMIT`) refuses a call
//! that would need more before it starts.
//!
//! These rely on the allocator refusing a 4 TiB block (Linux's default heuristic overcommit
//! does, on any machine with less than 4 TiB of memory and swap).

use minductor::internals::runtime::parse_memory_size;
use minductor::{
    compile_with, compile_with_options, jit, Backend, CompileOptions, DType, Graph, JitError,
    Parameters, RuntimeError, Sgd, Tensor, Traced, Tracer, TrainError, TrainStep,
};

const BACKENDS: [Backend; 3] = [Backend::Eager, Backend::AotEager, Backend::Inductor];
const FOUR_TIB: usize = 1 << 42;

/// `exp(x.expand([rows, 2^20]))` for `x: f32[rows, 1]`: 4 TiB of output for rows = 2^20.
fn expand_exp(rows: usize) -> Graph {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[rows, 1]);
    t.finish(&[x.expand(&[-1, 1 << 20]).exp()]).unwrap()
}

/// `[rows, 1]` holding `0, 1/rows, 2/rows, ...`.
fn column(rows: usize) -> Tensor {
    Tensor::from_vec(
        &[rows, 1],
        (0..rows).map(|i| i as f32 / rows as f32).collect(),
    )
    .unwrap()
}

fn assert_out_of_memory(result: Result<Vec<Tensor>, RuntimeError>, at_least: usize, what: &str) {
    match result {
        Err(RuntimeError::OutOfMemory { bytes, what: found }) => {
            assert!(bytes >= at_least, "{what}: {bytes} bytes ({found})");
        }
        Err(e) => panic!("{what}: expected OutOfMemory, got {e}"),
        Ok(_) => panic!("{what}: a call needing {at_least} bytes succeeded"),
    }
}

/// Every element of `got` is `exp(x[row])` of [`column`]'s values, within 2 ulp-ish.
fn assert_rows_are_exp(got: &Tensor, rows: usize) {
    assert_eq!(got.shape(), &[rows, 1 << 20]);
    let values = got.to_vec::<f32>().unwrap();
    for (row, chunk) in values.chunks(1 << 20).enumerate() {
        let want = (row as f32 / rows as f32).exp();
        for (k, &v) in chunk.iter().enumerate() {
            assert!(
                (v - want).abs() <= 2e-7 * want,
                "row {row} column {k}: {v} vs {want}"
            );
        }
    }
}

#[test]
fn a_4_tib_output_is_out_of_memory_on_every_backend_and_the_next_call_runs() {
    for backend in BACKENDS {
        let huge = compile_with(&expand_exp(1 << 20), backend).unwrap();
        assert_out_of_memory(
            huge.call(&[column(1 << 20)]),
            FOUR_TIB,
            &format!("{backend:?}"),
        );
        // The same object refuses again (nothing was left half-done), and the process serves
        // a normal call.
        assert_out_of_memory(
            huge.call(&[column(1 << 20)]),
            FOUR_TIB,
            &format!("{backend:?}, again"),
        );
        let small = compile_with(&expand_exp(3), backend).unwrap();
        let got = small.call(&[column(3)]).unwrap();
        assert_rows_are_exp(&got[0], 3);
    }
}

#[test]
fn jit_returns_out_of_memory_and_then_serves_smaller_calls() {
    let f = jit(|x: &[Traced]| vec![x[0].expand(&[-1, 1 << 20]).exp()]);
    assert_rows_are_exp(&f.call(&[column(2)]).unwrap()[0], 2);
    match f.call(&[column(1 << 20)]) {
        Err(JitError::Runtime(RuntimeError::OutOfMemory { bytes, .. })) => {
            assert!(bytes >= FOUR_TIB, "{bytes}")
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("a 4 TiB call succeeded"),
    }
    assert_rows_are_exp(&f.call(&[column(3)]).unwrap()[0], 3);
}

/// A training step whose forward makes a `[2^20, 2^20]` product (`x @ w`, realized: a GEMM's
/// output) is `OutOfMemory` on every backend and leaves the parameters as they were.
#[test]
fn a_training_step_needing_4_tib_is_out_of_memory_and_changes_nothing() {
    let n = 1 << 20;
    for backend in [Backend::Eager, Backend::Inductor] {
        let w = Tensor::from_vec(&[1, n], vec![0.5f32; n]).unwrap();
        let params = Parameters::new().with("w", w.clone());
        let mut train = TrainStep::with_backend(
            backend,
            params,
            Sgd::new(0.1),
            &[("x", DType::F32, &[n, 1])],
            |p, b| b[0].matmul(&p["w"]).sigmoid().mean(&[0, 1], false),
        )
        .unwrap();
        match train.step(&[column(n)]) {
            Err(TrainError::Runtime(RuntimeError::OutOfMemory { bytes, .. })) => {
                assert!(bytes >= FOUR_TIB, "{backend:?}: {bytes}")
            }
            Err(e) => panic!("{backend:?}: expected OutOfMemory, got {e}"),
            Ok(loss) => panic!("{backend:?}: a 4 TiB step succeeded (loss {loss})"),
        }
        assert_eq!(train.steps(), 0, "{backend:?}");
        assert_eq!(
            train
                .parameters()
                .get("w")
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            w.to_vec::<f32>().unwrap(),
            "{backend:?}: the parameters changed"
        );

        // A small model trains in the same process afterwards: the loss is sigmoid(0.5·x)'s
        // mean before the update, and it goes down.
        let params =
            Parameters::new().with("w", Tensor::from_vec(&[1, 4], vec![0.5f32; 4]).unwrap());
        let mut small = TrainStep::with_backend(
            backend,
            params,
            Sgd::new(0.1),
            &[("x", DType::F32, &[4, 1])],
            |p, b| b[0].matmul(&p["w"]).sigmoid().mean(&[0, 1], false),
        )
        .unwrap();
        let x = column(4);
        let first = small.step(std::slice::from_ref(&x)).unwrap();
        let want: f32 = (0..4)
            .map(|i| 1.0 / (1.0 + (-0.5 * i as f32 / 4.0).exp()))
            .sum::<f32>()
            / 4.0;
        assert!(
            (first - want).abs() < 1e-6,
            "{backend:?}: {first} vs {want}"
        );
        assert!(small.step(&[x]).unwrap() < first, "{backend:?}");
    }
}

#[test]
fn a_memory_limit_refuses_a_call_before_it_starts_on_every_backend() {
    // 8 rows of 2^20 f32: 32 MiB of output.
    let graph = expand_exp(8);
    for backend in BACKENDS {
        let limited = compile_with_options(
            &graph,
            CompileOptions {
                backend,
                memory_limit: Some(16 << 20),
                ..CompileOptions::default()
            },
        )
        .unwrap();
        assert_eq!(limited.memory_limit(), Some(16 << 20));
        match limited.call(&[column(8)]) {
            Err(RuntimeError::OutOfMemory { bytes, what }) => {
                assert!(bytes >= 32 << 20, "{backend:?}: {bytes}");
                assert!(what.contains("limit"), "{backend:?}: {what}");
            }
            other => panic!("{backend:?}: expected OutOfMemory, got {other:?}"),
        }
        let mut roomy = limited;
        roomy.set_memory_limit(Some(1 << 30));
        assert_rows_are_exp(&roomy.call(&[column(8)]).unwrap()[0], 8);
        roomy.set_memory_limit(None);
        assert_rows_are_exp(&roomy.call(&[column(8)]).unwrap()[0], 8);
    }
}

#[test]
fn the_memory_limit_variable_reads_binary_multiples() {
    assert_eq!(parse_memory_size("1048576"), Some(1 << 20));
    assert_eq!(parse_memory_size("512M"), Some(512 << 20));
    assert_eq!(parse_memory_size("4G"), Some(4 << 30));
    assert_eq!(parse_memory_size("2 GiB"), Some(2 << 30));
    assert_eq!(parse_memory_size("1t"), Some(1 << 40));
    assert_eq!(parse_memory_size(""), None);
    assert_eq!(parse_memory_size("lots"), None);
    assert_eq!(parse_memory_size("3X"), None);
    assert_eq!(parse_memory_size("99999999999999999999T"), None);
}

/// `MINDUCTOR_MEMORY_LIMIT` is read when a graph is compiled (other tests of this binary may
/// compile meanwhile and see it: 16 MiB fits each of their small calls, and their 4 TiB calls
/// are refused either way).
#[test]
fn the_memory_limit_variable_limits_what_is_compiled_while_it_is_set() {
    std::env::set_var("MINDUCTOR_MEMORY_LIMIT", "16M");
    let limited = compile_with(&expand_exp(8), Backend::Inductor);
    std::env::remove_var("MINDUCTOR_MEMORY_LIMIT");
    let limited = limited.unwrap();
    assert_eq!(limited.memory_limit(), Some(16 << 20));
    assert_out_of_memory(
        limited.call(&[column(8)]),
        32 << 20,
        "MINDUCTOR_MEMORY_LIMIT=16M",
    );
    let unlimited = compile_with(&expand_exp(8), Backend::Inductor).unwrap();
    assert_rows_are_exp(&unlimited.call(&[column(8)]).unwrap()[0], 8);
}

/// `x + n` where `n` is the number of values Rust code read at a graph break from
/// `read(x)` (`[rows, 2^20]` of them): the graph before the break and the read are one call's
/// work, so a read of 4 TiB is `OutOfMemory` from `jit`, not a trace error, and the next
/// call runs.
fn assert_a_read_of_4_tib_is_out_of_memory(read: fn(&Traced) -> Traced, what: &str) {
    let f = jit(move |x: &[Traced]| {
        let n = read(&x[0]).to_vec().len();
        vec![&x[0] + n as f64]
    });
    let reads_into_x_plus = |rows: usize| {
        let got = f.call(&[column(rows)]).unwrap();
        let values = got[0].to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..rows)
            .map(|i| i as f32 / rows as f32 + (rows << 20) as f32)
            .collect();
        assert_eq!(values, want, "{what}: {rows} rows");
    };
    reads_into_x_plus(2);
    match f.call(&[column(1 << 20)]) {
        Err(JitError::Runtime(RuntimeError::OutOfMemory { bytes, .. })) => {
            assert!(bytes >= FOUR_TIB, "{what}: {bytes}")
        }
        Err(e) => panic!("{what}: expected OutOfMemory, got {e}"),
        Ok(_) => panic!("{what}: a 4 TiB read succeeded"),
    }
    reads_into_x_plus(3);
}

#[test]
fn a_graph_break_reading_a_4_tib_value_is_out_of_memory() {
    // The value is computed by the graph before the break (its output cannot be allocated).
    assert_a_read_of_4_tib_is_out_of_memory(|x| x.expand(&[-1, 1 << 20]).exp(), "exp");
}

#[test]
fn a_graph_break_reading_a_4_tib_view_is_out_of_memory() {
    // The value is a view of an input (no output to allocate; the values read are 8 TiB of
    // f64).
    assert_a_read_of_4_tib_is_out_of_memory(|x| x.expand(&[-1, 1 << 20]), "expand");
}

/// Attention over `2^36` keys that are one key expanded (a view: no input or intermediate is
/// large): the fused attention step packs the keys into per-thread scratch, 4 TiB of it,
/// which is `OutOfMemory` naming that scratch; the next call, on few keys, runs and matches
/// the reference interpreter.
#[test]
fn attention_scratch_too_large_to_allocate_is_out_of_memory() {
    let attention = |keys: usize| {
        let t = Tracer::new();
        let q = t.input("q", DType::F32, &[1, 1, 4, 16]);
        let k = t.input("k", DType::F32, &[1, 1, 1, 16]);
        let v = t.input("v", DType::F32, &[1, 1, 1, 16]);
        let (k, v) = (
            k.expand(&[1, 1, keys as isize, 16]),
            v.expand(&[1, 1, keys as isize, 16]),
        );
        t.finish(&[q.scaled_dot_product_attention(&k, &v, None, false)])
            .unwrap()
    };
    let ramp = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|i| (i as f32 * scale).sin()).collect()).unwrap()
    };
    let inputs = [
        ramp(&[1, 1, 4, 16], 0.3),
        ramp(&[1, 1, 1, 16], 0.7),
        ramp(&[1, 1, 1, 16], 1.1),
    ];
    let huge = compile_with(&attention(1 << 36), Backend::Inductor).unwrap();
    match huge.call(&inputs) {
        Err(RuntimeError::OutOfMemory { bytes, what }) => {
            assert!(bytes >= FOUR_TIB, "{bytes} ({what})");
            assert!(what.contains("attention's packed keys"), "{what}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let graph = attention(37);
    let got = compile_with(&graph, Backend::Inductor)
        .unwrap()
        .call(&inputs)
        .unwrap();
    let want = compile_with(&graph, Backend::Eager)
        .unwrap()
        .call(&inputs)
        .unwrap();
    // Every key is the same, so every output row is `v`'s one row.
    let (got, want) = (
        got[0].to_vec::<f32>().unwrap(),
        want[0].to_vec::<f32>().unwrap(),
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6, "element {i}: {g} vs {w}");
    }
}

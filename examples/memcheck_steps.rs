//! Every kind of step the compiled code runs, each checked against the reference interpreter:
//! the program `.ci/memcheck` runs under valgrind memcheck (which must report zero errors), so
//! that no kernel or library routine reads memory it never wrote.
//!
//! Pointwise and reduction kernels (rows, runs of short rows, columns, argmax), plain, streamed and implicit
//! GEMMs, Winograd, fused attention (causal and not, T = 7, 13, 33, 65, 100, 129), scatter-add,
//! gathers (embedding, `take_along`), scans, fallback steps (f64) and a training step (AdamW).
//! Valgrind does not run AVX-512, so under it these are the AVX2 (and portable) paths.
//!
//! `cargo run --release --example memcheck_steps` (exits non-zero on a wrong result).

use minductor::{
    compile, interpret, AdamW, ConvOptions, DType, Graph, Parameters, Tensor, Tracer, TrainStep,
};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u32) -> Tensor {
    Tensor::from_vec(shape, values(shape.iter().product(), seed)).unwrap()
}

/// Compiles `graph`, runs it on `inputs` and compares every output with the interpreter's
/// (within `tolerance`, relative to the largest magnitude of each output).
fn check(name: &str, graph: &Graph, inputs: &[Tensor], tolerance: f64) -> Result<(), String> {
    let compiled = compile(graph).map_err(|e| format!("{name}: compile: {e}"))?;
    let got = compiled
        .call(inputs)
        .map_err(|e| format!("{name}: call: {e}"))?;
    let want = interpret(graph, inputs).map_err(|e| format!("{name}: interpret: {e}"))?;
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.shape() != w.shape() || g.dtype() != w.dtype() {
            return Err(format!("{name}: output {o}: {g:?} vs {w:?}"));
        }
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
        for (k, (a, b)) in g.iter().zip(&w).enumerate() {
            if !((a - b).abs() <= tolerance * scale || (a.is_nan() && b.is_nan())) {
                return Err(format!("{name}: output {o} element {k}: {a} vs {b}"));
            }
        }
    }
    println!(
        "{name}: ok ({} steps)",
        compiled
            .artifacts()
            .program
            .as_ref()
            .map_or(0, |p| p.steps.len())
    );
    Ok(())
}

fn run() -> Result<(), String> {
    // Pointwise, with transcendental math blocks.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[37, 301]);
    let graph = t
        .finish(&[(x.mul(2.0).add(0.5)).exp().tanh().add(&x.erf())])
        .unwrap();
    check("pointwise", &graph, &[tensor(&[37, 301], 1)], 1e-5)?;

    // Rows too short for a routine call each, a run of rows per call: rotary embeddings over
    // half heads of 33 (`cos` and `sin` broadcast across heads, the output heads first), and a
    // batch norm with a residual and a ReLU over rows of 9 that follow each other.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[2, 5, 3, 66]);
    let cos = t.input("cos", DType::F32, &[5, 1, 33]);
    let sin = t.input("sin", DType::F32, &[5, 1, 33]);
    let image = t.input("image", DType::F32, &[3, 4, 9, 9]);
    let mean = t.input("mean", DType::F32, &[4, 1, 1]);
    let var = t.input("var", DType::F32, &[4, 1, 1]);
    let weight = t.input("weight", DType::F32, &[4, 1, 1]);
    let bias = t.input("bias", DType::F32, &[4, 1, 1]);
    let residual = t.input("residual", DType::F32, &[3, 4, 9, 9]);
    let (x1, x2) = (x.slice(3, None, Some(33), 1), x.slice(3, Some(33), None, 1));
    let first = x1.mul(&cos).add(&x2.neg().mul(&sin));
    let second = x2.mul(&cos).add(&x1.mul(&sin));
    let rotary = minductor::Traced::cat(&[&first, &second], 3).permute(&[0, 2, 1, 3]);
    let rstd = var.abs().add(1e-5).rsqrt();
    let normed = (image.sub(&mean).mul(&rstd).mul(&weight).add(&bias))
        .add(&residual)
        .relu();
    let graph = t.finish(&[rotary, normed]).unwrap();
    let inputs = [
        tensor(&[2, 5, 3, 66], 20),
        tensor(&[5, 1, 33], 21),
        tensor(&[5, 1, 33], 22),
        tensor(&[3, 4, 9, 9], 23),
        tensor(&[4, 1, 1], 24),
        tensor(&[4, 1, 1], 25),
        tensor(&[4, 1, 1], 26),
        tensor(&[4, 1, 1], 27),
        tensor(&[3, 4, 9, 9], 28),
    ];
    check("short rows", &graph, &inputs, 1e-5)?;

    // Row reductions (softmax, layer_norm), a column sum (outer-reduction order), argmax.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[45, 77]);
    let graph = t
        .finish(&[
            x.softmax(-1),
            x.layer_norm(&[77], None, None, 1e-5),
            x.sum(&[0], false),
            x.argmax(1, false),
        ])
        .unwrap();
    check("reductions", &graph, &[tensor(&[45, 77], 2)], 1e-5)?;

    // A plain GEMM with a bias-gelu epilogue (more than 1024 rows: never streamed), and a
    // short product that streams `b`.
    let t = Tracer::new();
    let a = t.input("a", DType::F32, &[1031, 67]);
    let w = t.input("w", DType::F32, &[93, 67]);
    let bias = t.input("bias", DType::F32, &[93]);
    let short = t.input("short", DType::F32, &[9, 67]);
    let wide = t.input("wide", DType::F32, &[67, 1037]);
    let graph = t
        .finish(&[a.linear(&w, Some(&bias)).gelu(), short.matmul(&wide)])
        .unwrap();
    let inputs = [
        tensor(&[1031, 67], 3),
        tensor(&[93, 67], 4),
        tensor(&[93], 5),
        tensor(&[9, 67], 6),
        tensor(&[67, 1037], 7),
    ];
    check("gemm", &graph, &inputs, 1e-5)?;

    // Convolutions: 3x3 stride 1 (Winograd, which `.ci/memcheck` forces with
    // MINDUCTOR_CONV_ALGO=winograd) and 3x3 stride 2 (the implicit GEMM).
    for (name, stride) in [("conv winograd", 1), ("conv implicit", 2)] {
        let t = Tracer::new();
        let x = t.input("x", DType::F32, &[2, 5, 13, 11]);
        let w = t.input("w", DType::F32, &[7, 5, 3, 3]);
        let b = t.input("b", DType::F32, &[7]);
        let options = ConvOptions::default().stride(stride).padding(1);
        let graph = t.finish(&[x.conv2d(&w, Some(&b), options).relu()]).unwrap();
        let inputs = [
            tensor(&[2, 5, 13, 11], 8),
            tensor(&[7, 5, 3, 3], 9),
            tensor(&[7], 10),
        ];
        check(name, &graph, &inputs, 1e-5)?;
    }

    // Fused attention, causal and not, over the lengths that once read unwritten memory.
    for causal in [false, true] {
        for len in [7, 13, 33, 65, 100, 129] {
            let t = Tracer::new();
            let q = t.input("q", DType::F32, &[2, 3, len, 16]);
            let k = t.input("k", DType::F32, &[2, 3, len, 16]);
            let v = t.input("v", DType::F32, &[2, 3, len, 16]);
            let graph = t
                .finish(&[q.scaled_dot_product_attention(&k, &v, None, causal)])
                .unwrap();
            let shape = [2, 3, len, 16];
            let inputs = [tensor(&shape, 11), tensor(&shape, 12), tensor(&shape, 13)];
            check(
                &format!("attention causal={causal} T={len}"),
                &graph,
                &inputs,
                1e-5,
            )?;
        }
    }

    // Gathers (embedding rows, take_along), a scan, and f64 fallback steps.
    let t = Tracer::new();
    let table = t.input("table", DType::F32, &[50, 24]);
    let ids = t.input("ids", DType::I64, &[6, 9]);
    let x = t.input("x", DType::F32, &[6, 9]);
    let positions = t.input("positions", DType::I64, &[6, 4]);
    let picked = x.gather(1, &positions);
    let graph = t
        .finish(&[
            ids.embedding(&table).sum(&[-1], false),
            picked,
            x.cumsum(1),
            x.cast(DType::F64).exp().sum(&[1], false),
        ])
        .unwrap();
    let id_values: Vec<i64> = (0..54).map(|i| (i * 7 % 50) as i64).collect();
    let inputs = [
        tensor(&[50, 24], 14),
        Tensor::from_vec(&[6, 9], id_values).unwrap(),
        tensor(&[6, 9], 15),
        Tensor::from_vec(&[6, 4], (0..24).map(|i| (i * 5 % 9) as i64).collect()).unwrap(),
    ];
    check("gathers, scan, fallback", &graph, &inputs, 1e-5)?;

    // A training step: embedding (its gradient a scatter-add), a linear layer, cross entropy,
    // AdamW; the loss must go down.
    let params = Parameters::new()
        .with("table", tensor(&[40, 16], 16))
        .with("w", tensor(&[10, 16], 17))
        .with("b", tensor(&[10], 18));
    let mut train = TrainStep::new(
        params,
        AdamW::new(1e-2),
        &[("ids", DType::I64, &[12]), ("y", DType::I64, &[12])],
        |p, b| {
            b[0].embedding(&p["table"])
                .linear(&p["w"], Some(&p["b"]))
                .cross_entropy(&b[1])
        },
    )
    .map_err(|e| format!("training step: {e}"))?;
    let ids = Tensor::from_vec(&[12], (0..12).map(|i| (i * 3 % 40) as i64).collect()).unwrap();
    let y = Tensor::from_vec(&[12], (0..12).map(|i| (i % 10) as i64).collect()).unwrap();
    let first = train
        .step(&[ids.clone(), y.clone()])
        .map_err(|e| e.to_string())?;
    let mut last = first;
    for _ in 0..5 {
        last = train
            .step(&[ids.clone(), y.clone()])
            .map_err(|e| e.to_string())?;
    }
    if last.partial_cmp(&first) != Some(std::cmp::Ordering::Less) {
        return Err(format!(
            "training step: the loss went from {first} to {last}"
        ));
    }
    println!("training step: ok (loss {first} -> {last})");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

//! A batch of images through a small ResNet (a stem convolution, three basic blocks, max and
//! average pooling, a linear classifier) with the weights of the golden case
//! `model_tiny_resnet`: compiled, checked against PyTorch's scores in the same file, timed
//! against eager; then compiled again with its weights frozen (`compile_frozen`: batch norms
//! folded into the convolutions and their weights packed once, the images the only input),
//! checked the same way and timed alternately with the unfrozen compile.
//!
//! `cargo run --release --example resnet [path/to/model_tiny_resnet.safetensors]`

use minductor::{compile_frozen, compile_with, load_safetensors, Backend, Tracer};
use minductor_tools::golden::models::{tiny_resnet, TINY_RESNET};
use minductor_tools::golden::{compare, default_golden_models_dir};
use std::collections::HashMap;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| default_golden_models_dir().join("model_tiny_resnet.safetensors"));
    let tensors = load_safetensors(&path)?;
    // Inputs with the shapes and dtypes the file holds.
    let tracer = Tracer::new();
    let mut named = HashMap::new();
    for &name in TINY_RESNET {
        let t = tensors
            .get(name)
            .ok_or(format!("{name} is not in {}", path.display()))?;
        named.insert(name.to_string(), tracer.input(name, t.dtype(), t.shape()));
    }
    let graph = tracer.finish(&[tiny_resnet(&named)])?;
    let inputs: Vec<_> = TINY_RESNET.iter().map(|n| tensors[*n].clone()).collect();

    let compiled = compile_with(&graph, Backend::Inductor)?;
    let eager = compile_with(&graph, Backend::Eager)?;
    let scores = compiled.call(&inputs)?.remove(0);
    let images = scores.shape()[0];
    let classes = scores.shape()[1];
    println!(
        "{images} images of {:?} → scores {:?} (compiled in {:.1} ms)",
        &tensors["x"].shape()[1..],
        scores.shape(),
        compiled.compile_time().as_secs_f64() * 1e3
    );
    let values = scores.to_vec::<f32>()?;
    for (n, row) in values.chunks(classes).enumerate() {
        let (best, score) =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |a, (c, &s)| if s > a.1 { (c, s) } else { a },
            );
        println!("image {n}: class {best} (score {score:.4})");
    }
    if let Some(want) = tensors.get("out0") {
        let c = compare(&scores, want, 1e-4, 1e-4);
        println!(
            "against PyTorch: max abs error {:.2e} ({})",
            c.max_abs_error,
            if c.passed { "pass" } else { "FAIL" }
        );
    }
    let time = |f: &dyn Fn()| {
        let mut t: Vec<f64> = (0..20)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let compiled_ms = time(&|| {
        compiled.call(&inputs).expect("compiled call");
    });
    let eager_ms = time(&|| {
        eager.call(&inputs).expect("eager call");
    });
    println!("median of 20 calls: eager {eager_ms:.3} ms, compiled {compiled_ms:.3} ms");

    // Frozen: every input but the images is a constant of the compiled program.
    let weights: Vec<(&str, minductor::Tensor)> = TINY_RESNET[1..]
        .iter()
        .map(|&n| (n, tensors[n].clone()))
        .collect();
    let frozen = compile_frozen(&graph, &weights)?;
    let images_only = [tensors["x"].clone()];
    let frozen_scores = frozen.call(&images_only)?.remove(0);
    if let Some(want) = tensors.get("out0") {
        let c = compare(&frozen_scores, want, 1e-4, 1e-4);
        println!(
            "frozen (compiled in {:.1} ms): against PyTorch: max abs error {:.2e} ({})",
            frozen.compile_time().as_secs_f64() * 1e3,
            c.max_abs_error,
            if c.passed { "pass" } else { "FAIL" }
        );
    }
    // Alternately, so the machine's load hits both alike.
    let (mut plain_ms, mut frozen_ms) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let started = Instant::now();
        compiled.call(&inputs)?;
        plain_ms.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        frozen.call(&images_only)?;
        frozen_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    plain_ms.sort_by(f64::total_cmp);
    frozen_ms.sort_by(f64::total_cmp);
    println!(
        "median of 100 alternated calls: compiled {:.3} ms, frozen {:.3} ms",
        plain_ms[50], frozen_ms[50]
    );
    Ok(())
}

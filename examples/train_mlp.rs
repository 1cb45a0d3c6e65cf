//! Trains a small MLP classifier on a synthetic task with a compiled training step, printing the
//! loss as it falls and the accuracy on held-out points.
//!
//! The task: points in 16 dimensions, labelled by which of 4 fixed random directions they lie
//! furthest along (a teacher the MLP has to learn). One `TrainStep` runs forward, backward
//! (cross-entropy through `linear → gelu → linear`) and the AdamW update as one program.
//!
//! `cargo run --release --example train_mlp`

use minductor::{compile, trace, AdamW, DType, Parameters, Tensor, TrainStep};
use std::time::Instant;

const INPUTS: usize = 16;
const HIDDEN: usize = 64;
const CLASSES: usize = 4;
const BATCH: usize = 256;

/// A small xorshift generator: the example needs no randomness crate.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| self.uniform() * scale).collect();
        Tensor::from_vec(shape, data).expect("shape matches data")
    }
}

/// A batch of points and their teacher labels.
fn batch(rng: &mut Rng, teacher: &[f32], rows: usize) -> (Tensor, Tensor) {
    let points: Vec<f32> = (0..rows * INPUTS).map(|_| rng.uniform()).collect();
    let labels: Vec<i64> = points
        .chunks(INPUTS)
        .map(|p| {
            let score =
                |c: usize| -> f32 { (0..INPUTS).map(|i| teacher[c * INPUTS + i] * p[i]).sum() };
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .expect("at least one class") as i64
        })
        .collect();
    (
        Tensor::from_vec(&[rows, INPUTS], points).expect("shape matches data"),
        Tensor::from_vec(&[rows], labels).expect("shape matches data"),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng(0x5eed);
    let teacher: Vec<f32> = (0..CLASSES * INPUTS).map(|_| rng.uniform()).collect();
    let params = Parameters::new()
        .with("w1", rng.tensor(&[HIDDEN, INPUTS], 0.25))
        .with("b1", rng.tensor(&[HIDDEN], 0.1))
        .with("w2", rng.tensor(&[CLASSES, HIDDEN], 0.125))
        .with("b2", rng.tensor(&[CLASSES], 0.1));

    let started = Instant::now();
    let mut train = TrainStep::new(
        params,
        AdamW::new(1e-2),
        &[
            ("x", DType::F32, &[BATCH, INPUTS]),
            ("y", DType::I64, &[BATCH]),
        ],
        |p, b| {
            let hidden = b[0].linear(&p["w1"], Some(&p["b1"])).gelu();
            hidden.linear(&p["w2"], Some(&p["b2"])).cross_entropy(&b[1])
        },
    )?;
    println!(
        "compiled the training step in {:.1} ms ({} graph nodes, {} saved bytes between forward and backward)",
        started.elapsed().as_secs_f64() * 1e3,
        train.compiled().graph().len(),
        train
            .compiled()
            .artifacts()
            .partition
            .as_ref()
            .map_or(0, |p| p.saved_bytes()),
    );

    let steps = 300;
    let started = Instant::now();
    let mut first = None;
    let mut last = 0.0;
    for step in 1..=steps {
        let (x, y) = batch(&mut rng, &teacher, BATCH);
        last = train.step(&[x, y])?;
        first.get_or_insert(last);
        if step == 1 || step % 30 == 0 {
            println!("step {step:>4}  loss {last:.4}");
        }
    }
    let per_step = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
    println!("{per_step:.3} ms per step (batch data generation included)");

    // Accuracy on held-out points, with a compiled inference graph over the trained parameters.
    let held_out = 4096;
    let (x, y) = batch(&mut rng, &teacher, held_out);
    let infer = trace(|t| {
        let x = t.input("x", DType::F32, &[held_out, INPUTS]);
        let names = ["w1", "b1", "w2", "b2"];
        let p: Vec<_> = names
            .iter()
            .map(|&n| {
                let shape = train.parameters().get(n).expect("trained").shape().to_vec();
                t.input(n, DType::F32, &shape)
            })
            .collect();
        vec![x
            .linear(&p[0], Some(&p[1]))
            .gelu()
            .linear(&p[2], Some(&p[3]))]
    })?;
    let mut inputs = vec![x];
    for n in ["w1", "b1", "w2", "b2"] {
        inputs.push(train.parameters().get(n).expect("trained").clone());
    }
    let logits = compile(&infer)?.call(&inputs)?[0].to_vec::<f32>()?;
    let labels = y.to_vec::<i64>()?;
    let correct = logits
        .chunks(CLASSES)
        .zip(&labels)
        .filter(|(row, &label)| {
            let predicted = (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .expect("at least one class");
            predicted as i64 == label
        })
        .count();
    let accuracy = correct as f64 / held_out as f64;
    println!(
        "loss {:.4} -> {last:.4} over {steps} steps; held-out accuracy {:.1}% (chance: {:.0}%)",
        first.unwrap_or(0.0),
        accuracy * 100.0,
        100.0 / CLASSES as f64
    );
    if last >= first.unwrap_or(0.0) {
        return Err("the loss did not fall".into());
    }
    Ok(())
}

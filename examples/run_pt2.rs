//! Imports a program saved by `torch.export.save` and runs it, no Python or libtorch involved:
//! `cargo run --release --example run_pt2 -- MODEL.pt2 [INPUTS.safetensors]`
//! (default: `../shared/exported/tiny_gpt2.pt2` with its reference inputs). Prints the
//! signature (dynamic dims and their ranges), compiles once with the weights frozen, runs the
//! inputs (named as the program's user inputs in the safetensors file) and, when the file holds
//! PyTorch's outputs (`out0`, `out1`, ...), the largest difference from them.

use minductor::{export, load_safetensors};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/exported");
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| shared.join("tiny_gpt2.pt2"));
    let data = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| model.with_extension("safetensors"));

    let program = export::load(&model)?;
    println!("{}: {}", model.display(), program.signature());
    println!(
        "{} nodes of {} distinct ops, {} weights",
        program.ops().values().sum::<usize>(),
        program.ops().len(),
        program.weights().len()
    );
    let compiled = program.compile()?;
    let tensors = load_safetensors(&data)?;
    let inputs = program
        .signature()
        .inputs
        .iter()
        .map(|i| {
            tensors
                .get(&i.name)
                .cloned()
                .ok_or_else(|| format!("{} has no input `{}`", data.display(), i.name))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = compiled.call(&inputs)?;
    for (i, out) in outputs.iter().enumerate() {
        let expected = tensors.get(&format!("out{i}"));
        let gap = expected.map(|e| {
            out.to_f64_vec()
                .iter()
                .zip(e.to_f64_vec())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f64, f64::max)
        });
        match gap {
            Some(g) => println!(
                "out{i}: {}{:?}, max |minductor - PyTorch| = {g:.2e}",
                out.dtype(),
                out.shape()
            ),
            None => println!("out{i}: {}{:?}", out.dtype(), out.shape()),
        }
    }
    Ok(())
}

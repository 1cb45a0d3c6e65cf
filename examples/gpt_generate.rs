//! Greedy decoding with a GPT-2-style decoder (the weights of the golden cases
//! `model_gpt_tiny_t*`): one `jit` function is called on a growing sequence, each call's argmax
//! next token appended to the input. Prints the tokens, the compiles (the first length compiles
//! static; the second, whose length differs, makes the sequence dim symbolic, and that one graph
//! serves every later length: 2 compiles, 1 symbolic) and tokens per second.
//!
//! `cargo run --release --example gpt_generate [tokens] [path/to/model_gpt_tiny_t7.safetensors]`

use minductor::{jit, load_safetensors, Tensor, Traced};
use minductor_tools::golden::default_golden_models_dir;
use minductor_tools::golden::models::{gpt_forward, GPT_INPUTS};
use std::collections::HashMap;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let tokens: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| default_golden_models_dir().join("model_gpt_tiny_t7.safetensors"));
    let tensors = load_safetensors(&path)?;
    let positions = tensors["wpe"].shape()[0];
    let prompt = tensors["idx"].clone();
    let (batch, start) = (prompt.shape()[0], prompt.shape()[1]);
    let tokens = tokens.min(positions - start);

    let gpt = jit(|x: &[Traced]| {
        let named: HashMap<String, Traced> = GPT_INPUTS
            .iter()
            .zip(x)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        vec![gpt_forward(&named).remove(1)]
    })
    .input_names(GPT_INPUTS)
    .recompile_limit(positions);

    let mut sequences: Vec<Vec<i64>> = prompt
        .to_vec::<i64>()?
        .chunks(start)
        .map(|s| s.to_vec())
        .collect();
    let began = Instant::now();
    for step in 0..tokens {
        let length = start + step;
        let flat: Vec<i64> = sequences.iter().flatten().copied().collect();
        let mut inputs = vec![Tensor::from_vec(&[batch, length], flat)?];
        inputs.extend(GPT_INPUTS[1..].iter().map(|n| tensors[*n].clone()));
        let t = Instant::now();
        let next = gpt.call(&inputs)?.remove(0).to_vec::<i64>()?;
        for (s, &token) in sequences.iter_mut().zip(&next) {
            s.push(token);
        }
        println!(
            "length {length:>3}: next tokens {next:?} in {:.2} ms (compiles so far: {})",
            t.elapsed().as_secs_f64() * 1e3,
            gpt.stats().compiles
        );
    }
    let seconds = began.elapsed().as_secs_f64();
    for (n, s) in sequences.iter().enumerate() {
        println!("sequence {n}: {:?} + {:?}", &s[..start], &s[start..]);
    }
    let stats = gpt.stats();
    println!(
        "{} tokens × {batch} sequences in {:.1} ms: {:.0} tokens/s; {} compiles ({} symbolic), {} cache hits, {} eager fallbacks",
        tokens,
        seconds * 1e3,
        (tokens * batch) as f64 / seconds,
        stats.compiles,
        stats.symbolic_compiles,
        stats.cache_hits,
        stats.eager_fallbacks()
    );
    Ok(())
}

//! The benchmark suite: fixed-name f32 workloads that `minductor bench` and the criterion benches
//! run on the eager and the compiled backend.
//!
//! Each [`Workload`] carries its traced graph, deterministic random inputs, and the two figures its
//! speed is judged by: the bytes it must move (every input read once and every output written
//! once; intermediates do not count) and its FLOPs (2·M·N·K per GEMM, pointwise work not counted).
//! Workloads dominated by GEMMs are [`Bound::Compute`] and are reported in GFLOP/s; the others are
//! [`Bound::Memory`] and are reported in GB/s.
//!
//! The suite, by its fixed names (compared with other systems, so never renamed):
//! - `pointwise_gelu_4k`, `pointwise_gelu_1m`, `pointwise_gelu_16m`: `gelu(x * w + b)` (erf form)
//!   over 4096, 2^20 and 2^24 elements. `x`, `w` and `b` are all full-size 1-d tensors (no
//!   broadcasting), so the workload moves 3 reads + 1 write = 16 bytes per element;
//! - `softmax_4096x1024`: softmax over the last dim (moves 8 bytes per element);
//! - `layernorm_4096x1024`: affine layer_norm over the last dim, eps 1e-5;
//! - `mlp_256x1024x4096`: `linear(1024→4096) → gelu → linear(4096→1024)` on 256 rows;
//! - `attention_8x256x512`: a pre-LN transformer block (batch 8, sequence 256, width 512, 8 heads,
//!   MLP width 2048), the same block the golden case `model_transformer_block` checks;
//! - `resnet_block_8x64x56`: a ResNet basic block on `[8, 64, 56, 56]` (two 3x3 convolutions
//!   with padding 1, eval batch norm, ReLU, the residual add), as `torch_suite.py`'s
//!   `resnet_block`: 3.7 GFLOP;
//! - `llama_block_4x256x512`: a LLaMA-style block (batch 4, sequence 256, width 512, 8 query
//!   heads, 4 key-value heads, rotary embeddings, causal attention, SwiGLU MLP of width 1408), as
//!   `torch_suite.py`'s `llama_block`;
//! - `mlp_train_step_256`: one functional SGD step of that MLP (`mlp_256x1024x4096`'s shapes) on
//!   the mse loss: `loss, [p − 1e-3·d loss/d p for p in w1, b1, w2, b2]` (uniform inputs in [-1, 1]
//!   here, standard normal in the PyTorch suite: the time does not depend on the values).
//!
//! [`pointwise_gelu_sweep`] and [`softmax_sweep`] build the same computations at other sizes, for
//! the speedup-over-size plot and for fast tests.

use crate::golden::models::{suite_llama_block, suite_resnet_block};
use crate::golden::{mlp, transformer_block};
use minductor::{trace, DType, Graph, Tensor, TraceError, Traced, Tracer};
use std::collections::HashMap;
use thiserror::Error;

/// What a workload's speed is measured against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Reported in GB/s, as a fraction of the machine's copy bandwidth.
    Memory,
    /// GEMM-dominated: reported in GFLOP/s, as a fraction of the machine's GEMM peak.
    Compute,
}

/// One benchmark: a graph, its inputs and its cost figures.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub graph: Graph,
    pub inputs: Vec<Tensor>,
    /// Every input read once plus every output written once, in bytes.
    pub bytes_moved: u64,
    /// 2·M·N·K summed over the GEMMs (0 for workloads without GEMMs).
    pub flops: u64,
    pub bound: Bound,
    /// The size a sweep varies: elements of one input (pointwise) or of the matrix (softmax).
    pub elements: usize,
}

#[derive(Debug, Error)]
pub enum WorkloadError {
    #[error("unknown workload `{found}` (expected one of: {})", SUITE.join(", "))]
    Unknown { found: String },
    #[error("workload {name}: tracing failed: {source}")]
    Trace { name: String, source: TraceError },
}

/// The names of the suite, in the order the harness runs them.
pub const SUITE: [&str; 10] = [
    "pointwise_gelu_4k",
    "pointwise_gelu_1m",
    "pointwise_gelu_16m",
    "softmax_4096x1024",
    "layernorm_4096x1024",
    "mlp_256x1024x4096",
    "attention_8x256x512",
    "resnet_block_8x64x56",
    "llama_block_4x256x512",
    "mlp_train_step_256",
];

/// Element counts of the pointwise sweep: 2^12 to 2^24, ×4 per step.
pub const POINTWISE_SWEEP: [usize; 7] = [
    1 << 12,
    1 << 14,
    1 << 16,
    1 << 18,
    1 << 20,
    1 << 22,
    1 << 24,
];

/// Row counts of the softmax sweep over rows of 1024: 4 to 4096 rows, ×4 per step.
pub const SOFTMAX_SWEEP_ROWS: [usize; 6] = [4, 16, 64, 256, 1024, 4096];

/// Builds the suite workload `name`.
pub fn by_name(name: &str) -> Result<Workload, WorkloadError> {
    let mut workload = match name {
        "pointwise_gelu_4k" => pointwise_gelu(1 << 12),
        "pointwise_gelu_1m" => pointwise_gelu(1 << 20),
        "pointwise_gelu_16m" => pointwise_gelu(1 << 24),
        "softmax_4096x1024" => softmax(4096, 1024),
        "layernorm_4096x1024" => layer_norm(4096, 1024),
        "mlp_256x1024x4096" => mlp_workload(256, 1024, 4096),
        "attention_8x256x512" => attention(8, 256, 512, 8, 2048),
        "resnet_block_8x64x56" => resnet_block(8, 64, 56),
        "llama_block_4x256x512" => llama_block(4, 256, 512, 8, 4, 1408),
        "mlp_train_step_256" => mlp_train_step(256, 1024, 4096, 1e-3),
        _ => {
            return Err(WorkloadError::Unknown {
                found: name.to_string(),
            })
        }
    }?;
    workload.name = name.to_string();
    Ok(workload)
}

/// `gelu(x * w + b)` (erf form) with `x`, `w`, `b` of `n` elements each.
pub fn pointwise_gelu(n: usize) -> Result<Workload, WorkloadError> {
    let name = format!("pointwise_gelu_n{n}");
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[n]);
        let w = t.input("w", DType::F32, &[n]);
        let b = t.input("b", DType::F32, &[n]);
        vec![(&x * &w + &b).gelu()]
    })
    .map_err(|source| trace_error(&name, source))?;
    Ok(Workload {
        inputs: vec![
            uniform(&[n], -2.0, 2.0, 1),
            uniform(&[n], -2.0, 2.0, 2),
            uniform(&[n], -1.0, 1.0, 3),
        ],
        bytes_moved: f32_bytes(4 * n),
        flops: 0,
        bound: Bound::Memory,
        elements: n,
        graph,
        name,
    })
}

/// Softmax over the last dim of a `rows × cols` matrix.
pub fn softmax(rows: usize, cols: usize) -> Result<Workload, WorkloadError> {
    let name = format!("softmax_{rows}x{cols}");
    let graph = trace(|t| vec![t.input("x", DType::F32, &[rows, cols]).softmax(-1)])
        .map_err(|source| trace_error(&name, source))?;
    Ok(Workload {
        inputs: vec![uniform(&[rows, cols], -4.0, 4.0, 1)],
        bytes_moved: f32_bytes(2 * rows * cols),
        flops: 0,
        bound: Bound::Memory,
        elements: rows * cols,
        graph,
        name,
    })
}

/// Affine layer_norm over the last dim of a `rows × cols` matrix, eps 1e-5.
pub fn layer_norm(rows: usize, cols: usize) -> Result<Workload, WorkloadError> {
    let name = format!("layernorm_{rows}x{cols}");
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[rows, cols]);
        let g = t.input("g", DType::F32, &[cols]);
        let b = t.input("b", DType::F32, &[cols]);
        vec![x.layer_norm(&[cols], Some(&g), Some(&b), 1e-5)]
    })
    .map_err(|source| trace_error(&name, source))?;
    Ok(Workload {
        inputs: vec![
            uniform(&[rows, cols], -2.0, 2.0, 1),
            uniform(&[cols], 0.5, 1.5, 2),
            uniform(&[cols], -0.5, 0.5, 3),
        ],
        bytes_moved: f32_bytes(2 * rows * cols + 2 * cols),
        flops: 0,
        bound: Bound::Memory,
        elements: rows * cols,
        graph,
        name,
    })
}

/// `linear(width → hidden) → gelu → linear(hidden → width)` on `rows` rows. Weights are drawn
/// like PyTorch's default init (uniform in ±1/√fan_in), so activations stay O(1).
pub fn mlp_workload(rows: usize, width: usize, hidden: usize) -> Result<Workload, WorkloadError> {
    let name = format!("mlp_{rows}x{width}x{hidden}");
    let specs = [
        symmetric("x", &[rows, width], 1.0),
        symmetric("w1", &[hidden, width], init_bound(width)),
        symmetric("b1", &[hidden], init_bound(width)),
        symmetric("w2", &[width, hidden], init_bound(hidden)),
        symmetric("b2", &[width], init_bound(hidden)),
    ];
    let graph = trace_named(&name, &specs, |i| {
        mlp(&i["x"], &i["w1"], &i["b1"], &i["w2"], &i["b2"])
    })?;
    let inputs = random_inputs(&specs);
    let outputs = rows * width;
    Ok(Workload {
        bytes_moved: f32_bytes(inputs.iter().map(Tensor::numel).sum::<usize>() + outputs),
        flops: 2 * 2 * (rows * width * hidden) as u64,
        bound: Bound::Compute,
        elements: outputs,
        inputs,
        graph,
        name,
    })
}

/// One SGD step of the MLP on `rows` rows: the mse loss against a target `t`, its gradients with
/// respect to w1, b1, w2, b2 (the joint graph), and each parameter less `lr` times its gradient.
/// Five GEMMs: two forward, three backward (the input's gradient is not needed).
pub fn mlp_train_step(
    rows: usize,
    width: usize,
    hidden: usize,
    lr: f64,
) -> Result<Workload, WorkloadError> {
    let name = format!("mlp_train_step_{rows}");
    let specs = [
        symmetric("x", &[rows, width], 1.0),
        symmetric("t", &[rows, width], 1.0),
        symmetric("w1", &[hidden, width], 1.0),
        symmetric("b1", &[hidden], 1.0),
        symmetric("w2", &[width, hidden], 1.0),
        symmetric("b2", &[width], 1.0),
    ];
    let graph = {
        let tracer = Tracer::new();
        let i: HashMap<String, Traced> = specs
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    tracer.input(s.name, DType::F32, &s.shape),
                )
            })
            .collect();
        let params = [&i["w1"], &i["b1"], &i["w2"], &i["b2"]];
        let loss = mlp(&i["x"], params[0], params[1], params[2], params[3]).mse_loss(&i["t"]);
        let grads = loss.grad(&params);
        let mut outputs = vec![loss];
        outputs.extend(params.iter().zip(&grads).map(|(p, g)| *p - g * lr));
        tracer
            .finish(&outputs)
            .map_err(|source| trace_error(&name, source))?
    };
    let inputs = random_inputs(&specs);
    let params: usize = inputs[2..].iter().map(Tensor::numel).sum();
    Ok(Workload {
        bytes_moved: f32_bytes(inputs.iter().map(Tensor::numel).sum::<usize>() + params + 1),
        flops: 5 * 2 * (rows * width * hidden) as u64,
        bound: Bound::Compute,
        elements: rows * width,
        inputs,
        graph,
        name,
    })
}

/// A pre-LN transformer block: `y = x + attn(ln1(x)); out = y + mlp(ln2(y))`, with `heads`
/// heads of width `width / heads`, scaled dot-product attention (softmax, no mask) and an MLP of
/// width `mlp_width` with gelu.
pub fn attention(
    batch: usize,
    seq: usize,
    width: usize,
    heads: usize,
    mlp_width: usize,
) -> Result<Workload, WorkloadError> {
    let name = format!("attention_{batch}x{seq}x{width}");
    let (w, m) = (width, mlp_width);
    let gain = |name| InputSpec {
        name,
        shape: vec![w],
        low: 0.8,
        high: 1.2,
    };
    let specs = [
        symmetric("x", &[batch, seq, w], 1.0),
        gain("g1"),
        symmetric("bb1", &[w], 0.1),
        symmetric("wqkv", &[3 * w, w], init_bound(w)),
        symmetric("bqkv", &[3 * w], init_bound(w)),
        symmetric("wo", &[w, w], init_bound(w)),
        symmetric("bo", &[w], init_bound(w)),
        gain("g2"),
        symmetric("bb2", &[w], 0.1),
        symmetric("w1", &[m, w], init_bound(w)),
        symmetric("b1", &[m], init_bound(w)),
        symmetric("w2", &[w, m], init_bound(m)),
        symmetric("b2", &[w], init_bound(m)),
    ];
    let graph = trace_named(&name, &specs, |i| transformer_block(i, heads))?;
    let inputs = random_inputs(&specs);
    let tokens = batch * seq;
    let head_dim = width / heads;
    let gemm = |m: usize, n: usize, k: usize| 2 * (m * n * k) as u64;
    let flops = gemm(tokens, 3 * w, w) // qkv projection
        + 2 * (batch * heads) as u64 * gemm(seq, seq, head_dim) // q·kᵀ and p·v
        + gemm(tokens, w, w) // output projection
        + gemm(tokens, m, w)
        + gemm(tokens, w, m); // MLP
    Ok(Workload {
        bytes_moved: f32_bytes(inputs.iter().map(Tensor::numel).sum::<usize>() + tokens * w),
        flops,
        bound: Bound::Compute,
        elements: tokens * w,
        inputs,
        graph,
        name,
    })
}

/// The ResNet basic block of `torch_suite.py` on `[batch, channels, size, size]`: weights
/// `[channels, channels, 3, 3]` (uniform in ±0.1, about PyTorch's `randn · 0.06`), batch-norm
/// means in ±0.1, variances in [0.5, 1.5), gains in [0.9, 1.1), shifts in ±0.1.
pub fn resnet_block(batch: usize, channels: usize, size: usize) -> Result<Workload, WorkloadError> {
    let name = format!("resnet_block_{batch}x{channels}x{size}");
    let c = channels;
    let mut specs = vec![symmetric("x", &[batch, c, size, size], 1.0)];
    for (w, m, v, g, b) in [
        ("w1", "m1", "v1", "g1", "b1"),
        ("w2", "m2", "v2", "g2", "b2"),
    ] {
        specs.push(symmetric(w, &[c, c, 3, 3], 0.1));
        specs.push(symmetric(m, &[c], 0.1));
        specs.push(InputSpec {
            name: v,
            shape: vec![c],
            low: 0.5,
            high: 1.5,
        });
        specs.push(InputSpec {
            name: g,
            shape: vec![c],
            low: 0.9,
            high: 1.1,
        });
        specs.push(symmetric(b, &[c], 0.1));
    }
    let graph = trace_named(&name, &specs, suite_resnet_block)?;
    let inputs = random_inputs(&specs);
    let outputs = batch * c * size * size;
    let conv = 2 * (outputs * c * 9) as u64;
    Ok(Workload {
        bytes_moved: f32_bytes(inputs.iter().map(Tensor::numel).sum::<usize>() + outputs),
        flops: 2 * conv,
        bound: Bound::Compute,
        elements: outputs,
        inputs,
        graph,
        name,
    })
}

/// The LLaMA-style block of `torch_suite.py` (RMSNorm, `heads` query and `kv_heads` key-value
/// heads with rotary embeddings, causal attention, a SwiGLU MLP of width `mlp_width`) on
/// `[batch, seq, width]`.
pub fn llama_block(
    batch: usize,
    seq: usize,
    width: usize,
    heads: usize,
    kv_heads: usize,
    mlp_width: usize,
) -> Result<Workload, WorkloadError> {
    let name = format!("llama_block_{batch}x{seq}x{width}");
    let (w, m) = (width, mlp_width);
    let kv = w / heads * kv_heads;
    let gain = |name| InputSpec {
        name,
        shape: vec![w],
        low: 0.8,
        high: 1.2,
    };
    let specs = [
        symmetric("x", &[batch, seq, w], 1.0),
        gain("g1"),
        symmetric("wq", &[w, w], init_bound(w)),
        symmetric("wk", &[kv, w], init_bound(w)),
        symmetric("wv", &[kv, w], init_bound(w)),
        symmetric("wo", &[w, w], init_bound(w)),
        gain("g2"),
        symmetric("wg", &[m, w], init_bound(w)),
        symmetric("wu", &[m, w], init_bound(w)),
        symmetric("wd", &[w, m], init_bound(m)),
    ];
    let graph = trace_named(&name, &specs, |i| {
        suite_llama_block(i, heads as isize, kv_heads as isize)
    })?;
    let inputs = random_inputs(&specs);
    let tokens = batch * seq;
    let gemm = |m: usize, n: usize, k: usize| 2 * (m * n * k) as u64;
    let flops = gemm(tokens, w, w) + 2 * gemm(tokens, kv, w) // q, k, v projections
        + 2 * (batch * heads) as u64 * gemm(seq, seq, w / heads) // q·kᵀ and p·v
        + gemm(tokens, w, w) // output projection
        + 2 * gemm(tokens, m, w) + gemm(tokens, w, m); // SwiGLU MLP
    Ok(Workload {
        bytes_moved: f32_bytes(inputs.iter().map(Tensor::numel).sum::<usize>() + tokens * w),
        flops,
        bound: Bound::Compute,
        elements: tokens * w,
        inputs,
        graph,
        name,
    })
}

/// `pointwise_gelu` at each element count of `sizes`.
pub fn pointwise_gelu_sweep(sizes: &[usize]) -> Result<Vec<Workload>, WorkloadError> {
    sizes.iter().map(|&n| pointwise_gelu(n)).collect()
}

/// `softmax` over rows of `cols` at each row count of `rows`.
pub fn softmax_sweep(rows: &[usize], cols: usize) -> Result<Vec<Workload>, WorkloadError> {
    rows.iter().map(|&r| softmax(r, cols)).collect()
}

/// Width, heads, vocabulary, batch and sequence length of [`gpt_decoder`].
pub const DECODER_WIDTH: usize = 64;
pub const DECODER_HEADS: usize = 4;
pub const DECODER_VOCAB: usize = 128;
pub const DECODER_BATCH: usize = 2;
pub const DECODER_LENGTH: usize = 16;

/// The GPT-style decoder of the golden models (`golden::models::gpt_forward`: pre-LN blocks,
/// causal attention, tanh-GELU MLP of width 4·64, tied embeddings) with `layers` blocks, width
/// 64, 4 heads, a vocabulary of 128, on 2 sequences of 16 tokens: the logits and the argmax next
/// token. Weights are uniform in ±1/√fan_in, gains in [0.8, 1.2); token ids cycle through the
/// vocabulary. The compile benchmark (`minductor compile`) builds it at several depths: its graph
/// grows by the same block per layer.
pub fn gpt_decoder(layers: usize) -> Result<Workload, WorkloadError> {
    decoder(layers, None)
}

/// One SGD step of [`gpt_decoder`]: the cross-entropy of its logits against the token ids
/// themselves, its gradients with respect to every weight (the joint graph, partitioned), and
/// each weight less `lr` times its gradient: a training graph that grows by one block per layer,
/// for the compile benchmark (`minductor compile --train`).
pub fn gpt_decoder_train_step(layers: usize, lr: f64) -> Result<Workload, WorkloadError> {
    decoder(layers, Some(lr))
}

/// The decoder's forward pass, or with a learning rate its SGD step.
fn decoder(layers: usize, lr: Option<f64>) -> Result<Workload, WorkloadError> {
    let name = match lr {
        None => format!("gpt_decoder_{layers}l"),
        Some(_) => format!("gpt_decoder_train_{layers}l"),
    };
    let (w, vocab) = (DECODER_WIDTH, DECODER_VOCAB);
    let (batch, length) = (DECODER_BATCH, DECODER_LENGTH);
    // (name, shape, low, high) of every f32 input after the token ids, in tracing order.
    let mut specs: Vec<(String, Vec<usize>, f32, f32)> = vec![
        ("wte".into(), vec![vocab, w], -0.5, 0.5),
        ("wpe".into(), vec![length, w], -0.5, 0.5),
        ("lnf.g".into(), vec![w], 0.8, 1.2),
        ("lnf.b".into(), vec![w], -0.1, 0.1),
    ];
    for l in 0..layers {
        let b = init_bound(w);
        let b4 = init_bound(4 * w);
        for (p, shape, low, high) in [
            ("ln1.g", vec![w], 0.8, 1.2),
            ("ln1.b", vec![w], -0.1, 0.1),
            ("qkv.w", vec![3 * w, w], -b, b),
            ("qkv.b", vec![3 * w], -b, b),
            ("proj.w", vec![w, w], -b, b),
            ("proj.b", vec![w], -b, b),
            ("ln2.g", vec![w], 0.8, 1.2),
            ("ln2.b", vec![w], -0.1, 0.1),
            ("fc.w", vec![4 * w, w], -b, b),
            ("fc.b", vec![4 * w], -b, b),
            ("out.w", vec![w, 4 * w], -b4, b4),
            ("out.b", vec![w], -b4, b4),
        ] {
            specs.push((format!("h{l}.{p}"), shape, low, high));
        }
    }
    let tracer = Tracer::new();
    let mut named = HashMap::new();
    named.insert(
        "idx".to_string(),
        tracer.input("idx", DType::I64, &[batch, length]),
    );
    for (n, shape, _, _) in &specs {
        named.insert(n.clone(), tracer.input(n, DType::F32, shape));
    }
    let mut outputs = crate::golden::models::gpt_forward(&named);
    if let Some(lr) = lr {
        let logits = outputs[0].reshape(&[(batch * length) as isize, vocab as isize]);
        let targets = named["idx"].reshape(&[(batch * length) as isize]);
        let loss = logits.cross_entropy(&targets);
        let params: Vec<&Traced> = specs.iter().map(|(n, ..)| &named[n]).collect();
        let grads = loss.grad(&params);
        outputs = vec![loss];
        outputs.extend(params.iter().zip(&grads).map(|(p, g)| *p - g * lr));
    }
    let graph = tracer
        .finish(&outputs)
        .map_err(|source| trace_error(&name, source))?;
    let ids: Vec<i64> = (0..batch * length)
        .map(|i| (i * 37 % vocab) as i64)
        .collect();
    let mut inputs =
        vec![Tensor::from_vec(&[batch, length], ids).expect("ids have the shape's count")];
    inputs.extend(
        specs
            .iter()
            .enumerate()
            .map(|(seed, (_, shape, low, high))| uniform(shape, *low, *high, seed as u64 + 1)),
    );
    let tokens = batch * length;
    let gemm = |m: usize, n: usize, k: usize| 2 * (m * n * k) as u64;
    let per_layer = gemm(tokens, 3 * w, w)
        + 2 * (batch * DECODER_HEADS) as u64 * gemm(length, length, w / DECODER_HEADS)
        + gemm(tokens, w, w)
        + 2 * gemm(tokens, 4 * w, w);
    let forward = layers as u64 * per_layer + gemm(tokens, vocab, w);
    Ok(Workload {
        bytes_moved: f32_bytes(
            inputs.iter().skip(1).map(Tensor::numel).sum::<usize>() + tokens * vocab,
        ) + 8 * (2 * tokens) as u64,
        // A backward pass costs about two forward ones.
        flops: if lr.is_some() { 3 * forward } else { forward },
        bound: Bound::Compute,
        elements: tokens * w,
        inputs,
        graph,
        name,
    })
}

/// Deterministic values uniform in `[low, high)` from a splitmix64 stream seeded by `seed`.
pub fn uniform(shape: &[usize], low: f32, high: f32, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let data = (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // The top 24 bits give a float in [0, 1) exactly.
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
            low + (high - low) * unit
        })
        .collect();
    Tensor::from_vec(shape, data).expect("the data has the shape's element count")
}

fn f32_bytes(elements: usize) -> u64 {
    (elements * std::mem::size_of::<f32>()) as u64
}

fn init_bound(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}

fn trace_error(name: &str, source: TraceError) -> WorkloadError {
    WorkloadError::Trace {
        name: name.to_string(),
        source,
    }
}

/// An input of a traced workload: its name, shape and the range its random values are drawn from.
struct InputSpec {
    name: &'static str,
    shape: Vec<usize>,
    low: f32,
    high: f32,
}

fn symmetric(name: &'static str, shape: &[usize], bound: f32) -> InputSpec {
    InputSpec {
        name,
        shape: shape.to_vec(),
        low: -bound,
        high: bound,
    }
}

/// Traces `build` over inputs declared in the order of `specs`, looked up by name.
fn trace_named(
    name: &str,
    specs: &[InputSpec],
    build: impl FnOnce(&HashMap<String, Traced>) -> Traced,
) -> Result<Graph, WorkloadError> {
    let tracer = Tracer::new();
    let mut inputs = HashMap::new();
    for spec in specs {
        let input = tracer.input(spec.name, DType::F32, &spec.shape);
        inputs.insert(spec.name.to_string(), input);
    }
    let output = build(&inputs);
    tracer
        .finish(&[output])
        .map_err(|source| trace_error(name, source))
}

/// One input per spec, each from its own seed.
fn random_inputs(specs: &[InputSpec]) -> Vec<Tensor> {
    specs
        .iter()
        .enumerate()
        .map(|(seed, spec)| uniform(&spec.shape, spec.low, spec.high, seed as u64 + 1))
        .collect()
}

//! The cases of `../shared/golden-models`: the new ops (shape ops, indexing, losses, masks,
//! scans, arg-reductions, attention, convolution, pooling, normalisation) and the models (a
//! ResNet basic block, a small ResNet, a LLaMA-style block, a GPT-style decoder at three
//! lengths), each built from the shapes in its file, like `gen_models.py` builds it.

use super::Build;
use minductor::{ConvOptions, CrossEntropyOptions, DType, Traced};
use std::collections::HashMap;

/// `F.batch_norm(x, p[k.mean], p[k.var], p[k.w], p[k.b], training=False, eps=1e-5)`.
fn bn(x: &Traced, p: &HashMap<String, Traced>, k: &str) -> Traced {
    let at = |name: &str| &p[&format!("{k}.{name}")];
    x.batch_norm(at("mean"), at("var"), Some(at("w")), Some(at("b")), 1e-5)
}

/// The ResNet basic block of `gen_models.py` with parameters under `k`.
fn basic_block(x: &Traced, p: &HashMap<String, Traced>, k: &str, stride: usize) -> Traced {
    let conv3 = ConvOptions::default().stride(stride).padding(1);
    let y = bn(
        &x.conv2d(&p[&format!("{k}.conv1")], None, conv3),
        p,
        &format!("{k}.bn1"),
    )
    .relu();
    let y = bn(
        &y.conv2d(
            &p[&format!("{k}.conv2")],
            None,
            ConvOptions::default().padding(1),
        ),
        p,
        &format!("{k}.bn2"),
    );
    let shortcut = match p.get(&format!("{k}.down")) {
        Some(down) => bn(
            &x.conv2d(down, None, ConvOptions::default().stride(stride)),
            p,
            &format!("{k}.bnd"),
        ),
        None => x.clone(),
    };
    (y + shortcut).relu()
}

/// `x * rsqrt(mean(x², -1) + 1e-6) * g`.
fn rms_norm(x: &Traced, g: &Traced) -> Traced {
    x * ((x * x).mean(&[-1], true) + 1e-6).rsqrt() * g
}

/// `x · cos + rotate_half(x) · sin` for `angles: [T, D/2]` (the rotary embedding of `x: [B,
/// H, T, D]`, with `rotate_half(x) = cat(−x[.., D/2:], x[.., :D/2])`).
fn rotate(x: &Traced, angles: &Traced) -> Traced {
    let d = x.shape().get(3).copied().unwrap_or(0);
    let (cos, sin) = (angles.cos(), angles.sin());
    let cos = Traced::cat(&[&cos, &cos], -1);
    let sin = Traced::cat(&[&sin, &sin], -1);
    let half = (d / 2) as isize;
    let x1 = x.slice(-1, None, Some(half), 1);
    let x2 = x.slice(-1, Some(half), None, 1);
    x * cos + Traced::cat(&[&-x2, &x1], -1) * sin
}

/// `10000 ** (arange(0, d, 2) / d)` as `[1, d/2]`, and the positions `arange(t)` as `[t, 1]`
/// (f32).
fn rotary_frequencies(x: &Traced) -> (Traced, Traced) {
    let size = |dim: usize| x.shape().get(dim).copied().unwrap_or(0);
    let (t, d) = (size(2), size(3));
    let tracer = x.tracer();
    let exponents = tracer.arange_range(0.0, d as f64, 2.0, DType::F32) / d as f64;
    let frequencies = exponents.full_like(10000.0).pow(&exponents);
    let positions = tracer
        .arange(t, DType::I64)
        .reshape(&[t as isize, 1])
        .cast(DType::F32);
    (frequencies.reshape(&[1, (d / 2) as isize]), positions)
}

/// `gen_models.py`'s `rope`: angles `pos · (1 / 10000^(2i/d))`.
fn rope(x: &Traced) -> Traced {
    let (frequencies, positions) = rotary_frequencies(x);
    rotate(x, &(positions * frequencies.reciprocal()))
}

/// `torch_suite.py`'s `rope`: angles `pos / 10000^(2i/d)`.
fn rope_divided(x: &Traced) -> Traced {
    let (frequencies, positions) = rotary_frequencies(x);
    rotate(x, &(positions / frequencies))
}

/// The LLaMA-style block of `gen_models.py` (4 query heads, 2 key-value heads, rotary
/// embeddings of q and k).
fn llama_block(i: &HashMap<String, Traced>) -> Traced {
    llama_block_with(i, 4, 2, rope)
}

/// The LLaMA-style block of `torch_suite.py`'s `llama_block` (the `llama_block_4x256x512`
/// workload) with `heads` query heads and `kv_heads` key-value heads, over inputs named x, g1,
/// wq, wk, wv, wo, g2, wg, wu, wd.
pub(crate) fn suite_llama_block(
    i: &HashMap<String, Traced>,
    heads: isize,
    kv_heads: isize,
) -> Traced {
    llama_block_with(i, heads, kv_heads, rope_divided)
}

fn llama_block_with(
    i: &HashMap<String, Traced>,
    heads: isize,
    kv_heads: isize,
    rope: fn(&Traced) -> Traced,
) -> Traced {
    let x = &i["x"];
    let shape = x.shape();
    let (b, t, d) = (shape[0] as isize, shape[1] as isize, shape[2] as isize);
    let hd = d / heads;
    let h = rms_norm(x, &i["g1"]);
    let project = |w: &str, n: isize| {
        h.linear(&i[w], None)
            .reshape(&[b, t, n, hd])
            .transpose(1, 2)
    };
    let (q, k, v) = (
        project("wq", heads),
        project("wk", kv_heads),
        project("wv", kv_heads),
    );
    let (q, k) = (rope(&q), rope(&k));
    let repeats = (heads / kv_heads) as usize;
    let (k, v) = (
        k.repeat_interleave(repeats, 1),
        v.repeat_interleave(repeats, 1),
    );
    let a = q
        .scaled_dot_product_attention(&k, &v, None, true)
        .transpose(1, 2)
        .reshape(&[b, t, d]);
    let y = x + a.linear(&i["wo"], None);
    let n2 = rms_norm(&y, &i["g2"]);
    let gated = n2.linear(&i["wg"], None).silu() * n2.linear(&i["wu"], None);
    &y + gated.linear(&i["wd"], None)
}

/// `torch_suite.py`'s `resnet_block` (the `resnet_block_8x64x56` workload): two 3x3
/// convolutions with padding 1, each followed by eval batch norm, a ReLU after the first and
/// after the residual add, over inputs named x, w1, m1, v1, g1, b1, w2, m2, v2, g2, b2.
pub(crate) fn suite_resnet_block(i: &HashMap<String, Traced>) -> Traced {
    let conv = ConvOptions::default().padding(1);
    let bn = |y: Traced, n: &str| {
        let at = |p: &str| &i[&format!("{p}{n}")];
        y.batch_norm(at("m"), at("v"), Some(at("g")), Some(at("b")), 1e-5)
    };
    let x = &i["x"];
    let y = bn(x.conv2d(&i["w1"], None, conv), "1").relu();
    (bn(y.conv2d(&i["w2"], None, conv), "2") + x).relu()
}

/// The GPT-2-style decoder of `gen_models.py` (4 heads, tied embeddings): the logits and the
/// argmax next token of each sequence. The number of layers is the number of `hN.` blocks.
pub fn gpt_forward(i: &HashMap<String, Traced>) -> Vec<Traced> {
    let idx = &i["idx"];
    let layers = (0..)
        .take_while(|l| i.contains_key(&format!("h{l}.ln1.g")))
        .count();
    let heads = 4isize;
    // Sizes read as numbers (0 if an earlier error poisoned a value: tracing then fails). The
    // sequence length is never read: under `jit` it may be symbolic, so reshapes name it `-1`
    // and the positions are an arange of its dim.
    let size = |x: &Traced, d: usize| x.dims().get(d).map_or(0, |d| d.size());
    let b = size(idx, 0) as isize;
    let width = size(&i["wte"], 1);
    let di = width as isize;
    let hd = di / heads;
    let Some(t) = idx.dims().get(1).cloned() else {
        // A poisoned or wrongly ranked input: the embedding below reports it.
        return vec![idx.embedding(&i["wte"]); 2];
    };
    let positions = idx.tracer().arange_of(t, DType::I64);
    let mut x = idx.embedding(&i["wte"]) + positions.embedding(&i["wpe"]);
    let p = |l: usize, name: &str| &i[&format!("h{l}.{name}")];
    for l in 0..layers {
        let h = x.layer_norm(&[width], Some(p(l, "ln1.g")), Some(p(l, "ln1.b")), 1e-5);
        // `split(width, -1)` into q, k, v, as slices (a poisoned value still gives three).
        let qkv = h.linear(p(l, "qkv.w"), Some(p(l, "qkv.b")));
        let heads_of = |n: isize| {
            qkv.slice(-1, Some(n * di), Some((n + 1) * di), 1)
                .reshape(&[b, -1, heads, hd])
                .transpose(1, 2)
        };
        let (q, k, v) = (heads_of(0), heads_of(1), heads_of(2));
        let a = q
            .scaled_dot_product_attention(&k, &v, None, true)
            .transpose(1, 2)
            .reshape(&[b, -1, di]);
        x = &x + a.linear(p(l, "proj.w"), Some(p(l, "proj.b")));
        let h = x.layer_norm(&[width], Some(p(l, "ln2.g")), Some(p(l, "ln2.b")), 1e-5);
        let mlp = h
            .linear(p(l, "fc.w"), Some(p(l, "fc.b")))
            .gelu_tanh()
            .linear(p(l, "out.w"), Some(p(l, "out.b")));
        x = &x + mlp;
    }
    let logits = x
        .layer_norm(&[width], Some(&i["lnf.g"]), Some(&i["lnf.b"]), 1e-5)
        .linear(&i["wte"], None);
    let next = logits
        .slice(1, Some(-1), None, 1)
        .squeeze(1)
        .argmax(-1, false);
    vec![logits, next]
}

/// The inputs of the GPT-style decoder cases, in the order `gpt_forward` is traced with.
pub const GPT_INPUTS: &[&str] = &[
    "idx",
    "wte",
    "wpe",
    "lnf.g",
    "lnf.b",
    "h0.ln1.g",
    "h0.ln1.b",
    "h0.qkv.w",
    "h0.qkv.b",
    "h0.proj.w",
    "h0.proj.b",
    "h0.ln2.g",
    "h0.ln2.b",
    "h0.fc.w",
    "h0.fc.b",
    "h0.out.w",
    "h0.out.b",
    "h1.ln1.g",
    "h1.ln1.b",
    "h1.qkv.w",
    "h1.qkv.b",
    "h1.proj.w",
    "h1.proj.b",
    "h1.ln2.g",
    "h1.ln2.b",
    "h1.fc.w",
    "h1.fc.b",
    "h1.out.w",
    "h1.out.b",
];

const BASIC_BLOCK: &[&str] = &[
    "x",
    "blk.conv1",
    "blk.conv2",
    "blk.bn1.mean",
    "blk.bn1.var",
    "blk.bn1.w",
    "blk.bn1.b",
    "blk.bn2.mean",
    "blk.bn2.var",
    "blk.bn2.w",
    "blk.bn2.b",
];

/// The small ResNet of `gen_models.py`: a stem conv-bn-relu, three basic blocks (16, 32 with
/// stride 2, 64 with stride 2), `max_pool2d(2)`, global average pooling and a linear layer: class
/// scores of the images `x`. Inputs are named as in `model_tiny_resnet.safetensors`.
pub fn tiny_resnet(i: &HashMap<String, Traced>) -> Traced {
    let stem = i["x"].conv2d(&i["stem"], None, ConvOptions::default().padding(1));
    let y = bn(&stem, i, "stem_bn").relu();
    let y = basic_block(&y, i, "l1", 1);
    let y = basic_block(&y, i, "l2", 2);
    let y = basic_block(&y, i, "l3", 2);
    let pooled = y
        .max_pool2d(2, 2, 0)
        .adaptive_avg_pool2d((1, 1))
        .flatten(1, -1);
    pooled.linear(&i["fc.w"], Some(&i["fc.b"]))
}

/// The inputs of `tiny_resnet`, in the order it is traced with.
pub const TINY_RESNET: &[&str] = &[
    "x",
    "stem",
    "stem_bn.mean",
    "stem_bn.var",
    "stem_bn.w",
    "stem_bn.b",
    "l1.conv1",
    "l1.conv2",
    "l1.bn1.mean",
    "l1.bn1.var",
    "l1.bn1.w",
    "l1.bn1.b",
    "l1.bn2.mean",
    "l1.bn2.var",
    "l1.bn2.w",
    "l1.bn2.b",
    "l2.conv1",
    "l2.conv2",
    "l2.bn1.mean",
    "l2.bn1.var",
    "l2.bn1.w",
    "l2.bn1.b",
    "l2.bn2.mean",
    "l2.bn2.var",
    "l2.bn2.w",
    "l2.bn2.b",
    "l2.down",
    "l2.bnd.mean",
    "l2.bnd.var",
    "l2.bnd.w",
    "l2.bnd.b",
    "l3.conv1",
    "l3.conv2",
    "l3.bn1.mean",
    "l3.bn1.var",
    "l3.bn1.w",
    "l3.bn1.b",
    "l3.bn2.mean",
    "l3.bn2.var",
    "l3.bn2.w",
    "l3.bn2.b",
    "l3.down",
    "l3.bnd.mean",
    "l3.bnd.var",
    "l3.bnd.w",
    "l3.bnd.b",
    "fc.w",
    "fc.b",
];

pub(super) fn builder(name: &str) -> Option<(&'static [&'static str], Build)> {
    Some(match name {
        "op_split_chunk" => (&["x"], |i| {
            let x = &i["x"];
            let third = x.shape().last().copied().unwrap_or(0) / 3;
            let qkv = x.split(third, -1);
            let halves = x.chunk(2, 0);
            vec![&qkv[0] * &qkv[1] + &qkv[2], &halves[0] - &halves[1]]
        }),
        "op_logsumexp" => (&["x"], |i| vec![i["x"].logsumexp(&[-1], false)]),
        "op_gather" => (&["x", "idx"], |i| vec![i["x"].gather(1, &i["idx"])]),
        "op_index_select" => (&["x", "idx"], |i| vec![i["x"].index_select(0, &i["idx"])]),
        "op_cross_entropy" => (&["logits", "y", "y_ign"], |i| {
            let logits = &i["logits"];
            let smoothed = CrossEntropyOptions {
                ignore_index: -100,
                label_smoothing: 0.1,
            };
            vec![
                logits.cross_entropy(&i["y"]),
                logits.cross_entropy_with(&i["y_ign"], smoothed),
            ]
        }),
        "op_pad" => (&["x"], |i| vec![i["x"].pad(&[1, 2, 0, 1], 0.0)]),
        "op_squeeze_unsqueeze_flatten" => (&["x"], |i| {
            vec![i["x"].unsqueeze(1).squeeze(-1).flatten(1, -1) * 2.0]
        }),
        "op_sdpa_mask" => (&["q", "k", "v", "m"], |i| {
            vec![i["q"].scaled_dot_product_attention(&i["k"], &i["v"], Some(&i["m"]), false)]
        }),
        "op_causal_mask_softmax" => (&["x"], |i| {
            let x = &i["x"];
            let n = *x.shape().last().unwrap_or(&0);
            let mask = x.tracer().ones(&[n, n], DType::Bool).triu(1);
            vec![x.masked_fill(&mask, f64::NEG_INFINITY).softmax(-1)]
        }),
        "op_tril_arange" => (&["x"], |i| {
            let x = &i["x"];
            let n = *x.shape().last().unwrap_or(&0);
            vec![x.tril(0) + x.tracer().arange(n, DType::I64) * 0.5]
        }),
        "op_argmax_max" => (&["x"], |i| {
            let x = &i["x"];
            let (values, indices) = x.max_dim(1, false);
            vec![x.argmax(-1, false), values, indices, x.argmin(0, false)]
        }),
        "op_cumsum" => (&["x"], |i| vec![i["x"].cumsum(-1), i["x"].cumsum(0)]),
        "op_sdpa_causal" => (&["q", "k", "v"], |i| {
            vec![i["q"].scaled_dot_product_attention(&i["k"], &i["v"], None, true)]
        }),
        "op_conv2d" => (&["x", "w", "b"], |i| {
            vec![i["x"].conv2d(&i["w"], Some(&i["b"]), ConvOptions::default().padding(1))]
        }),
        "op_conv2d_stride_dilation" => (&["x", "w", "b"], |i| {
            let options = ConvOptions::default().stride(2).padding(2).dilation(2);
            vec![i["x"].conv2d(&i["w"], Some(&i["b"]), options)]
        }),
        "op_conv2d_groups" => (&["x", "w"], |i| {
            vec![i["x"].conv2d(&i["w"], None, ConvOptions::default().padding(1).groups(4))]
        }),
        "op_conv2d_depthwise" => (&["x", "w", "b"], |i| {
            let channels = i["x"].shape()[1];
            let options = ConvOptions::default().padding(2).groups(channels);
            vec![i["x"].conv2d(&i["w"], Some(&i["b"]), options)]
        }),
        "op_conv2d_1x1" => (&["x", "w"], |i| {
            vec![i["x"].conv2d(&i["w"], None, ConvOptions::default())]
        }),
        "op_conv1d" => (&["x", "w", "b"], |i| {
            vec![i["x"].conv1d(&i["w"], Some(&i["b"]), ConvOptions::default().padding(2))]
        }),
        "op_max_pool2d" => (&["x"], |i| vec![i["x"].max_pool2d(3, 2, 1)]),
        "model_resnet_basic_block" => (BASIC_BLOCK, |i| vec![basic_block(&i["x"], i, "blk", 1)]),
        "model_tiny_resnet" => (TINY_RESNET, |i| vec![tiny_resnet(i)]),
        "model_llama_block" => (
            &["x", "g1", "wq", "wk", "wv", "wo", "g2", "wg", "wu", "wd"],
            |i| vec![llama_block(i)],
        ),
        "model_gpt_tiny_t7" | "model_gpt_tiny_t13" | "model_gpt_tiny_t31" => {
            (GPT_INPUTS, gpt_forward)
        }
        "op_avg_pool2d" => (&["x"], |i| vec![i["x"].avg_pool2d(2)]),
        "op_adaptive_avg_pool2d" => (&["x"], |i| vec![i["x"].adaptive_avg_pool2d((1, 1))]),
        "op_batch_norm_eval" => (&["x", "mean", "var", "w", "b"], |i| {
            vec![i["x"].batch_norm(&i["mean"], &i["var"], Some(&i["w"]), Some(&i["b"]), 1e-5)]
        }),
        "op_group_norm" => (&["x", "w", "b"], |i| {
            vec![i["x"].group_norm(4, Some(&i["w"]), Some(&i["b"]), 1e-5)]
        }),
        _ => return None,
    })
}

/// The cases of `golden-models` this runner builds: all of them.
pub const SUPPORTED: [&str; 30] = [
    "op_causal_mask_softmax",
    "op_tril_arange",
    "op_split_chunk",
    "op_argmax_max",
    "op_cumsum",
    "op_logsumexp",
    "op_gather",
    "op_index_select",
    "op_cross_entropy",
    "op_pad",
    "op_squeeze_unsqueeze_flatten",
    "op_sdpa_causal",
    "op_sdpa_mask",
    "op_conv2d",
    "op_conv2d_stride_dilation",
    "op_conv2d_groups",
    "op_conv2d_depthwise",
    "op_conv2d_1x1",
    "op_conv1d",
    "op_max_pool2d",
    "op_avg_pool2d",
    "op_adaptive_avg_pool2d",
    "op_batch_norm_eval",
    "op_group_norm",
    "model_resnet_basic_block",
    "model_tiny_resnet",
    "model_llama_block",
    "model_gpt_tiny_t7",
    "model_gpt_tiny_t13",
    "model_gpt_tiny_t31",
];

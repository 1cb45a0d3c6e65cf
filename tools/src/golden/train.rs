//! The autodiff cases of the golden suite (`train_*`): a loss, then its gradients with respect to
//! the inputs the case's note names, in that order. The optimizer cases run through
//! [`minductor::train`] instead (see `super::run_case`).

use super::{compare_outputs, fail, load_tensors, mlp, transformer_block, Build, Case, CaseResult};
use minductor::{AdamW, Backend, Optimizer, Parameters, Sgd, Tensor, Traced, TrainStep};
use std::collections::HashMap;

/// `[loss, d loss / d each of wrt]`.
fn with_grads(loss: Traced, wrt: &[&Traced]) -> Vec<Traced> {
    let mut out = vec![loss.clone()];
    out.extend(loss.grad(wrt));
    out
}

fn params<'a>(i: &'a HashMap<String, Traced>, names: &[&str]) -> Vec<&'a Traced> {
    names.iter().map(|n| &i[*n]).collect()
}

/// The input order and the computation of each known gradient case.
pub(super) fn builder(name: &str) -> Option<(&'static [&'static str], Build)> {
    Some(match name {
        "train_mlp_mse_grads" => (&["x", "t", "w1", "b1", "w2", "b2"], |i| {
            let y = mlp(&i["x"], &i["w1"], &i["b1"], &i["w2"], &i["b2"]);
            with_grads(y.mse_loss(&i["t"]), &params(i, &["w1", "b1", "w2", "b2"]))
        }),
        "train_linear_cross_entropy_grads" => (&["x", "y", "w", "b"], |i| {
            let logits = i["x"].linear(&i["w"], Some(&i["b"]));
            with_grads(logits.cross_entropy(&i["y"]), &params(i, &["w", "b"]))
        }),
        "train_pointwise_grads" => (&["x", "w", "b"], |i| {
            let (x, w, b) = (&i["x"], &i["w"], &i["b"]);
            let terms = [
                (x * w + b).gelu(),
                x.silu() * w.tanh(),
                (b.sigmoid() + 1.0).log(),
                (-(x * x)).exp(),
                (x * x + 1.0).sqrt(),
                x / (w * w + 1.0),
                x.maximum(w),
                x.gt(0.0).where_(&(x * b), &b.abs()),
                w.erf() * (b * b + 1.0).rsqrt(),
                (x * x + 1.0).pow(1.5),
                x.sin() * w.cos(),
            ];
            let total = terms[1..].iter().fold(terms[0].clone(), |acc, t| acc + t);
            with_grads(total.sum(&[], false), &[x, w, b])
        }),
        "train_reduction_grads" => (&["x", "t"], |i| {
            let (x, t) = (&i["x"], &i["t"]);
            let loss = (x.softmax(-1) * t).sum(&[], false)
                + x.log_softmax(1).mean(&[], false)
                + x.amax(&[-1], false).sum(&[], false)
                + x.var(&[-1], false, false).sum(&[], false)
                + x.mean(&[0], false).pow(2.0).sum(&[], false);
            with_grads(loss, &[x])
        }),
        "train_layer_norm_grads" => (&["x", "g", "b", "t"], |i| {
            let (x, g, b) = (&i["x"], &i["g"], &i["b"]);
            let width = *x.shape().last().unwrap_or(&0);
            let loss = (x.layer_norm(&[width], Some(g), Some(b), 1e-5) * &i["t"]).sum(&[], false);
            with_grads(loss, &[x, g, b])
        }),
        "train_views_grads" => (&["a", "b", "c"], |i| {
            let (a, b, c) = (&i["a"], &i["b"], &i["c"]);
            let s = a.shape();
            let (s0, s1, s2) = (s[0] as isize, s[1] as isize, s[2] as isize);
            let loss = a
                .transpose(0, 1)
                .reshape(&[s1, -1])
                .slice(1, None, None, 3)
                .sum(&[], false)
                + Traced::cat(&[a, &(a * 2.0)], -1)
                    .sum(&[1], false)
                    .pow(2.0)
                    .mean(&[], false)
                + a.matmul(b).sin().sum(&[], false)
                + (a.slice(1, None, Some(1), 1) * c.expand(&[s0, 1, s2])).sum(&[], false)
                + a.bmm(&a.transpose(1, 2)).tanh().sum(&[], false);
            with_grads(loss, &[a, b, c])
        }),
        "train_embedding_grads" => (&["idx", "table", "w"], |i| {
            let (table, w) = (&i["table"], &i["w"]);
            let loss = (i["idx"].embedding(table) * w).sum(&[], false);
            with_grads(loss, &[table, w])
        }),
        "train_transformer_block_grads" => (
            &[
                "x", "g1", "bb1", "wqkv", "bqkv", "wo", "bo", "g2", "bb2", "w1", "b1", "w2", "b2",
                "t",
            ],
            |i| {
                let d = transformer_block(i, 4) - &i["t"];
                let loss = (&d * &d).mean(&[], false);
                let wrt = params(
                    i,
                    &[
                        "x", "g1", "bb1", "wqkv", "bqkv", "wo", "bo", "g2", "bb2", "w1", "b1",
                        "w2", "b2",
                    ],
                );
                with_grads(loss, &wrt)
            },
        ),
        _ => return None,
    })
}

/// The optimizer of an optimizer case (`train_sgd_momentum_mlp`, `train_adamw_mlp`), with the
/// settings gen.py uses.
pub(super) fn optimizer_case(name: &str) -> Option<Optimizer> {
    match name {
        "train_sgd_momentum_mlp" => Some(Sgd::new(0.1).momentum(0.9).into()),
        "train_adamw_mlp" => Some(
            AdamW::new(1e-2)
                .betas(0.9, 0.999)
                .eps(1e-8)
                .weight_decay(1e-2)
                .into(),
        ),
        _ => None,
    }
}

/// Runs as many steps of `optimizer` on the MLP's mse loss as the case has losses, through
/// [`TrainStep`] on `backend`; the outputs are the losses, then the parameters after the last step.
pub(super) fn run_optimizer_case(
    case: &Case,
    backend: Backend,
    optimizer: Optimizer,
    result: CaseResult,
) -> CaseResult {
    let tensors = match load_tensors(&case.file) {
        Ok(t) => t,
        Err(e) => return fail(result, e),
    };
    let names = ["w1", "b1", "w2", "b2"];
    let mut params = Parameters::new();
    for name in names {
        match tensors.get(name) {
            Some(t) => params.insert(name, t.clone()),
            None => return fail(result, format!("{name} missing from the file")),
        }
    }
    let (Some(x), Some(t)) = (tensors.get("x"), tensors.get("t")) else {
        return fail(result, "x or t missing from the file".into());
    };
    let steps = case
        .outputs
        .first()
        .and_then(|o| o.shape.first())
        .copied()
        .unwrap_or(0);
    let batch = [("x", x.dtype(), x.shape()), ("t", t.dtype(), t.shape())];
    let started = std::time::Instant::now();
    let train = TrainStep::with_backend(backend, params, optimizer, &batch, |p, b| {
        mlp(&b[0], &p["w1"], &p["b1"], &p["w2"], &p["b2"]).mse_loss(&b[1])
    });
    let mut train = match train {
        Ok(train) => train,
        Err(e) => return fail(result, e.to_string()),
    };
    let mut result = result;
    result.compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        match train.step(&[x.clone(), t.clone()]) {
            Ok(loss) => losses.push(loss),
            Err(e) => return fail(result, e.to_string()),
        }
    }
    let mut outputs = vec![Tensor::from_vec(&[steps], losses).expect("one loss per step")];
    outputs.extend(
        names
            .iter()
            .map(|n| train.parameters().get(n).expect("inserted").clone()),
    );
    compare_outputs(case, &tensors, &outputs, result)
}

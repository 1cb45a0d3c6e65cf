//! Cases of `../shared/golden-models` the runner knows how to build: the new ops that are
//! compositions of the op set today (shape ops, indexing, losses, pooling by reshape, batch and
//! group norm, attention with an additive mask). Convolutions, `max_pool2d`, scans, arg-reductions,
//! causal masks (`arange`/`triu`) and the models that need them are not built yet and are
//! skipped as unknown cases.

use super::Build;
use crate::CrossEntropyOptions;

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
            vec![i["q"].scaled_dot_product_attention(&i["k"], &i["v"], Some(&i["m"]))]
        }),
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

/// The cases of `golden-models` this runner builds (the rest are skipped as unknown).
pub const SUPPORTED: [&str; 12] = [
    "op_split_chunk",
    "op_logsumexp",
    "op_gather",
    "op_index_select",
    "op_cross_entropy",
    "op_pad",
    "op_squeeze_unsqueeze_flatten",
    "op_sdpa_mask",
    "op_avg_pool2d",
    "op_adaptive_avg_pool2d",
    "op_batch_norm_eval",
    "op_group_norm",
];


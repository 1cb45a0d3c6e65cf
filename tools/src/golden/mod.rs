//! The golden runner: rebuilds each PyTorch reference case of a manifest through the public API,
//! runs it on each backend, and compares with PyTorch's outputs.
//!
//! Every case is built from the shapes and dtypes stored in its file, never from fixed numbers, so
//! the same names at other shapes and seeds run unchanged. Case names the runner does not know are
//! skipped, not failed. A case passes when every element satisfies |got − want| ≤ atol + rtol·|want|
//! (NaN matches NaN; infinities must be equal).

pub mod models;
mod train;

use minductor::{compile_with, Backend, DType, Graph, Tensor, Traced, Tracer};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub file: PathBuf,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub rtol: f64,
    pub atol: f64,
}

fn spec_list(value: &serde_json::Value, named: bool) -> Result<Vec<TensorSpec>, String> {
    let parse = |name: String, v: &serde_json::Value| -> Result<TensorSpec, String> {
        let dtype_name = v["dtype"].as_str().ok_or("missing dtype")?;
        let dtype = DType::parse(dtype_name).ok_or(format!("unknown dtype {dtype_name}"))?;
        let shape = v["shape"]
            .as_array()
            .ok_or("missing shape")?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or("bad dim"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TensorSpec { name, dtype, shape })
    };
    if named {
        // `inputs` is an object in file order; serde_json keeps insertion order with preserve_order,
        // but we do not rely on it: order is taken from the case's builder by name.
        let map = value.as_object().ok_or("inputs must be an object")?;
        map.iter().map(|(k, v)| parse(k.clone(), v)).collect()
    } else {
        let list = value.as_array().ok_or("outputs must be a list")?;
        list.iter()
            .map(|v| parse(v["name"].as_str().unwrap_or("out").to_string(), v))
            .collect()
    }
}

/// Reads `dir/manifest.json`.
pub fn load_manifest(dir: &Path) -> Result<Vec<Case>, String> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let cases = json["cases"]
        .as_array()
        .ok_or("manifest has no `cases` list")?;
    cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().ok_or("case without name")?.to_string();
            let ctx = |e: String| format!("case {name}: {e}");
            Ok(Case {
                file: dir.join(c["file"].as_str().ok_or_else(|| ctx("no file".into()))?),
                inputs: spec_list(&c["inputs"], true).map_err(ctx)?,
                outputs: spec_list(&c["outputs"], false).map_err(ctx)?,
                rtol: c["rtol"].as_f64().unwrap_or(1e-5),
                atol: c["atol"].as_f64().unwrap_or(1e-5),
                name,
            })
        })
        .collect()
}

/// Every tensor of a safetensors file, by name.
pub fn load_tensors(path: &Path) -> Result<HashMap<String, Tensor>, String> {
    minductor::load_safetensors(path).map_err(|e| e.to_string())
}

/// Traces the computation of the case `name` for inputs of the given types, with the inputs
/// declared in `order`. `None` if the case is unknown.
pub fn build_case(
    name: &str,
    specs: &[TensorSpec],
) -> Option<(Vec<String>, Result<Graph, minductor::TraceError>)> {
    let builder = case_builder(name)?;
    let order: Vec<String> = builder.0.iter().map(|s| s.to_string()).collect();
    let tracer = Tracer::new();
    let mut inputs = HashMap::new();
    for n in &order {
        let spec = specs.iter().find(|s| &s.name == n)?;
        inputs.insert(n.clone(), tracer.input(n, spec.dtype, &spec.shape));
    }
    let outputs = (builder.1)(&inputs);
    Some((order, tracer.finish(&outputs)))
}

type Build = fn(&HashMap<String, Traced>) -> Vec<Traced>;

/// `linear → gelu → linear`, the MLP of the golden case `model_mlp` (also a benchmark workload).
pub(crate) fn mlp(x: &Traced, w1: &Traced, b1: &Traced, w2: &Traced, b2: &Traced) -> Traced {
    x.linear(w1, Some(b1)).gelu().linear(w2, Some(b2))
}

/// The pre-LN transformer block of `model_transformer_block` (also a benchmark workload), over
/// inputs named x, g1, bb1, wqkv, bqkv, wo, bo, g2, bb2, w1, b1, w2, b2.
pub(crate) fn transformer_block(i: &HashMap<String, Traced>, heads: usize) -> Traced {
    let x = &i["x"];
    let shape = x.shape();
    let (batch, seq, width) = (shape[0] as isize, shape[1] as isize, shape[2]);
    let head_dim = width / heads;
    let h = x.layer_norm(&[width], Some(&i["g1"]), Some(&i["bb1"]), 1e-5);
    let qkv = h.linear(&i["wqkv"], Some(&i["bqkv"]));
    let split = |n: usize| {
        qkv.slice(
            -1,
            Some((n * width) as isize),
            Some(((n + 1) * width) as isize),
            1,
        )
        .reshape(&[batch, seq, heads as isize, head_dim as isize])
        .transpose(1, 2)
    };
    let (q, k, v) = (split(0), split(1), split(2));
    let scores = q.matmul(&k.transpose(-1, -2)) / (head_dim as f64).sqrt();
    let attended = scores.softmax(-1).matmul(&v);
    let merged = attended
        .transpose(1, 2)
        .reshape(&[batch, seq, width as isize]);
    let y = x + merged.linear(&i["wo"], Some(&i["bo"]));
    let normed = y.layer_norm(&[width], Some(&i["g2"]), Some(&i["bb2"]), 1e-5);
    &y + mlp(&normed, &i["w1"], &i["b1"], &i["w2"], &i["b2"])
}

/// The input order and the computation of each known case.
fn case_builder(name: &str) -> Option<(&'static [&'static str], Build)> {
    const X: &[&str] = &["x"];
    const AB: &[&str] = &["a", "b"];
    let unary: Option<Build> = match name {
        "unary_neg" => Some(|i| vec![-&i["x"]]),
        "unary_abs" => Some(|i| vec![i["x"].abs()]),
        "unary_exp" | "unary_exp_wide" => Some(|i| vec![i["x"].exp()]),
        "unary_log" => Some(|i| vec![i["x"].log()]),
        "unary_sqrt" => Some(|i| vec![i["x"].sqrt()]),
        "unary_rsqrt" => Some(|i| vec![i["x"].rsqrt()]),
        "unary_sin" => Some(|i| vec![i["x"].sin()]),
        "unary_cos" => Some(|i| vec![i["x"].cos()]),
        "unary_tanh" => Some(|i| vec![i["x"].tanh()]),
        "unary_sigmoid" => Some(|i| vec![i["x"].sigmoid()]),
        "unary_relu" => Some(|i| vec![i["x"].relu()]),
        "unary_erf" => Some(|i| vec![i["x"].erf()]),
        "unary_reciprocal" => Some(|i| vec![i["x"].reciprocal()]),
        "unary_gelu" => Some(|i| vec![i["x"].gelu()]),
        "unary_silu" => Some(|i| vec![i["x"].silu()]),
        "unary_gelu_tanh" => Some(|i| vec![i["x"].gelu_tanh()]),
        "clamp" => Some(|i| vec![i["x"].clamp(Some(-0.5), Some(0.75))]),
        "scalar_chain" => Some(|i| {
            let x = &i["x"];
            vec![(x * 2.5 + 1.0) / 3.0 - x * x]
        }),
        "sum_last" | "sum_long_row" => Some(|i| vec![i["x"].sum(&[-1], false)]),
        "sum_first" => Some(|i| vec![i["x"].sum(&[0], false)]),
        "sum_middle_keepdim" => Some(|i| vec![i["x"].sum(&[1], true)]),
        "sum_all" => Some(|i| vec![i["x"].sum(&[], false)]),
        "mean_last" => Some(|i| vec![i["x"].mean(&[-1], false)]),
        "amax_mid" => Some(|i| vec![i["x"].amax(&[1], false)]),
        "amin_last" => Some(|i| vec![i["x"].amin(&[-1], false)]),
        "var_last" => Some(|i| vec![i["x"].var(&[-1], false, false)]),
        "softmax_last" | "softmax_large_logits" => Some(|i| vec![i["x"].softmax(-1)]),
        "softmax_first" => Some(|i| vec![i["x"].softmax(0)]),
        "log_softmax_last" => Some(|i| vec![i["x"].log_softmax(-1)]),
        "permute_mul" => Some(|i| vec![i["x"].permute(&[2, 0, 1]) * 2.0]),
        "reshape_sum" => Some(|i| {
            let x = &i["x"];
            let last = *x.shape().last().unwrap() as isize;
            vec![x.reshape(&[-1, last]).sum(&[0], false)]
        }),
        "slice_narrow" => Some(|i| vec![i["x"].slice(1, Some(1), Some(-1), 2) * 3.0]),
        _ => None,
    };
    if let Some(f) = unary {
        return Some((X, f));
    }
    let binary: Option<Build> = match name {
        "binary_add_bcast" => Some(|i| vec![&i["a"] + &i["b"]]),
        "binary_sub_bcast" => Some(|i| vec![&i["a"] - &i["b"]]),
        "binary_mul_bcast" => Some(|i| vec![&i["a"] * &i["b"]]),
        "binary_div_bcast" => Some(|i| vec![&i["a"] / &i["b"]]),
        "binary_maximum_bcast" => Some(|i| vec![i["a"].maximum(&i["b"])]),
        "binary_minimum_bcast" => Some(|i| vec![i["a"].minimum(&i["b"])]),
        "binary_pow" => Some(|i| vec![i["a"].pow(&i["b"])]),
        "where_gt" => Some(|i| vec![i["a"].gt(&i["b"]).where_(&i["a"], &(&i["b"] * 2.0))]),
        "compare_gt" => Some(|i| vec![i["a"].gt(&i["b"])]),
        "cat_last" => Some(|i| vec![Traced::cat(&[&i["a"], &i["b"]], -1)]),
        "matmul_2d" | "matmul_batched_bcast" | "matmul_large" => {
            Some(|i| vec![i["a"].matmul(&i["b"])])
        }
        "bmm" => Some(|i| vec![i["a"].bmm(&i["b"])]),
        _ => None,
    };
    if let Some(f) = binary {
        return Some((AB, f));
    }
    Some(match name {
        "gelu_chain" | "f16_gelu_chain" => (&["x", "w", "b"], |i| {
            vec![(&i["x"] * &i["w"] + &i["b"]).gelu()]
        }),
        "transpose_add" => (&["x", "y"], |i| vec![i["x"].transpose(0, 1) + &i["y"]]),
        "expand_add" => (&["x", "y"], |i| {
            let shape: Vec<isize> = i["y"].shape().iter().map(|&d| d as isize).collect();
            vec![i["x"].expand(&shape) + &i["y"]]
        }),
        "layer_norm" => (&["x", "g", "b"], |i| {
            let d = *i["x"].shape().last().unwrap();
            vec![i["x"].layer_norm(&[d], Some(&i["g"]), Some(&i["b"]), 1e-5)]
        }),
        "rms_norm" => (&["x", "g"], |i| {
            let x = &i["x"];
            vec![x * ((x * x).mean(&[-1], true) + 1e-6).rsqrt() * &i["g"]]
        }),
        "embedding" => (&["idx", "table"], |i| vec![i["idx"].embedding(&i["table"])]),
        "linear_bias_relu" => (&["x", "w", "b"], |i| {
            vec![i["x"].linear(&i["w"], Some(&i["b"])).relu()]
        }),
        "bf16_linear" => (&["x", "w", "b"], |i| {
            vec![i["x"].linear(&i["w"], Some(&i["b"]))]
        }),
        "model_mlp" => (&["x", "w1", "b1", "w2", "b2"], |i| {
            vec![mlp(&i["x"], &i["w1"], &i["b1"], &i["w2"], &i["b2"])]
        }),
        "model_transformer_block" => (
            &[
                "x", "g1", "bb1", "wqkv", "bqkv", "wo", "bo", "g2", "bb2", "w1", "b1", "w2", "b2",
            ],
            |i| vec![transformer_block(i, 4)],
        ),
        _ => return train::builder(name).or_else(|| models::builder(name)),
    })
}

/// The worst element of a comparison.
#[derive(Clone, Debug, Default)]
pub struct Comparison {
    pub max_abs_error: f64,
    pub passed: bool,
}

/// Compares `got` with `want` elementwise under `atol + rtol·|want|`.
pub fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Comparison {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Comparison {
            max_abs_error: f64::INFINITY,
            passed: false,
        };
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut result = Comparison {
        max_abs_error: 0.0,
        passed: true,
    };
    for (&a, &b) in g.iter().zip(&w) {
        if a.is_nan() && b.is_nan() || a == b {
            continue;
        }
        let err = (a - b).abs();
        if err.is_nan() || err > atol + rtol * b.abs() {
            result.passed = false;
        }
        result.max_abs_error = if err.is_nan() {
            f64::INFINITY
        } else {
            result.max_abs_error.max(err)
        };
    }
    result
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

#[derive(Clone, Debug)]
pub struct CaseResult {
    pub case: String,
    pub backend: Backend,
    pub max_abs_error: f64,
    /// Wall time of `compile_with` (passes and code generation).
    pub compile_ms: f64,
    pub outcome: Outcome,
}

/// Runs one case on one backend.
pub fn run_case(case: &Case, backend: Backend) -> CaseResult {
    let mut result = CaseResult {
        case: case.name.clone(),
        backend,
        max_abs_error: 0.0,
        compile_ms: 0.0,
        outcome: Outcome::Pass,
    };
    if let Some(optimizer) = train::optimizer_case(&case.name) {
        return train::run_optimizer_case(case, backend, optimizer, result);
    }
    let Some((order, graph)) = build_case(&case.name, &case.inputs) else {
        result.outcome = Outcome::Skip("unknown case".into());
        return result;
    };
    let graph = match graph {
        Ok(g) => g,
        Err(e) => return fail(result, e.to_string()),
    };
    let tensors = match load_tensors(&case.file) {
        Ok(t) => t,
        Err(e) => return fail(result, e),
    };
    let Some(inputs) = order
        .iter()
        .map(|n| tensors.get(n).cloned())
        .collect::<Option<Vec<_>>>()
    else {
        return fail(result, "an input is missing from the file".into());
    };
    let compiled = match compile_with(&graph, backend) {
        Ok(c) => c,
        Err(e) => return fail(result, e.to_string()),
    };
    result.compile_ms = compiled.compile_time().as_secs_f64() * 1e3;
    match compiled.call(&inputs) {
        Ok(outputs) => compare_outputs(case, &tensors, &outputs, result),
        Err(e) => fail(result, e.to_string()),
    }
}

fn fail(mut result: CaseResult, why: String) -> CaseResult {
    result.outcome = Outcome::Fail(why);
    result
}

/// Compares `outputs` with the case's `out0`, `out1`, … in `tensors`.
fn compare_outputs(
    case: &Case,
    tensors: &HashMap<String, Tensor>,
    outputs: &[Tensor],
    mut result: CaseResult,
) -> CaseResult {
    if outputs.len() != case.outputs.len() {
        return fail(
            result,
            format!("{} outputs, expected {}", outputs.len(), case.outputs.len()),
        );
    }
    for (got, spec) in outputs.iter().zip(&case.outputs) {
        let Some(want) = tensors.get(&spec.name) else {
            return fail(result, format!("{} missing from the file", spec.name));
        };
        let c = compare(got, want, case.rtol, case.atol);
        result.max_abs_error = result.max_abs_error.max(c.max_abs_error);
        if !c.passed {
            let why = format!(
                "{} exceeds atol {} + rtol {}",
                spec.name, case.atol, case.rtol
            );
            result.outcome = Outcome::Fail(why);
        }
    }
    result
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub results: Vec<CaseResult>,
}

impl Report {
    pub fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
    pub fn passed(&self) -> usize {
        self.count(|o| *o == Outcome::Pass)
    }
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Fail(_)))
    }
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skip(_)))
    }

    /// One line per case and backend, then `N passed, M failed, K skipped`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for r in &self.results {
            let verdict = match &r.outcome {
                Outcome::Pass => "pass".to_string(),
                Outcome::Fail(why) => format!("FAIL  {why}"),
                Outcome::Skip(why) => format!("skip  {why}"),
            };
            let _ = writeln!(
                s,
                "{:<34} {:<10} max_abs_err {:<10.3e} compile {:>7.2} ms  {verdict}",
                r.case,
                r.backend.name(),
                r.max_abs_error,
                r.compile_ms
            );
        }
        let _ = writeln!(
            s,
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        );
        s
    }
}

/// Runs every case of `dir/manifest.json` on each backend.
pub fn run_golden(dir: &Path, backends: &[Backend]) -> Result<Report, String> {
    let cases = load_manifest(dir)?;
    let mut report = Report::default();
    for case in &cases {
        for &backend in backends {
            report.results.push(run_case(case, backend));
        }
    }
    Ok(report)
}

/// The models' golden directory beside the repository (`../shared/golden-models`; this crate is
/// the repository's `tools/`), or
/// `$MINDUCTOR_GOLDEN_MODELS_DIR`.
pub fn default_golden_models_dir() -> PathBuf {
    std::env::var_os("MINDUCTOR_GOLDEN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden-models"))
}

/// The golden directory beside the repository (`../shared/golden`; this crate is the
/// repository's `tools/`), or `$MINDUCTOR_GOLDEN_DIR`.
pub fn default_golden_dir() -> PathBuf {
    std::env::var_os("MINDUCTOR_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden"))
}

//! The `.pt2` reference cases of `../shared/exported` (programs saved by `torch.export` with
//! their inputs and PyTorch's outputs): reading the manifest and running a case through
//! `minductor::export` on a backend, at the stored sizes and, when the case has them, at the
//! `alt.` sizes through the same compile.

use crate::golden::{compare, load_tensors};
use crate::workloads::{Bound, Workload};
use minductor::export::{self, ExportOptions, ExportedProgram, Weights};
use minductor::{Backend, CompileOptions, Tensor};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One case of the manifest.
#[derive(Clone, Debug)]
pub struct Pt2Case {
    pub name: String,
    pub file: PathBuf,
    pub data: PathBuf,
    pub decomposed: bool,
    /// The user inputs' names, in the program's argument order.
    pub inputs: Vec<String>,
    pub outputs: usize,
    pub has_alt: bool,
    pub rtol: f64,
    pub atol: f64,
    /// The distinct node targets of the saved graph.
    pub ops: Vec<String>,
}

/// `../shared/exported` beside the repository, or `$MINDUCTOR_EXPORTED_DIR`.
pub fn default_exported_dir() -> PathBuf {
    std::env::var_os("MINDUCTOR_EXPORTED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/exported"))
}

/// Every case of `dir/manifest.json`.
pub fn load_pt2_manifest(dir: &Path) -> Result<Vec<Pt2Case>, String> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let cases = json["cases"]
        .as_array()
        .ok_or_else(|| format!("{}: no `cases` list", path.display()))?;
    cases
        .iter()
        .map(|c| {
            let s = |k: &str| {
                c[k].as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("a case has no `{k}`"))
            };
            let names = |k: &str| -> Vec<String> {
                c[k].as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|i| i["name"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            Ok(Pt2Case {
                name: s("name")?,
                file: dir.join(s("file")?),
                data: dir.join(s("data")?),
                decomposed: c["decomposed"].as_bool().unwrap_or(false),
                inputs: names("inputs"),
                outputs: names("outputs").len(),
                has_alt: c["has_alt"].as_bool().unwrap_or(false),
                rtol: c["rtol"].as_f64().unwrap_or(1e-4),
                atol: c["atol"].as_f64().unwrap_or(1e-4),
                ops: c["ops"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|o| o.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// One run of a case at one set of sizes: `stored` or `alt`.
#[derive(Clone, Debug)]
pub struct Pt2Run {
    pub sizes: &'static str,
    pub max_abs_error: f64,
    pub passed: bool,
    pub detail: String,
}

/// Loads and compiles `case` once on `backend` (weights as `weights`) and runs every input set
/// of its data file through that compile.
pub fn run_pt2_case(
    case: &Pt2Case,
    backend: Backend,
    weights: Weights,
) -> Result<Vec<Pt2Run>, String> {
    let program = export::load(&case.file).map_err(|e| e.to_string())?;
    let options = ExportOptions {
        compile: CompileOptions {
            backend,
            ..Default::default()
        },
        weights,
    };
    let compiled = program
        .compile_with_options(options)
        .map_err(|e| e.to_string())?;
    let data = load_tensors(&case.data)?;
    let mut sets = vec![("stored", "")];
    if case.has_alt {
        sets.push(("alt", "alt."));
    }
    let mut runs = Vec::new();
    for (sizes, prefix) in sets {
        let inputs = named(&data, prefix, &case.inputs)?;
        let outputs = compiled
            .call(&inputs)
            .map_err(|e| format!("{sizes} sizes: {e}"))?;
        runs.push(check_outputs(
            &data,
            prefix,
            &outputs,
            case.outputs,
            case.rtol,
            case.atol,
            sizes,
        ));
    }
    Ok(runs)
}

fn named(
    data: &HashMap<String, Tensor>,
    prefix: &str,
    names: &[String],
) -> Result<Vec<Tensor>, String> {
    names
        .iter()
        .map(|n| {
            data.get(&format!("{prefix}{n}"))
                .cloned()
                .ok_or_else(|| format!("the data file has no `{prefix}{n}`"))
        })
        .collect()
}

/// Compares `outputs` with `{prefix}out0`, `{prefix}out1`, ...: floats within
/// `atol + rtol·|expected|`, integers and bools exactly.
pub fn check_outputs(
    data: &HashMap<String, Tensor>,
    prefix: &str,
    outputs: &[Tensor],
    expected_count: usize,
    rtol: f64,
    atol: f64,
    sizes: &'static str,
) -> Pt2Run {
    let mut run = Pt2Run {
        sizes,
        max_abs_error: 0.0,
        passed: outputs.len() == expected_count,
        detail: String::new(),
    };
    if outputs.len() != expected_count {
        run.detail = format!("{} outputs, expected {expected_count}", outputs.len());
        return run;
    }
    for (i, got) in outputs.iter().enumerate() {
        let key = format!("{prefix}out{i}");
        let Some(want) = data.get(&key) else {
            run.passed = false;
            run.detail = format!("the data file has no `{key}`");
            return run;
        };
        let (r, a) = if want.dtype().is_float() {
            (rtol, atol)
        } else {
            (0.0, 0.0)
        };
        let c = compare(&got.contiguous(), want, r, a);
        run.max_abs_error = run.max_abs_error.max(c.max_abs_error);
        if !c.passed {
            run.passed = false;
            run.detail += &format!(
                "out{i}: got {}{:?}, expected {}{:?}, max |err| {:.3e}; ",
                got.dtype(),
                got.shape(),
                want.dtype(),
                want.shape(),
                c.max_abs_error
            );
        }
    }
    run
}

/// A case of the manifest as a benchmark workload (`minductor bench --pt2`): the imported
/// program, and a [`Workload`] whose graph is the program's and whose inputs are the stored user
/// inputs.
pub struct Pt2Workload {
    pub workload: Workload,
    pub program: ExportedProgram,
}

/// Every case of `dir/manifest.json` whose name is in `names` (all when `None`), loaded as a
/// benchmark workload. `bytes_moved` counts the user inputs, the weights and the stored outputs
/// once; the cases are reported as memory-bound (no GEMM count is derived from an imported graph).
pub fn pt2_workloads(dir: &Path, names: Option<&[String]>) -> Result<Vec<Pt2Workload>, String> {
    let cases = load_pt2_manifest(dir)?;
    if let Some(names) = names {
        if let Some(bad) = names.iter().find(|n| !cases.iter().any(|c| &c.name == *n)) {
            let known: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
            return Err(format!(
                "no case `{bad}` in {}/manifest.json (cases: {})",
                dir.display(),
                known.join(", ")
            ));
        }
    }
    let bytes = |t: &Tensor| (t.numel() * t.dtype().size_bytes()) as u64;
    let mut out = Vec::new();
    for case in cases {
        if names.is_some_and(|n| !n.contains(&case.name)) {
            continue;
        }
        let program = export::load(&case.file).map_err(|e| format!("{}: {e}", case.name))?;
        let data = load_tensors(&case.data)?;
        let inputs = named(&data, "", &case.inputs)?;
        let outputs: Vec<String> = (0..case.outputs).map(|i| format!("out{i}")).collect();
        let outputs = named(&data, "", &outputs)?;
        let bytes_moved = inputs.iter().chain(&outputs).map(bytes).sum::<u64>()
            + program
                .weights()
                .iter()
                .map(|w| bytes(&w.tensor))
                .sum::<u64>();
        let workload = Workload {
            name: case.name.clone(),
            graph: program.graph().clone(),
            elements: inputs.first().map_or(0, |t| t.numel()),
            inputs,
            bytes_moved,
            flops: 0,
            bound: Bound::Memory,
        };
        out.push(Pt2Workload { workload, program });
    }
    Ok(out)
}

// ---- the `minductor pt2` command line --------------------------------------------------------

/// A tensor as a safetensors view (for writing outputs).
struct SafeView {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl safetensors::View for SafeView {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn safe_view(t: &Tensor) -> SafeView {
    use minductor::DType;
    let dtype = match t.dtype() {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I64 => safetensors::Dtype::I64,
        DType::Bool => safetensors::Dtype::BOOL,
    };
    let t = t.contiguous();
    SafeView {
        dtype,
        shape: t.shape().to_vec(),
        bytes: t.to_bytes(),
    }
}

/// Writes `tensors` (name, tensor) to a safetensors file.
pub fn save_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), String> {
    let views: Vec<(String, SafeView)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), safe_view(t)))
        .collect();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// `minductor pt2 info MODEL.pt2`: the signature, dynamic dims and ranges, op counts, which ops
/// cannot be imported, and whether the whole program imports.
pub fn info(path: &Path) -> Result<String, String> {
    let mut out = String::new();
    let ops = export::op_counts(path).map_err(|e| e.to_string())?;
    match export::load(path) {
        Ok(program) => {
            let (major, minor) = program.schema_version();
            out += &format!(
                "{}: schema {major}.{minor}, written by PyTorch {}\n",
                path.display(),
                program.torch_version()
            );
            out += &format!("signature: {}\n", program.signature());
            let weights = program.weights();
            let bytes: usize = weights
                .iter()
                .map(|w| w.tensor.numel() * w.tensor.dtype().size_bytes())
                .sum();
            out += &format!("weights: {} tensors, {bytes} bytes\n", weights.len());
            for d in &program.signature().dropped_outputs {
                out += &format!("not returned: {d}\n");
            }
            out += &format!("graph: {} nodes\n", program.graph().nodes().len());
            out += "import: ok\n";
        }
        Err(e) => out += &format!("{}: import fails: {e}\n", path.display()),
    }
    out += "ops:\n";
    for (target, count, supported) in &ops {
        out += &format!(
            "  {count:>5}  {target}{}\n",
            if *supported {
                ""
            } else {
                "   (cannot be imported)"
            }
        );
    }
    let unsupported: Vec<&str> = ops.iter().filter(|o| !o.2).map(|o| o.0.as_str()).collect();
    out += &format!(
        "unsupported ops: {}\n",
        if unsupported.is_empty() {
            "none".to_string()
        } else {
            unsupported.join(", ")
        }
    );
    Ok(out)
}

/// `minductor pt2 run MODEL.pt2 --inputs IN.safetensors --out OUT.safetensors`: the program's
/// user inputs are read by name from `inputs`; its user outputs are written as `out0`, `out1`..
pub fn run(model: &Path, inputs: &Path, out: &Path, backend: Backend) -> Result<String, String> {
    let program = export::load(model).map_err(|e| e.to_string())?;
    let data = load_tensors(inputs)?;
    let names: Vec<String> = program
        .signature()
        .inputs
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let args = named(&data, "", &names)?;
    let compiled = program
        .compile_with_options(ExportOptions {
            compile: CompileOptions {
                backend,
                ..Default::default()
            },
            weights: Weights::Frozen,
        })
        .map_err(|e| e.to_string())?;
    let outputs = compiled.call(&args).map_err(|e| e.to_string())?;
    let named_outputs: Vec<(String, Tensor)> = outputs
        .into_iter()
        .enumerate()
        .map(|(i, t)| (format!("out{i}"), t))
        .collect();
    save_tensors(out, &named_outputs)?;
    Ok(named_outputs
        .iter()
        .map(|(n, t)| format!("{n}: {}{:?}", t.dtype(), t.shape()))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// `minductor pt2 compile MODEL.pt2 -o MODEL.mind`: one self-contained artifact of the program
/// compiled with the inductor backend, its weights frozen into it (the artifact's `constants`
/// section). `minductor::load` and the C ABI's `minductor_load` read it with no other file; a
/// call takes the user inputs in the signature's order (listed in the returned text).
pub fn compile_artifact(model: &Path, out: &Path) -> Result<String, String> {
    let program = export::load(model).map_err(|e| e.to_string())?;
    let compiled = program.compile().map_err(|e| e.to_string())?;
    let compiled = compiled
        .compiled()
        .ok_or("the inductor compile has no single program")?;
    compiled.save(out).map_err(|e| e.to_string())?;
    let bytes = std::fs::metadata(out).map_or(0, |m| m.len());
    let constants = compiled.frozen_constants();
    let constant_bytes: usize = constants
        .iter()
        .map(|t| t.numel() * t.dtype().size_bytes())
        .sum();
    let inputs: Vec<String> = program
        .signature()
        .inputs
        .iter()
        .map(|i| format!("{}: {}", i.name, i.ty))
        .collect();
    Ok(format!(
        "wrote {} ({bytes} bytes; {} frozen constants, {constant_bytes} bytes, from {} weights)\n\
         call inputs in order: {}",
        out.display(),
        constants.len(),
        program.weights().len(),
        inputs.join(", ")
    ))
}

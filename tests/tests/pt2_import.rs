//! Every case of `../shared/exported` (programs saved by `torch.export`, raw and core ATen)
//! imported with `minductor::export`, compiled once per backend and run at the stored sizes and,
//! for dynamic cases, at the `alt.` sizes through the same compile, against PyTorch's outputs
//! with the manifest's tolerances. Nothing is skipped: the number of cases run is the manifest's.
//! Then bad archives, each with its typed error. (`pt2_artifact.rs` saves the compiled programs
//! as artifacts and loads them back.)

use minductor::export::{self, CallError, ExportOptions, ImportError, Weights};
use minductor::{Backend, CompileOptions, Tensor};
use minductor_tools::pt2::{default_exported_dir, load_pt2_manifest, run_pt2_case, Pt2Case};
use std::io::Write;

fn cases() -> Vec<Pt2Case> {
    let dir = default_exported_dir();
    let cases = load_pt2_manifest(&dir)
        .unwrap_or_else(|e| panic!("cannot read the manifest in {}: {e}", dir.display()));
    assert!(!cases.is_empty(), "the manifest lists no case");
    cases
}

fn run_all(backend: Backend, weights: Weights) {
    let cases = cases();
    let mut ran = 0;
    let mut failures = Vec::new();
    for case in &cases {
        match run_pt2_case(case, backend, weights) {
            Ok(runs) => {
                ran += 1;
                assert_eq!(
                    runs.len(),
                    if case.has_alt { 2 } else { 1 },
                    "{}",
                    case.name
                );
                for r in runs {
                    println!(
                        "{:<24} {:<9} {:<6} max|err| {:.2e} {}",
                        case.name,
                        backend.name(),
                        r.sizes,
                        r.max_abs_error,
                        if r.passed { "pass" } else { "FAIL" }
                    );
                    if !r.passed {
                        failures.push(format!("{} ({} sizes): {}", case.name, r.sizes, r.detail));
                    }
                }
            }
            Err(e) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures on {}:\n{}",
        failures.len(),
        backend.name(),
        failures.join("\n")
    );
    assert_eq!(ran, cases.len(), "every case of the manifest runs");
}

#[test]
fn every_exported_case_matches_pytorch_on_eager() {
    run_all(Backend::Eager, Weights::Frozen);
}

#[test]
fn every_exported_case_matches_pytorch_on_aot_eager() {
    run_all(Backend::AotEager, Weights::Frozen);
}

#[test]
fn every_exported_case_matches_pytorch_on_inductor() {
    run_all(Backend::Inductor, Weights::Frozen);
}

#[test]
fn every_exported_case_matches_pytorch_with_weights_as_inputs() {
    run_all(Backend::Inductor, Weights::Inputs);
}

/// Every node target the manifest lists (raw and core forms) is one the importer supports.
#[test]
fn every_manifest_op_is_supported() {
    let mut missing = Vec::new();
    for case in cases() {
        for op in &case.ops {
            if !export::is_supported(op) {
                missing.push(format!("{op} ({})", case.name));
            }
        }
    }
    assert!(missing.is_empty(), "unsupported: {missing:?}");
}

/// The signature of a dynamic case names its symbol and range; a call outside the range is a
/// typed error, and one compile serves two sizes inside it.
#[test]
fn dynamic_sizes_are_symbolic_and_guarded_by_their_range() {
    let case = cases()
        .into_iter()
        .find(|c| c.has_alt)
        .expect("the manifest has a dynamic case");
    let program = export::load(&case.file).unwrap();
    let sig = program.signature();
    assert_eq!(sig.inputs.len(), case.inputs.len());
    assert!(!sig.symbols.is_empty(), "{sig}");
    let range = sig.symbols[0].clone();
    // Find the input dim the symbol sizes.
    let (index, dim) = sig
        .inputs
        .iter()
        .enumerate()
        .find_map(|(i, input)| {
            input
                .ty
                .shape
                .iter()
                .position(|d| *d == minductor::Dim::Sym(range.sym))
                .map(|d| (i, d))
        })
        .expect("a user input carries the symbol");
    let compiled = program
        .compile_with_options(ExportOptions {
            compile: CompileOptions {
                backend: Backend::Eager,
                ..Default::default()
            },
            weights: Weights::Frozen,
        })
        .unwrap();
    let Some(max) = range.max else {
        return;
    };
    let inputs: Vec<Tensor> = sig
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let shape: Vec<usize> = input
                .ty
                .shape
                .iter()
                .enumerate()
                .map(|(d, size)| {
                    if i == index && d == dim {
                        max + 1
                    } else {
                        size.as_static().unwrap_or(range.min.max(2))
                    }
                })
                .collect();
            Tensor::zeros(input.ty.dtype, &shape)
        })
        .collect();
    match compiled.call(&inputs) {
        Err(CallError::OutOfRange { size, .. }) => assert_eq!(size, max + 1),
        other => panic!(
            "expected an out-of-range error, got {:?}",
            other.map(|o| o.len())
        ),
    }
}

// ---- bad archives ---------------------------------------------------------------------------

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(default_exported_dir().join(name)).unwrap()
}

/// Rewrites the zip `bytes` with `edit` applied to each entry's contents (entries stored).
fn rewrite(bytes: &[u8], edit: impl Fn(&str, Vec<u8>) -> Vec<u8>) -> Vec<u8> {
    let mut reader = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..reader.len() {
        let mut file = reader.by_index(i).unwrap();
        let name = file.name().unwrap().to_string();
        let mut contents = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut contents).unwrap();
        writer.start_file(name.as_str(), options).unwrap();
        writer.write_all(&edit(&name, contents)).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

#[test]
fn a_truncated_archive_is_a_typed_error() {
    let bytes = fixture_bytes("mlp_dynamic_batch.pt2");
    for cut in [bytes.len() / 2, bytes.len() - 10, 100] {
        let r = export::load_bytes(bytes[..cut].to_vec());
        assert!(
            matches!(
                r,
                Err(ImportError::NotZip { .. })
                    | Err(ImportError::Entry { .. })
                    | Err(ImportError::MissingEntry { .. })
            ),
            "cut at {cut}: {:?}",
            r.err()
        );
    }
}

#[test]
fn a_file_that_is_not_a_zip_is_a_typed_error() {
    let r = export::load_bytes(b"this is not a zip archive at all".to_vec());
    assert!(
        matches!(r, Err(ImportError::NotZip { .. })),
        "{:?}",
        r.err()
    );
    let missing = export::load("/nonexistent/model.pt2");
    assert!(matches!(missing, Err(ImportError::Io { .. })));
}

#[test]
fn an_unknown_schema_major_is_a_typed_error() {
    let bytes = rewrite(&fixture_bytes("mlp_dynamic_batch.pt2"), |name, contents| {
        if name.ends_with("models/model.json") {
            let mut json: serde_json::Value = serde_json::from_slice(&contents).unwrap();
            json["schema_version"]["major"] = serde_json::json!(99);
            serde_json::to_vec(&json).unwrap()
        } else {
            contents
        }
    });
    match export::load_bytes(bytes) {
        Err(ImportError::SchemaVersion {
            major, supported, ..
        }) => {
            assert_eq!(major, 99);
            assert_eq!(supported, export::SUPPORTED_SCHEMA_MAJOR);
        }
        other => panic!("expected a schema version error, got {:?}", other.err()),
    }
}

#[test]
fn an_unknown_op_names_the_op_the_node_and_its_stack_trace() {
    let bytes = rewrite(&fixture_bytes("mlp_dynamic_batch.pt2"), |name, contents| {
        if name.ends_with("models/model.json") {
            let mut json: serde_json::Value = serde_json::from_slice(&contents).unwrap();
            let nodes = json["graph_module"]["graph"]["nodes"]
                .as_array_mut()
                .unwrap();
            nodes[1]["target"] = serde_json::json!("torch.ops.aten.frobnicate.default");
            serde_json::to_vec(&json).unwrap()
        } else {
            contents
        }
    });
    match export::load_bytes(bytes) {
        Err(ImportError::UnsupportedOp {
            op,
            node,
            stack_trace,
        }) => {
            assert_eq!(op, "torch.ops.aten.frobnicate.default");
            assert!(!node.is_empty());
            assert!(stack_trace.contains("forward"), "{stack_trace}");
        }
        other => panic!("expected an unsupported-op error, got {:?}", other.err()),
    }
}

#[test]
fn a_weight_of_the_wrong_size_is_a_typed_error() {
    let bytes = rewrite(&fixture_bytes("small_cnn.pt2"), |name, contents| {
        if name.ends_with("data/weights/weight_0") {
            contents[..contents.len() / 2].to_vec()
        } else {
            contents
        }
    });
    match export::load_bytes(bytes) {
        Err(ImportError::WeightSize {
            expected, found, ..
        }) => assert_eq!(found * 2, expected),
        other => panic!("expected a weight size error, got {:?}", other.err()),
    }
}

/// `minductor pt2 run` (the command line's code): every case's outputs file matches PyTorch's.
#[test]
fn every_case_runs_through_the_command_line() {
    let dir = std::env::temp_dir().join(format!("minductor-pt2-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = cases();
    let mut ran = 0;
    for case in &cases {
        for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
            let out = dir.join(format!("{}-{}.safetensors", case.name, backend.name()));
            minductor_tools::pt2::run(&case.file, &case.data, &out, backend)
                .unwrap_or_else(|e| panic!("{} on {}: {e}", case.name, backend.name()));
            let got = minductor::load_safetensors(&out).unwrap();
            let want = minductor::load_safetensors(&case.data).unwrap();
            let outputs: Vec<Tensor> = (0..case.outputs)
                .map(|i| got[&format!("out{i}")].clone())
                .collect();
            assert_eq!(got.len(), case.outputs, "{}", case.name);
            let run = minductor_tools::pt2::check_outputs(
                &want,
                "",
                &outputs,
                case.outputs,
                case.rtol,
                case.atol,
                "stored",
            );
            assert!(
                run.passed,
                "{} on {}: {}",
                case.name,
                backend.name(),
                run.detail
            );
        }
        ran += 1;
    }
    assert_eq!(ran, cases.len());
    let info = minductor_tools::pt2::info(&cases[0].file).unwrap();
    assert!(
        info.contains("import: ok") && info.contains("unsupported ops: none"),
        "{info}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Dynamic cases at the ends of their ranges (other sizes than the stored ones, the least
/// possibly 1): the inductor compile agrees with the eager backend (the reference interpreter on
/// the same import). Inputs are the stored ones cycled to the new size.
#[test]
fn dynamic_cases_at_the_ends_of_their_ranges_agree_across_backends() {
    for case in cases().into_iter().filter(|c| c.has_alt) {
        let program = export::load(&case.file).unwrap();
        let data = minductor::load_safetensors(&case.data).unwrap();
        let compile = |backend| {
            program
                .compile_with_options(ExportOptions {
                    compile: CompileOptions {
                        backend,
                        ..Default::default()
                    },
                    weights: Weights::Frozen,
                })
                .unwrap()
        };
        let (eager, inductor) = (compile(Backend::Eager), compile(Backend::Inductor));
        let sig = program.signature().clone();
        for range in &sig.symbols {
            for size in [range.min.max(1), range.max.unwrap_or(64).min(64)] {
                let inputs: Vec<Tensor> = sig
                    .inputs
                    .iter()
                    .map(|input| {
                        let stored = &data[&input.name];
                        let shape: Vec<usize> = input
                            .ty
                            .shape
                            .iter()
                            .zip(stored.shape())
                            .map(|(d, &n)| {
                                if *d == minductor::Dim::Sym(range.sym) {
                                    size
                                } else {
                                    n
                                }
                            })
                            .collect();
                        let values = stored.to_f64_vec();
                        let count: usize = shape.iter().product();
                        let cycled: Vec<f64> =
                            (0..count).map(|i| values[i % values.len()]).collect();
                        Tensor::from_f64(stored.dtype(), &shape, &cycled).unwrap()
                    })
                    .collect();
                let want = eager.call(&inputs).unwrap();
                let got = inductor.call(&inputs).unwrap();
                let named: std::collections::HashMap<String, Tensor> = want
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("out{i}"), t.clone()))
                    .collect();
                let run = minductor_tools::pt2::check_outputs(
                    &named,
                    "",
                    &got,
                    want.len(),
                    case.rtol,
                    case.atol,
                    "stored",
                );
                assert!(
                    run.passed,
                    "{} at {} = {size}: {}",
                    case.name, range.name, run.detail
                );
                println!(
                    "{} at {} = {size}: max|err| {:.2e}",
                    case.name, range.name, run.max_abs_error
                );
            }
        }
    }
}

/// A scoping higher-order op (`torch.no_grad()` inside `forward` exports as
/// `wrap_with_set_grad_enabled` with a subgraph) imports its subgraph in place.
#[test]
fn a_wrap_with_set_grad_enabled_subgraph_is_inlined() {
    let bytes = rewrite(&fixture_bytes("mlp_dynamic_batch.pt2"), |name, contents| {
        if !name.ends_with("models/model.json") {
            return contents;
        }
        let mut json: serde_json::Value = serde_json::from_slice(&contents).unwrap();
        let graph = &mut json["graph_module"]["graph"];
        let nodes = graph["nodes"].as_array().unwrap().clone();
        // linear -> gelu -> linear_1: the gelu moves into a subgraph.
        let mut gelu = nodes[1].clone();
        assert!(gelu["target"].as_str().unwrap().contains("gelu"));
        let input = gelu["inputs"][0]["arg"]["as_tensor"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let output = gelu["outputs"][0]["as_tensor"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        gelu["inputs"][0]["arg"] = serde_json::json!({"as_tensor": {"name": "sub_in"}});
        let wrap = serde_json::json!({
            "target": "torch.ops.higher_order.wrap_with_set_grad_enabled",
            "inputs": [
                {"name": "arg0", "arg": {"as_bool": false}, "kind": 1},
                {"name": "arg1", "arg": {"as_graph": {"name": "submod_0", "graph": {
                    "inputs": [{"as_tensor": {"name": "sub_in"}}],
                    "outputs": [{"as_tensor": {"name": output}}],
                    "nodes": [gelu],
                    "tensor_values": {}, "sym_int_values": {}, "sym_bool_values": {},
                    "is_single_tensor_return": false, "custom_obj_values": {}, "sym_float_values": {}
                }}}, "kind": 1},
                {"name": "arg2", "arg": {"as_tensor": {"name": input}}, "kind": 1}
            ],
            "outputs": [{"as_tensor": {"name": output}}],
            "metadata": {},
            "name": "wrap_with_set_grad_enabled"
        });
        graph["nodes"] = serde_json::json!([nodes[0].clone(), wrap, nodes[2].clone()]);
        serde_json::to_vec(&json).unwrap()
    });
    let program = export::load_bytes(bytes).unwrap();
    let case = cases()
        .into_iter()
        .find(|c| c.name == "mlp_dynamic_batch")
        .unwrap();
    let data = minductor::load_safetensors(&case.data).unwrap();
    let outputs = program
        .compile()
        .unwrap()
        .call(&[data["x"].clone()])
        .unwrap();
    let run =
        minductor_tools::pt2::check_outputs(&data, "", &outputs, 1, case.rtol, case.atol, "stored");
    assert!(run.passed, "{}", run.detail);
}

/// A program written here (no PyTorch needed): ops the fixtures do not use, each against a
/// direct computation of PyTorch's definition.
#[test]
fn ops_beyond_the_fixtures_match_their_definitions() {
    use serde_json::json;
    let meta = |sizes: &[usize]| {
        json!({"dtype": 7, "sizes": sizes.iter().map(|n| json!({"as_int": n})).collect::<Vec<_>>(),
               "requires_grad": false, "device": {"type": "cpu", "index": null},
               "strides": [], "storage_offset": {"as_int": 0}, "layout": 7})
    };
    let t = |name: &str| json!({"as_tensor": {"name": name}});
    let node = |target: &str, inputs: serde_json::Value, outputs: &[&str]| {
        json!({"target": target, "inputs": inputs,
               "outputs": outputs.iter().map(|o| json!({"as_tensor": {"name": o}})).collect::<Vec<_>>(),
               "metadata": {"stack_trace": "File \"test.py\", line 1, in forward"}, "name": outputs[0]})
    };
    let output_specs: Vec<serde_json::Value> = ["roll", "up", "norm", "var", "mean", "rem"]
        .iter()
        .map(|n| json!({"user_output": {"arg": t(n)}}))
        .collect();
    let model = json!({
        "graph_module": {
            "graph": {
                "inputs": [t("x")],
                "outputs": [t("roll"), t("up"), t("norm"), t("var"), t("mean"), t("rem")],
                "nodes": [
                    node("torch.ops.aten.roll.default", json!([
                        {"name": "self", "arg": t("x")}, {"name": "shifts", "arg": {"as_ints": [1]}},
                        {"name": "dims", "arg": {"as_ints": [3]}}]), &["roll"]),
                    node("torch.ops.aten.upsample_nearest2d.vec", json!([
                        {"name": "input", "arg": t("x")}, {"name": "output_size", "arg": {"as_none": true}},
                        {"name": "scale_factors", "arg": {"as_floats": [2.0, 2.0]}}]), &["up"]),
                    node("torch.ops.aten.linalg_vector_norm.default", json!([
                        {"name": "self", "arg": t("x")}, {"name": "ord", "arg": {"as_float": 2.0}},
                        {"name": "dim", "arg": {"as_ints": [3]}}]), &["norm"]),
                    node("torch.ops.aten.var_mean.correction", json!([
                        {"name": "self", "arg": t("x")}, {"name": "dim", "arg": {"as_ints": [3]}},
                        {"name": "correction", "arg": {"as_int": 1}},
                        {"name": "keepdim", "arg": {"as_bool": true}}]), &["var", "mean"]),
                    node("torch.ops.aten.remainder.Scalar", json!([
                        {"name": "self", "arg": t("x")}, {"name": "other", "arg": {"as_float": 0.7}}]), &["rem"]),
                ],
                "tensor_values": {
                    "x": meta(&[2, 3, 4, 4]), "roll": meta(&[2, 3, 4, 4]), "up": meta(&[2, 3, 8, 8]),
                    "norm": meta(&[2, 3, 4]), "var": meta(&[2, 3, 4, 1]), "mean": meta(&[2, 3, 4, 1]),
                    "rem": meta(&[2, 3, 4, 4])
                },
                "sym_int_values": {}, "sym_bool_values": {}
            },
            "signature": {
                "input_specs": [{"user_input": {"arg": t("x")}}],
                "output_specs": output_specs
            },
            "module_call_graph": []
        },
        "opset_version": {"aten": 10},
        "range_constraints": {},
        "schema_version": {"major": 8, "minor": 20}
    });
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    writer
        .start_file("model/models/model.json", options)
        .unwrap();
    writer
        .write_all(&serde_json::to_vec(&model).unwrap())
        .unwrap();
    let bytes = writer.finish().unwrap().into_inner();
    let program = export::load_bytes(bytes).unwrap();

    let xs: Vec<f32> = (0..96)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
        .collect();
    let x = Tensor::from_vec(&[2, 3, 4, 4], xs.clone()).unwrap();
    let at = |n: usize, c: usize, i: usize, j: usize| xs[((n * 3 + c) * 4 + i) * 4 + j] as f64;
    for backend in [Backend::Eager, Backend::Inductor] {
        let compiled = program
            .compile_with_options(ExportOptions {
                compile: CompileOptions {
                    backend,
                    ..Default::default()
                },
                weights: Weights::Frozen,
            })
            .unwrap();
        let out = compiled.call(std::slice::from_ref(&x)).unwrap();
        let v: Vec<Vec<f64>> = out.iter().map(|o| o.contiguous().to_f64_vec()).collect();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 + 1e-5 * b.abs();
        for n in 0..2 {
            for c in 0..3 {
                for i in 0..4 {
                    let row: Vec<f64> = (0..4).map(|j| at(n, c, i, j)).collect();
                    let r = (n * 3 + c) * 4 + i;
                    for j in 0..4 {
                        assert!(close(v[0][r * 4 + j], row[(j + 3) % 4]), "roll");
                        let rem = row[j] - (row[j] / 0.7f32 as f64).floor() * 0.7f32 as f64;
                        assert!(
                            (v[5][r * 4 + j] - rem).abs() < 1e-5,
                            "remainder {} vs {rem}",
                            v[5][r * 4 + j]
                        );
                    }
                    let norm = row.iter().map(|a| a * a).sum::<f64>().sqrt();
                    assert!(close(v[2][r], norm), "norm");
                    let mean = row.iter().sum::<f64>() / 4.0;
                    let var = row.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / 3.0;
                    assert!(close(v[3][r], var) && close(v[4][r], mean), "var_mean");
                }
                for i in 0..8 {
                    for j in 0..8 {
                        let got = v[1][((n * 3 + c) * 8 + i) * 8 + j];
                        assert_eq!(got, at(n, c, i / 2, j / 2), "upsample at {i},{j}");
                    }
                }
            }
        }
    }
}

/// A static dim sliced to symbolic bounds (`position_ids[:, 0:seq]` of a fixed-size buffer):
/// `y[:s0]` and `y[1:s0 + 1]` with `s0` from another input, at two sizes through one compile.
#[test]
fn a_static_dim_sliced_to_a_symbolic_bound() {
    use serde_json::json;
    let symbol = json!({"as_expr": {"expr_str": "Symbol('s0', positive=True, integer=True)", "hint": {"as_int": 3}}});
    let plus_one = json!({"as_expr": {"expr_str": "Add(Symbol('s0', positive=True, integer=True), Integer(1))", "hint": {"as_int": 4}}});
    let meta = |sizes: Vec<serde_json::Value>| {
        json!({"dtype": 7, "sizes": sizes, "requires_grad": false,
               "device": {"type": "cpu", "index": null}, "strides": [],
               "storage_offset": {"as_int": 0}, "layout": 7})
    };
    let t = |name: &str| json!({"as_tensor": {"name": name}});
    let sym = |name: &str| json!({"as_sym_int": {"as_name": name}});
    let model = json!({
        "graph_module": {
            "graph": {
                "inputs": [t("x"), t("y")],
                "outputs": [t("a"), t("b")],
                "nodes": [
                    {"target": "torch.ops.aten.sym_size.int", "inputs": [
                        {"name": "self", "arg": t("x")}, {"name": "dim", "arg": {"as_int": 0}}],
                     "outputs": [sym("n")], "metadata": {}},
                    {"target": "_operator.add", "inputs": [
                        {"name": "a", "arg": sym("n")}, {"name": "b", "arg": {"as_int": 1}}],
                     "outputs": [sym("n1")], "metadata": {}},
                    {"target": "torch.ops.aten.slice.Tensor", "inputs": [
                        {"name": "self", "arg": t("y")}, {"name": "dim", "arg": {"as_int": 0}},
                        {"name": "start", "arg": {"as_int": 0}}, {"name": "end", "arg": sym("n")}],
                     "outputs": [t("a")], "metadata": {}},
                    {"target": "torch.ops.aten.slice.Tensor", "inputs": [
                        {"name": "self", "arg": t("y")}, {"name": "dim", "arg": {"as_int": 0}},
                        {"name": "start", "arg": {"as_int": 1}}, {"name": "end", "arg": sym("n1")}],
                     "outputs": [t("b")], "metadata": {}}
                ],
                "tensor_values": {
                    "x": meta(vec![symbol.clone(), json!({"as_int": 2})]),
                    "y": meta(vec![json!({"as_int": 10}), json!({"as_int": 3})]),
                    "a": meta(vec![symbol.clone(), json!({"as_int": 3})]),
                    "b": meta(vec![symbol.clone(), json!({"as_int": 3})])
                },
                "sym_int_values": {"n": symbol.clone(), "n1": plus_one},
                "sym_bool_values": {}
            },
            "signature": {
                "input_specs": [{"user_input": {"arg": t("x")}}, {"user_input": {"arg": t("y")}}],
                "output_specs": [{"user_output": {"arg": t("a")}}, {"user_output": {"arg": t("b")}}]
            },
            "module_call_graph": []
        },
        "range_constraints": {"s0": {"min_val": 2, "max_val": 9}},
        "schema_version": {"major": 8, "minor": 20}
    });
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    writer.start_file("m/models/model.json", options).unwrap();
    writer
        .write_all(&serde_json::to_vec(&model).unwrap())
        .unwrap();
    let program = export::load_bytes(writer.finish().unwrap().into_inner()).unwrap();
    let y: Vec<f32> = (0..30).map(|i| i as f32).collect();
    let y = Tensor::from_vec(&[10, 3], y).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let compiled = program
            .compile_with_options(ExportOptions {
                compile: CompileOptions {
                    backend,
                    ..Default::default()
                },
                weights: Weights::Frozen,
            })
            .unwrap();
        for n in [3usize, 7] {
            let x = Tensor::zeros(minductor::DType::F32, &[n, 2]);
            let out = compiled.call(&[x, y.clone()]).unwrap();
            let want_a: Vec<f64> = (0..n * 3).map(|i| i as f64).collect();
            let want_b: Vec<f64> = (3..(n + 1) * 3).map(|i| i as f64).collect();
            assert_eq!(out[0].shape(), &[n, 3]);
            assert_eq!(
                out[0].contiguous().to_f64_vec(),
                want_a,
                "{} n={n}",
                backend.name()
            );
            assert_eq!(
                out[1].contiguous().to_f64_vec(),
                want_b,
                "{} n={n}",
                backend.name()
            );
        }
        let too_big = compiled.call(&[Tensor::zeros(minductor::DType::F32, &[10, 2]), y.clone()]);
        assert!(matches!(too_big, Err(CallError::OutOfRange { .. })));
    }
}

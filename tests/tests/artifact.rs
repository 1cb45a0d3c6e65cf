//! Saved artifacts (`Compiled::save`, `minductor::load`): they load without tracing, in this
//! process and another, and compute what the compiled graph computes, bit for bit; truncated,
//! corrupted, foreign-version, wrong-CPU and tampered files are typed errors, never panics
//! (a proptest fuzzes the loader with byte mutations and truncations).

use minductor::{
    compile, compile_with, load, load_bytes, Artifact, ArtifactError, Backend, Compiled, DType,
    Graph, Tensor, Tracer,
};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::ramp;
use minductor_tests::{compare_outputs, Tolerance};
use proptest::prelude::*;
use std::path::PathBuf;

/// A fresh directory under the system's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("minductor-artifact-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An MLP with a softmax over a symbolic batch dim `s0`: GEMMs with epilogues, reductions,
/// intermediates in the arena.
fn mlp_graph() -> Graph {
    let t = Tracer::new();
    let x = t.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(32)].into_iter().collect(),
        ),
    );
    let w1 = t.input("w1", DType::F32, &[64, 32]);
    let b1 = t.input("b1", DType::F32, &[64]);
    let w2 = t.input("w2", DType::F32, &[16, 64]);
    let y = x
        .linear(&w1, Some(&b1))
        .gelu()
        .linear(&w2, None)
        .softmax(-1);
    t.finish(&[y]).unwrap()
}

fn mlp_inputs(batch: usize) -> Vec<Tensor> {
    vec![
        ramp(&[batch, 32], 0.1),
        ramp(&[64, 32], 0.2),
        ramp(&[64], 0.3),
        ramp(&[16, 64], 0.4),
    ]
}

/// A loss and its gradients (a joint graph with a tangent input), and an embedding lookup
/// (an index check) in one graph.
fn grad_graph() -> Graph {
    let t = Tracer::new();
    let ids = t.input("ids", DType::I64, &[6]);
    let table = t.input("table", DType::F32, &[10, 8]);
    let w = t.input("w", DType::F32, &[4, 8]);
    let h = ids.embedding(&table).linear(&w, None).tanh();
    let loss = (&h * &h).sum(&[], false);
    let mut outs = vec![loss.clone()];
    outs.extend(loss.grad(&[&table, &w]));
    t.finish(&outs).unwrap()
}

fn grad_inputs() -> Vec<Tensor> {
    vec![
        Tensor::from_vec(&[6], vec![0i64, 3, 9, 3, 1, 7]).unwrap(),
        ramp(&[10, 8], 0.5),
        ramp(&[4, 8], 0.6),
    ]
}

fn same(got: &[Tensor], want: &[Tensor], what: &str) {
    compare_outputs(got, want, Tolerance::EXACT, what).unwrap();
}

fn saved_bytes(compiled: &Compiled, dir: &std::path::Path) -> Vec<u8> {
    let path = dir.join("model.mind");
    compiled.save(&path).unwrap();
    std::fs::read(path).unwrap()
}

#[test]
fn a_loaded_artifact_computes_what_the_compiled_graph_does() {
    let dir = temp_dir("same");
    for (name, graph, inputs) in [
        ("mlp", mlp_graph(), vec![mlp_inputs(5), mlp_inputs(67)]),
        ("grad", grad_graph(), vec![grad_inputs()]),
    ] {
        let compiled = compile(&graph).unwrap();
        let path = dir.join(format!("{name}.mind"));
        compiled.save(&path).unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.graph().to_string(), graph.to_string());
        assert_eq!(
            loaded.artifacts().program,
            compiled.artifacts().program,
            "{name}"
        );
        assert_eq!(loaded.tangent_dtypes(), compiled.tangent_dtypes());
        for inputs in &inputs {
            let want = compiled.call(inputs).unwrap();
            same(&loaded.call(inputs).unwrap(), &want, name);
        }
        // The guards still apply: a wrong shape is the same typed error.
        let mut bad = inputs[0].clone();
        bad[1] = ramp(&[3, 3], 0.0);
        assert_eq!(
            loaded.call(&bad).unwrap_err().to_string(),
            compiled.call(&bad).unwrap_err().to_string()
        );
        // Saving the loaded one writes the same artifact.
        let again = dir.join(format!("{name}-again.mind"));
        loaded.save(&again).unwrap();
        assert_eq!(
            std::fs::read(&again).unwrap(),
            std::fs::read(&path).unwrap()
        );
    }
    // A bad embedding index is still caught by the loaded program's index check.
    let loaded = load(dir.join("grad.mind")).unwrap();
    let mut inputs = grad_inputs();
    inputs[0] = Tensor::from_vec(&[6], vec![0i64, 3, 10, 3, 1, 7]).unwrap();
    let err = loaded.call(&inputs).unwrap_err().to_string();
    assert!(err.contains("10"), "{err}");
}

#[test]
fn bad_files_are_typed_errors() {
    let dir = temp_dir("bad");
    let compiled = compile(&mlp_graph()).unwrap();
    let bytes = saved_bytes(&compiled, &dir);
    let artifact = Artifact::from_bytes(&bytes).unwrap();
    let err = |bytes: &[u8]| load_bytes(bytes).err().expect("a bad artifact loads");

    // Truncated anywhere: a typed error (the checksum line is the last thing written).
    for len in (0..bytes.len()).step_by(97).chain([bytes.len() - 1, 1, 5]) {
        match err(&bytes[..len]) {
            ArtifactError::Truncated(_) | ArtifactError::Corrupted(_) => {}
            other => panic!("truncated to {len} bytes: {other}"),
        }
    }
    // One byte changed in the middle: the checksum says so.
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x20;
    assert!(matches!(err(&flipped), ArtifactError::Corrupted(_)));
    // Not an artifact at all.
    assert!(matches!(
        err(b"\x7fELF\x02\x01\x01 not a model"),
        ArtifactError::NotAnArtifact
    ));
    assert!(matches!(
        load(dir.join("missing.mind")),
        Err(ArtifactError::Io { .. })
    ));
    // Another format version, before anything else is read.
    let text = String::from_utf8(bytes.clone()).unwrap();
    let future = text.replacen("format 2\n", "format 3\n", 1);
    assert!(matches!(
        err(future.as_bytes()),
        ArtifactError::ForeignFormat { .. }
    ));
    // Format 1 (before the constants section) still loads and computes the same.
    let format_1 = Artifact {
        format_version: 1,
        ..artifact.clone()
    };
    assert!(format_1
        .to_bytes()
        .starts_with(b"MINDUCTOR-ARTIFACT\nformat 1\n"));
    let old = load_bytes(&format_1.to_bytes()).unwrap();
    same(
        &old.call(&mlp_inputs(5)).unwrap(),
        &compiled.call(&mlp_inputs(5)).unwrap(),
        "format 1",
    );
    // Another minductor version, with a correct checksum.
    let older = Artifact {
        minductor_version: "0.0.1".into(),
        ..artifact.clone()
    };
    assert!(matches!(
        err(&older.to_bytes()),
        ArtifactError::ForeignVersion { .. }
    ));
    // A CPU this is not: another architecture, or a feature this machine lacks.
    let riscv = Artifact {
        arch: "riscv64".into(),
        ..artifact.clone()
    };
    let e = err(&riscv.to_bytes());
    assert!(matches!(e, ArtifactError::UnsupportedCpu { .. }), "{e}");
    let mut exotic = artifact.clone();
    exotic.required_features.push("avx512vp2intersect".into());
    match err(&exotic.to_bytes()) {
        ArtifactError::UnsupportedCpu { missing, .. } => {
            assert_eq!(missing, vec!["avx512vp2intersect".to_string()])
        }
        other => panic!("{other}"),
    }
    // A tampered program with a correct checksum: the verifier refuses a store outside its
    // buffer before any code exists.
    let store = artifact
        .program
        .lines()
        .find(|l| l.contains(": store buf") && l.contains("*o0"))
        .expect("a store indexed by the first outer loop");
    let tampered_line = store.replacen("*o0", "000000*o0", 1);
    let tampered = Artifact {
        program: artifact.program.replacen(store, &tampered_line, 1),
        ..artifact.clone()
    };
    let e = err(&tampered.to_bytes());
    assert!(matches!(e, ArtifactError::Verify(_)), "{e}");
    // Guards that disagree with the graph.
    let renamed = Artifact {
        guards: artifact.guards.replacen("input x:", "input y:", 1),
        ..artifact.clone()
    };
    assert!(matches!(
        err(&renamed.to_bytes()),
        ArtifactError::Inconsistent(_)
    ));
    // Only inductor results have a program to save.
    let eager = compile_with(&mlp_graph(), Backend::Eager).unwrap();
    assert!(matches!(
        eager.save(dir.join("eager.mind")),
        Err(ArtifactError::Unsupported(_))
    ));
    // The untouched bytes still load.
    load_bytes(&bytes).unwrap();
}

/// The artifact of the MLP, made once for the fuzz cases.
fn fuzz_seed() -> &'static (Vec<u8>, Artifact) {
    static SEED: std::sync::OnceLock<(Vec<u8>, Artifact)> = std::sync::OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_dir("fuzz");
        let compiled = compile(&mlp_graph()).unwrap();
        let bytes = saved_bytes(&compiled, &dir);
        let artifact = Artifact::from_bytes(&bytes).unwrap();
        (bytes, artifact)
    })
}

/// A loaded fuzz case must be a verified program that runs (or fails with a typed error) on
/// inputs of the types its guards declare.
fn exercise(loaded: Compiled) {
    let graph = loaded.graph();
    let inputs: Option<Vec<Tensor>> = graph
        .inputs()
        .iter()
        .map(|&i| {
            let ty = graph.ty(i);
            let shape: Vec<usize> = ty
                .shape
                .iter()
                .map(|d| d.as_static().unwrap_or(3))
                .collect();
            if shape.iter().product::<usize>() > 1 << 16 {
                return None;
            }
            Tensor::try_zeros(ty.dtype, &shape).ok()
        })
        .collect();
    if let Some(inputs) = inputs {
        let _ = loaded.call(&inputs);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Raw bytes: flips, insertions, deletions and a truncation anywhere.
    #[test]
    fn mutated_bytes_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        truncate in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (bytes, _) = fuzz_seed();
        let mut bytes = bytes.clone();
        for (at, byte, kind) in edits {
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => { bytes.remove(i); }
            }
        }
        if let Some(t) = truncate {
            bytes.truncate(t.index(bytes.len() + 1));
        }
        if let Ok(loaded) = load_bytes(&bytes) {
            exercise(loaded);
        }
    }

    /// Mutations of the sections' text with the checksum made right again, so that the
    /// parsers, the consistency checks and the verifier see them.
    #[test]
    fn mutated_sections_with_a_valid_checksum_never_panic(
        section in 0usize..3,
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::sample::select(vec![
                "0", "1", "9", "-", "s0", "buf0", "e0", "o0", "i0", "[", "]", ", ", " + ", "\n",
                "stage0", "%0", "1000000", "f32", "i64", "bool", "Input(0)", "Output",
            ]), 0u8..3),
            1..4,
        ),
    ) {
        let (_, artifact) = fuzz_seed();
        let mut artifact = artifact.clone();
        let text = match section {
            0 => &mut artifact.graph,
            1 => &mut artifact.guards,
            _ => &mut artifact.program,
        };
        for (at, token, kind) in edits {
            // A char boundary at or before the chosen byte.
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match kind {
                0 => text.insert_str(i, token),
                1 => {
                    let end = (i + token.len()).min(text.len());
                    let end = (end..=text.len()).find(|&e| text.is_char_boundary(e)).unwrap();
                    text.replace_range(i..end, token);
                }
                _ => {
                    let end = (i + 1..=text.len()).find(|&e| text.is_char_boundary(e)).unwrap_or(i);
                    text.replace_range(i..end, "");
                }
            }
        }
        if let Ok(loaded) = load_bytes(&artifact.to_bytes()) {
            exercise(loaded);
        }
    }
}

/// The same section mutations, deterministically, with a count of where each attempt stopped:
/// the fuzzing must get past the parsers to the verifier and to loaded programs.
#[test]
fn section_fuzzing_reaches_the_verifier_and_loads() {
    let (_, artifact) = fuzz_seed();
    let tokens = [
        "0", "1", "9", "-", "s0", "buf0", "e0", "o0", "i0", "[", "]", ", ", " + ", "%0",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..1500 {
        let mut a = artifact.clone();
        let text = match next(3) {
            0 => &mut a.graph,
            1 => &mut a.guards,
            _ => &mut a.program,
        };
        // Replace one run of digits (or one token) by another: small, mostly well-formed edits.
        let at = next(text.len());
        if text.is_char_boundary(at) {
            let end = (at + 1..=text.len())
                .find(|&e| text.is_char_boundary(e))
                .unwrap();
            text.replace_range(at..end, tokens[next(tokens.len())]);
        }
        let outcome = match load_bytes(&a.to_bytes()) {
            Ok(loaded) => {
                exercise(loaded);
                "loaded".to_string()
            }
            Err(e) => {
                let s = format!("{e:?}");
                s[..s.find(|c: char| !c.is_alphanumeric()).unwrap_or(s.len())].to_string()
            }
        };
        *counts.entry(outcome).or_default() += 1;
    }
    println!("{counts:?}");
    assert!(counts.get("Verify").copied().unwrap_or(0) > 0, "{counts:?}");
    assert!(counts.get("loaded").copied().unwrap_or(0) > 0, "{counts:?}");
}

/// The name of the environment variable that makes `load_in_another_process` the child.
const CHILD: &str = "MINDUCTOR_ARTIFACT_TEST_CHILD";

/// Saves here, loads in a child process (this test binary again, running only
/// `child_loads_and_runs`), and compares the child's outputs with this process's.
#[test]
fn an_artifact_loads_in_another_process() {
    let dir = temp_dir("process");
    let graph = mlp_graph();
    let compiled = compile(&graph).unwrap();
    let path = dir.join("mlp.mind");
    compiled.save(&path).unwrap();
    let out = dir.join("out.bin");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_loads_and_runs",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{}\n{}", path.display(), out.display()))
        .status()
        .unwrap();
    assert!(status.success(), "the child process failed");
    let got = std::fs::read(&out).expect("the child wrote its outputs");
    let want = compiled.call(&mlp_inputs(9)).unwrap();
    assert_eq!(got, want[0].to_bytes(), "the child's outputs differ");
}

/// Only does something in the child process of `an_artifact_loads_in_another_process`: loads
/// the artifact (no graph is traced or compiled in this process) and writes its output's bytes.
#[test]
fn child_loads_and_runs() {
    let Ok(paths) = std::env::var(CHILD) else {
        return;
    };
    let (artifact, out) = paths.split_once('\n').unwrap();
    let loaded = load(artifact).unwrap();
    let outputs = loaded.call(&mlp_inputs(9)).unwrap();
    std::fs::write(out, outputs[0].to_bytes()).unwrap();
}

//! `MINDUCTOR_DUMP_DIR` receives every file of a compiled graph's dump.
//!
//! Its own test binary with one test, because it sets a process-wide environment variable.

use minductor::{compile, compile_with, trace, Backend, DType};
use std::path::{Path, PathBuf};

/// The dump directory whose `0_captured.txt` is `graph_text`.
fn dump_of(root: &Path, graph_text: &str) -> Vec<PathBuf> {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| {
            std::fs::read_to_string(d.join("0_captured.txt"))
                .is_ok_and(|t| t.trim_end() == graph_text)
        })
        .collect()
}

#[test]
fn dump_dir_receives_every_stage() {
    let root = std::env::temp_dir().join(format!("minductor-dump-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::env::set_var("MINDUCTOR_DUMP_DIR", &root);

    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[4, 16]);
        let w = t.input("w", DType::F32, &[8, 16]);
        vec![x.linear(&w, None).gelu().softmax(-1)]
    })
    .unwrap();
    let compiled = compile(&graph).unwrap();
    let aot = compile_with(&graph, Backend::AotEager).unwrap();
    std::env::remove_var("MINDUCTOR_DUMP_DIR");

    let dirs = dump_of(&root, &graph.to_string());
    assert_eq!(dirs.len(), 2, "one directory per compile: {dirs:?}");
    let name = |d: &PathBuf| d.file_name().unwrap().to_string_lossy().into_owned();
    let mut names: Vec<String> = dirs.iter().map(name).collect();
    names.sort();
    assert!(names.iter().all(|n| n.starts_with("graph_")), "{names:?}");
    assert_ne!(names[0], names[1]);
    let backend_of = |d: &PathBuf| std::fs::read_to_string(d.join("info.txt")).unwrap();
    let inductor = dirs
        .iter()
        .find(|d| backend_of(d).contains("backend: inductor"))
        .unwrap();
    let aot_dir = dirs
        .iter()
        .find(|d| backend_of(d).contains("backend: aot_eager"))
        .unwrap();

    let read = |d: &Path, f: &str| {
        std::fs::read_to_string(d.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display()))
    };
    let artifacts = compiled.artifacts();
    let prims = artifacts.prim_graph.as_ref().unwrap();
    let program = artifacts.program.as_ref().unwrap();
    assert_eq!(
        read(inductor, "0_captured.txt").trim_end(),
        graph.to_string()
    );
    assert_eq!(
        read(inductor, "1_decompose.txt").trim_end(),
        minductor::internals::passes::decompose(&graph).to_string()
    );
    assert_eq!(
        read(inductor, "2_simplify.txt").trim_end(),
        prims.to_string()
    );
    assert_eq!(read(inductor, "3_program.txt"), program.to_string());
    let kernels = read(inductor, "kernels.txt");
    for step in minductor::internals::kernel_ir::program_cost(program) {
        assert!(kernels.contains(&step.name), "{kernels}");
    }
    assert!(kernels.contains("matmul"), "{kernels}");
    let plan = read(inductor, "buffer_plan.txt");
    assert_eq!(
        plan.lines().filter(|l| l.starts_with("buf")).count(),
        program.buffers.len() + 1,
        "a header and one line per buffer:\n{plan}"
    );
    for (kernel, clif) in &artifacts.cranelift_ir {
        assert_eq!(&read(inductor, &format!("output_code/{kernel}.clif")), clif);
    }
    assert_eq!(
        std::fs::read_dir(inductor.join("output_code"))
            .unwrap()
            .count(),
        program.kernels().count()
    );
    let dot = read(inductor, "graph.dot");
    assert!(dot.starts_with("digraph"), "{dot}");
    assert_eq!(
        dot.matches("subgraph \"cluster_").count(),
        program.steps.len()
            + program
                .steps
                .iter()
                .filter(|s| matches!(s, minductor::internals::kernel_ir::Step::Matmul(m) if m.epilogue.is_some()))
                .count(),
        "one cluster per kernel (epilogues included) and per GEMM:\n{dot}"
    );
    for kernel in program.kernels() {
        assert!(
            dot.contains(&format!("\"cluster_{}\"", kernel.name)),
            "{dot}"
        );
    }

    // aot_eager: the passes' graphs and the DOT without kernels, nothing of inductor's.
    assert_eq!(
        read(aot_dir, "2_simplify.txt").trim_end(),
        aot.artifacts().prim_graph.as_ref().unwrap().to_string()
    );
    assert!(read(aot_dir, "graph.dot").starts_with("digraph"));
    assert!(!aot_dir.join("kernels.txt").exists());
    assert!(!aot_dir.join("output_code").exists());

    std::fs::remove_dir_all(&root).unwrap();
}

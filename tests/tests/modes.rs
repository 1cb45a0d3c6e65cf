//! Compile modes (`CompileOptions::mode`, like `torch.compile(mode=...)`): they parse from
//! strings, are part of the compile-cache key and the artifact, and compute bitwise what the
//! default mode computes. `call_into` writes into the caller's tensors (the same memory, checked
//! by pointer) and rejects unusable ones with typed errors; max-autotune records its choices.

use minductor::internals::codegen_cpu::{CompiledProgram, Split};
use minductor::{
    compile_with_options, load_bytes, Artifact, Backend, CompileCache, CompileError,
    CompileOptions, Compiled, DType, Graph, Mode, RuntimeError, Tensor, Tracer,
};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::ramp;
use minductor_tests::{assert_allclose, Tolerance};

/// A GEMM with an epilogue, a softmax, an integer reduction (a fallback step), an output that is
/// an input and one value returned twice.
fn graph() -> Graph {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[64, 48]);
    let w = t.input("w", DType::F32, &[32, 48]);
    let y = x.linear(&w, None).gelu().softmax(-1);
    let counts = x.gt(0.0).cast(DType::I64).sum(&[1], false);
    t.finish(&[y.clone(), counts, x, y]).unwrap()
}

fn inputs(seed: f32) -> Vec<Tensor> {
    vec![ramp(&[64, 48], seed), ramp(&[32, 48], seed + 1.0)]
}

/// Held by the tests that set the thread count or read it across compiles (max-autotune's
/// choices are named by it), so that they do not change it under one another.
static THREAD_COUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn thread_count_lock() -> std::sync::MutexGuard<'static, ()> {
    THREAD_COUNT.lock().unwrap_or_else(|p| p.into_inner())
}

fn compiled(mode: Mode) -> Compiled {
    compile_with_options(
        &graph(),
        CompileOptions {
            mode,
            ..CompileOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn modes_parse_from_their_names() {
    for mode in [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune] {
        assert_eq!(mode.name().parse::<Mode>().unwrap(), mode);
        assert_eq!(mode.to_string(), mode.name());
    }
    assert_eq!(
        "reduce-overhead".parse::<Mode>().unwrap(),
        Mode::ReduceOverhead
    );
    let err = "max_autotune".parse::<Mode>().unwrap_err();
    assert!(matches!(err, CompileError::UnknownMode(_)));
    assert!(err.to_string().contains("reduce-overhead"), "{err}");
}

#[test]
fn every_mode_computes_bitwise_what_the_default_computes() {
    let default = compiled(Mode::Default);
    for mode in [Mode::ReduceOverhead, Mode::MaxAutotune] {
        let other = compiled(mode);
        assert_eq!(other.options().mode, mode);
        for seed in [0.1, 2.5] {
            let want = default.call(&inputs(seed)).unwrap();
            let got = other.call(&inputs(seed)).unwrap();
            assert_allclose(&got, &want, Tolerance::EXACT, mode.name());
        }
    }
}

#[test]
fn call_into_writes_into_the_callers_tensors() {
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let c = compiled(mode);
        let mut outputs = c.call(&inputs(0.3)).unwrap();
        // `call` returns one value returned twice as two handles on one storage; each output
        // handed back must own its storage, so the second gets a tensor of its own.
        outputs[3] = Tensor::zeros(DType::F32, &[64, 32]);
        let pointers: Vec<*const u8> = outputs.iter().map(|t| t.data_ptr()).collect();
        for seed in [1.0, 2.0] {
            c.call_into(&inputs(seed), &mut outputs).unwrap();
            let after: Vec<*const u8> = outputs.iter().map(|t| t.data_ptr()).collect();
            assert_eq!(
                after,
                pointers,
                "{}: the same memory is reused",
                mode.name()
            );
            let want = c.call(&inputs(seed)).unwrap();
            assert_allclose(&outputs, &want, Tolerance::EXACT, mode.name());
        }
    }
    // The eager backend takes the same call (it copies its results in).
    let graph = graph();
    let eager = compile_with_options(
        &graph,
        CompileOptions {
            backend: Backend::Eager,
            ..CompileOptions::default()
        },
    )
    .unwrap();
    let mut outputs = eager.call(&inputs(0.0)).unwrap();
    let pointer = outputs[0].data_ptr();
    eager.call_into(&inputs(4.0), &mut outputs).unwrap();
    assert_eq!(outputs[0].data_ptr(), pointer);
    assert_allclose(
        &outputs,
        &eager.call(&inputs(4.0)).unwrap(),
        Tolerance::EXACT,
        "eager call_into",
    );
}

#[test]
fn unusable_output_tensors_are_typed_errors() {
    let c = compiled(Mode::ReduceOverhead);
    let fresh = || {
        let mut outputs = c.call(&inputs(0.5)).unwrap();
        outputs[3] = Tensor::zeros(DType::F32, &[64, 32]);
        outputs
    };
    let expect_buffer_error = |outputs: &mut Vec<Tensor>, index: usize, found: &str| {
        let before: Vec<Vec<f64>> = outputs.iter().map(|t| t.to_f64_vec()).collect();
        let err = c.call_into(&inputs(1.5), outputs).unwrap_err();
        match &err {
            RuntimeError::OutputBuffer {
                index: i, found: f, ..
            } => {
                assert_eq!(*i, index, "{err}");
                assert!(f.contains(found), "{err}");
            }
            other => panic!("expected an output-buffer error, got {other}"),
        }
        // Nothing ran: the tensors are untouched.
        let after: Vec<Vec<f64>> = outputs.iter().map(|t| t.to_f64_vec()).collect();
        assert_eq!(before, after);
    };
    let mut outputs = fresh();
    outputs[0] = Tensor::zeros(DType::F32, &[64, 31]);
    expect_buffer_error(&mut outputs, 0, "f32[64, 31]");
    let mut outputs = fresh();
    outputs[1] = Tensor::zeros(DType::F32, &[64]);
    expect_buffer_error(&mut outputs, 1, "f32[64]");
    let mut outputs = fresh();
    outputs[2] = ramp(&[48, 64], 0.0).permute(&[1, 0]).unwrap();
    expect_buffer_error(&mut outputs, 2, "non-contiguous");
    let mut outputs = fresh();
    let _kept = outputs[3].clone();
    expect_buffer_error(&mut outputs, 3, "sharing its storage");
    // As returned by `call`, the value returned twice is one storage behind two handles.
    let mut outputs = c.call(&inputs(0.5)).unwrap();
    expect_buffer_error(&mut outputs, 0, "sharing its storage");
    // An input handed in as an output shares its storage with the input.
    let ins = inputs(1.5);
    let mut outputs = fresh();
    outputs[2] = ins[0].clone();
    let err = c.call_into(&ins, &mut outputs).unwrap_err();
    assert!(
        matches!(err, RuntimeError::OutputBuffer { index: 2, .. }),
        "{err}"
    );
    let mut outputs = fresh();
    outputs.pop();
    let err = c.call_into(&inputs(1.5), &mut outputs).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::OutputBufferCount {
                expected: 4,
                found: 3
            }
        ),
        "{err}"
    );
    // Bad inputs stay typed errors in reduce-overhead mode (checked by the program's binding).
    let err = c
        .call(&[ramp(&[64, 47], 0.0), ramp(&[32, 48], 0.0)])
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Shape { .. }), "{err}");
    let err = c.call(&[ramp(&[64, 48], 0.0)]).unwrap_err();
    assert!(matches!(err, RuntimeError::Arity { .. }), "{err}");
}

#[test]
fn the_mode_is_part_of_the_cache_key_and_the_artifact() {
    let _threads = thread_count_lock();
    let graph = graph();
    let keys: Vec<String> = [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune]
        .into_iter()
        .map(|mode| {
            CompileCache::key(
                &graph,
                &CompileOptions {
                    mode,
                    ..CompileOptions::default()
                },
            )
        })
        .collect();
    assert!(
        keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2],
        "{keys:?}"
    );
    for mode in [Mode::ReduceOverhead, Mode::MaxAutotune] {
        let c = compiled(mode);
        let artifact = Artifact::of(&c).unwrap();
        assert!(
            artifact.options.ends_with(&format!("mode={}", mode.name())),
            "{}",
            artifact.options
        );
        let loaded = load_bytes(&artifact.to_bytes()).unwrap();
        assert_eq!(loaded.options().mode, mode);
        assert_eq!(
            loaded.artifacts().autotune.is_empty(),
            mode != Mode::MaxAutotune
        );
        assert_allclose(
            &loaded.call(&inputs(0.9)).unwrap(),
            &c.call(&inputs(0.9)).unwrap(),
            Tolerance::EXACT,
            mode.name(),
        );
    }
}

#[test]
fn max_autotune_keeps_a_split_for_every_kernel_and_gemm_step() {
    let _threads = thread_count_lock();
    use minductor::internals::kernel_ir::{MatmulOperand, Step};
    let c = compiled(Mode::MaxAutotune);
    let program = c.artifacts().program.as_ref().unwrap();
    let kernel_steps: Vec<String> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(k.name.clone()),
            Step::Matmul(m) if matches!(m.b, MatmulOperand::View(_)) => {
                Some(format!("matmul_{}", m.out))
            }
            _ => None,
        })
        .collect();
    let tuned: Vec<String> = c
        .artifacts()
        .autotune
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    assert!(!tuned.is_empty());
    assert_eq!(tuned, kernel_steps);
    // Symbolic sizes: nothing to time, nothing tuned, still correct.
    let t = Tracer::new();
    let x = t.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(40)].into_iter().collect(),
        ),
    );
    let g = t.finish(&[x.softmax(-1)]).unwrap();
    let options = CompileOptions {
        mode: Mode::MaxAutotune,
        ..CompileOptions::default()
    };
    let symbolic = compile_with_options(&g, options).unwrap();
    assert!(symbolic.artifacts().autotune.is_empty());
    let x = ramp(&[5, 40], 0.2);
    let want = minductor::reference_executable(&g)(std::slice::from_ref(&x)).unwrap();
    assert_allclose(
        &symbolic.call(&[x]).unwrap(),
        &want,
        Tolerance::close(1e-5),
        "symbolic softmax",
    );
}

#[test]
fn jit_functions_compile_in_their_mode() {
    let body = |x: &[minductor::Traced]| vec![x[0].linear(&x[1], None).relu().softmax(-1)];
    let default = minductor::jit(body);
    let reduced = minductor::jit(body).mode("reduce-overhead".parse().unwrap());
    assert_eq!(reduced.options().mode, Mode::ReduceOverhead);
    for seed in [0.2, 0.4, 0.2] {
        let want = default.call(&inputs(seed)).unwrap();
        let got = reduced.call(&inputs(seed)).unwrap();
        assert_allclose(&got, &want, Tolerance::EXACT, "jit reduce-overhead");
    }
    let stats = reduced.stats();
    assert_eq!((stats.compiles, stats.cache_hits), (1, 2));
    // The guards still reject what does not match, before any compiled code runs.
    let err = reduced
        .call(&[ramp(&[64, 48], 0.0), ramp(&[32, 47], 0.0)])
        .unwrap_err();
    assert!(err.to_string().contains("47"), "{err}");
}

#[test]
fn max_autotune_choices_are_saved_and_reused_on_the_same_machine() {
    let _threads = thread_count_lock();
    let c = compiled(Mode::MaxAutotune);
    let mut artifact = Artifact::of(&c).unwrap();
    let threads = minductor::num_threads();
    assert!(
        artifact
            .autotune
            .starts_with(&format!("threads {threads}\n")),
        "{}",
        artifact.autotune
    );
    // Loaded on the machine that saved it: the choices are reused, not timed again.
    let loaded = load_bytes(&artifact.to_bytes()).unwrap();
    assert!(loaded.artifacts().autotune_reused);
    assert_eq!(loaded.artifacts().autotune, c.artifacts().autotune);
    // Kernel steps and the GEMM are tuned.
    let kernels: Vec<String> = c
        .artifacts()
        .autotune
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        kernels.iter().any(|k| k.starts_with("matmul_")),
        "{kernels:?}"
    );
    // Choices edited (kernels serial, the GEMM packed and cut by panels) load as they are, with
    // the same results.
    let edited: Vec<String> = kernels
        .iter()
        .map(|k| match k.starts_with("matmul_") {
            true => format!("gemm-t{threads}-1x{threads}"),
            false => "serial".to_string(),
        })
        .collect();
    artifact.autotune = std::iter::once(format!("threads {threads}"))
        .chain(kernels.iter().zip(&edited).map(|(k, s)| format!("{k} {s}")))
        .collect::<Vec<_>>()
        .join("\n");
    let loaded = load_bytes(&artifact.to_bytes()).unwrap();
    let splits: Vec<String> = loaded
        .artifacts()
        .autotune
        .iter()
        .map(|(_, s)| s.name())
        .collect();
    assert!(loaded.artifacts().autotune_reused);
    assert_eq!(splits, edited);
    assert_allclose(
        &loaded.call(&inputs(0.4)).unwrap(),
        &c.call(&inputs(0.4)).unwrap(),
        Tolerance::EXACT,
        "saved splits",
    );
    // Timed on another thread count, or naming other kernels: tuned again.
    for stale in [
        format!("threads {}\n{} serial", threads + 7, kernels[0]),
        format!("threads {threads}\nno_such_kernel serial"),
    ] {
        artifact.autotune = stale;
        let loaded = load_bytes(&artifact.to_bytes()).unwrap();
        let tuned: Vec<&String> = loaded.artifacts().autotune.iter().map(|(k, _)| k).collect();
        assert!(!loaded.artifacts().autotune_reused);
        assert_eq!(tuned, kernels.iter().collect::<Vec<_>>());
    }
}

/// Every GEMM plan max-autotune may choose (streamed; packed and cut by rows, by panels, both)
/// gives the same bits as the default plan, at 1, 2 and 4 threads, for a short and a tall
/// product with an epilogue (bias and ReLU) and without; a plan timed on another thread count
/// is ignored (the default runs).
#[test]
fn every_gemm_plan_gives_the_same_bits() {
    let _threads = thread_count_lock();
    use minductor::internals::codegen_cpu::{compile_program, GemmChoice};
    use minductor::internals::runtime::Executable;
    for (m, k, n) in [(40usize, 70usize, 300usize), (300, 64, 100)] {
        let t = Tracer::new();
        let x = t.input("x", DType::F32, &[m, k]);
        let w = t.input("w", DType::F32, &[n, k]);
        let b = t.input("b", DType::F32, &[n]);
        let g = t
            .finish(&[x.linear(&w, Some(&b)).relu(), x.matmul(&w.transpose(0, 1))])
            .unwrap();
        let inputs = vec![ramp(&[m, k], 0.1), ramp(&[n, k], 0.2), ramp(&[n], 0.3)];
        let program = minductor_tests::compiled_program(&g);
        let mut compiled = compile_program(&program).unwrap();
        for threads in [1, 2, 4] {
            minductor::set_num_threads(threads).unwrap();
            let want = compiled.run(&inputs).unwrap();
            let steps = tuned_steps(&mut compiled);
            assert!(steps.iter().any(|s| s.starts_with("matmul_")), "{steps:?}");
            let mut plans: Vec<Split> = GemmChoice::candidates(threads)
                .into_iter()
                .map(Split::Gemm)
                .collect();
            plans.push(Split::Gemm(GemmChoice {
                threads: threads + 1,
                streams: true,
                row_groups: 1,
                panel_groups: 1,
            }));
            for plan in plans {
                let splits = only_steps(&steps, "matmul_", plan);
                assert!(compiled.set_splits(&splits), "{splits:?}");
                let got = compiled.run(&inputs).unwrap();
                assert_allclose(
                    &got,
                    &want,
                    Tolerance::EXACT,
                    &format!("{m}x{k}x{n} on {threads} threads, plan {}", plan.name()),
                );
            }
        }
        minductor::set_num_threads(0).unwrap();
    }
}

/// An attention of q `[1, 4, t, 24]`, k and v `[1, 4 / group, s, 24 | 20]` (repeated along the
/// heads when `group > 1`), with a mask when `mask` says (`"add"`: an f32 `[t, s]` added to the
/// scores; `"keep"`: a bool `[t, s]`, true takes part), and its inputs.
fn attention_graph(
    t: usize,
    s: usize,
    group: usize,
    causal: bool,
    mask: &str,
) -> (Graph, Vec<Tensor>) {
    use minductor_tests::wide_ramp;
    let (h, e, ev) = (4, 24, 20);
    let kv = h / group;
    let tracer = Tracer::new();
    let q = tracer.input("q", DType::F32, &[1, h, t, e]);
    let k = tracer.input("k", DType::F32, &[1, kv, s, e]);
    let v = tracer.input("v", DType::F32, &[1, kv, s, ev]);
    let mut inputs = vec![
        wide_ramp(&[1, h, t, e], 0.0),
        wide_ramp(&[1, kv, s, e], 1.0),
        wide_ramp(&[1, kv, s, ev], 2.0),
    ];
    let m = match mask {
        "add" => {
            inputs.push(wide_ramp(&[t, s], 3.0));
            Some(tracer.input("m", DType::F32, &[t, s]))
        }
        "keep" => {
            let kept: Vec<bool> = (0..t * s).map(|i| (i * 7 + 3) % 5 != 0).collect();
            inputs.push(Tensor::from_vec(&[t, s], kept).unwrap());
            Some(tracer.input("m", DType::Bool, &[t, s]))
        }
        _ => None,
    };
    let (k, v) = if group > 1 {
        (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    } else {
        (k, v)
    };
    let out = q.scaled_dot_product_attention(&k, &v, m.as_ref(), causal);
    (tracer.finish(&[out]).unwrap(), inputs)
}

/// Every attention tiling max-autotune may choose (query rows per block, items per thread),
/// and one timed on another thread count, gives bitwise what the default tiling gives on one
/// thread, on 1, 2 and 4 threads: causal (with grouped-query heads) and not, without a mask,
/// with an additive and with a bool one, at odd sequence lengths.
#[test]
fn every_attention_tiling_gives_the_same_bits() {
    let _threads = thread_count_lock();
    use minductor::internals::codegen_cpu::{compile_program, AttentionChoice};
    use minductor::internals::kernel_ir::Step;
    use minductor::internals::runtime::Executable;
    for (t, s, group, causal, mask) in [
        (201, 201, 2, true, "none"),
        (131, 77, 1, false, "none"),
        (150, 190, 1, false, "keep"),
        (97, 97, 1, true, "add"),
    ] {
        let what = format!("t {t} s {s} group {group} causal {causal} mask {mask}");
        let (g, inputs) = attention_graph(t, s, group, causal, mask);
        let program = minductor_tests::compiled_program(&g);
        assert!(
            program
                .steps
                .iter()
                .any(|s| matches!(s, Step::Attention(_))),
            "{what}: not fused:\n{program}"
        );
        let mut compiled = compile_program(&program).unwrap();
        minductor::set_num_threads(1).unwrap();
        let want = compiled.run(&inputs).unwrap();
        for threads in [1, 2, 4] {
            minductor::set_num_threads(threads).unwrap();
            let steps = tuned_steps(&mut compiled);
            assert!(
                steps.iter().any(|s| s.starts_with("attention_")),
                "{what}: {steps:?}"
            );
            let mut tilings: Vec<Split> = AttentionChoice::candidates(threads)
                .into_iter()
                .map(Split::Attention)
                .collect();
            assert_eq!(tilings.len(), 8);
            tilings.push(Split::PerThread);
            tilings.push(Split::Attention(AttentionChoice {
                threads: threads + 1,
                query_block: 32,
                items_per_thread: 8,
            }));
            // The work items each tiling cuts the attention into (the executor's own rule).
            let mut cuts = std::collections::HashSet::new();
            for tiling in tilings {
                let splits = only_steps(&steps, "attention_", tiling);
                assert!(compiled.set_splits(&splits), "{splits:?}");
                let partition = compiled.partition_steps(&inputs, threads).unwrap();
                cuts.extend(
                    partition
                        .into_iter()
                        .filter(|p| p.name.starts_with("attention_"))
                        .map(|p| p.pieces),
                );
                let got = compiled.run(&inputs).unwrap();
                assert_allclose(
                    &got,
                    &want,
                    Tolerance::EXACT,
                    &format!("{what} on {threads} threads, {}", tiling.name()),
                );
            }
            if threads == 1 {
                // One thread runs the items in order on the caller: one piece, whatever the
                // tiling (the query block still changes the order of work, not the cut).
                assert!(
                    cuts.iter().all(|pieces| pieces.len() == 1),
                    "{what}: {cuts:?}"
                );
            } else {
                assert!(cuts.len() > 1, "{what}: every tiling cuts the same way");
            }
        }
        minductor::set_num_threads(0).unwrap();
    }
}

/// Max-autotune tunes an attention step; its tiling is saved in the artifact and in the compile
/// cache and reused on the same thread count (an edited one exactly as written, with the same
/// results), named by the thread count it was timed on; from another thread count, or when
/// not a tiling, it is timed again.
#[test]
fn an_attention_tiling_survives_the_artifact_and_the_cache() {
    let _threads = thread_count_lock();
    let (g, inputs) = attention_graph(133, 133, 2, true, "none");
    let options = CompileOptions {
        mode: Mode::MaxAutotune,
        ..CompileOptions::default()
    };
    let dir =
        std::env::temp_dir().join(format!("minductor-attention-tiling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = CompileCache::new(&dir);
    let (c, outcome) = cache.compile(&g, options).unwrap();
    assert_eq!(outcome, minductor::CacheOutcome::Miss);
    let threads = minductor::num_threads();
    let tuned = &c.artifacts().autotune;
    let Some(at) = tuned.iter().position(|(k, _)| k.starts_with("attention_")) else {
        panic!("no attention step tuned: {tuned:?}")
    };
    // The choice is the default or a tiling timed on this thread count.
    match tuned[at].1 {
        Split::PerThread => {}
        Split::Attention(a) => assert_eq!(a.threads, threads),
        other => panic!("attention tuned as {}", other.name()),
    }
    let want = c.call(&inputs).unwrap();
    // An edited choice (blocks of 32 rows, 8 items a thread) written into the cache entry.
    let edited = format!("attention-t{threads}-rows32-items8");
    let entry = cache.path(&CompileCache::key(&g, &options));
    let mut artifact = Artifact::from_bytes(&std::fs::read(&entry).unwrap()).unwrap();
    let lines: Vec<String> = std::iter::once(format!("threads {threads}"))
        .chain(tuned.iter().enumerate().map(|(i, (k, s))| match i == at {
            true => format!("{k} {edited}"),
            false => format!("{k} {}", s.name()),
        }))
        .collect();
    artifact.autotune = lines.join("\n");
    std::fs::write(&entry, artifact.to_bytes()).unwrap();
    let (hit, outcome) = cache.compile(&g, options).unwrap();
    assert_eq!(outcome, minductor::CacheOutcome::Hit);
    assert!(hit.artifacts().autotune_reused);
    assert_eq!(hit.artifacts().autotune[at].1.name(), edited);
    assert_allclose(
        &hit.call(&inputs).unwrap(),
        &want,
        Tolerance::EXACT,
        "cached tiling",
    );
    // Saved again from the loaded program, and loaded: the same choice.
    let again = Artifact::of(&hit).unwrap();
    assert!(again.autotune.contains(&edited), "{}", again.autotune);
    let loaded = load_bytes(&again.to_bytes()).unwrap();
    assert!(loaded.artifacts().autotune_reused);
    assert_eq!(loaded.artifacts().autotune[at].1.name(), edited);
    assert_allclose(
        &loaded.call(&inputs).unwrap(),
        &want,
        Tolerance::EXACT,
        "loaded tiling",
    );
    // Timed on another thread count, or a GEMM plan given to the attention: timed again.
    for (what, stale) in [
        (
            "threads",
            artifact.autotune.replacen(
                &format!("threads {threads}"),
                &format!("threads {}", threads + 3),
                1,
            ),
        ),
        (
            "gemm plan",
            artifact
                .autotune
                .replace(&edited, &format!("gemm-t{threads}-stream")),
        ),
    ] {
        let mut artifact = artifact.clone();
        artifact.autotune = stale;
        let loaded = load_bytes(&artifact.to_bytes()).unwrap();
        assert!(!loaded.artifacts().autotune_reused, "{what}");
        assert_eq!(loaded.artifacts().autotune.len(), tuned.len(), "{what}");
        assert_allclose(
            &loaded.call(&inputs).unwrap(),
            &want,
            Tolerance::EXACT,
            what,
        );
    }
    // A tiling out of range does not parse.
    for bad in [
        "attention-t2-rows30-items4",
        "attention-t0-rows32-items4",
        "attention-t2-rows32-items0",
    ] {
        assert_eq!(Split::from_name(bad), None, "{bad}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The steps max-autotune tunes in `compiled` (after one round of it).
fn tuned_steps(compiled: &mut CompiledProgram) -> Vec<String> {
    compiled
        .autotune(1)
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// `split` for the steps whose names start with `prefix`, the default for the others.
fn only_steps(steps: &[String], prefix: &str, split: Split) -> Vec<(String, Split)> {
    steps
        .iter()
        .map(|s| match s.starts_with(prefix) {
            true => (s.clone(), split),
            false => (s.clone(), Split::PerThread),
        })
        .collect()
}

//! A C program (`tests/c/run_model.c`), compiled with the system C compiler (`cc`) against
//! `include/minductor.h` and the built `libminductor_capi`, runs an artifact this test saves,
//! and its outputs must equal the Rust ones exactly; it also checks typed errors from C.
//! Without `cc` on the PATH the test fails, saying so.

use minductor::{compile, DType, Tensor, Tracer};
use minductor::{Dim, SymId, TensorType};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo put this test's dependencies in (`target/<profile>/deps`) and the one
/// above it, where the cdylib is.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!(
        "{}minductor_capi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    for dir in [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()] {
        if dir.join(&name).exists() {
            return dir;
        }
    }
    panic!(
        "{name} is neither in {} nor beside it; build it with `cargo build -p minductor-capi` \
         (same profile)",
        deps.display()
    );
}

fn find_cc() -> PathBuf {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {}", cc.to_string_lossy()))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    found.unwrap_or_else(|| {
        panic!(
            "the C ABI test needs a C compiler: `{}` is not on the PATH (install one, e.g. \
             `apt-get install gcc`, or set CC)",
            cc.to_string_lossy()
        )
    })
}

/// Compiles `tests/c/{source}` against the header and the built library into `exe`.
fn build_c_program(cc: &Path, source: &str, exe: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let build = Command::new(cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c").join(source))
        .arg("-o")
        .arg(exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lminductor_capi")
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{} failed:\n{}",
        cc.display(),
        String::from_utf8_lossy(&build.stderr)
    );
}

/// The input pattern the C program writes: `((i * 7 + k * 13) % 23) / 11 - 1`.
fn pattern(i: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|k| ((i * 7 + k * 13) % 23) as f32 / 11.0 - 1.0)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// An MLP with a softmax over a symbolic batch dim, and a second output: `x: f32[s0, 24]`,
/// `w1: f32[48, 24]`, `b1: f32[48]`, `w2: f32[10, 48]`.
fn mlp() -> minductor::Graph {
    let t = Tracer::new();
    let x = t.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(24)].into_iter().collect(),
        ),
    );
    let w1 = t.input("w1", DType::F32, &[48, 24]);
    let b1 = t.input("b1", DType::F32, &[48]);
    let w2 = t.input("w2", DType::F32, &[10, 48]);
    let h = x.linear(&w1, Some(&b1)).gelu();
    let y = h.linear(&w2, None).softmax(-1);
    t.finish(&[y, h.sum(&[1], false)]).unwrap()
}

#[test]
fn a_c_program_runs_a_saved_model() {
    let cc = find_cc();
    let dir = std::env::temp_dir().join(format!("minductor-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let compiled = compile(&mlp()).unwrap();
    let artifact = dir.join("mlp.mind");
    compiled.save(&artifact).unwrap();

    let lib = library_dir();
    let exe = dir.join("run_model");
    build_c_program(&cc, "run_model.c", &exe);

    let batch = 5;
    // The library this test was built with: cargo's LD_LIBRARY_PATH (which outranks the
    // rpath) also lists `target/<profile>`, where an older build of the cdylib may lie.
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .arg(&artifact)
        .arg(batch.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "the C program failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.ends_with("ok\n"), "{stdout}");

    let inputs: Vec<Tensor> = [vec![batch, 24], vec![48, 24], vec![48], vec![10, 48]]
        .iter()
        .enumerate()
        .map(|(i, s)| pattern(i, s))
        .collect();
    let want = compiled.call(&inputs).unwrap();
    for (o, want) in want.iter().enumerate() {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("out{o} shape")))
            .unwrap_or_else(|| panic!("no output {o} in:\n{stdout}"));
        let (shape, values) = line.split_once(" values").unwrap();
        let shape: Vec<usize> = shape
            .split_whitespace()
            .skip(2)
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(shape, want.shape(), "output {o}");
        let got: Vec<f32> = values
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        let want = want.to_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.len(), "output {o}");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "output {o}, element {k}: {g} vs {w}"
            );
        }
    }
}

/// `fuzz_abi.c`: every hostile argument (NULL pointers, wrong counts, ranks larger than the
/// shape array, bad dtype codes, negative and huge sizes, short buffers, misaligned data,
/// truncated and byte-flipped artifacts) returns its typed status with no crash and no output
/// written, a 4 TiB output is `MINDUCTOR_ERR_OUT_OF_MEMORY`, and good calls afterwards give
/// the same bits as before.
#[test]
fn hostile_c_calls_return_typed_statuses() {
    let cc = find_cc();
    let dir = std::env::temp_dir().join(format!("minductor-capi-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let artifact = dir.join("mlp.mind");
    compile(&mlp()).unwrap().save(&artifact).unwrap();

    // `x: f32[s0, 1]` expanded to `[s0, 2^20]`, then exp: 4 TiB for s0 = 2^20.
    let t = Tracer::new();
    let x = t.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(1)].into_iter().collect(),
        ),
    );
    let graph = t.finish(&[x.expand(&[-1, 1 << 20]).exp()]).unwrap();
    let big = dir.join("big.mind");
    compile(&graph).unwrap().save(&big).unwrap();

    let exe = dir.join("fuzz_abi");
    build_c_program(&cc, "fuzz_abi.c", &exe);
    // `MINDUCTOR_MEMCHECK=1` (set by `.ci/memcheck`) runs the program under valgrind memcheck,
    // which must report no error: no read of unwritten memory or outside a buffer in the C ABI.
    let memcheck = std::env::var("MINDUCTOR_MEMCHECK").is_ok_and(|v| v == "1");
    let mut command = if memcheck {
        let mut c = Command::new("valgrind");
        c.args(["--error-exitcode=99", "--track-origins=yes"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let run = command
        .env("LD_LIBRARY_PATH", library_dir())
        .arg(&artifact)
        .arg(&big)
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "the C program failed ({:?}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.ends_with("ok\n"), "{stdout}");
    assert!(
        stdout.contains("case input rank 1000000: MINDUCTOR_ERR_SHAPE"),
        "{stdout}"
    );
    assert!(
        stdout.contains("case 4 TiB output: MINDUCTOR_ERR_OUT_OF_MEMORY"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes `tensors` in `run_tensors.c`'s tensor-list format (see that file).
fn write_tensor_list(path: &Path, tensors: &[Tensor]) {
    let mut out = b"MTENSORS".to_vec();
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    for t in tensors {
        let code = [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::Bool,
        ]
        .iter()
        .position(|&d| d == t.dtype())
        .unwrap() as i32;
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&(t.rank() as u32).to_le_bytes());
        for &n in t.shape() {
            out.extend_from_slice(&(n as i64).to_le_bytes());
        }
        let data = t.to_bytes();
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(&data);
    }
    std::fs::write(path, out).unwrap();
}

/// Reads a tensor list `run_tensors.c` wrote.
fn read_tensor_list(path: &Path) -> Vec<Tensor> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"MTENSORS", "{}", path.display());
    let mut at = 8;
    let mut take = |n: usize| {
        let taken = &bytes[at..at + n];
        at += n;
        taken
    };
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let count = word(take(8));
    (0..count)
        .map(|_| {
            let code = i32::from_le_bytes(take(4).try_into().unwrap());
            let dtype = [
                DType::F32,
                DType::F64,
                DType::F16,
                DType::BF16,
                DType::I64,
                DType::Bool,
            ][code as usize];
            let rank = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
            let shape: Vec<usize> = (0..rank)
                .map(|_| i64::from_le_bytes(take(8).try_into().unwrap()) as usize)
                .collect();
            let len = word(take(8)) as usize;
            Tensor::from_bytes(dtype, &shape, take(len)).unwrap()
        })
        .collect()
}

/// The deployment path of a PyTorch model: every case of `../shared/exported` is compiled by
/// `minductor pt2 compile` into one artifact that carries its frozen weights, a C program
/// (`run_tensors.c`) loads that file alone through the C ABI and runs it on the case's inputs
/// (the stored sizes, and for dynamic cases the `alt.` sizes through the same artifact), and
/// its outputs match PyTorch's at the manifest's tolerances, and this process's run of the
/// same artifact bit for bit. No case is skipped.
#[test]
fn a_c_program_runs_each_exported_model_from_its_artifact() {
    use minductor_tools::pt2;
    let cc = find_cc();
    let dir = std::env::temp_dir().join(format!("minductor-capi-pt2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("run_tensors");
    build_c_program(&cc, "run_tensors.c", &exe);
    let cases = pt2::load_pt2_manifest(&pt2::default_exported_dir()).unwrap();
    assert!(!cases.is_empty(), "no case in the manifest");
    let mut ran = Vec::new();
    for case in &cases {
        let artifact = dir.join(format!("{}.mind", case.name));
        let report = pt2::compile_artifact(&case.file, &artifact)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        println!("{}: {report}", case.name);
        // No file beside the artifact: it is the whole model.
        let beside: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&case.name) && *n != format!("{}.mind", case.name))
            .collect();
        assert!(beside.is_empty(), "{}: {beside:?}", case.name);
        let loaded = minductor::load(&artifact).unwrap();
        let data = minductor::load_safetensors(&case.data).unwrap();
        let mut sets = vec![("stored", "")];
        if case.has_alt {
            sets.push(("alt", "alt."));
        }
        for (sizes, prefix) in sets {
            let inputs: Vec<Tensor> = case
                .inputs
                .iter()
                .map(|n| data[&format!("{prefix}{n}")].clone())
                .collect();
            let inputs_path = dir.join(format!("{}.{sizes}.in", case.name));
            let outputs_path = dir.join(format!("{}.{sizes}.out", case.name));
            write_tensor_list(&inputs_path, &inputs);
            let run = Command::new(&exe)
                .env("LD_LIBRARY_PATH", library_dir())
                .arg(&artifact)
                .arg(&inputs_path)
                .arg(&outputs_path)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&run.stdout);
            assert!(
                run.status.success() && stdout.ends_with("ok\n"),
                "{} ({sizes} sizes): the C program failed:\n{stdout}\n{}",
                case.name,
                String::from_utf8_lossy(&run.stderr)
            );
            let got = read_tensor_list(&outputs_path);
            let check = pt2::check_outputs(
                &data,
                prefix,
                &got,
                case.outputs,
                case.rtol,
                case.atol,
                sizes,
            );
            assert!(
                check.passed,
                "{} ({sizes} sizes) from C: {}",
                case.name, check.detail
            );
            let here = loaded.call(&inputs).unwrap();
            assert_eq!(got.len(), here.len(), "{}", case.name);
            for (o, (g, h)) in got.iter().zip(&here).enumerate() {
                assert_eq!(g.shape(), h.shape(), "{} output {o}", case.name);
                assert!(
                    g.to_bytes() == h.to_bytes(),
                    "{} ({sizes} sizes) output {o}: C and Rust differ",
                    case.name
                );
            }
            println!(
                "{} ({sizes} sizes): max |err| {:.3e} vs PyTorch (atol {:.1e}, rtol {:.1e})",
                case.name, check.max_abs_error, case.atol, case.rtol
            );
        }
        // A size outside an exported range: the C program's run is refused with
        // MINDUCTOR_ERR_SHAPE (the range is in the artifact).
        let signature = minductor::export::load(&case.file)
            .unwrap()
            .signature()
            .clone();
        if let Some(range) = signature.symbols.iter().find(|r| r.max.is_some()) {
            let too_big = range.max.unwrap() + 1;
            let inputs: Vec<Tensor> = signature
                .inputs
                .iter()
                .map(|input| {
                    let shape: Vec<usize> = input
                        .ty
                        .shape
                        .iter()
                        .map(|d| match d {
                            minductor::Dim::Sym(s) if *s == range.sym => too_big,
                            minductor::Dim::Sym(s) => signature
                                .symbols
                                .iter()
                                .find(|r| r.sym == *s)
                                .map_or(1, |r| r.min.max(1)),
                            d => d.as_static().unwrap_or(1),
                        })
                        .collect();
                    Tensor::zeros(input.ty.dtype, &shape)
                })
                .collect();
            let inputs_path = dir.join(format!("{}.out-of-range.in", case.name));
            write_tensor_list(&inputs_path, &inputs);
            let run = Command::new(&exe)
                .env("LD_LIBRARY_PATH", library_dir())
                .arg(&artifact)
                .arg(&inputs_path)
                .arg(dir.join("unused.out"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert!(
                !run.status.success() && stderr.contains("MINDUCTOR_ERR_SHAPE"),
                "{}: size {too_big} outside {}..={}: {stderr}",
                case.name,
                range.min,
                too_big - 1
            );
        }
        ran.push(case.name.clone());
    }
    assert_eq!(ran.len(), cases.len());
    assert!(ran.iter().any(|n| n == "tiny_gpt2"), "{ran:?}");
    std::fs::remove_dir_all(&dir).ok();
}

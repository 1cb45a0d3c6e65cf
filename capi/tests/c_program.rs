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

/// The input pattern the C program writes: `((i * 7 + k * 13) % 23) / 11 - 1`.
fn pattern(i: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|k| ((i * 7 + k * 13) % 23) as f32 / 11.0 - 1.0)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

#[test]
fn a_c_program_runs_a_saved_model() {
    let cc = find_cc();
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("minductor-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // An MLP with a softmax over a symbolic batch dim, and a second output.
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
    let graph = t.finish(&[y, h.sum(&[1], false)]).unwrap();
    let compiled = compile(&graph).unwrap();
    let artifact = dir.join("mlp.mind");
    compiled.save(&artifact).unwrap();

    let lib = library_dir();
    let exe = dir.join("run_model");
    let build = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/run_model.c"))
        .arg("-o")
        .arg(&exe)
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

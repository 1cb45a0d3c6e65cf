//! Deployment of imported PyTorch programs: every case of `../shared/exported`, compiled with its
//! weights frozen, saves as one artifact whose `constants` section carries the frozen values;
//! `minductor::load` rebuilds it from that file alone and computes what the compile computed,
//! bit for bit, and so matches PyTorch at the manifest's tolerances. Truncated artifacts, a
//! flipped byte in the constants' data, and crafted constants with a valid checksum (a wrong
//! byte length, an unaligned offset, a wrong name or type) are typed errors, never panics.

use minductor::artifact::{Constant, CONSTANT_ALIGNMENT, FORMAT_VERSION};
use minductor::export::{self, CompiledProgram};
use minductor::{load, load_bytes, Artifact, ArtifactError, Compiled, Tensor};
use minductor_tools::pt2::{check_outputs, default_exported_dir, load_pt2_manifest, Pt2Case};
use std::collections::HashMap;
use std::path::PathBuf;

fn cases() -> Vec<Pt2Case> {
    let dir = default_exported_dir();
    let cases = load_pt2_manifest(&dir)
        .unwrap_or_else(|e| panic!("cannot read the manifest in {}: {e}", dir.display()));
    assert!(!cases.is_empty(), "the manifest lists no case");
    cases
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "minductor-pt2-artifact-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The case compiled with the inductor backend, weights frozen.
fn compile_case(case: &Pt2Case) -> CompiledProgram {
    export::load(&case.file)
        .and_then(|p| p.compile())
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

fn single(program: &CompiledProgram) -> &Compiled {
    program
        .compiled()
        .expect("an inductor compile is one program")
}

/// The case's input sets: `("stored", "")` and, when it has them, `("alt", "alt.")`, each with
/// its inputs in the program's argument order.
fn input_sets(
    case: &Pt2Case,
    data: &HashMap<String, Tensor>,
) -> Vec<(&'static str, &'static str, Vec<Tensor>)> {
    let mut sets = vec![("stored", "")];
    if case.has_alt {
        sets.push(("alt", "alt."));
    }
    sets.into_iter()
        .map(|(sizes, prefix)| {
            let inputs = case
                .inputs
                .iter()
                .map(|n| data[&format!("{prefix}{n}")].clone())
                .collect();
            (sizes, prefix, inputs)
        })
        .collect()
}

#[test]
fn every_exported_case_round_trips_through_an_artifact_with_its_constants() {
    let dir = temp_dir("round-trip");
    let cases = cases();
    let mut ran = 0;
    for case in &cases {
        let program = compile_case(case);
        let compiled = single(&program);
        let path = dir.join(format!("{}.mind", case.name));
        compiled.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let artifact = Artifact::from_bytes(&bytes).unwrap();
        assert_eq!(artifact.format_version, FORMAT_VERSION);
        assert_eq!(
            artifact.constants.len(),
            compiled.frozen_constants().len(),
            "{}",
            case.name
        );
        assert!(
            !artifact.constants.is_empty(),
            "{}: nothing frozen",
            case.name
        );
        for (c, t) in artifact.constants.iter().zip(compiled.frozen_constants()) {
            assert_eq!(c.data, t.to_bytes(), "{}: constant {}", case.name, c.name);
        }

        let loaded = load(&path).unwrap();
        assert_eq!(loaded.graph().to_string(), compiled.graph().to_string());
        assert_eq!(loaded.artifacts().program, compiled.artifacts().program);
        assert_eq!(
            loaded.prepacked_operands(),
            compiled.prepacked_operands(),
            "{}",
            case.name
        );
        let data = minductor::load_safetensors(&case.data).unwrap();
        for (sizes, prefix, inputs) in input_sets(case, &data) {
            let want = program.call(&inputs).unwrap();
            let got = loaded.call(&inputs).unwrap();
            assert_eq!(got.len(), want.len(), "{}", case.name);
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.dtype(), w.dtype());
                assert_eq!(g.shape(), w.shape());
                assert!(
                    g.to_bytes() == w.to_bytes(),
                    "{} ({sizes} sizes) output {o}: the loaded artifact differs from its compile",
                    case.name
                );
            }
            let check = check_outputs(
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
                "{} ({sizes} sizes): {}",
                case.name, check.detail
            );
            println!(
                "{:<24} {sizes:<6} {} constants, {} bytes in the file; max |err| {:.2e}",
                case.name,
                artifact.constants.len(),
                bytes.len(),
                check.max_abs_error
            );
        }
        // The exported ranges of the symbolic sizes travel in the artifact: a size outside
        // one is the same typed error from the loaded graph as from the compiled one.
        let signature = program.signature();
        assert_eq!(
            loaded.size_ranges(),
            compiled.size_ranges(),
            "{}",
            case.name
        );
        assert_eq!(
            loaded.size_ranges().len(),
            signature.symbols.len(),
            "{}",
            case.name
        );
        for range in &signature.symbols {
            let below = range.min.checked_sub(1);
            for size in below.into_iter().chain(range.max.map(|m| m + 1)) {
                let inputs: Vec<Tensor> = signature
                    .inputs
                    .iter()
                    .map(|input| {
                        let shape: Vec<usize> = input
                            .ty
                            .shape
                            .iter()
                            .map(|d| match d {
                                minductor::Dim::Sym(s) if *s == range.sym => size,
                                // Another symbol: the least size in its own range.
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
                let err = loaded.call(&inputs).unwrap_err();
                assert!(
                    matches!(err, minductor::RuntimeError::Shape { .. }),
                    "{}: size {size}: {err}",
                    case.name
                );
                assert_eq!(
                    err.to_string(),
                    compiled.call(&inputs).unwrap_err().to_string()
                );
            }
        }
        // Saving the loaded one writes the same file.
        let again = dir.join(format!("{}-again.mind", case.name));
        loaded.save(&again).unwrap();
        assert!(std::fs::read(&again).unwrap() == bytes, "{}", case.name);
        ran += 1;
    }
    assert_eq!(ran, cases.len(), "every case of the manifest runs");
    std::fs::remove_dir_all(&dir).ok();
}

/// The constants' data block starts at a file offset that is a multiple of 64 wherever the
/// section lands (header lengths from 0 to 130 more bytes move it through every padding and
/// across a digit of the section's length), and every such file decodes to what was encoded.
#[test]
fn the_data_block_is_aligned_wherever_the_section_starts() {
    let case = &cases()[0];
    let program = compile_case(case);
    let artifact = Artifact::of(single(&program)).unwrap();
    for extra in 0..130 {
        let moved = Artifact {
            arch: format!("{}{}", artifact.arch, " ".repeat(extra)),
            ..artifact.clone()
        };
        let bytes = moved.to_bytes();
        assert_eq!(Artifact::from_bytes(&bytes).unwrap(), moved, "{extra}");
        let start = data_block_start(&bytes);
        assert_eq!(start % CONSTANT_ALIGNMENT, 0, "{extra}");
        let first = &moved.constants[0].data;
        assert_eq!(&bytes[start..start + first.len()], &first[..]);
    }
}

/// Where the constants' data block starts: the section's last `D` bytes (`data D`).
fn data_block_start(bytes: &[u8]) -> usize {
    let (section_end, contents) = constants_section(bytes);
    let line = b"\ndata ";
    let at = bytes[contents..]
        .windows(line.len())
        .position(|w| w == line)
        .unwrap()
        + contents
        + line.len();
    let end = at + bytes[at..].iter().position(|&b| b == b'\n').unwrap();
    let len: usize = std::str::from_utf8(&bytes[at..end])
        .unwrap()
        .parse()
        .unwrap();
    section_end - len
}

/// The end of the constants section (its closing newline) and the start of its contents.
fn constants_section(bytes: &[u8]) -> (usize, usize) {
    let header = b"\nsection constants ";
    let at = bytes
        .windows(header.len())
        .position(|w| w == header)
        .expect("a constants section")
        + header.len();
    let line_end = at + bytes[at..].iter().position(|&b| b == b'\n').unwrap();
    let len: usize = std::str::from_utf8(&bytes[at..line_end])
        .unwrap()
        .parse()
        .unwrap();
    (line_end + 1 + len, line_end + 1)
}

/// 64-bit FNV-1a, the artifact's checksum, to craft files that pass it.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// `bytes` with its checksum line written again for its (edited) contents.
fn rechecksummed(bytes: &[u8]) -> Vec<u8> {
    let body_end = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .unwrap()
        + 1;
    let mut out = bytes[..body_end].to_vec();
    let sum = fnv1a64(&out);
    out.extend_from_slice(format!("checksum fnv1a64 {sum:016x}\n").as_bytes());
    out
}

fn load_error(bytes: &[u8]) -> ArtifactError {
    match load_bytes(bytes) {
        Ok(_) => panic!("a bad artifact loaded"),
        Err(e) => e,
    }
}

#[test]
fn bad_artifacts_with_constants_are_typed_errors() {
    for case in cases() {
        let program = compile_case(&case);
        let artifact = Artifact::of(single(&program)).unwrap();
        let bytes = artifact.to_bytes();
        let name = &case.name;
        let (section_end, contents) = constants_section(&bytes);
        let data_start = data_block_start(&bytes);

        // Truncated anywhere, the constants' data included: `Truncated`.
        let cuts = (0..bytes.len()).step_by(bytes.len() / 97 + 1).chain([
            contents,
            data_start,
            data_start + 1,
            section_end,
            bytes.len() - 1,
        ]);
        for len in cuts {
            match load_error(&bytes[..len]) {
                ArtifactError::Truncated(_) => {}
                other => panic!("{name}: truncated to {len} bytes: {other}"),
            }
        }

        // One byte of a weight flipped: the checksum says so.
        let mut flipped = bytes.clone();
        flipped[(data_start + section_end) / 2] ^= 0x01;
        match load_error(&flipped) {
            ArtifactError::Corrupted(m) => assert!(m.contains("checksum"), "{name}: {m}"),
            other => panic!("{name}: a flipped constant byte: {other}"),
        }

        // A constant one element short or long, with a valid checksum: `ConstantSize`.
        let k = artifact.constants.len() / 2;
        let element = artifact.constants[k].ty.dtype.size_bytes();
        for delta in [-1i64, 1] {
            let mut crafted = artifact.clone();
            let data = &mut crafted.constants[k].data;
            let len = (data.len() as i64 + delta * element as i64) as usize;
            data.resize(len, 0);
            match load_error(&crafted.to_bytes()) {
                ArtifactError::ConstantSize {
                    name: constant,
                    expected,
                    found,
                    ..
                } => {
                    assert_eq!(constant, artifact.constants[k].name);
                    assert_eq!(expected, artifact.constants[k].data.len());
                    assert_eq!(found, len);
                }
                other => panic!("{name}: a constant of {len} bytes: {other}"),
            }
        }
        // One whose stated type is not the graph's (a different shape, the same bytes).
        let mut crafted = artifact.clone();
        let c = &mut crafted.constants[k];
        let numel = c.data.len() / element;
        c.ty = minductor::TensorType::new(
            c.ty.dtype,
            [minductor::Dim::Static(numel)].into_iter().collect(),
        );
        if crafted.constants[k] != artifact.constants[k] {
            assert!(matches!(
                load_error(&crafted.to_bytes()),
                ArtifactError::Inconsistent(_)
            ));
        }
        // Renamed, one missing, one too many.
        let mut crafted = artifact.clone();
        crafted.constants[k].name.push('x');
        assert!(matches!(
            load_error(&crafted.to_bytes()),
            ArtifactError::Inconsistent(_)
        ));
        // (Without its only constant, a graph would be a valid unfrozen one.)
        if artifact.constants.len() > 1 {
            let mut crafted = artifact.clone();
            crafted.constants.pop();
            assert!(matches!(
                load_error(&crafted.to_bytes()),
                ArtifactError::Inconsistent(_)
            ));
        }
        let mut crafted = artifact.clone();
        let extra: Constant = crafted.constants[0].clone();
        crafted.constants.insert(0, extra);
        assert!(matches!(
            load_error(&crafted.to_bytes()),
            ArtifactError::Inconsistent(_)
        ));

        // An offset that is not a multiple of 64, in the table's text with a valid checksum
        // (the section keeps its length): `Corrupted`.
        let first_offset = b" offset 0 bytes ";
        let at = bytes[contents..]
            .windows(first_offset.len())
            .position(|w| w == first_offset)
            .unwrap()
            + contents
            + " offset ".len();
        for digit in [b'1', b'9'] {
            let mut crafted = bytes.clone();
            crafted[at] = digit;
            match load_error(&rechecksummed(&crafted)) {
                ArtifactError::Corrupted(m) => {
                    assert!(m.contains("section constants"), "{name}: {m}")
                }
                other => panic!("{name}: offset {}: {other}", digit as char),
            }
        }
        // Non-zero padding before the data block, when there is padding.
        let padding_end = data_start;
        if bytes[padding_end - 1] == 0 {
            let mut crafted = bytes.clone();
            crafted[padding_end - 1] = 7;
            assert!(matches!(
                load_error(&rechecksummed(&crafted)),
                ArtifactError::Corrupted(_)
            ));
        }
        // A format 1 file has no constants section.
        let mut old = artifact.clone();
        old.format_version = 1;
        assert!(matches!(
            load_error(&old.to_bytes()),
            ArtifactError::Corrupted(_)
        ));
        // The untouched bytes load.
        load_bytes(&bytes).unwrap();
    }
}

/// Small edits of the constants (names, types, byte lengths) with a valid checksum never
/// panic: each is a typed error or, when the edit is harmless, a model that runs.
#[test]
fn edited_constants_never_panic() {
    let case = &cases()[0];
    let program = compile_case(case);
    let artifact = Artifact::of(single(&program)).unwrap();
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..200 {
        let mut a = artifact.clone();
        let k = next(a.constants.len());
        let c = &mut a.constants[k];
        match next(4) {
            0 => {
                let len = next(c.data.len() + 9);
                c.data.resize(len, 0xff);
            }
            1 => c.name = format!("frozen.{}", next(40)),
            2 => {
                let mut shape: Vec<minductor::Dim> = c.ty.shape.to_vec();
                if !shape.is_empty() {
                    let d = next(shape.len());
                    shape[d] = minductor::Dim::Static(next(5));
                }
                c.ty = minductor::TensorType::new(c.ty.dtype, shape.into_iter().collect());
            }
            _ => {
                let dtypes = [
                    minductor::DType::F32,
                    minductor::DType::I64,
                    minductor::DType::Bool,
                ];
                c.ty = minductor::TensorType::new(dtypes[next(3)], c.ty.shape.clone());
            }
        }
        let outcome = match load_bytes(&a.to_bytes()) {
            Ok(loaded) => {
                let data = minductor::load_safetensors(&case.data).unwrap();
                let inputs: Vec<Tensor> = case.inputs.iter().map(|n| data[n].clone()).collect();
                let _ = loaded.call(&inputs);
                "loaded".to_string()
            }
            Err(e) => {
                let s = format!("{e:?}");
                s[..s.find(|c: char| !c.is_alphanumeric()).unwrap_or(s.len())].to_string()
            }
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    println!("{outcomes:?}");
    assert!(outcomes.contains_key("ConstantSize"), "{outcomes:?}");
    assert!(outcomes.contains_key("Inconsistent"), "{outcomes:?}");
}

/// Byte edits of the constants section's table and padding (replacements, insertions and
/// deletions of tokens, so lengths and offsets shift), with the checksum made right again:
/// the section is read by length and every edit is a typed error or a model that runs.
#[test]
fn edited_constants_table_bytes_never_panic() {
    let case = &cases()[0];
    let program = compile_case(case);
    let bytes = Artifact::of(single(&program)).unwrap().to_bytes();
    let (_, contents) = constants_section(&bytes);
    let data_start = data_block_start(&bytes);
    let tokens: [&[u8]; 14] = [
        b"0",
        b"1",
        b"9",
        b"64",
        b" ",
        b"\n",
        b": ",
        b" offset ",
        b" bytes ",
        b"data ",
        b"count ",
        b"f32",
        b"[",
        b"\0",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let data = minductor::load_safetensors(&case.data).unwrap();
    let inputs: Vec<Tensor> = case.inputs.iter().map(|n| data[n].clone()).collect();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..400 {
        let mut edited = bytes.clone();
        let at = contents + next(data_start - contents);
        let token = tokens[next(tokens.len())];
        match next(3) {
            0 => {
                let end = (at + token.len()).min(data_start);
                edited.splice(at..end, token.iter().copied());
            }
            1 => {
                edited.splice(at..at, token.iter().copied());
            }
            _ => {
                edited.remove(at);
            }
        }
        let outcome = match load_bytes(&rechecksummed(&edited)) {
            Ok(loaded) => {
                let _ = loaded.call(&inputs);
                "loaded".to_string()
            }
            Err(e) => {
                let s = format!("{e:?}");
                s[..s.find(|c: char| !c.is_alphanumeric()).unwrap_or(s.len())].to_string()
            }
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    println!("{outcomes:?}");
    assert!(outcomes.contains_key("Corrupted"), "{outcomes:?}");
}

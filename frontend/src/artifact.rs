//! Saved compiled graphs (AOTInductor's package, in small): `Compiled::save(path)` writes a
//! versioned artifact, [`load`] rebuilds a callable `Compiled` from it in any process, without
//! tracing or running the passes.
//!
//! # Format (version [`FORMAT_VERSION`])
//!
//! A UTF-8 text file, one header field per line, then length-prefixed sections, then a checksum:
//!
//! ```text
//! MINDUCTOR-ARTIFACT
//! format 1
//! minductor 0.1.0
//! arch x86_64
//! requires sse2
//! compiled-with sse2 sse4.1 avx avx2 fma avx512f
//! options backend=inductor activation_memory_budget=1.0 mode=default
//! section graph <bytes>
//! <the graph's text>
//! section guards <bytes>
//! <one line per input, tangent and output>
//! section program <bytes>
//! <the kernel program's text, buffer plan included>
//! section autotune <bytes>          (max-autotune only)
//! <`threads N`, then one `KERNEL SPLIT` line per kernel step>
//! checksum fnv1a64 <16 hex digits>
//! ```
//!
//! - `format` is checked first: another format version is [`ArtifactError::ForeignFormat`];
//!   another `minductor` version is [`ArtifactError::ForeignVersion`] (the kernel IR's meaning
//!   may change between versions even when its text does not).
//! - The checksum (64-bit FNV-1a of every byte before the `checksum` line) catches truncation
//!   and accidental corruption; it is no defence against a crafted file. What makes a crafted
//!   file harmless is that the program is re-verified (`verify_program`: every load and store
//!   inside its buffer, the plan's slots disjoint) before any code is generated from it.
//! - No machine code is stored: loading runs Cranelift again on the kernel program, for the
//!   loading CPU. So `requires` lists only what the code generator needs on `arch` (SSE2 on
//!   x86-64); `compiled-with` records the saving host's features, for information (FMA
//!   contraction and the AVX-512/AVX2 math blocks change the last bits of some results).
//! - Sections: `graph` is the graph as traced (`Graph`'s text; it gives `Compiled::graph` and the
//!   input checks), `guards` what a call must pass (`input NAME: TYPE`, a symbolic dim `sN`
//!   taking any size consistent across inputs), the dtype of each tangent input a joint graph is
//!   fed with ones (`tangent f32`) and what it returns (`output TYPE`), and `program` the kernel
//!   program with its buffer plan (`Program`'s text). Section lengths are in bytes; each
//!   section is followed by a newline.
//! - `autotune` (written only in `max-autotune` mode) caches the thread split max-autotune chose
//!   for each kernel step, with the thread count it was timed on. A load reuses the choices when
//!   it runs on the same thread count and CPU features as the saving machine (the compile cache's
//!   case) and tunes again otherwise.

use crate::compile::{with_tangents, Artifacts, Backend, CompileOptions, Compiled, Mode};
use minductor_codegen_cpu::{compile_program, CodegenError};
use minductor_ir::text::{Cursor, ParseError};
use minductor_ir::{DType, Graph, TensorType};
use minductor_kernel_ir::{verify_program, BufferKind, Program, VerifyError};
use std::path::{Path, PathBuf};
use std::time::Instant;
use thiserror::Error;

/// The first line of every artifact.
pub const MAGIC: &str = "MINDUCTOR-ARTIFACT";
/// The layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The `minductor` version this build writes and accepts.
pub const MINDUCTOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why an artifact cannot be saved or loaded.
#[derive(Debug, Error)]
pub enum ArtifactError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a minductor artifact (it does not start with `{MAGIC}`)")]
    NotAnArtifact,
    #[error("the artifact is truncated: {0}")]
    Truncated(String),
    #[error("the artifact is corrupted: {0}")]
    Corrupted(String),
    #[error("artifact format {found}, but this build reads format {expected}")]
    ForeignFormat { found: String, expected: u32 },
    #[error("artifact written by minductor {found}, but this is minductor {expected}")]
    ForeignVersion { found: String, expected: String },
    #[error("the artifact needs a {arch} CPU with {required:?}; this is a {host_arch} CPU without {missing:?}")]
    UnsupportedCpu {
        arch: String,
        required: Vec<String>,
        host_arch: String,
        missing: Vec<String>,
    },
    #[error("section `{section}` does not parse: {error}")]
    Parse {
        section: &'static str,
        error: ParseError,
    },
    #[error("the sections disagree: {0}")]
    Inconsistent(String),
    #[error("the program fails verification: {0}")]
    Verify(Box<VerifyError>),
    #[error("code generation failed: {0}")]
    Codegen(#[from] CodegenError),
    #[error("cannot save: {0}")]
    Unsupported(String),
}

/// An artifact's fields, before encoding or after decoding (the sections as text).
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    pub format_version: u32,
    pub minductor_version: String,
    /// `std::env::consts::ARCH` of the machine the code is for.
    pub arch: String,
    /// CPU features the loading machine must have (names as `is_x86_feature_detected!` spells
    /// them).
    pub required_features: Vec<String>,
    /// The saving machine's features, for information.
    pub compiled_with: Vec<String>,
    /// The compile options as [`options_text`] writes them.
    pub options: String,
    pub graph: String,
    pub guards: String,
    pub program: String,
    /// Max-autotune's choices (`threads N`, then `KERNEL SPLIT` lines); empty when not tuned.
    pub autotune: String,
}

/// 64-bit FNV-1a over `bytes` (the checksum, and the compile cache's key hash).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// What the code generator needs on this architecture (Cranelift's x86-64 backend: SSE2).
fn generator_requirements() -> Vec<String> {
    if cfg!(target_arch = "x86_64") {
        vec!["sse2".to_string()]
    } else {
        Vec::new()
    }
}

/// Features whose presence this build can test, in the order `compiled-with` lists them.
const KNOWN_FEATURES: &[&str] = &[
    "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
    "lzcnt", "avx512f", "avx512dq", "avx512bw", "avx512vl", "neon",
];

/// Whether this CPU has `feature`; `false` for names this build does not know.
pub fn host_has_feature(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        match feature {
            "sse2" => has!("sse2"),
            "sse3" => has!("sse3"),
            "ssse3" => has!("ssse3"),
            "sse4.1" => has!("sse4.1"),
            "sse4.2" => has!("sse4.2"),
            "popcnt" => has!("popcnt"),
            "avx" => has!("avx"),
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "bmi1" => has!("bmi1"),
            "bmi2" => has!("bmi2"),
            "lzcnt" => has!("lzcnt"),
            "avx512f" => has!("avx512f"),
            "avx512dq" => has!("avx512dq"),
            "avx512bw" => has!("avx512bw"),
            "avx512vl" => has!("avx512vl"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match feature {
            "neon" => std::arch::is_aarch64_feature_detected!("neon"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

impl Artifact {
    /// The artifact of a compiled graph (inductor only: the others have no kernel program).
    pub fn of(compiled: &Compiled) -> Result<Artifact, ArtifactError> {
        let Some(program) = compiled.artifacts().program.as_ref() else {
            return Err(ArtifactError::Unsupported(format!(
                "only the inductor backend makes a kernel program to save (this is {})",
                compiled.backend().name()
            )));
        };
        if !compiled.frozen_constants().is_empty() {
            return Err(ArtifactError::Unsupported(
                "a frozen compile's constants are tensors, which the artifact format does not \
                 carry; save the graph compiled without freezing"
                    .into(),
            ));
        }
        let graph = compiled.graph().to_string();
        let program_text = program.to_string();
        // Only what loads back is saved: both texts must parse to what they print.
        let reparsed = graph
            .parse::<Graph>()
            .map(|g| g.to_string() == graph)
            .unwrap_or(false)
            && program_text
                .parse::<Program>()
                .map(|p| &p == program)
                .unwrap_or(false);
        if !reparsed {
            return Err(ArtifactError::Unsupported(
                "the graph or program text does not parse back to itself (an input name with a \
                 line break?)"
                    .into(),
            ));
        }
        let mut guards = String::new();
        let g = compiled.graph();
        for (i, &id) in g.inputs().iter().enumerate() {
            guards.push_str(&format!("input {}: {}\n", g.input_name(i), g.ty(id)));
        }
        for dtype in compiled.tangent_dtypes() {
            guards.push_str(&format!("tangent {dtype}\n"));
        }
        for &out in &program.outputs {
            let b = program.buffer(out);
            let ty = TensorType::new(b.dtype, b.shape.iter().copied().collect());
            guards.push_str(&format!("output {ty}\n"));
        }
        Ok(Artifact {
            format_version: FORMAT_VERSION,
            minductor_version: MINDUCTOR_VERSION.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            required_features: generator_requirements(),
            compiled_with: KNOWN_FEATURES
                .iter()
                .filter(|f| host_has_feature(f))
                .map(|f| f.to_string())
                .collect(),
            options: options_text(compiled.options()),
            graph,
            guards,
            program: program_text,
            autotune: autotune_text(&compiled.artifacts().autotune),
        })
    }

    /// The file's bytes (see the module doc).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        out.push_str(&format!("{MAGIC}\nformat {}\n", self.format_version));
        out.push_str(&format!("minductor {}\n", self.minductor_version));
        out.push_str(&format!("arch {}\n", self.arch));
        out.push_str(&format!("requires {}\n", self.required_features.join(" ")));
        out.push_str(&format!("compiled-with {}\n", self.compiled_with.join(" ")));
        out.push_str(&format!("options {}\n", self.options));
        for (name, text) in self.sections() {
            out.push_str(&format!("section {name} {}\n{text}\n", text.len()));
        }
        let sum = fnv1a64(out.as_bytes());
        out.push_str(&format!("checksum fnv1a64 {sum:016x}\n"));
        out.into_bytes()
    }

    fn sections(&self) -> Vec<(&'static str, &str)> {
        let mut sections = vec![
            ("graph", self.graph.as_str()),
            ("guards", self.guards.as_str()),
            ("program", self.program.as_str()),
        ];
        if !self.autotune.is_empty() {
            sections.push(("autotune", self.autotune.as_str()));
        }
        sections
    }

    /// Decodes a file's bytes, checking magic, format, checksum and version (not the CPU nor
    /// the sections' contents: [`Artifact::load`] does).
    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact, ArtifactError> {
        let magic = format!("{MAGIC}\n");
        if !bytes.starts_with(magic.as_bytes()) {
            return Err(if magic.as_bytes().starts_with(bytes) {
                ArtifactError::Truncated("the file ends inside the magic line".into())
            } else {
                ArtifactError::NotAnArtifact
            });
        }
        // The format line, before anything whose layout depends on it.
        let rest = &bytes[magic.len()..];
        let line_end = rest.iter().position(|&b| b == b'\n').ok_or_else(|| {
            ArtifactError::Truncated("the file ends before the format line".into())
        })?;
        let format_line = String::from_utf8_lossy(&rest[..line_end]);
        let found = format_line
            .strip_prefix("format ")
            .ok_or_else(|| ArtifactError::Corrupted("the second line is not `format N`".into()))?;
        if found != FORMAT_VERSION.to_string() {
            return Err(ArtifactError::ForeignFormat {
                found: found.chars().take(32).collect(),
                expected: FORMAT_VERSION,
            });
        }
        // The checksum line ends the file.
        let body_end = match bytes[..bytes.len().saturating_sub(1)]
            .iter()
            .rposition(|&b| b == b'\n')
        {
            Some(i) if bytes.ends_with(b"\n") => i + 1,
            _ => {
                return Err(ArtifactError::Truncated(
                    "no checksum line at the end".into(),
                ))
            }
        };
        let checksum_line = std::str::from_utf8(&bytes[body_end..bytes.len() - 1])
            .map_err(|_| ArtifactError::Corrupted("the checksum line is not text".into()))?;
        let Some(hex) = checksum_line.strip_prefix("checksum fnv1a64 ") else {
            return Err(ArtifactError::Truncated(
                "the file does not end with its checksum line".into(),
            ));
        };
        let stored = u64::from_str_radix(hex, 16)
            .ok()
            .filter(|_| hex.len() == 16)
            .ok_or_else(|| ArtifactError::Corrupted(format!("checksum `{hex}` is malformed")))?;
        let body = &bytes[..body_end];
        let computed = fnv1a64(body);
        if computed != stored {
            return Err(ArtifactError::Corrupted(format!(
                "checksum {computed:016x} of the contents, but the file says {stored:016x}"
            )));
        }
        let body = std::str::from_utf8(body)
            .map_err(|e| ArtifactError::Corrupted(format!("not UTF-8 text: {e}")))?;
        Self::decode_body(&body[magic.len() + line_end + 1..])
    }

    /// The header fields after `format` and the sections (a body whose checksum matched).
    fn decode_body(mut body: &str) -> Result<Artifact, ArtifactError> {
        let corrupted = |what: &str| ArtifactError::Corrupted(what.to_string());
        // The next line, which must be `name value`: the value.
        fn next_field(body: &mut &str, name: &str) -> Result<String, ArtifactError> {
            let corrupted = |what: String| ArtifactError::Corrupted(what);
            let (line, rest) = body
                .split_once('\n')
                .ok_or_else(|| corrupted(format!("the header ends before `{name}`")))?;
            *body = rest;
            let value = line
                .strip_prefix(name)
                .and_then(|v| v.strip_prefix(' '))
                .ok_or_else(|| corrupted(format!("expected the `{name}` line")))?;
            Ok(value.to_string())
        }
        let minductor_version = next_field(&mut body, "minductor")?;
        if minductor_version != MINDUCTOR_VERSION {
            return Err(ArtifactError::ForeignVersion {
                found: minductor_version.chars().take(32).collect(),
                expected: MINDUCTOR_VERSION.to_string(),
            });
        }
        let arch = next_field(&mut body, "arch")?;
        let words = |s: String| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let required_features = words(next_field(&mut body, "requires")?);
        let compiled_with = words(next_field(&mut body, "compiled-with")?);
        let options = next_field(&mut body, "options")?;
        let mut sections = Vec::new();
        for name in ["graph", "guards", "program"] {
            let len: usize = next_field(&mut body, "section")?
                .strip_prefix(name)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| corrupted(&format!("expected `section {name} <bytes>`")))?;
            let text = body
                .get(..len)
                .filter(|_| body.as_bytes().get(len) == Some(&b'\n'))
                .ok_or_else(|| corrupted(&format!("section {name} is not {len} bytes long")))?;
            sections.push(text.to_string());
            body = &body[len + 1..];
        }
        // The optional last section.
        let mut autotune = String::new();
        if let Some(rest) = body.strip_prefix("section autotune ") {
            let (len, rest) = rest
                .split_once('\n')
                .and_then(|(len, rest)| Some((len.parse::<usize>().ok()?, rest)))
                .ok_or_else(|| corrupted("expected `section autotune <bytes>`"))?;
            let text = rest
                .get(..len)
                .filter(|_| rest.as_bytes().get(len) == Some(&b'\n'))
                .ok_or_else(|| corrupted(&format!("section autotune is not {len} bytes long")))?;
            autotune = text.to_string();
            body = &rest[len + 1..];
        }
        if !body.is_empty() {
            return Err(corrupted("bytes after the last section"));
        }
        let [graph, guards, program]: [String; 3] =
            sections.try_into().expect("three sections were read");
        Ok(Artifact {
            format_version: FORMAT_VERSION,
            minductor_version,
            arch,
            required_features,
            compiled_with,
            options,
            graph,
            guards,
            program,
            autotune,
        })
    }

    /// Checks that this machine can run the artifact: the same architecture, every required
    /// feature present.
    pub fn check_cpu(&self) -> Result<(), ArtifactError> {
        let host_arch = std::env::consts::ARCH;
        let missing: Vec<String> = self
            .required_features
            .iter()
            .filter(|f| !host_has_feature(f))
            .cloned()
            .collect();
        if self.arch != host_arch || !missing.is_empty() {
            return Err(ArtifactError::UnsupportedCpu {
                arch: self.arch.clone(),
                required: self.required_features.clone(),
                host_arch: host_arch.to_string(),
                missing,
            });
        }
        Ok(())
    }

    /// Rebuilds the compiled graph: checks the CPU, parses the sections, checks them against
    /// each other, verifies the program and generates its code.
    pub fn load(&self) -> Result<Compiled, ArtifactError> {
        let started = Instant::now();
        self.check_cpu()?;
        let parse = |section: &'static str| move |error| ArtifactError::Parse { section, error };
        let graph: Graph = self.graph.parse().map_err(parse("graph"))?;
        let program: Program = self.program.parse().map_err(parse("program"))?;
        let guards = Guards::parse(&self.guards).map_err(parse("guards"))?;
        guards.check(&graph, &program)?;
        if program.plan.is_none() {
            return Err(ArtifactError::Inconsistent(
                "the program has no buffer plan".into(),
            ));
        }
        verify_program(&program, &[]).map_err(|e| ArtifactError::Verify(Box::new(e)))?;
        let options = parse_options(&self.options)
            .ok_or_else(|| ArtifactError::Corrupted(format!("options `{}`", self.options)))?;
        let mut compiled = compile_program(&program)?;
        // Tuning is about the machine: the saved choices hold on the same thread count and
        // CPU features; anywhere else it runs again.
        let mut autotune_reused = false;
        let autotune = if options.mode != Mode::MaxAutotune {
            Vec::new()
        } else {
            match self.reusable_autotune() {
                Some(splits) if compiled.set_splits(&splits) => {
                    autotune_reused = true;
                    splits
                }
                _ => crate::compile::autotune(&mut compiled),
            }
        };
        let artifacts = Artifacts {
            autotune,
            autotune_reused,
            cranelift_ir: compiled
                .kernels()
                .map(|k| (k.name.clone(), k.clif.clone()))
                .collect(),
            program: Some(program),
            ..Artifacts::default()
        };
        let executable = with_tangents(Box::new(compiled), &guards.tangents);
        Ok(Compiled::from_parts(
            graph,
            executable,
            artifacts,
            options,
            guards.tangents,
            started.elapsed(),
        ))
    }
}

impl Artifact {
    /// The saved max-autotune choices, if they were timed on this machine's thread count and
    /// CPU features (`None` if absent, from elsewhere, or not parsable).
    fn reusable_autotune(&self) -> Option<Vec<(String, minductor_codegen_cpu::Split)>> {
        let mut lines = self.autotune.lines();
        let threads: usize = lines.next()?.strip_prefix("threads ")?.parse().ok()?;
        let same_features = KNOWN_FEATURES
            .iter()
            .all(|f| host_has_feature(f) == self.compiled_with.iter().any(|c| c == f));
        if threads != minductor_runtime::num_threads() || !same_features {
            return None;
        }
        lines
            .map(|line| {
                let (kernel, split) = line.split_once(' ')?;
                Some((
                    kernel.to_string(),
                    minductor_codegen_cpu::Split::from_name(split)?,
                ))
            })
            .collect()
    }
}

/// The autotune section's text for `choices` (empty when there are none).
fn autotune_text(choices: &[(String, minductor_codegen_cpu::Split)]) -> String {
    if choices.is_empty() {
        return String::new();
    }
    let mut text = format!("threads {}", minductor_runtime::num_threads());
    for (kernel, split) in choices {
        text.push_str(&format!("\n{kernel} {}", split.name()));
    }
    text
}

/// The options line: `backend=inductor activation_memory_budget=1.0 mode=default` (the budget
/// as `{:?}` prints it, so it reads back exactly).
pub fn options_text(options: &CompileOptions) -> String {
    format!(
        "backend={} activation_memory_budget={:?} mode={}",
        options.backend.name(),
        options.partition.activation_memory_budget,
        options.mode
    )
}

/// Reads [`options_text`]'s line back (inductor only: artifacts hold kernel programs). A line
/// without `mode=` (written before modes existed) means the default mode.
fn parse_options(text: &str) -> Option<CompileOptions> {
    let rest = text.strip_prefix("backend=inductor activation_memory_budget=")?;
    let (budget, mode) = match rest.split_once(" mode=") {
        Some((budget, mode)) => (budget, mode.parse::<Mode>().ok()?),
        None => (rest, Mode::Default),
    };
    let mut options = CompileOptions {
        backend: Backend::Inductor,
        mode,
        ..CompileOptions::default()
    };
    options.partition.activation_memory_budget = budget.parse::<f64>().ok()?;
    Some(options)
}

/// The `guards` section, parsed.
struct Guards {
    inputs: Vec<(String, TensorType)>,
    tangents: Vec<DType>,
    outputs: Vec<TensorType>,
}

impl Guards {
    fn parse(text: &str) -> Result<Guards, ParseError> {
        let mut guards = Guards {
            inputs: Vec::new(),
            tangents: Vec::new(),
            outputs: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let mut c = Cursor::new(line, i + 1);
            if c.try_eat("input ") {
                let rest = c.rest();
                let split = rest.rfind(": ").ok_or_else(|| c.error("`NAME: TYPE`"))?;
                let mut ty = Cursor::new(&rest[split + 2..], i + 1);
                guards
                    .inputs
                    .push((rest[..split].to_string(), ty.tensor_type()?));
                ty.end()?;
            } else if c.try_eat("tangent ") {
                guards.tangents.push(c.dtype()?);
                c.end()?;
            } else if c.try_eat("output ") {
                guards.outputs.push(c.tensor_type()?);
                c.end()?;
            } else {
                return Err(c.error("`input`, `tangent` or `output`"));
            }
        }
        Ok(guards)
    }

    /// The guards must describe the graph's inputs, and the program's inputs and outputs.
    fn check(&self, graph: &Graph, program: &Program) -> Result<(), ArtifactError> {
        let fail = |m: String| Err(ArtifactError::Inconsistent(m));
        let declared: Vec<(String, TensorType)> = (0..graph.inputs().len())
            .map(|i| {
                let ty = graph.ty(graph.inputs()[i]).clone();
                (graph.input_name(i).to_string(), ty)
            })
            .collect();
        if declared != self.inputs {
            return fail("the guards' inputs are not the graph's".into());
        }
        let count = self.inputs.len() + self.tangents.len();
        for b in &program.buffers {
            let BufferKind::Input(n) = b.kind else {
                continue;
            };
            let expected = match n.checked_sub(self.inputs.len()) {
                None => self.inputs[n].1.clone(),
                Some(t) if t < self.tangents.len() => TensorType::scalar(self.tangents[t]),
                Some(_) => return fail(format!("program input {n} of {count} inputs")),
            };
            if b.dtype != expected.dtype || b.shape[..] != expected.shape[..] {
                return fail(format!(
                    "program input {n} is {}{:?}, the guards say {expected}",
                    b.dtype, b.shape
                ));
            }
        }
        let outputs: Vec<TensorType> = program
            .outputs
            .iter()
            .map(|&o| {
                let b = program.buffers.get(o.0 as usize)?;
                Some(TensorType::new(b.dtype, b.shape.iter().copied().collect()))
            })
            .collect::<Option<_>>()
            .unwrap_or_default();
        if outputs != self.outputs || outputs.len() != graph.outputs().len() {
            return fail("the guards' outputs are not the program's".into());
        }
        Ok(())
    }
}

/// Reads and loads the artifact at `path` (see the module doc).
pub fn load(path: impl AsRef<Path>) -> Result<Compiled, ArtifactError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_bytes(&bytes)
}

/// Loads an artifact from its bytes.
pub fn load_bytes(bytes: &[u8]) -> Result<Compiled, ArtifactError> {
    Artifact::from_bytes(bytes)?.load()
}

/// Writes `bytes` to `path` atomically: to a temporary file in the same directory, then a
/// rename, so a reader sees the old file or the new one, never a part.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    use std::io::Write;
    let io = |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::other("the path names no file")))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let temp_name = format!(
        ".{}.{}.{nanos}.tmp",
        name.to_string_lossy(),
        std::process::id()
    );
    let temp = match dir {
        Some(d) => d.join(temp_name),
        None => PathBuf::from(temp_name),
    };
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map_err(io)
}

impl Compiled {
    /// Saves this compiled graph as an artifact (see the `artifact` module doc) that
    /// [`load`] reads back in any process on a machine with the same architecture. Only the
    /// inductor backend's results can be saved.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ArtifactError> {
        let bytes = Artifact::of(self)?.to_bytes();
        write_atomically(path.as_ref(), &bytes)
    }
}

//! Saved compiled graphs (AOTInductor's package, in small): `Compiled::save(path)` writes a
//! versioned artifact, [`load`] rebuilds a callable `Compiled` from it in any process, without
//! tracing or running the passes.
//!
//! # Format (version [`FORMAT_VERSION`])
//!
//! A header of text lines, then length-prefixed sections, then a checksum line. Every section
//! is text except `constants`, whose tensor data is binary: the reader takes each section by its
//! byte length, never by lines.
//!
//! ```text
//! MINDUCTOR-ARTIFACT
//! format 2
//! minductor 0.1.0
//! arch x86_64
//! requires sse2
//! compiled-with sse2 sse4.1 avx avx2 fma avx512f
//! options backend=inductor activation_memory_budget=1.0 mode=default
//! section graph <bytes>
//! <the graph's text>
//! section guards <bytes>
//! <one line per input, tangent, size range and output>
//! section program <bytes>
//! <the kernel program's text, buffer plan included>
//! section autotune <bytes>          (max-autotune only)
//! <`threads N`, then one `KERNEL SPLIT` line per kernel step>
//! section constants <bytes>         (a frozen compile only)
//! count <N>
//! <NAME>: <TYPE> offset <O> bytes <B>   (N lines, one per constant)
//! data <D>
//! <zero bytes up to the next file offset that is a multiple of 64>
//! <D bytes of tensor data>
//! checksum fnv1a64 <16 hex digits>
//! ```
//!
//! - `format` is checked first: a format this build does not read is
//!   [`ArtifactError::ForeignFormat`]. Format 1 is format 2 without a `constants` section; this
//!   build reads both and writes 2. Another `minductor` version is
//!   [`ArtifactError::ForeignVersion`] (the kernel IR's meaning may change between versions even
//!   when its text does not).
//! - The checksum (64-bit FNV-1a of every byte before the `checksum` line, the constants' data
//!   included) catches truncation and accidental corruption; it is no defence against a crafted
//!   file. What makes a crafted file harmless is that the program is re-verified
//!   (`verify_program`: every load and store inside its buffer, the plan's slots disjoint)
//!   before any code is generated from it, and that each constant's byte length is checked
//!   against the type the graph declares for it.
//! - No machine code is stored: loading runs Cranelift again on the kernel program, for the
//!   loading CPU. So `requires` lists only what the code generator needs on `arch` (SSE2 on
//!   x86-64); `compiled-with` records the saving host's features, for information (FMA
//!   contraction and the AVX-512/AVX2 math blocks change the last bits of some results).
//! - Sections: `graph` is the graph as compiled (`Graph`'s text; it gives `Compiled::graph` and
//!   the input checks), `guards` what a call must pass (`input NAME: TYPE`, a symbolic dim `sN`
//!   taking any size consistent across inputs), the dtype of each tangent input a joint graph is
//!   fed with ones (`tangent f32`), the sizes a symbolic dim may take when they are restricted
//!   (`range s0: 2..=64`, or `range s0: 1..`: an imported program's `range_constraints`, which a
//!   call of the loaded graph checks as the compiled one did) and what it returns
//!   (`output TYPE`), and `program` the kernel program with its buffer plan (`Program`'s text).
//!   Section lengths are in bytes; each section is followed by a newline.
//! - `autotune` (written only in `max-autotune` mode) caches the thread split max-autotune chose
//!   for each kernel step (a GEMM's plan, an attention's tiling), with the thread count it was
//!   timed on. A load reuses the choices when
//!   it runs on the same thread count and CPU features as the saving machine (the compile cache's
//!   case) and tunes again otherwise.
//! - `constants` (written only for a frozen compile, `compile_frozen` or an imported `.pt2`)
//!   holds the frozen values: the graph's last `N` inputs, which a call of the loaded graph
//!   does not take (it feeds them itself, as the compile did). Each table line names the graph
//!   input, its type (static sizes) and where its bytes lie in the data block: `O` from the
//!   block's start, a multiple of 64, and `B` bytes, row-major and little-endian (bool: one byte,
//!   0 or 1). The data block starts at a file offset that is a multiple of 64, so a constant can
//!   be used in place once the file is mapped at an aligned address. A load checks the names and
//!   types against the graph's last inputs and `B` against the type
//!   ([`ArtifactError::ConstantSize`] when it differs), then packs the GEMM operands among them
//!   once, as the frozen compile did.

use crate::compile::{
    with_tangents, Artifacts, Backend, CompileOptions, Compiled, Mode, SizeRange,
};
use minductor_codegen_cpu::{compile_program, CodegenError};
use minductor_ir::text::{Cursor, ParseError};
use minductor_ir::{DType, Dim, Graph, TensorType};
use minductor_kernel_ir::{verify_program, BufferKind, Program, VerifyError};
use minductor_runtime::Tensor;
use std::path::{Path, PathBuf};
use std::time::Instant;
use thiserror::Error;

/// The first line of every artifact.
pub const MAGIC: &str = "MINDUCTOR-ARTIFACT";
/// The layout this build writes (it reads this one and format 1, which has no constants).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest layout this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// The alignment of the constants' data: of the data block's file offset and of each
/// constant's offset inside it.
pub const CONSTANT_ALIGNMENT: usize = 64;
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
    #[error("artifact format {found}, but this build reads formats {OLDEST_FORMAT_VERSION} to {expected}")]
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
    #[error(
        "constant `{name}` is {ty}, which takes {expected} bytes, but the artifact holds {found}"
    )]
    ConstantSize {
        name: String,
        ty: String,
        expected: usize,
        found: usize,
    },
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
    /// A frozen compile's constants, the values of the graph's last inputs in order; empty
    /// otherwise (and in format 1).
    pub constants: Vec<Constant>,
}

/// One frozen value of the `constants` section.
#[derive(Clone, Debug, PartialEq)]
pub struct Constant {
    /// The graph input it feeds.
    pub name: String,
    /// Its type as the section's table states it (a load checks it against the graph's).
    pub ty: TensorType,
    /// Its elements, row-major and little-endian.
    pub data: Vec<u8>,
}

/// 64-bit FNV-1a over `bytes` (the checksum, and the compile cache's key hash).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = Fnv1a::new();
    hash.add(bytes);
    hash.0
}

/// 64-bit FNV-1a, fed a piece at a time; as a `fmt::Write`, it hashes text as it is written
/// (a dump name hashes a graph's text without holding it whole).
pub(crate) struct Fnv1a(pub(crate) u64);

impl Fnv1a {
    pub(crate) fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl std::fmt::Write for Fnv1a {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.add(s.as_bytes());
        Ok(())
    }
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
        let constants = constants_of(compiled)?;
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
        for range in compiled.size_ranges() {
            guards.push_str(&format!("range {range}\n"));
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
            constants,
        })
    }

    /// The file's bytes (see the module doc).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut header = format!("{MAGIC}\nformat {}\n", self.format_version);
        header.push_str(&format!("minductor {}\n", self.minductor_version));
        header.push_str(&format!("arch {}\n", self.arch));
        header.push_str(&format!("requires {}\n", self.required_features.join(" ")));
        header.push_str(&format!("compiled-with {}\n", self.compiled_with.join(" ")));
        header.push_str(&format!("options {}\n", self.options));
        out.extend_from_slice(header.as_bytes());
        for (name, text) in self.sections() {
            out.extend_from_slice(format!("section {name} {}\n{text}\n", text.len()).as_bytes());
        }
        if !self.constants.is_empty() {
            self.push_constants(&mut out);
        }
        let sum = fnv1a64(&out);
        out.extend_from_slice(format!("checksum fnv1a64 {sum:016x}\n").as_bytes());
        out
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

    /// Appends the `constants` section: the table, zero bytes up to an aligned file offset,
    /// the data block (each constant at an aligned offset in it), and the closing newline.
    fn push_constants(&self, out: &mut Vec<u8>) {
        let mut table = format!("count {}\n", self.constants.len());
        let mut offsets = Vec::with_capacity(self.constants.len());
        let mut data_len = 0usize;
        for c in &self.constants {
            let offset = data_len.next_multiple_of(CONSTANT_ALIGNMENT);
            table.push_str(&format!(
                "{}: {} offset {offset} bytes {}\n",
                c.name,
                c.ty,
                c.data.len()
            ));
            offsets.push(offset);
            data_len = offset + c.data.len();
        }
        table.push_str(&format!("data {data_len}\n"));
        // The padding depends on where the section's text starts, which depends on how many
        // digits its length has, which depends on the padding: try each digit count (and, at a
        // power of ten, 64 more zero bytes) until the length written has the digits assumed.
        let prefix = "section constants ";
        let (len, pad) = (1..=20usize)
            .flat_map(|digits| [0, 1, 2].map(|extra| (digits, extra)))
            .find_map(|(digits, extra)| {
                let table_end = out.len() + prefix.len() + digits + 1 + table.len();
                let pad = table_end.next_multiple_of(CONSTANT_ALIGNMENT) - table_end
                    + extra * CONSTANT_ALIGNMENT;
                let len = table.len() + pad + data_len;
                (len.to_string().len() == digits).then_some((len, pad))
            })
            .expect("some digit count from 1 to 20 fits a length below 2^64");
        out.extend_from_slice(format!("{prefix}{len}\n{table}").as_bytes());
        out.resize(out.len() + pad, 0);
        let data_start = out.len();
        debug_assert!(data_start.is_multiple_of(CONSTANT_ALIGNMENT));
        out.resize(data_start + data_len, 0);
        for (c, offset) in self.constants.iter().zip(offsets) {
            out[data_start + offset..data_start + offset + c.data.len()].copy_from_slice(&c.data);
        }
        out.push(b'\n');
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
        let format_version = found
            .parse::<u32>()
            .ok()
            .filter(|v| (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(v))
            .filter(|v| v.to_string() == found)
            .ok_or_else(|| ArtifactError::ForeignFormat {
                found: found.chars().take(32).collect(),
                expected: FORMAT_VERSION,
            })?;
        // The checksum line ends the file. Whatever else the last line is (binary data
        // included), the file was cut short.
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
        let Some(hex) = bytes[body_end..bytes.len() - 1].strip_prefix(b"checksum fnv1a64 ") else {
            return Err(ArtifactError::Truncated(
                "the file does not end with its checksum line".into(),
            ));
        };
        let hex = String::from_utf8_lossy(hex);
        let stored = u64::from_str_radix(&hex, 16)
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
        let mut reader = Reader {
            bytes: body,
            pos: magic.len() + line_end + 1,
        };
        Self::decode_body(&mut reader, format_version)
    }

    /// The header fields after `format` and the sections (a body whose checksum matched).
    fn decode_body(body: &mut Reader<'_>, format_version: u32) -> Result<Artifact, ArtifactError> {
        let corrupted = |what: String| ArtifactError::Corrupted(what);
        let minductor_version = body.field("minductor")?.to_string();
        if minductor_version != MINDUCTOR_VERSION {
            return Err(ArtifactError::ForeignVersion {
                found: minductor_version.chars().take(32).collect(),
                expected: MINDUCTOR_VERSION.to_string(),
            });
        }
        let arch = body.field("arch")?.to_string();
        let words = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let required_features = words(body.field("requires")?);
        let compiled_with = words(body.field("compiled-with")?);
        let options = body.field("options")?.to_string();
        let mut texts = Vec::new();
        for name in ["graph", "guards", "program"] {
            let (found, bytes) = body.section()?;
            if found != name {
                return Err(corrupted(format!(
                    "expected section `{name}`, found `{found}`"
                )));
            }
            texts.push(section_text(name, bytes)?);
        }
        // The optional sections, in this order.
        let mut autotune = None;
        let mut constants = None;
        while !body.at_end() {
            let (name, bytes) = body.section()?;
            match name {
                "autotune" if autotune.is_none() && constants.is_none() => {
                    autotune = Some(section_text(name, bytes)?);
                }
                "constants" if format_version >= 2 && constants.is_none() => {
                    let start = body.pos - bytes.len() - 1;
                    constants = Some(decode_constants(bytes, start)?);
                }
                other => {
                    return Err(corrupted(format!(
                        "unexpected section `{}` (format {format_version})",
                        other.chars().take(32).collect::<String>()
                    )))
                }
            }
        }
        let [graph, guards, program]: [String; 3] =
            texts.try_into().expect("three sections were read");
        Ok(Artifact {
            format_version,
            minductor_version,
            arch,
            required_features,
            compiled_with,
            options,
            graph,
            guards,
            program,
            autotune: autotune.unwrap_or_default(),
            constants: constants.unwrap_or_default(),
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
    /// each other, verifies the program and generates its code. The constants are copied into
    /// the graph's tensors; [`Artifact::into_compiled`] moves them instead.
    pub fn load(&self) -> Result<Compiled, ArtifactError> {
        self.load_with(None)
    }

    /// [`Artifact::load`], consuming the artifact: each constant's bytes are freed as soon as
    /// its tensor is made, so loading a frozen model holds its weights about once, not twice.
    pub fn into_compiled(mut self) -> Result<Compiled, ArtifactError> {
        let constants = std::mem::take(&mut self.constants);
        self.load_with(Some(constants))
    }

    /// [`Artifact::load`], with the constants given (`Some`, then consumed) or read from `self`.
    fn load_with(&self, owned: Option<Vec<Constant>>) -> Result<Compiled, ArtifactError> {
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
        let constants = match owned {
            Some(owned) => constant_tensors(&graph, owned.len(), owned.into_iter().map(Ok))?,
            None => constant_tensors(&graph, self.constants.len(), self.constants.iter().map(Err))?,
        };
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
        let ranges = guards.ranges;
        let mut compiled = Compiled::from_parts(
            graph,
            executable,
            artifacts,
            options,
            guards.tangents,
            started.elapsed(),
        );
        compiled.set_size_ranges(&ranges);
        if !constants.is_empty() {
            compiled.set_frozen(constants, started.elapsed());
        }
        Ok(compiled)
    }
}

/// The constants as tensors, once each is checked against the graph input it feeds: the graph's
/// last `count` inputs, in order, with the same names and types, and as many bytes as the type
/// takes. Each constant is owned (`Ok`: its bytes are freed once its tensor is made) or borrowed
/// (`Err`).
fn constant_tensors<'c>(
    graph: &Graph,
    count: usize,
    constants: impl Iterator<Item = Result<Constant, &'c Constant>>,
) -> Result<Vec<Tensor>, ArtifactError> {
    let inputs = graph.inputs();
    let Some(first) = inputs.len().checked_sub(count) else {
        return Err(ArtifactError::Inconsistent(format!(
            "{count} constants for a graph of {} inputs",
            inputs.len()
        )));
    };
    constants
        .enumerate()
        .map(|(k, c)| {
            let c: &Constant = match &c {
                Ok(owned) => owned,
                Err(borrowed) => borrowed,
            };
            let (name, ty) = (graph.input_name(first + k), graph.ty(inputs[first + k]));
            if c.name != name || c.ty != *ty {
                return Err(ArtifactError::Inconsistent(format!(
                    "constant {k} is `{}: {}`, but graph input {} is `{name}: {ty}`",
                    c.name,
                    c.ty,
                    first + k
                )));
            }
            let Some(shape) = ty.static_sizes() else {
                return Err(ArtifactError::Inconsistent(format!(
                    "constant `{name}` has a symbolic type {ty}"
                )));
            };
            let expected = shape
                .iter()
                .try_fold(ty.dtype.size_bytes(), |acc, &n| acc.checked_mul(n));
            if expected != Some(c.data.len()) {
                return Err(ArtifactError::ConstantSize {
                    name: name.to_string(),
                    ty: ty.to_string(),
                    expected: expected.unwrap_or(usize::MAX),
                    found: c.data.len(),
                });
            }
            Tensor::from_bytes(ty.dtype, &shape, &c.data)
                .map_err(|e| ArtifactError::Corrupted(format!("constant `{name}`: {e}")))
        })
        .collect()
}

/// A frozen compile's constants as the `constants` section holds them: each named after the
/// graph input it feeds, with that input's type.
fn constants_of(compiled: &Compiled) -> Result<Vec<Constant>, ArtifactError> {
    let frozen = compiled.frozen_constants();
    if frozen.is_empty() {
        return Ok(Vec::new());
    }
    if cfg!(target_endian = "big") {
        return Err(ArtifactError::Unsupported(
            "constants are stored little-endian; this build runs on a big-endian CPU".into(),
        ));
    }
    let graph = compiled.graph();
    let first = graph.inputs().len() - frozen.len();
    frozen
        .iter()
        .enumerate()
        .map(|(k, tensor)| {
            let ty = graph.ty(graph.inputs()[first + k]).clone();
            if ty.dtype != tensor.dtype() || ty.static_sizes().as_deref() != Some(tensor.shape()) {
                return Err(ArtifactError::Unsupported(format!(
                    "frozen constant {k} is {}{:?}, but its graph input is {ty}",
                    tensor.dtype(),
                    tensor.shape()
                )));
            }
            Ok(Constant {
                name: graph.input_name(first + k).to_string(),
                ty,
                data: tensor.to_bytes(),
            })
        })
        .collect()
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

/// A position in an artifact's body (whose checksum matched): what is malformed there is
/// [`ArtifactError::Corrupted`], a crafted or buggy file rather than a truncated one.
struct Reader<'a> {
    /// The body, from the magic line to the checksum line (excluded).
    bytes: &'a [u8],
    /// The offset of the next unread byte, from the file's start.
    pos: usize,
}

impl<'a> Reader<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    /// The next line as text, without its newline.
    fn line(&mut self, what: &str) -> Result<&'a str, ArtifactError> {
        let rest = &self.bytes[self.pos.min(self.bytes.len())..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| ArtifactError::Corrupted(format!("the contents end before {what}")))?;
        let line = std::str::from_utf8(&rest[..end])
            .map_err(|_| ArtifactError::Corrupted(format!("{what} is not text")))?;
        self.pos += end + 1;
        Ok(line)
    }

    /// The next line, which must be `name value`: the value.
    fn field(&mut self, name: &str) -> Result<&'a str, ArtifactError> {
        self.line(&format!("the `{name}` line"))?
            .strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .ok_or_else(|| ArtifactError::Corrupted(format!("expected the `{name}` line")))
    }

    /// The next section: `section NAME LEN`, then `LEN` bytes taken by length (they may hold
    /// anything, line breaks included), then a newline. Its name and bytes.
    fn section(&mut self) -> Result<(&'a str, &'a [u8]), ArtifactError> {
        let corrupted = |what: String| ArtifactError::Corrupted(what);
        let line = self.field("section")?;
        let (name, len) = line
            .rsplit_once(' ')
            .and_then(|(name, len)| Some((name, len.parse::<usize>().ok()?)))
            .ok_or_else(|| {
                corrupted(format!(
                    "expected `section NAME <bytes>`, found `{}`",
                    short(line)
                ))
            })?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| self.bytes.get(end) == Some(&b'\n'))
            .ok_or_else(|| corrupted(format!("section {} is not {len} bytes long", short(name))))?;
        let bytes = &self.bytes[self.pos..end];
        self.pos = end + 1;
        Ok((name, bytes))
    }
}

/// The first 32 characters of `text`, for a message about a malformed file.
fn short(text: &str) -> String {
    text.chars().take(32).collect()
}

/// A text section's contents.
fn section_text(name: &str, bytes: &[u8]) -> Result<String, ArtifactError> {
    std::str::from_utf8(bytes)
        .map(str::to_string)
        .map_err(|e| ArtifactError::Corrupted(format!("section {name} is not UTF-8 text: {e}")))
}

/// The `constants` section's contents (`bytes`, which start at file offset `start`): the
/// table, the zero padding and the data block, each constant's place checked to lie inside
/// the block at an aligned offset. Whether each byte length fits its type is [`Artifact::load`]'s
/// check, against the graph.
fn decode_constants(bytes: &[u8], start: usize) -> Result<Vec<Constant>, ArtifactError> {
    let corrupted = |what: String| ArtifactError::Corrupted(format!("section constants: {what}"));
    let mut table = Reader { bytes, pos: 0 };
    let count: usize = table
        .field("count")?
        .parse()
        .map_err(|_| corrupted("`count N` expected".into()))?;
    // Each table line takes at least a dozen bytes: a count beyond that is a lie, refused
    // before anything is allocated for it.
    if count > bytes.len() / 12 {
        return Err(corrupted(format!(
            "{count} constants in {} bytes",
            bytes.len()
        )));
    }
    let mut places = Vec::with_capacity(count);
    for k in 0..count {
        let line = table.line(&format!("constant {k}"))?;
        let parsed = (|| {
            let (declared, place) = line.rsplit_once(" offset ")?;
            let (offset, len) = place.split_once(" bytes ")?;
            let (name, ty) = declared.rsplit_once(": ")?;
            Some((
                name,
                ty,
                offset.parse::<usize>().ok()?,
                len.parse::<usize>().ok()?,
            ))
        })();
        let (name, ty, offset, len) = parsed.ok_or_else(|| {
            corrupted(format!(
                "expected `NAME: TYPE offset O bytes B`, found `{}`",
                short(line)
            ))
        })?;
        let mut cursor = Cursor::new(ty, k + 2);
        let ty = cursor
            .tensor_type()
            .and_then(|ty| cursor.end().map(|()| ty))
            .map_err(|error| ArtifactError::Parse {
                section: "constants",
                error,
            })?;
        places.push((name.to_string(), ty, offset, len));
    }
    let data_len: usize = table
        .field("data")?
        .parse()
        .map_err(|_| corrupted("`data <bytes>` expected".into()))?;
    // The data block is the section's last `data_len` bytes; zeros before it up to its
    // aligned start.
    let data_at = bytes
        .len()
        .checked_sub(data_len)
        .filter(|&at| at >= table.pos)
        .ok_or_else(|| corrupted(format!("a data block of {data_len} bytes does not fit")))?;
    if !(start + data_at).is_multiple_of(CONSTANT_ALIGNMENT) {
        return Err(corrupted(format!(
            "the data block starts at file offset {}, not a multiple of {CONSTANT_ALIGNMENT}",
            start + data_at
        )));
    }
    if bytes[table.pos..data_at].iter().any(|&b| b != 0) {
        return Err(corrupted(
            "the padding before the data block is not zeros".into(),
        ));
    }
    let data = &bytes[data_at..];
    places
        .into_iter()
        .map(|(name, ty, offset, len)| {
            if !offset.is_multiple_of(CONSTANT_ALIGNMENT) {
                return Err(corrupted(format!(
                    "`{name}` at offset {offset}, not a multiple of {CONSTANT_ALIGNMENT}"
                )));
            }
            let place = offset
                .checked_add(len)
                .and_then(|end| data.get(offset..end))
                .ok_or_else(|| {
                    corrupted(format!(
                        "`{name}`: {len} bytes at offset {offset} lie outside the {data_len}-byte data block"
                    ))
                })?;
            Ok(Constant {
                name,
                ty,
                data: place.to_vec(),
            })
        })
        .collect()
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
    ranges: Vec<SizeRange>,
    outputs: Vec<TensorType>,
}

impl Guards {
    fn parse(text: &str) -> Result<Guards, ParseError> {
        let mut guards = Guards {
            inputs: Vec::new(),
            tangents: Vec::new(),
            ranges: Vec::new(),
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
            } else if c.try_eat("range ") {
                let Dim::Sym(sym) = c.dim()? else {
                    return Err(c.error("a symbolic dim `sN`"));
                };
                c.eat(": ")?;
                let min = c.usize()?;
                c.eat("..")?;
                let max = if c.try_eat("=") {
                    Some(c.usize()?)
                } else {
                    None
                };
                c.end()?;
                guards.ranges.push(SizeRange { sym, min, max });
            } else if c.try_eat("output ") {
                guards.outputs.push(c.tensor_type()?);
                c.end()?;
            } else {
                return Err(c.error("`input`, `tangent`, `range` or `output`"));
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
        for range in &self.ranges {
            let used = self
                .inputs
                .iter()
                .any(|(_, ty)| ty.shape.contains(&Dim::Sym(range.sym)));
            if !used {
                return fail(format!("`range {range}`: no input has that symbol"));
            }
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
    let artifact = Artifact::from_bytes(&bytes)?;
    // The file's bytes go before the constants become tensors: a frozen model's weights are
    // held once in the decoded constants, then moved into tensors one at a time.
    drop(bytes);
    artifact.into_compiled()
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

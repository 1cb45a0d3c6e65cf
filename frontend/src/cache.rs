//! The on-disk compile cache (Inductor's FX graph cache, in small): with `MINDUCTOR_CACHE_DIR`
//! set, `compile_with_options` on the inductor backend looks for an artifact of the same graph
//! and options under `$MINDUCTOR_CACHE_DIR/compiled/` and loads it instead of running the passes
//! (code generation still runs: no machine code is stored); on a miss it compiles and saves one.
//!
//! - The key is a 64-bit FNV-1a hash of the artifact format version, the minductor version, the
//!   architecture, the options and the graph's text. A hit is only taken when the
//!   stored artifact's graph text and options equal the request's, so a hash collision is a
//!   miss, not a wrong program.
//! - Entries are written atomically (a temporary file in the same directory, then a rename), so
//!   concurrent processes see a whole artifact or none. An unreadable entry (truncated,
//!   corrupted, another version) is compiled again and overwritten; a failed write only logs.
//! - The cache applies to `compile`, `compile_with(.., inductor)`, `compile_with_options` and
//!   so to `jit`; [`CompileCache`] uses a directory given in code.

use crate::artifact::{
    fnv1a64, options_text, write_atomically, Artifact, FORMAT_VERSION, MINDUCTOR_VERSION,
};
use crate::compile::{compile_uncached, Backend, CompileError, CompileOptions, Compiled};
use minductor_ir::Graph;
use std::path::{Path, PathBuf};

/// The environment variable naming the cache directory.
pub const CACHE_DIR_VAR: &str = "MINDUCTOR_CACHE_DIR";

/// What a cached compile did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache.
    Hit,
    /// Compiled, and saved for next time.
    Miss,
    /// Compiled; the entry was not written (why).
    MissNotSaved(String),
    /// Not cacheable (a backend other than inductor): compiled without the cache.
    Bypass,
}

/// A directory of compiled artifacts keyed by graph and options.
#[derive(Clone, Debug)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// A cache in `dir` (created when the first entry is written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    /// The cache `MINDUCTOR_CACHE_DIR` names (its `compiled/` subdirectory), if it is set.
    pub fn from_env() -> Option<Self> {
        let dir = std::env::var_os(CACHE_DIR_VAR).filter(|d| !d.is_empty())?;
        Some(CompileCache::new(Path::new(&dir).join("compiled")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of `graph` compiled with `options` (16 hex digits).
    pub fn key(graph: &Graph, options: &CompileOptions) -> String {
        let material = format!(
            "format {FORMAT_VERSION}\nminductor {MINDUCTOR_VERSION}\narch {}\noptions {}\n{graph}",
            std::env::consts::ARCH,
            options_text(options)
        );
        format!("{:016x}", fnv1a64(material.as_bytes()))
    }

    /// Where the entry of `key` lives.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.mind"))
    }

    /// Loads `graph` compiled with `options` from the cache, or compiles it and stores it.
    pub fn compile(
        &self,
        graph: &Graph,
        options: CompileOptions,
    ) -> Result<(Compiled, CacheOutcome), CompileError> {
        if options.backend != Backend::Inductor {
            return Ok((compile_uncached(graph, options)?, CacheOutcome::Bypass));
        }
        let path = self.path(&Self::key(graph, &options));
        if let Some(compiled) = self.lookup(&path, graph, &options) {
            return Ok((compiled, CacheOutcome::Hit));
        }
        let compiled = compile_uncached(graph, options)?;
        let saved = std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("{}: {e}", self.dir.display()))
            .and_then(|()| {
                let bytes = Artifact::of(&compiled)
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                write_atomically(&path, &bytes).map_err(|e| e.to_string())
            });
        let outcome = match saved {
            Ok(()) => CacheOutcome::Miss,
            Err(why) => {
                tracing::warn!(target: "minductor::perf", "compile cache: not saved: {why}");
                CacheOutcome::MissNotSaved(why)
            }
        };
        Ok((compiled, outcome))
    }

    /// The entry at `path`, if it exists, loads, and is for this very graph and these options.
    fn lookup(&self, path: &Path, graph: &Graph, options: &CompileOptions) -> Option<Compiled> {
        let bytes = std::fs::read(path).ok()?;
        let loaded = Artifact::from_bytes(&bytes).and_then(|artifact| {
            if artifact.graph != graph.to_string() || artifact.options != options_text(options) {
                return Ok(None);
            }
            artifact.into_compiled().map(|mut compiled| {
                compiled.mark_from_cache();
                Some(compiled)
            })
        });
        match loaded {
            Ok(Some(compiled)) => {
                tracing::debug!(
                    target: "minductor::perf",
                    "compile cache hit {} ({:.2} ms)",
                    path.display(),
                    compiled.compile_time().as_secs_f64() * 1e3
                );
                Some(compiled)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(
                    target: "minductor::perf",
                    "compile cache: {} is unusable ({e}); compiling again",
                    path.display()
                );
                None
            }
        }
    }
}

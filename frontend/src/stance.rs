//! Stances, like `torch.compiler.set_stance`: how every `jit` function on this thread behaves.
//!
//! - `Default`: compile on a cache miss, up to the recompile limit;
//! - `ForceEager`: ignore the cache and run the function eagerly (traced and interpreted op by op);
//! - `EagerOnRecompile`: use cached code when a guard set passes, run eagerly instead of recompiling;
//! - `FailOnRecompile`: a recompile is an error ([`crate::JitError::RecompileForbidden`]);
//! - `EagerThenCompile`: the first call of each new input signature (the inputs' dtypes and
//!   shapes) that no cache entry's guards accept runs eagerly; the next call with that signature
//!   compiles. The eager call records its sizes in the function's dynamic-shape state as a compile
//!   would, so a dim seen at two sizes is compiled symbolic at once (no static compile wasted, the
//!   point of PyTorch's `eager_then_compile`). A call that a cache entry's guards accept runs the
//!   cached code whatever its signature.
//!
//! Apart from stances, a single function can be excluded from compilation altogether with
//! [`crate::Jit::disable`] (`torch.compiler.disable`): its calls always run eagerly.
//!
//! A first compile (no cache entry yet) is not a recompile, as in PyTorch. The stance is per
//! thread and scoped: [`set_stance`] returns a guard that restores the previous stance when
//! dropped (also while a panic unwinds), and [`with_stance`] runs a closure under a stance.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Stance {
    #[default]
    Default,
    ForceEager,
    EagerOnRecompile,
    FailOnRecompile,
    EagerThenCompile,
}

impl Stance {
    pub fn name(self) -> &'static str {
        match self {
            Stance::Default => "default",
            Stance::ForceEager => "force_eager",
            Stance::EagerOnRecompile => "eager_on_recompile",
            Stance::FailOnRecompile => "fail_on_recompile",
            Stance::EagerThenCompile => "eager_then_compile",
        }
    }
}

impl fmt::Display for Stance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Stance::Default),
            "force_eager" => Ok(Stance::ForceEager),
            "eager_on_recompile" => Ok(Stance::EagerOnRecompile),
            "fail_on_recompile" => Ok(Stance::FailOnRecompile),
            "eager_then_compile" => Ok(Stance::EagerThenCompile),
            other => Err(format!(
                "unknown stance `{other}` (expected default, force_eager, eager_on_recompile, \
                 fail_on_recompile or eager_then_compile)"
            )),
        }
    }
}

thread_local! {
    static STANCE: Cell<Stance> = const { Cell::new(Stance::Default) };
}

/// The stance in force on this thread.
pub fn current_stance() -> Stance {
    STANCE.with(|s| s.get())
}

/// Restores the stance it replaced when dropped.
#[must_use = "the stance is restored when this guard is dropped"]
pub struct StanceGuard {
    previous: Stance,
}

impl Drop for StanceGuard {
    fn drop(&mut self) {
        STANCE.with(|s| s.set(self.previous));
    }
}

/// Sets the stance on this thread until the returned guard is dropped.
pub fn set_stance(stance: Stance) -> StanceGuard {
    let previous = STANCE.with(|s| s.replace(stance));
    StanceGuard { previous }
}

/// Runs `f` under `stance`, restoring the previous stance afterwards (also if `f` panics).
pub fn with_stance<R>(stance: Stance, f: impl FnOnce() -> R) -> R {
    let _guard = set_stance(stance);
    f()
}

//! Scratch memory of the kernels: packed GEMM panels, the attention's packed keys and values,
//! Winograd's transformed tiles. [`Scratch`] is a growable run of f32 values starting on a
//! cache line, allocated fallibly (an allocation that fails is a [`ScratchError::OutOfMemory`],
//! never an abort: its size can follow an operand's, which a caller controls).
//!
//! Checking mode: while at least one [`CheckScratch`] is alive (the executor holds one during a
//! call under `MINDUCTOR_CHECK_BUFFERS=1`), every scratch buffer a kernel prepares is laid out
//! afresh with [`GUARD_LINES`] cache lines of guard before and after it and filled, guards
//! included, with the [`UNWRITTEN`] pattern, a signalling NaN whose payload survives arithmetic:
//! a result computed from scratch no one wrote carries it into the output, where the executor
//! looks for it, and [`Scratch::check`] reports a guard byte a kernel changed (a write outside
//! the buffer). Calls running without checking meanwhile only pay for the filling.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use thiserror::Error;

/// The 4 bytes checking mode fills memory with: f32 `0x7FA5A5A5`, a signalling NaN whose
/// payload (`0x25A5A5`) survives arithmetic (which only sets the quiet bit).
pub const UNWRITTEN: u32 = 0x7FA5_A5A5;

/// Cache lines of guard before and after a scratch buffer in checking mode.
pub const GUARD_LINES: usize = 2;

/// Live [`CheckScratch`] guards.
static CHECKING: AtomicUsize = AtomicUsize::new(0);

/// Turns checking mode on for scratch buffers while it lives (see the module doc).
#[must_use = "checking lasts as long as the guard"]
pub struct CheckScratch(());

impl CheckScratch {
    pub fn new() -> CheckScratch {
        CHECKING.fetch_add(1, Ordering::SeqCst);
        CheckScratch(())
    }
}

impl Default for CheckScratch {
    fn default() -> Self {
        CheckScratch::new()
    }
}

impl Drop for CheckScratch {
    fn drop(&mut self) {
        CHECKING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether scratch is being checked (some [`CheckScratch`] is alive).
pub fn checking() -> bool {
    CHECKING.load(Ordering::Relaxed) > 0
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScratchError {
    #[error("no memory for {bytes} bytes of {what}")]
    OutOfMemory { bytes: usize, what: &'static str },
    /// Checking mode found a guard byte changed: a kernel wrote outside its scratch.
    #[error(
        "a kernel wrote outside its scratch ({what}, {len} values): guard byte at {at} from \
         the buffer's start"
    )]
    Overwritten {
        what: &'static str,
        len: usize,
        at: isize,
    },
}

impl From<ScratchError> for minductor_runtime::RuntimeError {
    fn from(e: ScratchError) -> Self {
        match e {
            ScratchError::OutOfMemory { bytes, what } => {
                minductor_runtime::RuntimeError::out_of_memory(bytes, what)
            }
            e @ ScratchError::Overwritten { .. } => {
                minductor_runtime::RuntimeError::BufferCheck(e.to_string())
            }
        }
    }
}

/// A 64-byte aligned run of f32 values: whole cache lines, aligned zmm loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

const ZERO_LINE: Line = Line([0.0; 16]);
const UNWRITTEN_LINE: Line = Line([f32::from_bits(UNWRITTEN); 16]);

/// A growable buffer of f32 values starting on a cache line, zero-initialized when grown
/// (pattern-filled and guarded in checking mode).
#[derive(Default)]
pub struct Scratch {
    lines: Vec<Line>,
    /// The first line of the buffer (after the guard in checking mode, else 0).
    start: usize,
    /// Values in use; `start · 16 + len ≤ lines.len() · 16`, and in checking mode
    /// `GUARD_LINES` lines follow the last one in use.
    len: usize,
    /// Whether the last `prepare` laid the buffer out for checking.
    guarded: bool,
}

impl Scratch {
    pub const fn new() -> Self {
        Scratch {
            lines: Vec::new(),
            start: 0,
            len: 0,
            guarded: false,
        }
    }

    /// Makes room for `len` values and sets the length to it; `OutOfMemory` (naming `what`)
    /// when the allocator has no room. Values kept from an earlier use are unspecified, except
    /// in checking mode, where every value (and the guards) holds the [`UNWRITTEN`] pattern.
    pub fn prepare(&mut self, len: usize, what: &'static str) -> Result<(), ScratchError> {
        let lines = len.div_ceil(16);
        if checking() {
            let total = lines
                .checked_add(2 * GUARD_LINES)
                .ok_or(ScratchError::OutOfMemory {
                    bytes: usize::MAX,
                    what,
                })?;
            if self.lines.len() < total {
                self.lines = Vec::new();
                self.lines = allocate(total, what, UNWRITTEN_LINE)?;
            }
            self.lines.fill(UNWRITTEN_LINE);
            self.start = GUARD_LINES;
            self.guarded = true;
        } else {
            if self.lines.len() < lines {
                // The old block is freed first: growing never holds both.
                self.lines = Vec::new();
                self.lines = allocate(lines, what, ZERO_LINE)?;
            }
            self.start = 0;
            self.guarded = false;
        }
        self.len = len;
        Ok(())
    }

    /// In checking mode, the first guard byte (or byte past the buffer's end within its last
    /// line) that no longer holds the pattern, as an error naming `what`; `Ok` otherwise.
    pub fn check(&self, what: &'static str) -> Result<(), ScratchError> {
        if !self.guarded {
            return Ok(());
        }
        let values = self.all_values();
        let first = self.start * 16;
        let end = (self.start + self.len.div_ceil(16)) * 16;
        let before = first - GUARD_LINES * 16..first;
        let after = first + self.len..(end + GUARD_LINES * 16).min(values.len());
        for i in before.chain(after) {
            if values[i].to_bits() != UNWRITTEN {
                return Err(ScratchError::Overwritten {
                    what,
                    len: self.len,
                    at: (i as isize - first as isize) * 4,
                });
            }
        }
        Ok(())
    }

    /// Values the buffer can hold without growing.
    pub fn capacity(&self) -> usize {
        self.lines.len() * 16
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.all_values()[self.start * 16..][..self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        let (start, len) = (self.start * 16, self.len);
        &mut self.all_values_mut()[start..][..len]
    }

    fn all_values(&self) -> &[f32] {
        // SAFETY: `lines` holds `lines.len() · 16` initialized f32 values (`Line` is `repr(C)`
        // over `[f32; 16]`, without padding).
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.lines.len() * 16)
        }
    }

    fn all_values_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `all_values`; `&mut self` makes the borrow unique.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.lines.as_mut_ptr() as *mut f32,
                self.lines.len() * 16,
            )
        }
    }
}

/// The first error of work split across threads: each piece records its result, and the
/// caller returns the first error once the pieces have joined.
pub(crate) struct FirstError<E>(Mutex<Option<E>>);

impl<E> FirstError<E> {
    pub(crate) fn new() -> Self {
        FirstError(Mutex::new(None))
    }

    /// Keeps `result`'s error unless an earlier one is kept.
    pub(crate) fn record(&self, result: Result<(), E>) {
        if let Err(e) = result {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    }

    pub(crate) fn into_result(self) -> Result<(), E> {
        match self.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `lines` lines of `fill`, or `OutOfMemory`.
fn allocate(lines: usize, what: &'static str, fill: Line) -> Result<Vec<Line>, ScratchError> {
    let bytes = lines.saturating_mul(std::mem::size_of::<Line>());
    let mut grown: Vec<Line> = Vec::new();
    grown
        .try_reserve_exact(lines)
        .map_err(|_| ScratchError::OutOfMemory { bytes, what })?;
    grown.resize(lines, fill);
    Ok(grown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checking mode is process-wide: these run one after the other in one test.
    #[test]
    fn checking_mode_fills_guards_and_catches_a_write_past_the_end() {
        let mut scratch = Scratch::new();
        scratch.prepare(20, "test").unwrap();
        assert_eq!(scratch.as_slice(), &[0.0; 20]);
        {
            let _check = CheckScratch::new();
            scratch.prepare(20, "test").unwrap();
            // Every value starts as the pattern, so a read before a write is visible.
            assert!(scratch.as_slice().iter().all(|v| v.to_bits() == UNWRITTEN));
            scratch.as_mut_slice().fill(1.0);
            assert_eq!(scratch.check("test"), Ok(()));
            // One value past the end, as a kernel overrunning its buffer writes it.
            let past = scratch.start * 16 + scratch.len;
            scratch.all_values_mut()[past] = 2.0;
            assert_eq!(
                scratch.check("test"),
                Err(ScratchError::Overwritten {
                    what: "test",
                    len: 20,
                    at: 80
                })
            );
            // And one before the start.
            scratch.prepare(20, "test").unwrap();
            let before = scratch.start * 16 - 1;
            scratch.all_values_mut()[before] = 2.0;
            assert!(matches!(
                scratch.check("test"),
                Err(ScratchError::Overwritten { at: -4, .. })
            ));
        }
        // Out of checking mode a write there is not looked for (no guards are laid out).
        scratch.prepare(20, "test").unwrap();
        assert_eq!(scratch.check("test"), Ok(()));
    }

    #[test]
    fn an_oversized_scratch_is_out_of_memory() {
        let mut scratch = Scratch::new();
        match scratch.prepare(1 << 42, "huge") {
            Err(ScratchError::OutOfMemory { bytes, what }) => {
                assert_eq!((bytes, what), (1 << 44, "huge"));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        scratch.prepare(3, "small").unwrap();
        assert_eq!(scratch.as_slice(), &[0.0; 3]);
    }
}

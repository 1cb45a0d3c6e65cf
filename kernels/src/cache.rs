//! The sizes of this CPU's caches, read at run time: the L1 data and L2 caches choose the
//! GEMM's blocking, the last level which stores bypass it (see `math::block::rows`). From
//! Linux's sysfs, else from CPUID (leaf 4 on Intel, 0x8000001D on AMD).

use std::sync::OnceLock;

/// The cache a prefetch brings its line into.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Level {
    L1,
    L2,
}

/// Hints that the line holding `value` will be read soon, into `level`. Only a hint: `value`
/// need not point into any allocation.
#[inline(always)]
pub(crate) fn prefetch_line(value: *const f32, level: Level) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and changes no state the program sees.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let p = value as *const i8;
        match level {
            Level::L1 => _mm_prefetch::<_MM_HINT_T0>(p),
            Level::L2 => _mm_prefetch::<_MM_HINT_T1>(p),
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (value, level);
}

/// Bytes of the L2 (unified) cache of one core, if the system says; read once (GEMMs ask on
/// every call whether to stream).
pub fn l2_bytes() -> Option<usize> {
    static L2: OnceLock<Option<usize>> = OnceLock::new();
    *L2.get_or_init(|| {
        sysfs_size(2)
            .or_else(|| cpuid_size(2))
            .filter(|&bytes| bytes >= 64 * 1024)
    })
}

/// Bytes of the L1 data cache of one core, if the system says; read once.
pub fn l1d_bytes() -> Option<usize> {
    static L1D: OnceLock<Option<usize>> = OnceLock::new();
    *L1D.get_or_init(|| {
        sysfs_size(1)
            .or_else(|| cpuid_size(1))
            .filter(|&bytes| bytes >= 4 * 1024)
    })
}

/// Bytes of the L3 cache that cpu0 shares with its neighbours (a socket's, or on AMD one core
/// complex's), if the system says; read once.
pub fn l3_bytes() -> Option<usize> {
    static L3: OnceLock<Option<usize>> = OnceLock::new();
    *L3.get_or_init(|| {
        sysfs_size(3)
            .or_else(|| cpuid_size(3))
            .filter(|&bytes| bytes >= 256 * 1024)
    })
}

/// `/sys/devices/system/cpu/cpu0/cache/index*/`: the `size` ("1024K") of the data or unified
/// cache of level `wanted`.
fn sysfs_size(wanted: u32) -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    for entry in dir.flatten() {
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if level.trim() != wanted.to_string() || kind.trim() == "Instruction" {
            continue;
        }
        return parse_size(size.trim());
    }
    None
}

/// "1024K", "2M" or "524288" as bytes.
fn parse_size(text: &str) -> Option<usize> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let value: usize = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        _ => return None,
    };
    value.checked_mul(scale)
}

/// The size of the data or unified cache of level `wanted` from CPUID's deterministic cache
/// parameters: leaf 4 (Intel) or 0x8000001D
/// (AMD), whose sub-leaves each describe one cache (type in EAX[4:0], 0 for none; level in
/// EAX[7:5]; ways, partitions, line size and sets in EBX and ECX).
#[cfg(target_arch = "x86_64")]
fn cpuid_size(wanted: u32) -> Option<usize> {
    use std::arch::x86_64::__cpuid_count;
    // A leaf above the maximum the CPU reports returns unspecified values: read the maxima.
    let max_basic = __cpuid_count(0, 0).eax;
    let max_extended = __cpuid_count(0x8000_0000, 0).eax;
    let leaves = [
        (4, max_basic >= 4),
        (0x8000_001D, max_extended >= 0x8000_001D),
    ];
    for (leaf, present) in leaves {
        if !present {
            continue;
        }
        for sub in 0..16 {
            let r = __cpuid_count(leaf, sub);
            let kind = r.eax & 0x1F;
            if kind == 0 {
                break;
            }
            let level = (r.eax >> 5) & 0x7;
            if level == wanted && kind != 2 {
                let ways = ((r.ebx >> 22) & 0x3FF) as usize + 1;
                let partitions = ((r.ebx >> 12) & 0x3FF) as usize + 1;
                let line = (r.ebx & 0xFFF) as usize + 1;
                let sets = r.ecx as usize + 1;
                return Some(ways * partitions * line * sets);
            }
        }
    }
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_size(_: u32) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("1024K"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("524288"), Some(524288));
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size(""), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn cpuid_and_sysfs_agree_when_both_answer() {
        for level in [1, 2, 3] {
            if let (Some(sysfs), Some(cpuid)) = (sysfs_size(level), cpuid_size(level)) {
                assert_eq!(sysfs, cpuid, "L{level}");
            }
        }
    }
}

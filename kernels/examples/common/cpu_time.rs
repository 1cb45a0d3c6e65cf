//! CPU time of this thread or process, for the kernel examples' measurements: on a shared,
//! busy host it counts only our own work (spinning waits included), not the time other
//! processes ran. Included by each example with `#[path = "common/cpu_time.rs"] mod cpu_time;`.

#![allow(dead_code)]

/// `struct timespec` of 64-bit Linux.
#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// Seconds on `clock` (a Linux clock id).
fn seconds(clock: i32) -> f64 {
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: `time` is a valid, writable `struct timespec` for the call.
    let status = unsafe { clock_gettime(clock, &mut time) };
    assert_eq!(status, 0, "clock_gettime");
    time.seconds as f64 + time.nanoseconds as f64 * 1e-9
}

/// CPU seconds this thread has used so far.
pub fn thread_cpu_seconds() -> f64 {
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    seconds(CLOCK_THREAD_CPUTIME_ID)
}

/// CPU seconds every thread of this process has used so far.
pub fn process_cpu_seconds() -> f64 {
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    seconds(CLOCK_PROCESS_CPUTIME_ID)
}

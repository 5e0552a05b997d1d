// Rust unwinding target: a release build (no frame pointers by default).
// Usage: unwind_rust SECONDS (of its own CPU time: a busy machine makes it
// run longer, not give fewer samples)

/// The process's CPU time in seconds (glibc's clock_gettime; the program
/// is built by plain rustc, without the libc crate).
fn cpu_now() -> f64 {
    extern "C" {
        fn clock_gettime(clock: i32, time: *mut [i64; 2]) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut time = [0i64; 2];
    // SAFETY: `time` is a 64-bit timespec, the layout on both of the
    // 64-bit targets the tests build for.
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    time[0] as f64 + time[1] as f64 / 1e9
}

#[inline(never)]
fn hot_loop(n: u64) -> u64 {
    (0..n).fold(0, |acc, i| std::hint::black_box(acc ^ i.wrapping_mul(31)))
}

#[inline(never)]
fn stage(n: u64) -> u64 {
    let mut pad = [0u64; 8];
    pad[0] = hot_loop(std::hint::black_box(n));
    std::hint::black_box(&mut pad);
    pad[0]
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let end = cpu_now() + seconds;
    let mut total = 0;
    while cpu_now() < end {
        total ^= stage(200_000);
    }
    std::hint::black_box(total);
}

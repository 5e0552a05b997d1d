// Rust unwinding target: a release build (no frame pointers by default).
// Usage: unwind_rust SECONDS
use std::time::{Duration, Instant};

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
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut total = 0;
    while Instant::now() < end {
        total ^= stage(200_000);
    }
    std::hint::black_box(total);
}

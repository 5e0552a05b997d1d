// Rust symbolization target: prints the address of worker::spin, then waits
// for stdin to close.
mod worker {
    #[inline(never)]
    pub fn spin(n: u64) -> u64 {
        (0..n).fold(0, |acc, i| acc ^ i.wrapping_mul(31))
    }
}

fn main() {
    let spin: fn(u64) -> u64 = worker::spin;
    println!("{spin:p}");
    std::hint::black_box(spin(std::hint::black_box(10)));
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

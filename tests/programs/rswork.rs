// Rust naming target, built with `-C debuginfo=line-tables-only` (what
// `debug = "line-tables-only"` gives): DWARF then names functions without
// their path (`hot_path`), the symbol table with it (`rswork::hot_path`).
// Prints the address of hot_path, then waits for stdin to close.
use std::collections::BTreeMap;

trait Shape {
    fn area(&self) -> f64;
}

struct Square(f64);

impl Shape for Square {
    #[inline(never)]
    fn area(&self) -> f64 {
        self.0 * self.0
    }
}

mod stats {
    #[inline(never)]
    pub fn histogram(values: &[u64]) -> std::collections::BTreeMap<u64, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for value in values {
            *counts.entry(value % 17).or_insert(0) += 1;
        }
        counts
    }
}

#[inline(never)]
fn hot_path(n: u64) -> u64 {
    (0..n).fold(0, |acc, i| acc ^ i.wrapping_mul(31).rotate_left((i % 7) as u32))
}

#[inline(never)]
fn total<T: Shape>(shapes: &[T]) -> f64 {
    shapes.iter().map(Shape::area).sum()
}

fn main() {
    let hot: fn(u64) -> u64 = hot_path;
    println!("{hot:p}");
    let mut values: Vec<u64> = (0..1000).map(|i| hot(std::hint::black_box(i))).collect();
    values.sort_unstable();
    let counts: BTreeMap<u64, usize> = stats::histogram(&values);
    let squares: Vec<Square> = values.iter().map(|v| Square(*v as f64)).collect();
    std::hint::black_box((counts, total(&squares)));
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

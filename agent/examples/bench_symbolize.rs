//! Symbolization benchmark: hostprof's symbolizer against `llvm-symbolizer`
//! and binutils `addr2line` on one binary with DWARF.
//!
//! ```text
//! cargo run --release -p hostprof --example bench_symbolize -- BINARY [COUNT]
//! ```
//!
//! Picks COUNT (default 100 000) distinct addresses inside function bodies,
//! deterministically, symbolizes them with each tool (both external tools in
//! batch mode, addresses on stdin), and prints wall times and how often each
//! tool's innermost function agrees with llvm-symbolizer's. Names are
//! compared raw (`--no-demangle`), so demangler differences do not count.
use std::{
    collections::BTreeSet,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use hostprof::symbolize::Symbolizer;
use object::{Object, ObjectSymbol, SymbolKind};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let binary = PathBuf::from(
        args.next()
            .context("usage: bench_symbolize BINARY [COUNT] (e.g. target/debug/hostprof)")?,
    );
    let count: usize = match args.next() {
        Some(count) => count
            .to_str()
            .and_then(|count| count.parse().ok())
            .context("COUNT must be a number")?,
        None => 100_000,
    };
    let addresses = pick_addresses(&binary, count)?;
    println!(
        "{} distinct addresses in {}",
        addresses.len(),
        binary.display()
    );

    let start = Instant::now();
    let symbolizer = Symbolizer::new();
    let module = symbolizer.module_for_path(&binary)?;
    let hostprof: Vec<String> = addresses
        .iter()
        .map(|&address| {
            module
                .lookup_address(address)
                .first()
                .map_or_else(|| "??".to_string(), |line| line.system_name.to_string())
        })
        .collect();
    let hostprof_time = start.elapsed();

    let (llvm, llvm_time) = run_batch(
        // LLVM 19's, the tests' reference for names (tests/common/llvm.rs).
        Command::new("llvm-symbolizer-19")
            .arg(format!("--obj={}", binary.display()))
            .args(["--no-demangle", "--inlining"]),
        &addresses,
        parse_llvm,
    )
    .context("run llvm-symbolizer-19 (cargo xtask setup installs it)")?;
    let (binutils, binutils_time) = run_batch(
        Command::new("addr2line")
            .args(["-a", "-f", "-i", "-e"])
            .arg(&binary),
        &addresses,
        parse_addr2line,
    )
    .context("run addr2line (apt-get install binutils)")?;
    if llvm.len() != addresses.len() || binutils.len() != addresses.len() {
        bail!(
            "output mismatch: {} addresses, llvm-symbolizer answered {}, addr2line {}",
            addresses.len(),
            llvm.len(),
            binutils.len()
        );
    }

    println!();
    println!(
        "{:<22} {:>12} {:>14} {:>22}",
        "tool", "wall time", "addresses/s", "innermost = llvm's"
    );
    for (name, time, names) in [
        ("hostprof", hostprof_time, &hostprof),
        ("llvm-symbolizer", llvm_time, &llvm),
        ("addr2line (binutils)", binutils_time, &binutils),
    ] {
        let agree = names.iter().zip(&llvm).filter(|(a, b)| a == b).count();
        println!(
            "{name:<22} {:>10.3} s {:>14.0} {:>21.2}%",
            time.as_secs_f64(),
            addresses.len() as f64 / time.as_secs_f64(),
            100.0 * agree as f64 / addresses.len() as f64
        );
    }
    let disagreements: Vec<_> = hostprof
        .iter()
        .zip(&llvm)
        .zip(&addresses)
        .filter(|((a, b), _)| a != b)
        .take(5)
        .collect();
    if !disagreements.is_empty() {
        println!("\nfirst disagreements (address: hostprof | llvm-symbolizer):");
        for ((ours, theirs), address) in disagreements {
            println!("  {address:#x}: {ours} | {theirs}");
        }
    }
    Ok(())
}

/// `count` distinct addresses inside sized function symbols, chosen by a
/// fixed-seed generator so every run (and every tool) sees the same set.
fn pick_addresses(binary: &Path, count: usize) -> anyhow::Result<Vec<u64>> {
    let data = std::fs::read(binary).with_context(|| format!("read {}", binary.display()))?;
    let file = object::File::parse(&*data).context("parse the binary as ELF")?;
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.size() > 0)
        .map(|symbol| (symbol.address(), symbol.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|(address, _)| *address);
    let code: u64 = functions.iter().map(|(_, size)| size).sum();
    if functions.is_empty() || code < 2 * count as u64 {
        bail!(
            "{} has {} bytes of sized functions: too few for {count} addresses (use a binary with a .symtab)",
            binary.display(),
            code
        );
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: deterministic and good enough to spread picks.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut picked = BTreeSet::new();
    while picked.len() < count {
        let (start, size) = functions[(next() % functions.len() as u64) as usize];
        picked.insert(start + next() % size);
    }
    // Sorted, as every tool gets them: a profile's addresses cluster too.
    Ok(picked.into_iter().collect())
}

/// Runs a batch symbolizer with one hex address per stdin line.
fn run_batch(
    command: &mut Command,
    addresses: &[u64],
    parse: fn(&str) -> Vec<String>,
) -> anyhow::Result<(Vec<String>, Duration)> {
    let input: String = addresses
        .iter()
        .map(|address| format!("{address:#x}\n"))
        .collect();
    let start = Instant::now();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = child.stdin.take().context("piped stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let mut output = String::new();
    child
        .stdout
        .take()
        .context("piped stdout")?
        .read_to_string(&mut output)?;
    child.wait()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("stdin writer panicked"))??;
    Ok((parse(&output), start.elapsed()))
}

/// llvm-symbolizer: per address, (function, location) pairs innermost first,
/// then an empty line.
fn parse_llvm(output: &str) -> Vec<String> {
    output
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| block.lines().next().unwrap_or("??").to_string())
        .collect()
}

/// addr2line -a: per address, the address line, then (function, location)
/// pairs innermost first.
fn parse_addr2line(output: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut lines = output.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("0x") {
            names.push(lines.peek().copied().unwrap_or("??").to_string());
        }
    }
    names
}

//! An OpenTelemetry thread-context writer (OTEP 4947) in Rust, for
//! tests/thread_context.rs: the C writer's normal mode
//! (tests/programs/otel_thread_ctx.c) with the same arguments, timing and
//! log, so that every check made of the C writer is made of this one.
//!
//!   otel_thread_ctx_rs LOG STOP SECONDS [THREADS]
//!     THREADS threads (default 3) burn CPU until the file STOP exists (at
//!     most SECONDS), cycling through: a new span attached for 6 ms (a
//!     fresh record, valid = 1, then the pointer), detached (pointer NULL)
//!     for 3 ms, and a record marked under modification (valid = 0) for
//!     3 ms. Each span carries attributes (OTEP 4947's attrs-data):
//!     http.route, "/cart" or "/checkout" by turns, and, once the process
//!     context has been republished with a second key (KEYS_AFTER_NS after
//!     the start), http.method "GET" or "POST". The process context (OTEP
//!     4719) holds the key map: ["http.route"], then ["http.route",
//!     "http.method"]. Each switch is logged, at exit, to LOG as
//!     "tid monotonic_ns state trace_hex span_hex route method", state 1
//!     linked, 0 none, "-" for no attribute; the first line is
//!     "offset REALTIME-MONOTONIC_ns".
//!
//! Timestamps are CLOCK_MONOTONIC: the clock of bpf_ktime_get_ns, which
//! the sampler stamps samples with.
//!
//! One file built by `rustc` alone, without crates: the few C library
//! calls it needs (memfd_create, mmap, madvise, prctl, clock_gettime,
//! gettid) are declared below; std links the C library anyway. x86_64 and
//! aarch64 Linux only, as the agent is.
//!
//! `otel_thread_ctx_v1` is a thread-local of this executable (static TLS),
//! exported in .dynsym (build with
//! `-C link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1`).
use std::{
    ffi::{c_char, c_int, c_uint, c_ulong, c_void},
    fmt::Write as _,
    fs::File,
    io::Write as _,
    os::fd::FromRawFd,
    path::Path,
    ptr,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering, fence},
    time::Duration,
};

/// The record, laid out as the OTEP says (trace-id, span-id, valid,
/// trace-flags, attrs-data-size in host byte order, attrs-data): no field
/// needs padding, so `repr(C)` gives the byte-packed layout.
#[repr(C, align(8))]
struct Record {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// Atomic so that the stores that publish and withdraw the record are
    /// ordered after the bytes they cover.
    valid: AtomicU8,
    trace_flags: u8,
    attrs_data_size: u16,
    attrs_data: [u8; 36],
}

const _: () = {
    assert!(std::mem::offset_of!(Record, span_id) == 16);
    assert!(std::mem::offset_of!(Record, valid) == 24);
    assert!(std::mem::offset_of!(Record, trace_flags) == 25);
    assert!(std::mem::offset_of!(Record, attrs_data_size) == 26);
    assert!(std::mem::offset_of!(Record, attrs_data) == 28);
};

impl Record {
    fn empty() -> Record {
        Record {
            trace_id: [0; 16],
            span_id: [0; 8],
            valid: AtomicU8::new(0),
            trace_flags: 0,
            attrs_data_size: 0,
            attrs_data: [0; 36],
        }
    }
}

// The thread-local, `otel_thread_ctx_v1`: an 8-byte STT_TLS symbol in
// .tbss, exported. Stable Rust cannot define one: `thread_local!` gives a
// mangled name behind an accessor, and `#[thread_local]` (which with
// `#[no_mangle]` would) is nightly only. So it is defined in assembly and
// reached through the thread pointer with the local-exec sequence below,
// which the static linker resolves for a variable of the executable itself
// (its offset from the thread pointer is known at link time).
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".globl otel_thread_ctx_v1",
    ".type otel_thread_ctx_v1, @tls_object",
    ".size otel_thread_ctx_v1, 8",
    ".p2align 3",
    "otel_thread_ctx_v1:",
    ".zero 8",
    ".popsection",
);

/// This thread's `otel_thread_ctx_v1`, as the pointer-sized atomic it is
/// stored through (the variable is 8 bytes, 8-aligned, zeroed at thread
/// start: a null pointer).
fn thread_ctx() -> &'static AtomicPtr<Record> {
    let address: *mut AtomicPtr<Record>;
    // SAFETY: reads the thread pointer and adds the variable's link-time
    // offset from it; no memory is written, no flags changed.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            "movq %fs:0, {0}",
            "leaq otel_thread_ctx_v1@tpoff({0}), {0}",
            out(reg) address,
            options(att_syntax, nostack, preserves_flags, readonly),
        );
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!(
            "mrs {0}, tpidr_el0",
            "add {0}, {0}, #:tprel_hi12:otel_thread_ctx_v1, lsl #12",
            "add {0}, {0}, #:tprel_lo12_nc:otel_thread_ctx_v1",
            out(reg) address,
            options(nostack, preserves_flags, nomem),
        );
    }
    // SAFETY: the variable lives as long as the thread, and only this
    // thread uses the reference (it is not sent elsewhere).
    unsafe { &*address }
}

// The C library's calls that std does not offer.
const CLOCK_REALTIME: c_int = 0;
const CLOCK_MONOTONIC: c_int = 1;
const CLOCK_BOOTTIME: c_int = 7;
const SC_PAGESIZE: c_int = 30;
const MFD_CLOEXEC: c_uint = 1;
const MFD_ALLOW_SEALING: c_uint = 2;
const MFD_NOEXEC_SEAL: c_uint = 8;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_PRIVATE: c_int = 2;
const MAP_ANONYMOUS: c_int = 0x20;
const MADV_DONTFORK: c_int = 10;
const PR_SET_VMA: c_int = 0x53564d41;
const PR_SET_VMA_ANON_NAME: c_ulong = 0;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    fn sysconf(name: c_int) -> i64;
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn mmap(
        address: *mut c_void,
        length: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    fn madvise(address: *mut c_void, length: usize, advice: c_int) -> c_int;
    fn prctl(option: c_int, ...) -> c_int;
    fn gettid() -> c_int;
}

fn now_ns(clock: c_int) -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill; the clocks used exist.
    unsafe { clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn burn_until(end: u64) {
    let mut sink = 0u64;
    while now_ns(CLOCK_MONOTONIC) < end {
        for i in 0..2000u64 {
            sink = std::hint::black_box(sink.wrapping_add(i.wrapping_mul(2654435761)));
        }
    }
}

// Publishing the process context as OTEP 4719 asks of a writer
// (otel_ctx_publish.h's, in Rust). Header (32 bytes): "OTEL_CTX", version
// 2, payload size, CLOCK_BOOTTIME publication time, payload pointer; the
// payload a ProcessContext protobuf encoded by hand.

#[repr(C)]
struct Header {
    signature: [u8; 8],
    version: u32,
    payload_size: u32,
    monotonic_published_at_ns: u64,
    payload: u64,
}

const _: () = assert!(size_of::<Header>() == 32);

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A length-delimited field: tag, length, bytes.
fn put_field(out: &mut Vec<u8>, field: u64, data: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// KeyValue { key = 1; AnyValue value = 2 { string_value = 1 } } as field
/// `field` (1 in a Resource, 2 for ProcessContext's extra attributes).
fn put_attribute(out: &mut Vec<u8>, field: u64, key: &str, value: &str) {
    let mut any = Vec::new();
    put_field(&mut any, 1, value.as_bytes());
    let mut kv = Vec::new();
    put_field(&mut kv, 1, key.as_bytes());
    put_field(&mut kv, 2, &any);
    put_field(out, field, &kv);
}

/// ProcessContext.attributes (field 2) entry
/// `threadlocal.attribute_key_map`: an AnyValue { array_value = 5 {
/// repeated AnyValue values = 1 { string_value = 1 } } } of `keys`
/// (OTEP 4947).
fn put_key_map(out: &mut Vec<u8>, keys: &[&str]) {
    let mut array = Vec::new();
    for key in keys {
        let mut one = Vec::new();
        put_field(&mut one, 1, key.as_bytes());
        put_field(&mut array, 1, &one);
    }
    let mut any = Vec::new();
    put_field(&mut any, 5, &array);
    let mut kv = Vec::new();
    put_field(&mut kv, 1, b"threadlocal.attribute_key_map");
    put_field(&mut kv, 2, &any);
    put_field(out, 2, &kv);
}

const KEYS: [&str; 2] = ["http.route", "http.method"];

/// ProcessContext { resource { service.name }, attributes: the thread
/// context's schema and the key map of the first `keys` keys }, kept for
/// the process's life: the header points at it.
fn encode_context(keys: usize) -> &'static [u8] {
    let mut resource = Vec::new();
    put_attribute(&mut resource, 1, "service.name", "otel-thread-writer-rs");
    let mut out = Vec::new();
    put_field(&mut out, 1, &resource);
    put_attribute(&mut out, 2, "threadlocal.schema_version", "tls_v1");
    put_key_map(&mut out, &KEYS[..keys]);
    Box::leak(out.into_boxed_slice())
}

/// Names the mapping "OTEL_CTX" for readers that look for it by name
/// (it fails on a memfd's mapping, which is named by its file already).
fn name_mapping(header: *mut Header, size: usize) {
    // SAFETY: prctl reads the name; the range is the mapping's.
    unsafe {
        prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            header as c_ulong,
            size as c_ulong,
            c"OTEL_CTX".as_ptr(),
        );
    }
}

/// Maps the header (a memfd's page, else an anonymous one), fills it and
/// stamps it last, as the OTEP asks.
fn publish(payload: &'static [u8]) -> (*mut Header, usize) {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { sysconf(SC_PAGESIZE) } as usize;
    let mut header = usize::MAX as *mut c_void; // MAP_FAILED
    // SAFETY: the name is a C string; a kernel without MFD_NOEXEC_SEAL
    // refuses it, and is asked again without.
    let mut fd = unsafe {
        memfd_create(
            c"OTEL_CTX".as_ptr(),
            MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL,
        )
    };
    if fd < 0 {
        // SAFETY: as above.
        fd = unsafe { memfd_create(c"OTEL_CTX".as_ptr(), MFD_CLOEXEC | MFD_ALLOW_SEALING) };
    }
    if fd >= 0 {
        // SAFETY: a new descriptor that nothing else owns; closed on drop,
        // the mapping keeps the file.
        let file = unsafe { File::from_raw_fd(fd) };
        if file.set_len(size as u64).is_ok() {
            // SAFETY: a new private mapping of the file's one page.
            header = unsafe {
                mmap(
                    ptr::null_mut(),
                    size,
                    PROT_READ | PROT_WRITE,
                    MAP_PRIVATE,
                    fd,
                    0,
                )
            };
        }
    }
    if header as usize == usize::MAX {
        // SAFETY: a new anonymous mapping.
        header = unsafe {
            mmap(
                ptr::null_mut(),
                size,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
                -1,
                0,
            )
        };
    }
    if header as usize == usize::MAX {
        eprintln!("mmap: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    let header = header.cast::<Header>();
    // SAFETY: `header` is this process's new page, read by others only
    // (volatile: the stores are for another process to see).
    unsafe {
        madvise(header.cast(), size, MADV_DONTFORK);
        ptr::addr_of_mut!((*header).signature).write_volatile(*b"OTEL_CTX");
        ptr::addr_of_mut!((*header).version).write_volatile(2);
        ptr::addr_of_mut!((*header).payload_size).write_volatile(payload.len() as u32);
        ptr::addr_of_mut!((*header).payload).write_volatile(payload.as_ptr() as u64);
        fence(Ordering::SeqCst);
        ptr::addr_of_mut!((*header).monotonic_published_at_ns)
            .write_volatile(now_ns(CLOCK_BOOTTIME));
    }
    name_mapping(header, size);
    (header, size)
}

/// Points the header at a new payload: the stamp 0 while it changes, then
/// a later one.
fn republish(header: *mut Header, size: usize, payload: &'static [u8]) {
    // SAFETY: the header `publish` mapped, written by this thread only.
    unsafe {
        let stamp = ptr::addr_of_mut!((*header).monotonic_published_at_ns);
        let before = stamp.read_volatile();
        stamp.write_volatile(0);
        fence(Ordering::SeqCst);
        ptr::addr_of_mut!((*header).payload).write_volatile(payload.as_ptr() as u64);
        ptr::addr_of_mut!((*header).payload_size).write_volatile(payload.len() as u32);
        fence(Ordering::SeqCst);
        let now = now_ns(CLOCK_BOOTTIME);
        stamp.write_volatile(if now > before { now } else { before + 1 });
    }
    name_mapping(header, size);
}

/// When the key map gains http.method.
const KEYS_AFTER_NS: u64 = 1_500_000_000;
/// Keys of the published map: a thread writes only those.
static PUBLISHED_KEYS: AtomicUsize = AtomicUsize::new(0);
static STOPPING: AtomicBool = AtomicBool::new(false);

const SPAN_NS: u64 = 6_000_000;
const GAP_NS: u64 = 3_000_000;
const MAX_SWITCHES: usize = 20_000;

/// One switch of a thread: when, and what it then had attached.
struct Switch {
    ns: u64,
    state: u8,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    route: Option<&'static str>,
    method: Option<&'static str>,
}

fn note(
    log: &mut Vec<Switch>,
    record: Option<&Record>,
    route: Option<&'static str>,
    method: Option<&'static str>,
) {
    if log.len() >= MAX_SWITCHES {
        return;
    }
    log.push(Switch {
        ns: now_ns(CLOCK_MONOTONIC),
        state: u8::from(record.is_some()),
        trace_id: record.map_or([0; 16], |record| record.trace_id),
        span_id: record.map_or([0; 8], |record| record.span_id),
        route,
        method,
    });
}

/// Appends one attribute entry (key index, length, UTF-8 bytes).
fn put_attr(record: &mut Record, at: usize, key: u8, value: &str) -> usize {
    record.attrs_data[at] = key;
    record.attrs_data[at + 1] = value.len() as u8;
    record.attrs_data[at + 2..at + 2 + value.len()].copy_from_slice(value.as_bytes());
    at + 2 + value.len()
}

/// One writing thread: returns its id and its switches.
fn run(index: u64, seconds: f64) -> (c_int, Vec<Switch>) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { gettid() };
    let slot = thread_ctx();
    // Two records used in turn: the one being built is never the one the
    // pointer shows. They outlive every pointer to them: the loop ends
    // with the pointer NULL.
    let mut records = Box::new([Record::empty(), Record::empty()]);
    let mut log = Vec::with_capacity(MAX_SWITCHES);
    let end = now_ns(CLOCK_MONOTONIC) + (seconds * 1e9) as u64;
    let mut serial = 0u64;
    note(&mut log, None, None, None);
    while !STOPPING.load(Ordering::Relaxed) && now_ns(CLOCK_MONOTONIC) < end {
        let record = &mut records[(serial & 1) as usize];
        serial += 1;
        // Attach: build the record, mark it valid, then point at it. The
        // reader is the kernel interrupting this thread (or switching it
        // out): the release stores keep the bytes before them.
        *record = Record::empty();
        for i in 0..16 {
            record.trace_id[i] = (0x10 * (index + 1) + (serial >> 8) + i as u64) as u8;
        }
        for i in 0..8 {
            record.span_id[i] = ((serial >> (8 * (i % 4))) + 0x40 * (i / 4) as u64 + 1) as u8;
        }
        record.trace_flags = 1;
        let route = ["/cart", "/checkout"][(serial & 1) as usize];
        let method = if PUBLISHED_KEYS.load(Ordering::Acquire) < 2 {
            None
        } else if !serial.is_multiple_of(3) {
            Some("GET")
        } else {
            Some("POST")
        };
        let mut size = put_attr(record, 0, 0, route);
        if let Some(method) = method {
            size = put_attr(record, size, 1, method);
        }
        record.attrs_data_size = size as u16;
        record.valid.store(1, Ordering::Release);
        slot.store(ptr::from_mut(record), Ordering::Release);
        note(&mut log, Some(&*record), Some(route), method);
        burn_until(now_ns(CLOCK_MONOTONIC) + SPAN_NS);
        // Detach: the pointer back to NULL.
        slot.store(ptr::null_mut(), Ordering::Release);
        note(&mut log, None, None, None);
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
        // A record under modification: pointed at, valid = 0.
        record.valid.store(0, Ordering::Release);
        slot.store(ptr::from_mut(record), Ordering::Release);
        note(&mut log, None, None, None);
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
        slot.store(ptr::null_mut(), Ordering::Release);
    }
    (tid, log)
}

fn hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: {} LOG STOP SECONDS [THREADS]", args[0]);
        std::process::exit(2);
    }
    let seconds: f64 = args[3].parse().unwrap_or(0.0);
    let threads: usize = args.get(4).map_or(Some(3), |n| n.parse().ok()).unwrap_or(0);
    if !(1..=16).contains(&threads) {
        std::process::exit(2);
    }
    // The key map before any thread writes a key index.
    let (context, mapping_size) = publish(encode_context(1));
    PUBLISHED_KEYS.store(1, Ordering::Release);
    let mono = now_ns(CLOCK_MONOTONIC);
    let real = now_ns(CLOCK_REALTIME);
    let writers: Vec<_> = (0..threads as u64)
        .map(|index| std::thread::spawn(move || run(index, seconds)))
        .collect();
    let end = mono + (seconds * 1e9) as u64;
    let stop = Path::new(&args[2]);
    while !stop.exists() && now_ns(CLOCK_MONOTONIC) < end {
        // The key map grows (append-only, as the OTEP says), then threads
        // write the new key.
        if PUBLISHED_KEYS.load(Ordering::Relaxed) == 1
            && now_ns(CLOCK_MONOTONIC) - mono >= KEYS_AFTER_NS
        {
            republish(context, mapping_size, encode_context(2));
            PUBLISHED_KEYS.store(2, Ordering::Release);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    STOPPING.store(true, Ordering::Relaxed);
    let logs: Vec<_> = writers
        .into_iter()
        .map(|writer| writer.join().expect("a writing thread"))
        .collect();
    let mut out = format!("offset {}\n", real.wrapping_sub(mono) as i64);
    for (tid, log) in &logs {
        for entry in log {
            let _ = write!(out, "{tid} {} {} ", entry.ns, entry.state);
            hex(&mut out, &entry.trace_id);
            out.push(' ');
            hex(&mut out, &entry.span_id);
            let _ = writeln!(
                out,
                " {} {}",
                entry.route.unwrap_or("-"),
                entry.method.unwrap_or("-")
            );
        }
    }
    let written = File::create(&args[1]).and_then(|mut file| file.write_all(out.as_bytes()));
    std::process::exit(if written.is_ok() { 0 } else { 1 });
}

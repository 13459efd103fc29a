//! Times `Header::decode` on typical headers and on hostile 16 MiB ones, and reports how much
//! memory each decode allocates at its peak (a counting global allocator).
//!
//! ```text
//! cargo run --release -p handoff-wire --example header_decode            # both
//! cargo run --release -p handoff-wire --example header_decode typical    # or hostile
//! valgrind --tool=callgrind target/release/examples/header_decode repeat [INDEX]
//! ```
//!
//! The hostile headers are the ones of issue 11: a `ready` whose ignored key holds an array of
//! 16 M empty maps, and a `hello` (and a `msg`) whose `f` is such an array. A decoder that
//! checks the header value limit of `spec/WIRE.md` §9 as it reads rejects them after at most
//! 65 536 values, without allocating in proportion to them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use handoff_wire::{Descriptor, Header, Limits, TicketClaim};

/// The system allocator, counting the bytes currently allocated and the peak since the last reset.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` once; returns its result, how long it took and the peak bytes it allocated.
fn once<T>(f: impl FnOnce() -> T) -> (T, Duration, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    (out, took, PEAK.load(Ordering::Relaxed) - base)
}

/// Nanoseconds per decode of `header`, over enough rounds to take about half a second.
fn per_decode(header: &[u8]) -> f64 {
    let limits = Limits::DEFAULT;
    let mut rounds = 1_000u32;
    loop {
        let start = Instant::now();
        for _ in 0..rounds {
            black_box(Header::decode(black_box(header), &limits).expect("a valid header"));
        }
        let took = start.elapsed();
        if took > Duration::from_millis(500) {
            return took.as_nanos() as f64 / rounds as f64;
        }
        rounds *= 4;
    }
}

/// The msgpack bytes of `{"k": KIND, KEY: [{} × count]}`, an array32 of empty maps.
fn empty_maps(kind: &str, key: &str, count: u32) -> Vec<u8> {
    let mut out = vec![0x82, 0xa1, b'k', 0xa0 | kind.len() as u8];
    out.extend_from_slice(kind.as_bytes());
    out.push(0xa0 | key.len() as u8);
    out.extend_from_slice(key.as_bytes());
    out.push(0xdd);
    out.extend_from_slice(&count.to_be_bytes());
    out.resize(out.len() + count as usize, 0x80);
    out
}

/// `empty_maps` with as many maps as fill exactly the default header limit of 16 MiB.
fn hostile(kind: &str, key: &str) -> Vec<u8> {
    let limit = Limits::DEFAULT.max_header_bytes as usize;
    let overhead = empty_maps(kind, key, 0).len();
    let header = empty_maps(kind, key, (limit - overhead) as u32);
    assert_eq!(header.len(), limit);
    header
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    if which == "repeat" {
        // A fixed amount of work, to count instructions with `valgrind --tool=callgrind`:
        // 100 000 decodes of each typical header, or of the one whose index follows.
        let only: Option<usize> = std::env::args().nth(2).and_then(|i| i.parse().ok());
        for (i, (_, header)) in typical_headers().into_iter().enumerate() {
            if only.is_some_and(|only| only != i) {
                continue;
            }
            let bytes = header.encode();
            for _ in 0..100_000 {
                black_box(Header::decode(black_box(&bytes), &Limits::DEFAULT).expect("a valid header"));
            }
        }
        return;
    }
    if which != "hostile" {
        typical();
    }
    if which != "typical" {
        hostile_headers();
    }
}

/// Headers as applications send them, named after the vectors they resemble.
fn typical_headers() -> Vec<(&'static str, Header<'static>)> {
    let ticket = TicketClaim {
        len: 1 << 20,
        owner: "0123456789abcdef0123456789abcdef".into(),
        addr: Some("tcp://127.0.0.1:7070".into()),
        lease: 42,
        token: (64u8..96).collect(),
        digest: handoff_wire::TicketDigest::Blake3([0x74; 32]),
        ttl_ms: 30_000,
        lazy: false,
    };
    let body: &'static [u8] = &[
        0x82, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 0, 0xa4, b'm', b'e', b't', b'a', 0xd6, 0x01, 0, 0, 0,
        1,
    ];
    vec![
        (
            "msg, no frames (msg-no-frames)",
            Header::Msg {
                type_name: "handoff.Ping",
                body: &[0x81, 0xa3, b's', b'e', b'q', 0x07],
                frames: vec![],
            },
        ),
        (
            "msg, two inline frames (msg-two-frames)",
            Header::Msg {
                type_name: "demo.Sample",
                body,
                frames: vec![Descriptor::Inline { len: 11 }, Descriptor::Inline { len: 4 }],
            },
        ),
        (
            "msg, a ticket and an inline frame (msg-ticket)",
            Header::Msg {
                type_name: "demo.Sample",
                body,
                frames: vec![Descriptor::Ticket(ticket), Descriptor::Inline { len: 3 }],
            },
        ),
    ]
}

fn typical() {
    println!("typical headers (Header::decode, default limits):");
    for (what, header) in &typical_headers() {
        let bytes = header.encode();
        let ns = per_decode(&bytes);
        let (_, _, peak) = once(|| Header::decode(&bytes, &Limits::DEFAULT));
        println!(
            "  {what}: {} header bytes, {ns:.0} ns per decode, {peak} bytes allocated",
            bytes.len()
        );
    }
}

fn hostile_headers() {
    println!("hostile headers of 16 MiB (16 777 216 bytes):");
    for (what, kind, key) in [
        ("ready, ignored key x = [{} x 16.8 M]", "ready", "x"),
        ("hello, f = [{} x 16.8 M]", "hello", "f"),
        ("msg, f = [{} x 16.8 M]", "msg", "f"),
    ] {
        let bytes = hostile(kind, key);
        let (result, took, peak) = once(|| Header::decode(&bytes, &Limits::DEFAULT).map(|_| ()));
        let outcome = match result {
            Ok(()) => "accepted".to_string(),
            Err(e) => e.code().to_string(),
        };
        println!(
            "  {what}: {outcome} in {:.3} ms, {peak} bytes allocated at the peak",
            took.as_secs_f64() * 1e3
        );
    }
}

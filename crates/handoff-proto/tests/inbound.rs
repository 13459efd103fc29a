//! The established connection's receiving machine, driven with no socket: every stream is
//! fed in pieces of seeded random sizes, and must give the same events whatever the pieces.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_proto::inbound::{Digest, Event, Frame, Inbound, Step, MAX_PENDING_FDS};
use handoff_proto::receive::{self, Asked, Receiving};
use handoff_proto::recv_buffers::RecvPool;
use handoff_proto::seeded::SplitMix64;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Descriptor, Header, Limits, TicketOp, WireError};

const TIMEOUT: Duration = Duration::from_secs(5);

fn inbound(shm: bool) -> Inbound {
    Inbound::new(
        Receiving::new(Limits::DEFAULT, shm),
        Arc::new(|name: &str| match name {
            "unknown" => Err(WireError::UnknownType {
                name: name.to_string(),
                known: "t".into(),
            }),
            _ => Ok(()),
        }),
        RecvPool::new(64 << 20),
        TIMEOUT,
    )
}

fn header(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

/// A message with inline frames of these sizes, each filled with its index.
fn message(sizes: &[usize]) -> Vec<u8> {
    let frames = sizes.iter().map(|&n| Descriptor::Inline { len: n as u64 }).collect();
    let mut out = header(&Header::Msg {
        type_name: "t",
        body: &[0x91, 0x07],
        frames,
    });
    for (i, &n) in sizes.iter().enumerate() {
        out.extend(std::iter::repeat_n(i as u8 + 1, n));
    }
    out
}

fn pulled(req: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = header(&Header::Ticket(TicketOp::Pulled {
        req,
        len: bytes.len() as u64,
    }));
    out.extend_from_slice(bytes);
    out
}

/// What a driver saw: the events, and the room it was asked for.
#[derive(Default)]
struct Seen {
    events: Vec<Event>,
    room: Vec<(u64, usize)>,
}

/// Drives `inb` over `stream` fed in random pieces (at most `most` bytes each), answering
/// room at once and `pulled` from `asked`, until the stream ends or fails.
fn drive(
    inb: &mut Inbound,
    stream: &[u8],
    seed: u64,
    most: usize,
    asked: impl Fn(u64) -> Option<Asked>,
) -> (Seen, Result<(), WireError>) {
    let mut rng = SplitMix64::new(seed);
    let mut seen = Seen::default();
    let mut at = 0;
    let now = Instant::now();
    loop {
        let step = match inb.poll(now) {
            Ok(s) => s,
            Err(e) => return (seen, Err(e)),
        };
        match step {
            Step::Read => {
                let space = inb.recv_space();
                assert!(!space.is_empty(), "a read with no space");
                if at == stream.len() {
                    inb.handle_eof();
                    continue;
                }
                let n = (1 + rng.below(most as u64) as usize)
                    .min(space.len())
                    .min(stream.len() - at);
                space[..n].copy_from_slice(&stream[at..at + n]);
                at += n;
                inb.received(n, now);
            }
            Step::Room { bytes, messages } => {
                assert!(inb.recv_space().is_empty(), "no reading while room is taken");
                seen.room.push((bytes, messages));
                assert!(inb.try_take_room(0, now));
            }
            Step::CheckPulled { req, len } => inb.pulled_verdict(receive::pulled(asked(req), len), now),
            Step::Event(e) => seen.events.push(e),
            Step::Closed => return (seen, Ok(())),
        }
    }
}

fn frame_bytes(f: &Frame) -> &[u8] {
    match f {
        Frame::Bytes(b) => b,
        other => panic!("bytes expected, got {other:?}"),
    }
}

#[test]
fn messages_decode_the_same_whatever_the_pieces() {
    let sizes: &[&[usize]] = &[&[], &[0], &[5, 70_000], &[1 << 20, 3], &[65_535, 65_536, 65_537]];
    let mut stream = Vec::new();
    for s in sizes {
        stream.extend(message(s));
    }
    for seed in 0..200u64 {
        let most = [1, 7, 4096, 100_000, 2 << 20][seed as usize % 5];
        let mut inb = inbound(false);
        let (seen, result) = drive(&mut inb, &stream, seed, most, |_| None);
        result.unwrap();
        assert_eq!(seen.events.len(), sizes.len(), "seed {seed}");
        for (event, s) in seen.events.iter().zip(sizes) {
            let Event::Message(m) = event else { panic!("a message") };
            assert_eq!(m.type_name, "t");
            assert_eq!(&m.body[..], [0x91, 0x07]);
            assert_eq!(m.frames.len(), s.len());
            for (i, (f, &n)) in m.frames.iter().zip(s.iter()).enumerate() {
                let b = frame_bytes(f);
                assert_eq!(b.len(), n, "seed {seed} frame {i}");
                assert!(b.iter().all(|&x| x == i as u8 + 1), "seed {seed}: frame {i} corrupt");
            }
        }
        // Each message took its room once, before its frames.
        assert_eq!(seen.room.len(), sizes.len());
    }
}

#[test]
fn a_large_header_takes_room_before_it_is_read() {
    // Past four read chunks: the header keeps the buffer it was read into.
    let big = vec![0u8; 300_000];
    let stream = header(&Header::Msg {
        type_name: "t",
        body: &[0xc4, 0, 0], // a bin8 placeholder, replaced below
        frames: vec![],
    });
    // A body of 200,000 bytes as msgpack bin32.
    let mut body = vec![0xc6];
    body.extend((big.len() as u32).to_be_bytes());
    body.extend(&big);
    let body_len = body.len();
    let stream2 = header(&Header::Msg {
        type_name: "t",
        body: &body,
        frames: vec![],
    });
    let mut all = stream.clone();
    all.extend(&stream2);
    let mut inb = inbound(false);
    let (seen, result) = drive(&mut inb, &all, 1, 9000, |_| None);
    result.unwrap();
    assert_eq!(seen.events.len(), 2);
    let len2 = (stream2.len() - 4) as u64;
    // The small header's message takes its room at once; the large one takes room for its
    // header first, then for the rest of the message on the same permit.
    assert_eq!(seen.room[1], (len2, 0));
    assert_eq!(seen.room[2].1, 1);
    let Event::Message(m) = &seen.events[1] else {
        panic!("a message")
    };
    assert_eq!(m.body.len(), body_len);
}

#[test]
fn pulled_bytes_are_read_hashed_skipped_or_dropped() {
    let small = vec![3u8; 1000];
    let large = (0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>();
    let mut stream = pulled(1, &small);
    stream.extend(pulled(2, &large));
    stream.extend(pulled(3, &large)); // asked for another length: skipped, reported
    stream.extend(pulled(4, &small)); // nobody asked: dropped
    stream.extend(message(&[2]));
    let asked = |req| match req {
        1 => Some(Asked {
            len: Some(1000),
            hash: true,
        }),
        2 => Some(Asked {
            len: Some(large.len() as u64),
            hash: true,
        }),
        3 => Some(Asked {
            len: Some(5),
            hash: false,
        }),
        _ => None,
    };
    for seed in 0..20 {
        let mut inb = inbound(false);
        let (seen, result) = drive(&mut inb, &stream, seed, 300_000, asked);
        result.unwrap();
        let [Event::Pulled {
            req: 1,
            bytes: b1,
            digest: Digest::Hashed(d1),
        }, Event::Pulled {
            req: 2,
            bytes: b2,
            digest: Digest::Hashed(d2),
        }, Event::PulledMismatch { req: 3, why }, Event::Message(m)] = &seen.events[..]
        else {
            panic!("unexpected events {:?}", seen.events)
        };
        assert_eq!(&b1[..], &small[..]);
        assert_eq!(d1, blake3::hash(&small).as_bytes());
        assert_eq!(&b2[..], &large[..]);
        assert_eq!(d2, blake3::hash(&large).as_bytes(), "seed {seed}");
        assert!(why.contains("pull of 5"), "{why}");
        assert_eq!(frame_bytes(&m.frames[0]), [1, 1]);
    }
}

#[test]
fn an_end_of_stream_between_messages_closes_and_inside_one_truncates() {
    let whole = message(&[10, 100_000]);
    for cut in [0, whole.len()] {
        let (_, r) = drive(&mut inbound(false), &whole[..cut], 0, 1000, |_| None);
        r.unwrap();
    }
    for cut in [1, 3, 4, 9, whole.len() - 100_001, whole.len() - 50_000, whole.len() - 1] {
        let (seen, r) = drive(&mut inbound(false), &whole[..cut], 0, 1000, |_| None);
        let e = r.unwrap_err();
        assert_eq!(e.code(), "truncated", "cut at {cut}: {e}");
        assert!(seen.events.is_empty());
    }
    let skipped = pulled(9, &[0; 100]);
    let (_, r) = drive(&mut inbound(false), &skipped[..skipped.len() - 1], 0, 1000, |_| None);
    assert!(r.unwrap_err().to_string().contains("pulled bytes"));
}

#[test]
fn silence_inside_a_message_times_out_and_idling_between_messages_does_not() {
    let mut inb = inbound(false);
    let t0 = Instant::now();
    assert!(matches!(inb.poll(t0).unwrap(), Step::Read));
    assert_eq!(inb.poll_timeout(), None, "an idle connection has no timer");
    let whole = message(&[10]);
    let space = inb.recv_space();
    space[..5].copy_from_slice(&whole[..5]);
    inb.received(5, t0);
    assert!(matches!(inb.poll(t0).unwrap(), Step::Read));
    assert_eq!(inb.poll_timeout(), Some(t0 + TIMEOUT));
    inb.handle_timeout(t0 + TIMEOUT / 2).unwrap();
    let e = inb.handle_timeout(t0 + TIMEOUT).unwrap_err();
    assert_eq!(e.code(), "timeout");
    assert!(e.to_string().contains("in the middle of a message"), "{e}");
    assert!(matches!(inb.poll(t0).unwrap(), Step::Closed));
}

#[test]
fn a_peers_error_an_unknown_type_and_a_release_on_tcp_fail_as_they_should() {
    let mut stream = header(&Header::Error {
        code: "bad".into(),
        message: "why".into(),
    });
    stream.extend(message(&[1]));
    let (seen, r) = drive(&mut inbound(false), &stream, 0, 100, |_| None);
    r.unwrap();
    assert!(matches!(&seen.events[..], [Event::PeerRefused { code, .. }] if code == "bad"));

    let unknown = header(&Header::Msg {
        type_name: "unknown",
        body: &[0x90],
        frames: vec![],
    });
    let (_, r) = drive(&mut inbound(false), &unknown, 0, 100, |_| None);
    assert_eq!(r.unwrap_err().code(), "unknown-type");

    let release = header(&Header::Release { leases: vec![1, 2] });
    let (_, r) = drive(&mut inbound(false), &release, 0, 100, |_| None);
    assert!(r.is_err(), "no release on tcp");
    let (seen, r) = drive(&mut inbound(true), &release, 0, 100, |_| None);
    r.unwrap();
    assert!(matches!(&seen.events[..], [Event::Release(l)] if l == &[1, 2]));
}

fn devnull() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

fn shm_message(n: usize) -> Vec<u8> {
    let frames = (0..n)
        .map(|i| Descriptor::Shm {
            len: 10,
            offset: 0,
            size: 4096,
            lease: i as u64,
            sealed: false,
        })
        .collect();
    header(&Header::Msg {
        type_name: "t",
        body: &[0x90],
        frames,
    })
}

/// Feeds all of `stream` at once with `fds` beside it, and polls to the end.
fn with_fds(stream: &[u8], fds: usize) -> (Vec<Event>, Result<(), WireError>) {
    let mut inb = inbound(true);
    let mut events = Vec::new();
    let now = Instant::now();
    let space = inb.recv_space();
    space[..stream.len()].copy_from_slice(stream);
    inb.received(stream.len(), now);
    if let Err(e) = inb.handle_fds((0..fds).map(|_| devnull())) {
        return (events, Err(e));
    }
    loop {
        match inb.poll(now) {
            Ok(Step::Read) => inb.handle_eof(),
            Ok(Step::Room { .. }) => assert!(inb.try_take_room(0, now)),
            Ok(Step::Event(e)) => events.push(e),
            Ok(Step::Closed) => return (events, Ok(())),
            Ok(Step::CheckPulled { .. }) => unreachable!(),
            Err(e) => return (events, Err(e)),
        }
    }
}

#[test]
fn descriptors_are_exactly_those_announced() {
    let (events, r) = with_fds(&shm_message(2), 2);
    r.unwrap();
    let [Event::Message(m)] = &events[..] else { panic!() };
    assert!(matches!(
        m.frames[..],
        [Frame::Shm { lease: 0, .. }, Frame::Shm { lease: 1, .. }]
    ));
    assert_eq!(with_fds(&shm_message(2), 1).1.unwrap_err().code(), "bad-shm", "too few");
    assert_eq!(
        with_fds(&shm_message(1), 2).1.unwrap_err().code(),
        "bad-shm",
        "one stray"
    );
    assert_eq!(
        with_fds(&[], MAX_PENDING_FDS + 1).1.unwrap_err().code(),
        "bad-shm",
        "over the bound"
    );
}

/// A driver's hasher that copies what it is handed, to check it got every byte in order.
struct Copying(Vec<u8>);

impl handoff_proto::inbound::HashBehind for Copying {
    fn arrived(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(self: Box<Self>) -> Option<[u8; 32]> {
        Some(*blake3::hash(&self.0).as_bytes())
    }
}

#[test]
fn a_large_answer_is_hashed_by_the_drivers_hasher_in_order() {
    let large = (0..(9u32 << 20)).map(|i| (i % 253) as u8).collect::<Vec<_>>();
    let stream = pulled(7, &large);
    let asked = |_| {
        Some(Asked {
            len: Some(large.len() as u64),
            hash: true,
        })
    };
    for seed in 0..3 {
        let mut inb = inbound(false).with_hash_behind(Box::new(|| Some(Box::new(Copying(Vec::new())))));
        let (seen, r) = drive(&mut inb, &stream, seed, 3 << 20, asked);
        r.unwrap();
        let mut events = seen.events.into_iter();
        let Some(Event::Pulled {
            req: 7,
            bytes,
            digest: Digest::Behind(behind),
        }) = events.next()
        else {
            panic!("the answer, hashed behind")
        };
        assert!(events.next().is_none());
        assert_eq!(&bytes[..], &large[..]);
        let digest = behind.finish();
        assert!(
            digest == Some(*blake3::hash(&large).as_bytes()),
            "seed {seed}: the hasher got other bytes, or not in order"
        );
    }
    // A smaller answer is hashed inline even with a hasher at hand.
    let small = vec![1u8; 100_000];
    let mut inb = inbound(false).with_hash_behind(Box::new(|| Some(Box::new(Copying(Vec::new())))));
    let (seen, r) = drive(&mut inb, &pulled(8, &small), 0, 1 << 20, |_| {
        Some(Asked {
            len: Some(100_000),
            hash: true,
        })
    });
    r.unwrap();
    assert!(
        matches!(&seen.events[..], [Event::Pulled { digest: Digest::Hashed(d), .. }] if d == blake3::hash(&small).as_bytes())
    );
}

/// A driver's hasher that checks, when it is dropped, that the answer's buffer is still out
/// of the pool (a helper thread may still be reading it).
struct WatchingPool(RecvPool);

impl handoff_proto::inbound::HashBehind for WatchingPool {
    fn arrived(&mut self, _: &[u8]) {}
    fn finish(self: Box<Self>) -> Option<[u8; 32]> {
        None
    }
}

impl Drop for WatchingPool {
    fn drop(&mut self) {
        assert_eq!(
            self.0.idle_bytes(),
            0,
            "the buffer went back to the pool before the hasher"
        );
    }
}

#[test]
fn a_hasher_is_dropped_before_the_answer_it_reads_when_the_stream_breaks() {
    let pool = RecvPool::new(64 << 20);
    let watched = pool.clone();
    let mut inb = Inbound::new(
        Receiving::new(Limits::DEFAULT, false),
        Arc::new(|_: &str| Ok(())),
        pool.clone(),
        TIMEOUT,
    )
    .with_hash_behind(Box::new(move || Some(Box::new(WatchingPool(watched.clone())))));
    let large = vec![5u8; 9 << 20];
    let stream = pulled(1, &large);
    let asked = |_| {
        Some(Asked {
            len: Some(large.len() as u64),
            hash: true,
        })
    };
    let (_, r) = drive(&mut inb, &stream[..stream.len() / 2], 0, 1 << 20, asked);
    assert_eq!(r.unwrap_err().code(), "truncated");
    assert!(
        pool.idle_bytes() > 0,
        "the answer's buffer went back to the pool after the hasher"
    );
}

#[test]
fn descriptors_beside_a_ticket_request_are_strays() {
    let op = header(&Header::Ticket(TicketOp::Unlease {
        lease: 1,
        token: vec![0; 32],
    }));
    assert_eq!(with_fds(&op, 1).1.unwrap_err().code(), "bad-shm");
    assert!(with_fds(&op, 0).1.is_ok());
}

#[test]
fn a_driver_busy_with_an_event_does_not_time_its_peer_out() {
    let mut inb = inbound(false);
    let t0 = Instant::now();
    let mut stream = message(&[3]);
    stream.extend(&message(&[3])[..5]);
    let space = inb.recv_space();
    space[..stream.len()].copy_from_slice(&stream);
    inb.received(stream.len(), t0);
    assert!(matches!(inb.poll(t0).unwrap(), Step::Room { .. }));
    assert!(inb.try_take_room(0, t0));
    assert!(matches!(inb.poll(t0).unwrap(), Step::Event(Event::Message(_))));
    // The driver comes back long after, with part of the next message buffered.
    let later = t0 + 3 * TIMEOUT;
    assert!(matches!(inb.poll(later).unwrap(), Step::Read));
    assert_eq!(inb.poll_timeout(), Some(later + TIMEOUT));
    inb.handle_timeout(later + TIMEOUT / 2).unwrap();
}

/// Feeds `bytes` whole and polls once.
fn feed(inb: &mut Inbound, bytes: &[u8], now: Instant) -> Step {
    let mut at = 0;
    while at < bytes.len() {
        let space = inb.recv_space();
        let n = space.len().min(bytes.len() - at);
        assert!(n > 0, "space to read into");
        space[..n].copy_from_slice(&bytes[at..at + n]);
        inb.received(n, now);
        at += n;
    }
    inb.poll(now).unwrap()
}

#[test]
fn a_message_takes_its_room_from_the_budget_and_carries_it() {
    use handoff_proto::budget::{Account, Budget};
    let budget = Budget::new(1 << 20, 100_000, 0, 8);
    let account = Arc::new(Account::default());
    let mut inb = inbound(false).with_budget(budget.clone(), account.clone());
    let now = Instant::now();
    // Another peer's message fills the node: this one waits, and reads nothing meanwhile.
    let other = Arc::new(Account::default());
    let hog = budget.try_acquire(&other, 1 << 20, 1, 0).unwrap();
    let stream = message(&[50_000]);
    let head = header_len_of(&stream);
    assert!(matches!(
        feed(&mut inb, &stream[..head], now),
        Step::Room { messages: 1, .. }
    ));
    assert!(!inb.try_take_room(0, now), "no room while the node is full");
    assert!(inb.recv_space().is_empty(), "and no reading");
    drop(hog);
    assert!(inb.try_take_room(0, now));
    let Step::Event(Event::Message(m)) = feed(&mut inb, &stream[head..], now) else {
        panic!("the message")
    };
    let held = m.permit.as_ref().expect("its room").bytes();
    assert!(held >= 50_000, "the frame's bytes and the overhead: {held}");
    assert_eq!(account.bytes(), held);
    drop(m);
    assert_eq!((account.bytes(), budget.used()), (0, 0), "given back with the message");
}

#[test]
fn room_a_large_header_took_goes_back_unless_it_was_a_message() {
    use handoff_proto::budget::{Account, Budget};
    let budget = Budget::new(1 << 30, 1 << 30, 0, 8);
    let account = Arc::new(Account::default());
    let mut inb = inbound(false).with_budget(budget.clone(), account.clone());
    let now = Instant::now();
    // A refused ticket answer with a 300 KB message: a large header, and no message.
    let refusal = header(&Header::Ticket(TicketOp::Refused {
        req: 1,
        code: "x".into(),
        message: "m".repeat(300_000),
    }));
    assert!(matches!(
        feed(&mut inb, &refusal[..4], now),
        Step::Room { messages: 0, .. }
    ));
    assert!(inb.try_take_room(0, now));
    assert!(account.bytes() >= 300_000, "the header's room, taken before it is read");
    let step = feed(&mut inb, &refusal[4..], now);
    assert!(
        matches!(step, Step::Event(Event::Ticket(TicketOp::Refused { .. }))),
        "{step:?}"
    );
    assert_eq!(budget.used(), 0, "given back with the event");
}

/// The length of the header (with its prefix) at the start of `stream`.
fn header_len_of(stream: &[u8]) -> usize {
    4 + u32::from_be_bytes(stream[..4].try_into().unwrap()) as usize
}

/// A `pulled` header for `req` announcing no bytes, padded past the small-header size with
/// an unknown key (which a receiver ignores, spec §6 rule 3).
fn padded_pulled(req: u64, pad: usize) -> Vec<u8> {
    let plain = header(&Header::Ticket(TicketOp::Pulled { req, len: 0 }));
    let mut map = plain[4..].to_vec();
    assert_eq!(map[0] & 0xf0, 0x80, "a fixmap");
    map[0] += 1;
    map.extend_from_slice(&[0xa3, b'p', b'a', b'd', 0xdb]);
    map.extend_from_slice(&(pad as u32).to_be_bytes());
    map.extend(std::iter::repeat_n(b'x', pad));
    let mut out = (map.len() as u32).to_be_bytes().to_vec();
    out.extend(map);
    out
}

#[test]
fn large_headers_that_end_with_no_event_do_not_stack_room() {
    use handoff_proto::budget::{Account, Budget};
    let budget = Budget::new(1 << 30, 1 << 20, 0, 8);
    let account = Arc::new(Account::default());
    let mut inb = inbound(false).with_budget(budget.clone(), account.clone());
    let now = Instant::now();
    // `pulled` answers nobody asked for are read past and dropped (no event): each took
    // room for its large header, which must go back before the next item takes more.
    for i in 0..20 {
        let answer = padded_pulled(1000 + i, 200_000);
        let mut at = 0;
        loop {
            match inb.poll(now).unwrap() {
                Step::Read if at == answer.len() => break,
                Step::Read => {
                    let space = inb.recv_space();
                    let n = space.len().min(answer.len() - at);
                    space[..n].copy_from_slice(&answer[at..at + n]);
                    inb.received(n, now);
                    at += n;
                }
                Step::Room { .. } => assert!(inb.try_take_room(0, now)),
                Step::CheckPulled { len, .. } => inb.pulled_verdict(receive::pulled(None, len), now),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(
            account.bytes() < 300_000,
            "after {} dropped answers the peer holds {} bytes of room",
            i + 1,
            account.bytes()
        );
    }
    assert_eq!(budget.used(), 0);
}

#[test]
fn a_connection_that_fails_gives_its_room_back_at_once() {
    use handoff_proto::budget::{Account, Budget};
    let budget = Budget::new(1 << 30, 1 << 30, 0, 8);
    let account = Arc::new(Account::default());
    let mut inb = inbound(false).with_budget(budget.clone(), account.clone());
    let now = Instant::now();
    let stream = message(&[50_000]);
    let head = header_len_of(&stream);
    assert!(matches!(feed(&mut inb, &stream[..head], now), Step::Room { .. }));
    assert!(inb.try_take_room(0, now));
    assert!(matches!(feed(&mut inb, &stream[head..head + 1000], now), Step::Read));
    assert!(account.bytes() >= 50_000, "the message's room is held while it arrives");
    inb.handle_eof();
    assert_eq!(inb.poll(now).unwrap_err().code(), "truncated");
    assert_eq!(
        budget.used(),
        0,
        "given back when the connection fails, not when it is dropped"
    );
}

#[test]
fn only_a_large_frames_own_buffer_counts_as_filling_a_frame() {
    // A driver reads on after a short read into a large frame's buffer (the rest of the
    // frame is on its way), and stops after one into the shared read buffer (the socket is
    // empty): `filling_frame` tells the two apart.
    let large = 1 << 20;
    let stream = message(&[10, large]);
    let mut inb = inbound(false);
    let now = Instant::now();
    let mut at = 0;
    let mut seen_filling = Vec::new();
    loop {
        match inb.poll(now).unwrap() {
            Step::Read => {
                let space = inb.recv_space();
                let n = space.len().min(stream.len() - at).min(4096);
                space[..n].copy_from_slice(&stream[at..at + n]);
                at += n;
                seen_filling.push(inb.filling_frame());
                inb.received(n, now);
            }
            Step::Room { .. } => assert!(inb.try_take_room(0, now)),
            Step::Event(Event::Message(m)) => {
                assert_eq!(frame_bytes(&m.frames[1]).len(), large);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // The header and the small frame come through the read buffer; then every read but
    // (perhaps) the first of the large frame, which the read buffer held the start of, goes
    // into the frame's own buffer.
    assert!(!seen_filling[0], "the header is read into the shared buffer");
    let into_frame = seen_filling.iter().filter(|&&f| f).count();
    assert!(
        into_frame >= large / 4096 - 16,
        "{into_frame} reads into the frame's buffer"
    );
    assert!(
        seen_filling.iter().skip_while(|&&f| !f).all(|&f| f),
        "once into the frame, every read"
    );
}

#[test]
fn a_turn_of_reading_ends_at_an_empty_socket_or_the_turns_bound() {
    use handoff_proto::inbound::READ_TURN_BYTES;
    let stream = message(&[1 << 20]);
    let mut inb = inbound(false);
    let now = Instant::now();
    // The header's read, into the shared buffer: a short one ends the turn, a full one not.
    assert!(matches!(inb.poll(now).unwrap(), Step::Read));
    let space = inb.recv_space().len();
    assert!(inb.turn_ends_after_read(10, space, 10));
    assert!(!inb.turn_ends_after_read(space, space, space));
    // Into the frame's own buffer: a short read reads on, until the turn's bound.
    let mut at = 0;
    while !inb.filling_frame() {
        match inb.poll(now).unwrap() {
            Step::Read => {
                let space = inb.recv_space();
                let n = space.len().min(stream.len() - at);
                space[..n].copy_from_slice(&stream[at..at + n]);
                at += n;
                if !inb.filling_frame() {
                    inb.received(n, now);
                }
            }
            Step::Room { .. } => assert!(inb.try_take_room(0, now)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(!inb.turn_ends_after_read(4096, 1 << 19, 4096));
    assert!(inb.turn_ends_after_read(4096, 1 << 19, READ_TURN_BYTES));
}

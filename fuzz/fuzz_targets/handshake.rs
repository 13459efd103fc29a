//! The handshake engine (`handoff_proto::Handshake`) fed arbitrary bytes, descriptor counts,
//! ends of stream, time and evictions, in every state it can reach: the input first picks a
//! role, the two preambles and how many rounds an honest peer (same secret) runs with it,
//! then what an attacker sends from there.
//!
//! Findings: a panic; a byte taken that was not given; a failed or finished handshake that
//! still wants bytes or a timer; a version outside 1..=3; and anything the engine writes that
//! a conforming peer must refuse (its output is read back as a preamble and headers under the
//! handshake's limits, each of which must decode).

#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_proto::handshake::{Config, DialerNonces, Failure, Handshake, Status};
use handoff_wire::auth::Role;
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::{Header, Ident, Limits, Preamble};
use libfuzzer_sys::fuzz_target;

const PREAMBLES: [Preamble; 5] = [
    Preamble::OURS,
    Preamble::ACCEPTING_V2,
    Preamble::ACCEPTING_V1,
    Preamble::V2_ONLY,
    Preamble::V1_ONLY,
];

fn config(name: &str, role: Role, preamble: Preamble, nonce: u8, t0: Instant) -> Config {
    Config {
        ident: Ident {
            node_id: format!("{name:0>32}"),
            name: name.into(),
            host_id: "h".into(),
            pid: 1,
            process_id: "p".into(),
            language: "rust".into(),
            implementation: "fuzz".into(),
            capabilities: vec!["inline".into()],
            listen: None,
            unix: None,
        },
        secret: b"fuzz".to_vec(),
        limits: Limits::DEFAULT,
        preamble,
        role,
        nonce: [nonce; 32],
        deadline: t0 + Duration::from_secs(10),
        progress_timeout: Duration::from_secs(3),
        dialed: Arc::new(DialerNonces::new(Duration::from_secs(10))),
    }
}

/// Everything the engine wrote, read back as a peer would: a preamble, then whole headers,
/// each of which decodes under the handshake's limits.
fn check_output(out: &[u8]) {
    assert!(out.len() >= PREAMBLE_LEN, "the engine's output starts with its preamble");
    Preamble::decode(&out[..PREAMBLE_LEN]).expect("the engine's preamble decodes");
    let limits = Limits::DEFAULT.during_handshake();
    let mut rest = &out[PREAMBLE_LEN..];
    while !rest.is_empty() {
        assert!(rest.len() >= 4, "a header's length prefix is cut");
        let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        assert!(rest.len() >= 4 + n, "a header is cut");
        Header::decode(&rest[4..4 + n], &limits).expect("every header the engine writes decodes");
        rest = &rest[4 + n..];
    }
}

fn settled(hs: &Handshake) {
    if hs.is_over() {
        assert_eq!(hs.wants(), 0, "an ended handshake reads nothing more");
        assert_eq!(hs.poll_timeout(), None, "an ended handshake needs no timer");
    } else {
        assert!(hs.poll_timeout().is_some());
    }
    if let Status::Done(done) = hs.status() {
        assert!((1..=3).contains(&done.version));
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let t0 = Instant::now();
    let role = if data[0] & 1 == 0 { Role::Dialer } else { Role::Acceptor };
    let ours = PREAMBLES[(data[0] >> 1) as usize % PREAMBLES.len()];
    let theirs = PREAMBLES[(data[0] >> 4) as usize % PREAMBLES.len()];
    let rounds = data[1] % 8;
    let mut target = Handshake::new(config("t", role, ours, 1, t0), t0);
    let mut honest = Handshake::new(config("h", role.peer(), theirs, 2, t0), t0);
    let mut written = Vec::new();
    // The honest peer's rounds: everything each side has to say, then admission.
    let mut to_target = Vec::new();
    for _ in 0..rounds {
        let out = target.take_transmit();
        written.extend_from_slice(&out);
        let mut rest = &out[..];
        while !rest.is_empty() && honest.wants() > 0 {
            let n = honest.handle_input(rest, 0, t0);
            rest = &rest[n..];
        }
        to_target.extend(honest.take_transmit());
        let n = target.handle_input(&to_target, 0, t0);
        assert!(n <= to_target.len());
        to_target.drain(..n);
        for hs in [&mut target, &mut honest] {
            if let Status::Admit(_) = hs.status() {
                hs.admit(Ok(()));
            }
        }
    }
    // The attacker's turn.
    let mut now = t0;
    let mut ops = &data[2..];
    while let Some((&op, rest)) = ops.split_first() {
        ops = rest;
        match op % 8 {
            0..=3 => {
                let len = (op as usize >> 3).min(ops.len());
                let (chunk, rest) = ops.split_at(len);
                ops = rest;
                let fds = usize::from(op % 8 == 3);
                let used = target.handle_input(chunk, fds, now);
                assert!(used <= chunk.len(), "took {used} of {} bytes", chunk.len());
            }
            4 => target.handle_eof(),
            5 => {
                now += Duration::from_millis(u64::from(op >> 3) * 200);
                target.handle_timeout(now);
            }
            6 => target.evict(),
            _ => {
                if let Status::Admit(_) = target.status() {
                    let verdict = if op & 8 == 0 {
                        Ok(())
                    } else {
                        Err(handoff_wire::WireError::Handshake("already connected".into()))
                    };
                    target.admit(verdict);
                }
            }
        }
        settled(&target);
        written.extend(target.take_transmit());
    }
    written.extend(target.take_transmit());
    check_output(&written);
    if let Status::Failed(Failure::Refused(e)) = target.status() {
        assert!(!e.code().is_empty());
    }
});

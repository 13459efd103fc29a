//! The established connection's receiving machine (`handoff_proto::inbound::Inbound`) fed an
//! arbitrary stream in arbitrary pieces, with arbitrary descriptors beside it, on TCP or a
//! Unix socket, while the driver's answers (room, `pulled` verdicts, time, the end of the
//! stream) come in the order the input picks.
//!
//! Findings: a panic; space offered while the machine waits for the driver; a byte taken
//! that was not given; a timer while it waits for the driver; a message whose frames break
//! the limits or the channel's kinds; more descriptors held than the bound; and a machine
//! that goes on after an error; room in the budget still held once the connection and its
//! events are gone. With the mode's second bit the machine also answers ticket requests as
//! an owner (from an empty lease table: every answer a refusal).

#![no_main]

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_proto::budget::{Account, Budget};
use handoff_proto::inbound::{Event, Frame, Inbound, Step, MAX_PENDING_FDS};
use handoff_proto::receive::{Pulled, Receiving};
use handoff_proto::recv_buffers::RecvPool;
use handoff_proto::ticket_leases::{LeaseConfig, LeaseTable};
use handoff_wire::{Limits, WireError};
use libfuzzer_sys::fuzz_target;

/// Small limits, so that the fuzzer reaches them.
const LIMITS: Limits = Limits {
    max_header_bytes: 1 << 20,
    max_frames: 16,
    max_frame_bytes: 1 << 20,
    max_message_bytes: 2 << 20,
    max_header_values: 4096,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let shm = mode & 1 == 1;
    let t0 = Instant::now();
    let inb = Inbound::new(
        Receiving::new(LIMITS, shm),
        Arc::new(|name: &str| match name {
            "t" | "u" => Ok(()),
            _ => Err(WireError::UnknownType {
                name: name.to_string(),
                known: "t, u".into(),
            }),
        }),
        RecvPool::new(4 << 20),
        Duration::from_secs(3),
    );
    // A budget that always has room (the driver's answers say yes), so that what is taken
    // can be counted back.
    let budget = Budget::new(1 << 40, 1 << 40, 0, usize::MAX);
    let mut inb = inb.with_budget(budget.clone(), Arc::new(Account::default()));
    if mode & 2 == 2 {
        let leases = Arc::new(LeaseTable::new(LeaseConfig::default(), 8));
        inb = inb.with_owner(leases, "holder", "owner");
    }
    run(&mut inb, data, shm, t0);
    drop(inb);
    assert_eq!(
        budget.used(),
        0,
        "room held after the connection and its events are gone"
    );
});

fn run(inb: &mut Inbound, mut data: &[u8], shm: bool, t0: Instant) {
    let mut now = t0;
    let mut failed = false;
    let mut waiting_for_driver = false;
    for _ in 0..10_000 {
        let step = match inb.poll(now) {
            Ok(s) => s,
            Err(_) => {
                assert!(!failed, "an error after an error");
                failed = true;
                continue;
            }
        };
        match step {
            Step::Closed => {
                assert_eq!(inb.poll_timeout(), None);
                assert!(inb.recv_space().is_empty(), "space after the end");
                return;
            }
            Step::Room { .. } | Step::CheckPulled { .. } => {
                assert!(!failed, "the machine went on after an error");
                assert!(inb.recv_space().is_empty(), "space while waiting for the driver");
                assert_eq!(inb.poll_timeout(), None, "a timer while waiting for the driver");
                waiting_for_driver = true;
            }
            Step::Event(ref e) => check_event(e, shm),
            Step::Read => {}
        }
        // The next action, as the input says.
        let Some((&op, rest)) = data.split_first() else {
            inb.handle_eof();
            if waiting_for_driver {
                answer(inb, &step, 0, now);
                waiting_for_driver = false;
            }
            continue;
        };
        data = rest;
        if waiting_for_driver && op & 0x80 == 0 {
            answer(inb, &step, op, now);
            waiting_for_driver = false;
            continue;
        }
        match op % 8 {
            0 => {
                now += Duration::from_millis(u64::from(op) * 40);
                let _ = inb.handle_timeout(now);
            }
            1 => {
                let fds = (0..op / 8 % 5).map(|_| devnull());
                let _ = inb.handle_fds(fds);
                assert!(
                    inb.pending_fds() <= MAX_PENDING_FDS,
                    "more descriptors held than the bound"
                );
            }
            _ => {
                let want = usize::from(op / 8) + 1;
                let space = inb.recv_space();
                let n = want.min(space.len()).min(data.len());
                if n == 0 {
                    continue;
                }
                space[..n].copy_from_slice(&data[..n]);
                data = &data[n..];
                inb.received(n, now);
            }
        }
    }
}

fn answer(inb: &mut Inbound, step: &Step, op: u8, now: Instant) {
    match step {
        Step::Room { .. } => assert!(inb.try_take_room(0, now)),
        Step::CheckPulled { len, .. } => {
            let verdict = match op % 3 {
                0 => Pulled::Read { hash: op & 8 == 8 },
                1 => Pulled::Mismatch(format!("not {len}")),
                _ => Pulled::Drop,
            };
            inb.pulled_verdict(verdict, now);
        }
        _ => {}
    }
}

fn check_event(e: &Event, shm: bool) {
    if let Event::Message(m) = e {
        assert!(m.frames.len() as u64 <= u64::from(LIMITS.max_frames), "too many frames");
        let mut total = 0;
        for f in &m.frames {
            match f {
                Frame::Bytes(b) => {
                    assert!(b.len() as u64 <= LIMITS.max_frame_bytes);
                    total += b.len() as u64;
                }
                Frame::Shm { len, .. } | Frame::Mapped { len, .. } => {
                    assert!(shm, "a shm frame on tcp");
                    total += len;
                }
                Frame::Ticket(_) => {}
                // This receiver did not announce `cuda` (spec §7.10): the engine refuses the
                // kind before a message is made.
                Frame::Device(_) => panic!("a cuda frame reached a node that did not announce cuda"),
            }
        }
        assert!(total <= LIMITS.max_message_bytes, "the message is over its limit");
    }
}

fn devnull() -> OwnedFd {
    std::fs::File::open("/dev/null").expect("/dev/null").into()
}

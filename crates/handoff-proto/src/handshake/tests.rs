//! The handshake machine driven in memory: two machines wired to each other, and an
//! attacker's bytes fed to one.

use super::*;

const SECRET: &[u8] = b"s3cret";

fn ident(name: &str) -> Ident {
    Ident {
        node_id: format!("{name:0>32}"),
        name: name.into(),
        host_id: "host".into(),
        pid: 1,
        process_id: "p".into(),
        language: "rust".into(),
        implementation: "test".into(),
        capabilities: vec!["inline".into()],
        listen: None,
        unix: None,
    }
}

fn config(name: &str, role: Role, preamble: Preamble, nonce: u8, t0: Instant) -> Config {
    Config {
        ident: ident(name),
        secret: SECRET.to_vec(),
        limits: Limits::DEFAULT,
        preamble,
        role,
        nonce: [nonce; 32],
        deadline: t0 + Duration::from_secs(10),
        progress_timeout: Duration::from_secs(30),
        dialed: Arc::new(DialerNonces::new(Duration::from_secs(10))),
    }
}

/// Moves bytes both ways, a byte at a time when `trickle`, admitting every ident, until
/// neither side has anything to say.
fn run(a: &mut Handshake, b: &mut Handshake, now: Instant, trickle: bool) {
    let (mut ab, mut ba) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        for (hs, ours) in [(&mut *a, &mut ab), (&mut *b, &mut ba)] {
            ours.extend(hs.take_transmit());
            if let Status::Admit(_) = hs.status() {
                hs.admit(Ok(()));
                ours.extend(hs.take_transmit());
            }
        }
        let mut moved = false;
        for (hs, theirs) in [(&mut *b, &mut ab), (&mut *a, &mut ba)] {
            let want = hs.wants().min(if trickle { 1 } else { usize::MAX }).min(theirs.len());
            if want > 0 {
                let used = hs.handle_input(&theirs[..want], 0, now);
                assert_eq!(used, want, "a machine takes every byte it asked for");
                theirs.drain(..used);
                moved = true;
            }
        }
        if !moved && !a.has_transmit() && !b.has_transmit() {
            return;
        }
    }
    panic!("the handshake did not settle");
}

#[test]
fn every_pair_of_preambles_settles_as_negotiation_says() {
    let t0 = Instant::now();
    let preambles = [
        Preamble::OURS,
        Preamble::ACCEPTING_V2,
        Preamble::ACCEPTING_V1,
        Preamble::V2_ONLY,
        Preamble::V1_ONLY,
    ];
    for pa in preambles {
        for pb in preambles {
            for trickle in [false, true] {
                let mut a = Handshake::new(config("a", Role::Dialer, pa, 1, t0), t0);
                let mut b = Handshake::new(config("b", Role::Acceptor, pb, 2, t0), t0);
                run(&mut a, &mut b, t0, trickle);
                match pa.negotiate(&pb) {
                    Ok(v) => {
                        let Status::Done(da) = a.status() else {
                            panic!("{pa:?}/{pb:?}: {:?}", a.status())
                        };
                        let Status::Done(db) = b.status() else {
                            panic!("{pa:?}/{pb:?}: {:?}", b.status())
                        };
                        assert_eq!((da.version, db.version), (v, v));
                        assert_eq!(da.ident.name, "b");
                        assert_eq!(db.ident.name, "a");
                        assert_eq!(a.wants(), 0, "nothing is read past ready");
                    }
                    Err(_) => {
                        assert!(matches!(a.status(), Status::Failed(_)), "{pa:?}/{pb:?}");
                        assert!(matches!(b.status(), Status::Failed(_)), "{pa:?}/{pb:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_wrong_secret_fails_both_sides_and_the_acceptor_never_proves() {
    let t0 = Instant::now();
    let mut a = Handshake::new(config("a", Role::Dialer, Preamble::OURS, 1, t0), t0);
    let mut cb = config("b", Role::Acceptor, Preamble::OURS, 2, t0);
    cb.secret = b"other".to_vec();
    let mut b = Handshake::new(cb, t0);
    run(&mut a, &mut b, t0, false);
    assert!(
        matches!(b.status(), Status::Failed(Failure::Refused(WireError::AuthFailed(_)))),
        "{:?}",
        b.status()
    );
    assert!(
        matches!(a.status(), Status::Failed(Failure::PeerRefused { code, .. }) if code == "auth-failed"),
        "{:?}",
        a.status()
    );
    assert!(
        b.drain_after_failure(),
        "an auth failure drains the peer before closing"
    );
}

/// An acceptor that answers a dialer with the dialer's own challenge (a reflection): refused.
#[test]
fn a_reflected_challenge_is_refused_in_every_version() {
    let t0 = Instant::now();
    for preamble in [Preamble::OURS, Preamble::V2_ONLY, Preamble::V1_ONLY] {
        let mut a = Handshake::new(config("a", Role::Dialer, preamble, 1, t0), t0);
        let sent = a.take_transmit();
        // The reflector sends our preamble back, then whatever we send next, verbatim.
        a.handle_input(&sent, 0, t0);
        let next = a.take_transmit();
        a.handle_input(&next, 0, t0);
        let Status::Failed(Failure::Refused(WireError::Handshake(why))) = a.status() else {
            panic!("{preamble:?}: {:?}", a.status())
        };
        assert!(why.contains("echoed our own nonce"), "{why}");
    }
}

/// A node's own dialer challenge relayed into one of its accepted connections (§5.8): the
/// acceptor knows the nonce from its node's set and refuses, before proving anything.
#[test]
fn a_relayed_dialer_nonce_is_refused_by_the_same_node_only() {
    let t0 = Instant::now();
    let node = Arc::new(DialerNonces::new(Duration::from_secs(10)));
    let mut dial = config("n", Role::Dialer, Preamble::OURS, 7, t0);
    dial.dialed = node.clone();
    let mut dialer = Handshake::new(dial, t0);
    let dialer_bytes = dialer.take_transmit();
    // The attacker dials the node back and presents the node's own challenge.
    let mut acc = config("n", Role::Acceptor, Preamble::OURS, 8, t0);
    acc.dialed = node.clone();
    let mut acceptor = Handshake::new(acc, t0);
    acceptor.take_transmit();
    let mut relayed = dialer_bytes.clone();
    // The dialer's challenge comes after our preamble reaches it; build it as it would be.
    dialer.handle_input(&Preamble::OURS.encode(), 0, t0);
    relayed.extend(dialer.take_transmit());
    acceptor.handle_input(&relayed, 0, t0);
    let Status::Failed(Failure::Refused(WireError::Handshake(why))) = acceptor.status() else {
        panic!("{:?}", acceptor.status())
    };
    assert!(why.contains("relayed back to us"), "{why}");
    let out = acceptor.take_transmit();
    assert!(!out.windows(4).any(|w| w == b"auth"), "the acceptor proved nothing");

    // Another node (its own set) takes the same challenge as any other.
    let mut other = Handshake::new(config("o", Role::Acceptor, Preamble::OURS, 9, t0), t0);
    other.handle_input(&relayed, 0, t0);
    assert_eq!(other.status(), &Status::InProgress);

    // And once the window has passed, the node forgets the nonce.
    let later = t0 + Duration::from_secs(21);
    let mut acc = config("n", Role::Acceptor, Preamble::OURS, 10, later);
    acc.dialed = node;
    let mut late = Handshake::new(acc, later);
    late.handle_input(&relayed, 0, later);
    assert_eq!(late.status(), &Status::InProgress);
}

#[test]
fn descriptors_before_ready_fail_the_handshake_without_a_drain() {
    let t0 = Instant::now();
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    b.handle_input(&Preamble::OURS.encode()[..3], 1, t0);
    assert!(matches!(
        b.status(),
        Status::Failed(Failure::Refused(WireError::BadShm(_)))
    ));
    assert!(!b.drain_after_failure());
    assert_eq!(b.wants(), 0, "a failed handshake reads nothing more");
}

#[test]
fn the_deadline_and_an_eviction_fail_a_handshake_and_say_so_only_after_a_preamble() {
    let t0 = Instant::now();
    let mut silent = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    assert_eq!(silent.poll_timeout(), Some(t0 + Duration::from_secs(10)));
    silent.take_transmit();
    silent.handle_timeout(t0 + Duration::from_secs(9));
    assert_eq!(silent.status(), &Status::InProgress);
    silent.handle_timeout(t0 + Duration::from_secs(10));
    assert!(matches!(
        silent.status(),
        Status::Failed(Failure::Refused(WireError::Timeout(_)))
    ));
    assert!(
        silent.take_transmit().is_empty(),
        "no error to a peer that sent no preamble"
    );
    assert_eq!(silent.poll_timeout(), None);

    let mut stalled = Handshake::new(
        Config {
            progress_timeout: Duration::from_secs(2),
            ..config("b", Role::Acceptor, Preamble::OURS, 2, t0)
        },
        t0,
    );
    stalled.handle_input(&Preamble::OURS.encode()[..4], 0, t0 + Duration::from_secs(1));
    assert_eq!(
        stalled.poll_timeout(),
        Some(t0 + Duration::from_secs(3)),
        "the preamble stalls"
    );
    stalled.handle_input(&Preamble::OURS.encode()[4..], 0, t0 + Duration::from_secs(2));
    assert_eq!(
        stalled.poll_timeout(),
        Some(t0 + Duration::from_secs(10)),
        "idle between headers"
    );
    stalled.handle_input(&[0, 0], 0, t0 + Duration::from_secs(5));
    stalled.handle_timeout(t0 + Duration::from_secs(7));
    let Status::Failed(Failure::Refused(WireError::Timeout(why))) = stalled.status() else {
        panic!("{:?}", stalled.status())
    };
    assert!(why.contains("header length"), "{why}");

    let mut evicted = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    evicted.take_transmit();
    evicted.handle_input(&Preamble::OURS.encode(), 0, t0);
    evicted.take_transmit();
    evicted.evict();
    assert!(matches!(
        evicted.status(),
        Status::Failed(Failure::Refused(WireError::Overloaded(_)))
    ));
    let told = evicted.take_transmit();
    let header = Header::decode(&told[4..], &Limits::DEFAULT).unwrap();
    assert!(matches!(header, Header::Error { code, .. } if code == "overloaded"));
    assert!(!evicted.drain_after_failure());
}

#[test]
fn the_end_of_the_stream_is_a_close_at_a_boundary_and_truncation_inside_an_item() {
    let t0 = Instant::now();
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    b.handle_input(&Preamble::OURS.encode(), 0, t0);
    b.handle_eof();
    assert_eq!(
        b.status(),
        &Status::Failed(Failure::PeerClosed {
            waiting_for: "challenge"
        })
    );
    let mut c = Handshake::new(config("c", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    c.handle_input(&Preamble::OURS.encode()[..5], 0, t0);
    c.handle_eof();
    assert!(matches!(
        c.status(),
        Status::Failed(Failure::Refused(WireError::Truncated { .. }))
    ));
}

#[test]
fn an_admission_refused_is_said_to_the_peer() {
    let t0 = Instant::now();
    let mut a = Handshake::new(config("a", Role::Dialer, Preamble::OURS, 1, t0), t0);
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    let (mut ab, mut ba) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        ab.extend(a.take_transmit());
        ba.extend(b.take_transmit());
        let n = b.handle_input(&ab, 0, t0);
        ab.drain(..n);
        let n = a.handle_input(&ba, 0, t0);
        ba.drain(..n);
        if let Status::Admit(peer) = b.status() {
            assert_eq!(peer.name, "a");
            b.admit(Err(WireError::Handshake("node id already connected".into())));
        }
        if let Status::Admit(_) = a.status() {
            a.admit(Ok(()));
        }
    }
    assert!(matches!(b.status(), Status::Failed(Failure::Refused(_))));
    assert!(
        matches!(a.status(), Status::Failed(Failure::PeerRefused { message, .. }) if message.contains("already connected")),
        "{:?}",
        a.status()
    );
}

/// Input that arrives after the deadline fails the handshake, whichever of the read and the
/// timer a driver saw first (tokio's `select!` polls its branches in random order).
#[test]
fn input_after_the_deadline_is_refused() {
    let t0 = Instant::now();
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    b.take_transmit();
    let late = t0 + Duration::from_secs(11); // deadline is t0 + 10 s
    b.handle_input(&Preamble::OURS.encode(), 0, late);
    assert!(
        matches!(b.status(), Status::Failed(Failure::Refused(WireError::Timeout(_)))),
        "input after the deadline was processed: {:?}",
        b.status()
    );
}

/// The §5.8 relay (a node's own dial spliced into a connection back to it) would get through
/// if the accepted handshake took the relayed challenge after its deadline, once the dialer
/// nonce's window W = 2 x timeout has passed; it does not. Timeline (T = 10 s): the node
/// dials at t0 (nonce remembered until t0+20); the attacker dials back at t0+9.99 (the
/// accepted handshake's deadline is t0+19.99) and crosses the challenges; its challenge on
/// the accepted connection is processed at t0+20, 10 ms past that deadline.
#[test]
fn a_relay_past_the_deadline_and_the_nonce_window_gets_nowhere() {
    let t0 = Instant::now();
    let node = Arc::new(DialerNonces::new(Duration::from_secs(10)));
    let mut dcfg = config("n", Role::Dialer, Preamble::OURS, 7, t0);
    dcfg.dialed = node.clone();
    let mut dialed = Handshake::new(dcfg, t0);
    dialed.take_transmit();
    let ta = t0 + Duration::from_millis(9_990);
    let mut acfg = config("n", Role::Acceptor, Preamble::OURS, 8, ta);
    acfg.dialed = node.clone();
    acfg.deadline = ta + Duration::from_secs(10);
    let mut accepted = Handshake::new(acfg, ta);
    accepted.take_transmit();
    // The attacker sends the node's own preamble on both connections.
    accepted.handle_input(&Preamble::OURS.encode(), 0, ta);
    let acc_challenge = accepted.take_transmit(); // nA, framed
    dialed.handle_input(&Preamble::OURS.encode(), 0, ta);
    let dial_challenge = dialed.take_transmit(); // nD, framed
                                                 // On the dialed connection the attacker answers with nA: the node proves as dialer.
    dialed.handle_input(&acc_challenge, 0, ta);
    let dialer_proof = dialed.take_transmit();
    assert!(!dialer_proof.is_empty());
    // On the accepted connection, nD and the node's own dialer proof, past the deadline.
    let late = t0 + Duration::from_secs(20);
    accepted.handle_input(&dial_challenge, 0, late);
    accepted.handle_input(&dialer_proof, 0, late);
    let out = accepted.take_transmit();
    // What the acceptor wrote: its proof and its ident, to a peer without the secret.
    let leaked = out.windows(5).any(|w| w == b"ident");
    assert!(
        !leaked,
        "a relayed handshake reached the identities after its deadline: {:?}",
        accepted.status()
    );
}

/// `admit` out of turn is ignored: the machine goes on with its step.
#[test]
fn an_admit_out_of_turn_does_not_break_the_machine() {
    let t0 = Instant::now();
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    b.take_transmit();
    b.handle_input(&Preamble::OURS.encode(), 0, t0);
    b.admit(Ok(())); // out of turn: the machine waits for a challenge
    assert_eq!(b.status(), &Status::InProgress);
    let mut a = Handshake::new(config("a", Role::Dialer, Preamble::OURS, 1, t0), t0);
    a.take_transmit();
    a.handle_input(&Preamble::OURS.encode(), 0, t0);
    let ch = a.take_transmit();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.handle_input(&ch, 0, t0)));
    assert!(r.is_ok(), "handle_input panicked after an out-of-turn admit");
}

/// A truncated item reports what it needed and what it had: here 10 of 16 preamble bytes.
#[test]
fn a_truncation_reports_what_was_needed_and_what_arrived() {
    let t0 = Instant::now();
    let mut b = Handshake::new(config("b", Role::Acceptor, Preamble::OURS, 2, t0), t0);
    b.handle_input(&Preamble::OURS.encode()[..10], 0, t0);
    b.handle_eof();
    let Status::Failed(Failure::Refused(WireError::Truncated { needed, available, .. })) = b.status() else {
        panic!("{:?}", b.status())
    };
    assert_eq!(
        (*needed, *available),
        (16, 10),
        "the old reader said 16 needed, 10 available"
    );
}

//! What a node decides when it dials, with no I/O: what an address names (`inproc://NAME`,
//! `unix://PATH`, `tcp://HOST:PORT` or plain `HOST:PORT`) and the host a TLS dialer checks in
//! it; whether a TCP connection moves on to the peer's Unix socket, given the channel the
//! caller pinned (spec §7.1); where a holder dials a ticket's owner, whether the node it
//! reached there is that owner, and which of the owners it dialed it lets go of to dial
//! another ([`OwnerDials`]; spec §7.6, §9.1).

use handoff_wire::{Channel, Endpoint, Locality, TicketClaim};

/// What an address given to `connect` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// A node of this process, by name (`inproc://NAME`).
    Inproc(&'a str),
    /// A same-host node's Unix socket, by path (`unix://PATH`).
    Unix(&'a str),
    /// Any other node, as `HOST:PORT` (`tcp://HOST:PORT`, or `HOST:PORT` without a scheme).
    Tcp(&'a str),
}

impl Target<'_> {
    /// What `addr` names (see [`Target`]).
    pub fn of(addr: &str) -> Target<'_> {
        if let Some(name) = addr.strip_prefix("inproc://") {
            return Target::Inproc(name);
        }
        if let Some(path) = addr.strip_prefix("unix://") {
            return Target::Unix(path);
        }
        Target::Tcp(strip_scheme(addr, "tcp://"))
    }
}

/// `addr` without its `scheme` prefix, if it has one.
pub fn strip_scheme<'a>(addr: &'a str, scheme: &str) -> &'a str {
    addr.strip_prefix(scheme).unwrap_or(addr)
}

/// The host part of a `HOST:PORT` target: what a TLS dialer checks the accepting side's
/// certificate against unless told another name (a name, or an IP address).
pub fn host_of(target: &str) -> &str {
    target.rsplit_once(':').map_or(target, |(host, _port)| host)
}

/// What a dialer does once its TCP connection to a peer is established ([`switch_after_tcp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch<'p> {
    /// Keep the TCP connection (the caller pinned `tcp`, or the peer cannot be reached
    /// through shared memory and the caller did not ask for it).
    Stay,
    /// Connect to the peer's Unix socket at this address and use that connection instead;
    /// if that fails, keep the TCP connection unless the caller pinned `shm`.
    Try(&'p str),
    /// The caller pinned `shm`, which the peer cannot give, for this reason: close the TCP
    /// connection and fail.
    Refuse(&'static str),
}

/// Whether a TCP connection to `peer` moves on to its Unix socket (spec §7.1,
/// [`unix_switch`](crate::peers::unix_switch)), with the channel the caller `pinned`:
/// `Some(Channel::Tcp)` never switches, `Some(Channel::Shm)` refuses a peer that cannot be
/// reached through shared memory, and no pin switches where the peer can be.
pub fn switch_after_tcp<'p>(
    pinned: Option<Channel>,
    locality: Locality,
    we_offer_shm: bool,
    peer: &Endpoint,
    peer_unix: Option<&'p str>,
) -> Switch<'p> {
    if pinned == Some(Channel::Tcp) {
        return Switch::Stay;
    }
    match crate::peers::unix_switch(locality, we_offer_shm, peer, peer_unix) {
        Ok(path) => Switch::Try(path),
        Err(reason) if pinned == Some(Channel::Shm) => Switch::Refuse(reason),
        Err(_) => Switch::Stay,
    }
}

/// Where a holder that is not connected to a ticket's owner dials it: the address the
/// ticket carries; or why it cannot.
pub fn owner_address(claim: &TicketClaim) -> Result<&str, &'static str> {
    claim
        .addr
        .as_deref()
        .ok_or("not connected to the owner, and the ticket has no address")
}

/// Where a holder with no connection to a ticket's owner dials it: the address the ticket
/// carries, if it is one the holder may dial ([`peers::may_dial`](crate::peers::may_dial):
/// `tcp://`, and not `our_listen`); otherwise why not.
pub fn dial_target<'c>(claim: &'c TicketClaim, our_listen: Option<&str>) -> Result<&'c str, String> {
    let addr = owner_address(claim)?;
    crate::peers::may_dial(addr, our_listen)?;
    Ok(addr)
}

/// Checks that the node a holder reached at `addr` for a ticket's owner, whose id is
/// `reached`, is that owner (`owner`, the ticket's node id): a node that listens there now
/// may be another one.
pub fn check_reached_owner(addr: &str, reached: &str, owner: &str) -> Result<(), String> {
    if reached != owner {
        return Err(format!("the node at {addr} is {reached}, not the ticket's owner"));
    }
    Ok(())
}

/// How long after its last use (a request of ours) a kept connection to an owner is not
/// closed to make room: the request is counted as outstanding only once it is sent.
pub const RECENTLY_USED: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a kept owner connection closed to make room for another may still deliver what
/// the owner sends (after what we queued was written) before it is cut.
pub const CLOSED_FOR_ROOM_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The connections a holder opened to reach ticket owners and keeps open (spec §9.1: at most
/// [`Bounds::max_owner_connections`](crate::bounds::Bounds::max_owner_connections)), the
/// least recently used first; `K` names a connection for the driver.
///
/// Before it dials another owner, a driver asks [`make_room`](Self::make_room), which
/// reserves a place and may name a connection to close first; then it reports the dial
/// ([`dialed`](Self::dialed) or [`gave_up`](Self::gave_up)). It reports each request it
/// makes on a kept connection ([`used`](Self::used)), and each that closes
/// ([`ended`](Self::ended)). The owner's own messages are not use: otherwise any owner
/// could keep its connection from ever making room.
///
/// It also counts the holds this node has at each owner, the tickets it received and still
/// keeps ([`held`](Self::held), [`let_go`](Self::let_go)): a connection to an owner where
/// we hold something is never the one closed, since closing it would end those holds
/// (spec §7.7), and a peer's tickets could then make another peer's fail.
#[derive(Debug)]
pub struct OwnerDials<K> {
    /// Least recently used first, each with when it was last used.
    kept: std::collections::VecDeque<(K, std::time::Instant)>,
    /// The same, for a quick look-up (most messages come on other connections).
    members: std::collections::HashSet<K>,
    /// Places reserved by dials under way.
    dialing: usize,
    max: usize,
    /// Live holds at each owner (tickets received and kept), by owner.
    holds: std::collections::HashMap<K, usize>,
}

impl<K: Eq + std::hash::Hash + Clone> OwnerDials<K> {
    /// Keeps at most `max` (at least 1), dials under way included.
    pub fn new(max: usize) -> OwnerDials<K> {
        OwnerDials {
            kept: std::collections::VecDeque::new(),
            members: std::collections::HashSet::new(),
            dialing: 0,
            max: max.max(1),
            holds: std::collections::HashMap::new(),
        }
    }

    /// This node took a hold at owner `k` (it received a ticket of `k`'s).
    pub fn held(&mut self, k: K) {
        *self.holds.entry(k).or_insert(0) += 1;
    }

    /// A hold at owner `k` ended here (the ticket's last handle went).
    pub fn let_go(&mut self, k: &K) {
        if let Some(n) = self.holds.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                self.holds.remove(k);
            }
        }
    }

    /// Holds this node has at owner `k`.
    pub fn holds_at(&self, k: &K) -> usize {
        self.holds.get(k).copied().unwrap_or(0)
    }

    /// How many are kept (dials under way not included).
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Whether `k` is one of the kept.
    pub fn is_kept(&self, k: &K) -> bool {
        self.members.contains(k)
    }

    /// Before another owner is dialed, at `now`: reserves a place for it. Kept connections
    /// that are no longer `alive` are forgotten first. `Ok(None)` when there was room;
    /// `Ok(Some(k))` when `k` gave its place up (the least recently used of those that are
    /// not `busy`, with no request of ours outstanding, where we hold nothing, and unused
    /// for [`RECENTLY_USED`]), for the driver to close; or why there is none, and nothing
    /// is reserved.
    pub fn make_room(
        &mut self,
        now: std::time::Instant,
        alive: impl Fn(&K) -> bool,
        busy: impl Fn(&K) -> bool,
    ) -> Result<Option<K>, String> {
        let gone: Vec<K> = self
            .kept
            .iter()
            .filter(|(k, _)| !alive(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.ended(k);
        }
        if self.kept.len() + self.dialing < self.max {
            self.dialing += 1;
            return Ok(None);
        }
        let idle = |(k, at): &(K, std::time::Instant)| {
            !busy(k) && self.holds_at(k) == 0 && now.saturating_duration_since(*at) >= RECENTLY_USED
        };
        match self.kept.iter().position(idle) {
            Some(i) => {
                self.dialing += 1;
                let (k, _) = self.kept.remove(i).expect("found at i");
                self.members.remove(&k);
                Ok(Some(k))
            }
            None => Err(format!(
                "this node keeps {} connections to ticket owners it dialed (its bound), and none can close: \
                 each has a request outstanding, tickets of its owner held, or was used within {:?}",
                self.kept.len() + self.dialing,
                RECENTLY_USED
            )),
        }
    }

    /// The dial [`make_room`](Self::make_room) reserved for reached its owner `k` at `now`:
    /// kept, as the most recently used.
    pub fn dialed(&mut self, k: K, now: std::time::Instant) {
        self.dialing = self.dialing.saturating_sub(1);
        self.ended(&k);
        self.members.insert(k.clone());
        self.kept.push_back((k, now));
    }

    /// The dial [`make_room`](Self::make_room) reserved for failed (or was given up): its
    /// place is free.
    pub fn gave_up(&mut self) {
        self.dialing = self.dialing.saturating_sub(1);
    }

    /// A request of ours goes out on `k` at `now`: the most recently used, if it is one of
    /// the kept.
    pub fn used(&mut self, k: &K, now: std::time::Instant) {
        if !self.members.contains(k) {
            return;
        }
        if let Some(i) = self.kept.iter().position(|(x, _)| x == k) {
            if let Some((x, _)) = self.kept.remove(i) {
                self.kept.push_back((x, now));
            }
        }
    }

    /// `k` closed (whoever closed it): no longer kept.
    pub fn ended(&mut self, k: &K) {
        if self.members.remove(k) {
            self.kept.retain(|(x, _)| x != k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::TicketDigest;

    #[test]
    fn a_holder_keeps_so_many_owner_connections_and_lets_the_least_recently_used_idle_one_go() {
        let t0 = std::time::Instant::now();
        let later = t0 + RECENTLY_USED;
        let alive = |_: &&str| true;
        let idle = |_: &&str| false;
        let mut dials = OwnerDials::new(3);
        for k in ["a", "b", "c"] {
            assert_eq!(dials.make_room(t0, alive, idle), Ok(None));
            dials.dialed(k, t0);
        }
        let why = dials.make_room(t0, alive, idle).unwrap_err();
        assert!(why.contains("used within"), "all used just now: {why}");
        assert_eq!(
            dials.make_room(later, alive, idle),
            Ok(Some("a")),
            "the least recently used"
        );
        dials.dialed("d", later);
        dials.used(&"b", later);
        let later = later + RECENTLY_USED;
        assert_eq!(
            dials.make_room(later, alive, |k: &&str| *k == "c"),
            Ok(Some("d")),
            "c is busy, b was used since"
        );
        dials.gave_up();
        assert_eq!(dials.len(), 2, "c and b");
        assert_eq!(
            dials.make_room(later, alive, |_: &&str| true),
            Ok(None),
            "a place was free"
        );
        let why = dials.make_room(later, alive, |_: &&str| true).unwrap_err();
        assert!(why.contains("keeps 3 connections"), "dials under way count: {why}");
        dials.gave_up();
        dials.ended(&"b");
        assert_eq!(dials.len(), 1);
        assert!(dials.is_kept(&"c") && !dials.is_kept(&"b"));
        dials.used(&"z", later); // not one of the kept: nothing changes
        assert_eq!(dials.make_room(later, alive, idle), Ok(None));
        dials.dialed("c", later); // dialed again: kept once
        assert_eq!(dials.len(), 1);
        // A kept connection that closed unseen is forgotten before room is looked for.
        let mut dials = OwnerDials::new(1);
        dials.make_room(t0, alive, idle).unwrap();
        dials.dialed("x", t0);
        assert_eq!(dials.make_room(t0, |k: &&str| *k != "x", |_: &&str| true), Ok(None));
        assert_eq!(
            OwnerDials::<u8>::new(0).make_room(t0, |_| true, |_| true),
            Ok(None),
            "at least one"
        );
    }

    #[test]
    fn a_connection_to_an_owner_where_we_hold_tickets_is_not_closed_to_make_room() {
        let t0 = std::time::Instant::now();
        let later = t0 + RECENTLY_USED;
        let (alive, idle) = (|_: &&str| true, |_: &&str| false);
        let mut dials = OwnerDials::new(2);
        for k in ["a", "b"] {
            dials.make_room(t0, alive, idle).unwrap();
            dials.dialed(k, t0);
        }
        dials.held("a");
        dials.held("a");
        assert_eq!(
            dials.make_room(later, alive, idle),
            Ok(Some("b")),
            "a holds two tickets"
        );
        dials.dialed("c", later);
        dials.held("c");
        let why = dials.make_room(later + RECENTLY_USED, alive, idle).unwrap_err();
        assert!(why.contains("tickets of its owner held"), "{why}");
        dials.let_go(&"a");
        assert_eq!(dials.holds_at(&"a"), 1);
        dials.let_go(&"a");
        dials.let_go(&"a"); // (one too many: nothing below zero)
        assert_eq!(dials.holds_at(&"a"), 0);
        assert_eq!(dials.make_room(later + RECENTLY_USED, alive, idle), Ok(Some("a")));
    }

    #[test]
    fn an_address_names_a_node_by_its_scheme() {
        assert_eq!(Target::of("inproc://a"), Target::Inproc("a"));
        assert_eq!(Target::of("unix:///run/b.sock"), Target::Unix("/run/b.sock"));
        assert_eq!(Target::of("tcp://10.0.0.1:7000"), Target::Tcp("10.0.0.1:7000"));
        assert_eq!(Target::of("10.0.0.1:7000"), Target::Tcp("10.0.0.1:7000"));
        assert_eq!(strip_scheme("tcp://[::1]:9", "tcp://"), "[::1]:9");
        assert_eq!(strip_scheme("[::1]:9", "tcp://"), "[::1]:9");
        assert_eq!(host_of("example.org:7000"), "example.org");
        assert_eq!(host_of("[::1]:9"), "[::1]");
        assert_eq!(host_of("example.org"), "example.org", "no port");
    }

    fn endpoint(caps: &[&str]) -> Endpoint {
        Endpoint {
            node_id: "b".into(),
            name: "node-b".into(),
            host_id: "h".into(),
            process_id: "p".into(),
            language: "rust".into(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn a_pinned_channel_decides_the_switch_to_shm() {
        let (shm, plain) = (endpoint(&["shm"]), endpoint(&[]));
        let sock = Some("unix:///run/b.sock");
        let same = Locality::SameHost;
        assert_eq!(
            switch_after_tcp(None, same, true, &shm, sock),
            Switch::Try("unix:///run/b.sock")
        );
        assert_eq!(
            switch_after_tcp(Some(Channel::Shm), same, true, &shm, sock),
            Switch::Try("unix:///run/b.sock")
        );
        assert_eq!(
            switch_after_tcp(Some(Channel::Tcp), same, true, &shm, sock),
            Switch::Stay
        );
        assert_eq!(switch_after_tcp(None, same, true, &plain, sock), Switch::Stay);
        assert_eq!(
            switch_after_tcp(Some(Channel::Shm), same, true, &plain, sock),
            Switch::Refuse("it offers no Unix socket")
        );
        assert_eq!(
            switch_after_tcp(Some(Channel::Shm), Locality::Remote, true, &shm, sock),
            Switch::Refuse("it is on another host")
        );
    }

    #[test]
    fn a_holder_dials_the_ticket_s_address_and_checks_whom_it_reached() {
        let mut claim = TicketClaim {
            len: 1,
            owner: "a".into(),
            addr: Some("tcp://10.0.0.1:7000".into()),
            lease: 1,
            token: vec![0; 32],
            digest: TicketDigest::Blake3([0; 32]),
            ttl_ms: 1000,
            lazy: false,
        };
        assert_eq!(owner_address(&claim), Ok("tcp://10.0.0.1:7000"));
        claim.addr = None;
        assert_eq!(
            owner_address(&claim),
            Err("not connected to the owner, and the ticket has no address")
        );
        assert!(check_reached_owner("tcp://10.0.0.1:7000", "a", "a").is_ok());
        assert_eq!(
            check_reached_owner("tcp://10.0.0.1:7000", "c", "a").unwrap_err(),
            "the node at tcp://10.0.0.1:7000 is c, not the ticket's owner"
        );
    }
}

//! What a node decides when it dials, with no I/O: what an address names (`inproc://NAME`,
//! `unix://PATH`, `tcp://HOST:PORT` or plain `HOST:PORT`) and the host a TLS dialer checks in
//! it; whether a TCP connection moves on to the peer's Unix socket, given the channel the
//! caller pinned (spec §7.1); and where a holder dials a ticket's owner, and whether the node
//! it reached there is that owner (spec §7.6, §9.1).

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
/// ticket carries; or why it cannot (errors then name the owner by its id).
pub fn owner_address(claim: &TicketClaim) -> Result<&str, &'static str> {
    claim
        .addr
        .as_deref()
        .ok_or("not connected to the owner, and the ticket has no address")
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

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::TicketDigest;

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

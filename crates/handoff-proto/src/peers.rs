//! What a node decides about its peers around a handshake, with no I/O: the identity it
//! presents, whether a peer's node id may join (spec §5.1 step 6), whether a TCP
//! connection switches to the peer's Unix socket (§7.1), and which ticket addresses may be
//! dialled (§9.1).

use handoff_wire::{Channel, Endpoint, Ident, Locality, Route, WireError};

/// Checks what a node will say about itself against what every peer accepts (spec §5.2): its
/// name and, if set, its host id; why not, if they do not fit.
pub fn check_own_identity(name: &str, host_id: Option<&str>) -> Result<(), String> {
    use handoff_wire::identity_lengths::{HOST_BYTES, NAME_BYTES};
    let fits = |what: &str, value: &str, most: u32| {
        if value.len() > most as usize {
            return Err(format!(
                "the node's {what} is {} bytes; peers accept at most {most} (spec WIRE.md §5.2)",
                value.len()
            ));
        }
        Ok(())
    };
    fits("name", name, NAME_BYTES)?;
    host_id.map_or(Ok(()), |host| fits("host id", host, HOST_BYTES))
}

/// The identity a node presents in its handshake: its endpoint, this process's pid, the
/// implementation's name and version, and where it can be reached.
pub fn ident_of(me: &Endpoint, implementation: &str, listen: Option<String>, unix: Option<String>) -> Ident {
    Ident {
        node_id: me.node_id.clone(),
        name: me.name.clone(),
        host_id: me.host_id.clone(),
        pid: std::process::id(),
        process_id: me.process_id.clone(),
        language: me.language.clone(),
        implementation: implementation.to_string(),
        capabilities: me.capabilities.clone(),
        listen,
        unix,
    }
}

/// The endpoint a peer's identity describes.
pub fn endpoint_of(ident: &Ident) -> Endpoint {
    Endpoint {
        node_id: ident.node_id.clone(),
        name: ident.name.clone(),
        host_id: ident.host_id.clone(),
        process_id: ident.process_id.clone(),
        language: ident.language.clone(),
        capabilities: ident.capabilities.clone(),
    }
}

/// The step before `ready` (spec §5.1 step 6, §5.4 step 7): a node id names one node in one
/// process. The peer's identity must not carry our own id `me`, and where a node with its
/// id is `connected` already, that node must be the same process: the same node opening a
/// second connection (the switch to a Unix socket, a reconnection) is welcome.
///
/// It runs on an identity the peer sent after proving the secret (v2, v3) or covered by
/// its proof (v1), so what the refusal says goes only to a member of the cluster.
pub fn admit(me: &str, ident: &Ident, connected: Option<&Endpoint>) -> Result<(), WireError> {
    if ident.node_id == me {
        return Err(WireError::Handshake(format!(
            "the peer presents this node's own id {} (a connection to itself, or a copied id)",
            ident.node_id
        )));
    }
    match connected {
        Some(existing) if existing.process_id != ident.process_id => Err(WireError::Handshake(format!(
            "node id {} is already connected as {:?} from another process ({}); node ids must be unique",
            ident.node_id, existing.name, existing.process_id
        ))),
        _ => Ok(()),
    }
}

/// Whether a TCP connection to `peer` switches to its Unix socket (§7.1): the peer's Unix
/// socket when both nodes share the host, we accept same-host peers (`we_offer_shm`), and
/// the peer announced `shm` with a socket; otherwise why not.
pub fn unix_switch<'p>(
    locality: Locality,
    we_offer_shm: bool,
    peer: &Endpoint,
    peer_unix: Option<&'p str>,
) -> Result<&'p str, &'static str> {
    if locality == Locality::Remote {
        return Err("it is on another host");
    }
    if !we_offer_shm {
        return Err("this node has shared memory turned off");
    }
    match peer_unix {
        Some(path) if peer.has_capability("shm") => Ok(path),
        _ => Err("it offers no Unix socket"),
    }
}

/// Whether a node of this process may connect in process (`inproc://NAME`) to the node
/// `name`, whose cluster secret is `theirs`, ours being `ours`: only with the same secret,
/// compared in constant time, as a handshake would prove it.
pub fn inproc_admit(name: &str, ours: &[u8], theirs: &[u8]) -> Result<(), WireError> {
    let same = ours.len() == theirs.len() && ours.iter().zip(theirs).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same {
        return Err(WireError::AuthFailed(format!(
            "node {name:?} has a different cluster secret"
        )));
    }
    Ok(())
}

/// The two routes of a connection between `local` and `remote` on `channel`: the one
/// messages to the peer take, and the one they come by.
pub fn routes(local: &Endpoint, remote: &Endpoint, channel: Channel) -> (Route, Route) {
    let locality = Locality::between(local, remote);
    let route = |from: &Endpoint, to: &Endpoint| Route {
        from: from.clone(),
        to: to.clone(),
        locality,
        channel,
    };
    (route(local, remote), route(remote, local))
}

/// Whether a ticket's owner may be asked for its bytes at all (spec §9.1): not when the
/// ticket names this node (`me`) itself, which a node never dials; otherwise why not.
pub fn check_owner(owner: &str, me: &str) -> Result<(), String> {
    if owner == me {
        return Err("the ticket names this node itself as its owner; a node does not dial itself".into());
    }
    Ok(())
}

/// Whether a ticket's `addr` may be dialled to reach its owner (spec §9.1): only a
/// `tcp://` address, and not `our_listen`, this node's own listen address, however it is
/// spelled (a node that listens on a loopback or every address is reached by any local
/// one: `localhost`, `127.0.0.2`, `[::1]`); otherwise why not.
pub fn may_dial(addr: &str, our_listen: Option<&str>) -> Result<(), String> {
    let Some(target) = addr.strip_prefix("tcp://") else {
        return Err(format!("the ticket's address {addr:?} is not a tcp:// address"));
    };
    let ours = our_listen.and_then(|l| l.strip_prefix("tcp://"));
    if ours.is_some_and(|o| same_listener(o, target)) {
        return Err(format!(
            "the ticket's address {addr} is this node's own listen address; a node does not dial itself"
        ));
    }
    Ok(())
}

/// Whether `host:port` address `b` reaches the listener at `a` plainly: the same text, the
/// same socket address, or the same port with both hosts local.
fn same_listener(a: &str, b: &str) -> bool {
    let split = |s: &str| -> Option<(String, u16)> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        Some((host.to_ascii_lowercase(), port.parse().ok()?))
    };
    let local = |h: &str| {
        matches!(h, "localhost" | "localhost.localdomain" | "ip6-localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
    };
    match (split(a), split(b)) {
        (Some((ha, pa)), Some((hb, pb))) if pa == pb => {
            let ip = |h: &str| h.parse::<std::net::IpAddr>().ok();
            ha == hb || ip(&ha).is_some_and(|x| ip(&hb) == Some(x)) || (local(&ha) && local(&hb))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_nodes_meet_only_with_the_same_secret() {
        assert!(inproc_admit("b", b"s3cret", b"s3cret").is_ok());
        let e = inproc_admit("b", b"s3cret", b"other!").unwrap_err();
        assert!(matches!(&e, WireError::AuthFailed(m) if m == "node \"b\" has a different cluster secret"));
        assert!(inproc_admit("b", b"s", b"").is_err());
    }

    #[test]
    fn the_routes_of_a_connection_are_mirror_images() {
        let (a, b) = (endpoint("a", "p", &[]), endpoint("b", "q", &[]));
        let (out, back) = routes(&a, &b, Channel::Tcp);
        assert_eq!((out.from.node_id.as_str(), out.to.node_id.as_str()), ("a", "b"));
        assert_eq!((back.from.node_id.as_str(), back.to.node_id.as_str()), ("b", "a"));
        assert_eq!(out.locality, back.locality);
        assert_eq!(back.channel, Channel::Tcp);
    }

    fn endpoint(id: &str, process: &str, caps: &[&str]) -> Endpoint {
        Endpoint {
            node_id: id.into(),
            name: format!("node-{id}"),
            host_id: "h".into(),
            process_id: process.into(),
            language: "rust".into(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn a_node_id_is_one_node_in_one_process() {
        let them = ident_of(&endpoint("b", "p1", &[]), "handoff-rs/test", None, None);
        assert_eq!(endpoint_of(&them), endpoint("b", "p1", &[]));
        assert!(admit("a", &them, None).is_ok());
        let err = admit("b", &them, None).unwrap_err().to_string();
        assert!(err.contains("this node's own id"), "{err}");
        assert!(
            admit("a", &them, Some(&endpoint("b", "p1", &[]))).is_ok(),
            "a second connection"
        );
        let err = admit("a", &them, Some(&endpoint("b", "p2", &[])))
            .unwrap_err()
            .to_string();
        assert!(err.contains("another process (p2)") && err.contains("node-b"), "{err}");
    }

    #[test]
    fn a_node_says_only_what_peers_accept_about_itself() {
        assert!(check_own_identity("alpha", None).is_ok());
        let err = check_own_identity(&"n".repeat(257), None).unwrap_err();
        assert!(
            err.starts_with("the node's name is 257 bytes; peers accept at most 256"),
            "{err}"
        );
        let err = check_own_identity("alpha", Some(&"h".repeat(300))).unwrap_err();
        assert!(err.starts_with("the node's host id is 300 bytes"), "{err}");
    }

    #[test]
    fn a_ticket_dials_only_tcp_addresses_other_than_our_own() {
        assert!(may_dial("tcp://127.0.0.1:9", None).is_ok());
        assert!(may_dial("tcp://127.0.0.1:9", Some("tcp://127.0.0.1:10")).is_ok());
        let err = may_dial("unix:///tmp/x.sock", None).unwrap_err();
        assert!(err.contains("not a tcp:// address"), "{err}");
        let err = may_dial("tcp://127.0.0.1:9", Some("tcp://127.0.0.1:9")).unwrap_err();
        assert!(err.contains("this node's own"), "{err}");
        assert!(
            may_dial("tcp://[::1]:9", Some("tcp://[0:0:0:0:0:0:0:1]:9")).is_err(),
            "the same socket address"
        );
        // Spelled otherwise, as the Python peer's `is_own_address` sees it too.
        for alias in ["localhost:9", "LOCALHOST:9", "127.0.0.2:9", "[::1]:9", "0.0.0.0:9"] {
            assert!(
                may_dial(&format!("tcp://{alias}"), Some("tcp://127.0.0.1:9")).is_err(),
                "{alias} reaches our loopback listener"
            );
        }
        assert!(
            may_dial("tcp://localhost:9", Some("tcp://0.0.0.0:9")).is_err(),
            "every address"
        );
        assert!(
            may_dial("tcp://localhost:10", Some("tcp://127.0.0.1:9")).is_ok(),
            "another port"
        );
        assert!(
            may_dial("tcp://10.1.2.3:9", Some("tcp://127.0.0.1:9")).is_ok(),
            "another host"
        );
    }

    #[test]
    fn a_tcp_connection_switches_only_to_a_same_host_peer_with_a_socket() {
        let shm = endpoint("b", "p", &["shm"]);
        let sock = Some("unix:///run/b.sock");
        assert_eq!(
            unix_switch(Locality::SameHost, true, &shm, sock),
            Ok("unix:///run/b.sock")
        );
        assert_eq!(
            unix_switch(Locality::SameProcess, true, &shm, sock),
            Ok("unix:///run/b.sock")
        );
        assert_eq!(
            unix_switch(Locality::Remote, true, &shm, sock),
            Err("it is on another host")
        );
        assert!(unix_switch(Locality::SameHost, false, &shm, sock).is_err());
        assert!(unix_switch(Locality::SameHost, true, &shm, None).is_err());
        let plain = endpoint("b", "p", &[]);
        assert_eq!(
            unix_switch(Locality::SameHost, true, &plain, sock),
            Err("it offers no Unix socket")
        );
    }
}

//! What a node decides about a message its connection received, once the connection's
//! engine (`inbound`) handed it over, with no waiting: how a type name the node does not
//! take is refused (spec §11.2 step 3), whether the message waits for its tickets to be
//! redeemed before the application gets it (spec §7.6, §9.1), and how a received ticket
//! names its owner in errors from then on.

use handoff_wire::{DeviceClaim, Endpoint, TicketClaim, TicketDigest, WireError};

use crate::settings::Redeem;

/// The hold a node keeps on the lease of a `cuda` frame received from node `owner` (spec
/// §7.10), as a ticket claim: a pull of it (where the memory cannot be mapped) and its
/// `unlease` go as a ticket's. It has no digest to check (a pull of it is never checked
/// against one) and no deadline to renew.
pub fn device_hold(claim: &DeviceClaim, owner: &str) -> TicketClaim {
    TicketClaim {
        len: claim.len,
        owner: owner.to_string(),
        addr: None,
        lease: claim.lease,
        token: claim.token.clone(),
        digest: TicketDigest::Blake3([0; 32]),
        ttl_ms: 0,
        lazy: true,
    }
}

/// The `unknown-type` refusal of a message named `name`, naming the `known` types the node
/// takes, sorted and separated by `, ` (as both drivers name them).
pub fn unknown_type<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> WireError {
    let mut names: Vec<&str> = known.into_iter().collect();
    names.sort_unstable();
    WireError::UnknownType {
        name: name.to_string(),
        known: names.join(", "),
    }
}

/// Whether a received message waits to be redeemed before delivery, on a node that redeems
/// as `redeem` says: `Some(bytes)` queues it, with the bytes of its tickets to redeem first
/// (the engine's `eager_tickets` and `eager_ticket_bytes`), or 0 for a message with none that
/// only keeps its place behind the messages of its connection still waiting (`queue_busy`);
/// `None` hands it to the application now.
pub fn redeem_first(eager_tickets: bool, eager_ticket_bytes: u64, redeem: Redeem, queue_busy: bool) -> Option<u64> {
    let eager = eager_tickets && redeem == Redeem::Eager;
    (eager || queue_busy).then_some(if eager { eager_ticket_bytes } else { 0 })
}

/// How a ticket received from `sender` names its owner in errors, fixed at receipt
/// ([`owner_label`](crate::ticket_requests::owner_label)): by the sender's name when the
/// sender owns it, else by the name of a node connected now with the owner's id
/// (`connected_name`, asked only then), else by its id.
pub fn owner_label_at_receipt(
    claim: &TicketClaim,
    sender: &Endpoint,
    connected_name: impl FnOnce(&str) -> Option<String>,
) -> String {
    let owner_name = if claim.owner == sender.node_id {
        Some(sender.name.clone())
    } else {
        connected_name(&claim.owner)
    };
    crate::ticket_requests::owner_label(claim, owner_name.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::TicketDigest;

    #[test]
    fn an_unknown_type_is_refused_naming_the_known_ones_sorted() {
        let e = unknown_type("x.Z", ["b.B", "a.A"]);
        assert_eq!(e.code(), "unknown-type");
        assert!(matches!(&e, WireError::UnknownType { name, known } if name == "x.Z" && known == "a.A, b.B"));
        let none = unknown_type("x.Z", []);
        assert!(matches!(&none, WireError::UnknownType { known, .. } if known.is_empty()));
    }

    #[test]
    fn only_eager_tickets_and_a_busy_queue_hold_a_message_back() {
        assert_eq!(redeem_first(true, 100, Redeem::Eager, false), Some(100));
        assert_eq!(redeem_first(true, 100, Redeem::Eager, true), Some(100));
        assert_eq!(
            redeem_first(true, 100, Redeem::Lazy, false),
            None,
            "lazy: delivered as is"
        );
        assert_eq!(
            redeem_first(true, 100, Redeem::Lazy, true),
            Some(0),
            "behind others, with nothing to redeem"
        );
        assert_eq!(redeem_first(false, 0, Redeem::Eager, true), Some(0));
        assert_eq!(redeem_first(false, 0, Redeem::Eager, false), None);
    }

    #[test]
    fn a_received_ticket_names_its_owner_by_the_sender_or_a_connected_node() {
        let sender = Endpoint {
            node_id: "0000000000000000000000000000000a".into(),
            name: "alice".into(),
            host_id: "h".into(),
            process_id: "p".into(),
            language: "rust".into(),
            capabilities: vec![],
        };
        let claim = |owner: &str| TicketClaim {
            len: 1,
            owner: owner.into(),
            addr: Some("tcp://10.0.0.1:7000".into()),
            lease: 1,
            token: vec![0; 32],
            digest: TicketDigest::Blake3([0; 32]),
            ttl_ms: 1000,
            lazy: false,
        };
        let asked = std::cell::Cell::new(false);
        let label = owner_label_at_receipt(&claim(&sender.node_id), &sender, |_| {
            asked.set(true);
            None
        });
        assert_eq!(label, "alice (tcp://10.0.0.1:7000)");
        assert!(!asked.get(), "the sender is not looked up");
        let third = "0000000000000000000000000000000c";
        let label = owner_label_at_receipt(&claim(third), &sender, |id| (id == third).then(|| "carol".into()));
        assert_eq!(label, "carol (tcp://10.0.0.1:7000)");
        let label = owner_label_at_receipt(&claim(third), &sender, |_| None);
        assert_eq!(label, "000000000000 (tcp://10.0.0.1:7000)");
    }
}

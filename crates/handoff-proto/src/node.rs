//! [`NodeCore`]: what every connection of a node shares, the same in both drivers: who the
//! node is and what it accepts, its receive budget and receive buffers, its mapping cache,
//! the nonces it sent as a dialer, the lease table of what it sent as tickets, the ids
//! of its ticket requests and the connections it dialed to reach ticket owners. A driver keeps one per node, adds what waits its own way (tasks,
//! a wake pipe), and builds each connection's handshake and receiving half from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_wire::auth::Role;
use handoff_wire::{Endpoint, Limits, Preamble};

use crate::budget::{Account, Budget};
use crate::handshake::{Config, DialerNonces};
use crate::inbound::{Inbound, TypeCheck};
use crate::receive::Receiving;
use crate::recv_buffers::RecvPool;
use crate::shm::idle::{self, HeldForReuse, IdleTimes};
use crate::shm::{MappingCache, SegmentPool};
use crate::ticket_leases::{LeaseConfig, LeaseTable};
use crate::Bounds;

/// Idle mappings a node keeps for reuse, at most (bytes), unless its settings say.
pub const DEFAULT_KEPT_MAPPINGS: usize = 4 << 30;

/// What a node is made of, as its driver's settings say.
pub struct CoreSettings {
    /// Who the node is.
    pub me: Endpoint,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// The limits of an established connection (spec §9).
    pub limits: Limits,
    /// What peers can make the node hold (spec §9.1).
    pub bounds: Bounds,
    /// The preamble the node sends (spec §3).
    pub preamble: Preamble,
    /// The leases of what the node sends as tickets.
    pub leases: LeaseConfig,
    /// Idle bytes of receive buffers the node keeps for reuse.
    pub recv_pool_bytes: usize,
    /// Idle bytes of received segments the node keeps mapped for reuse
    /// ([`DEFAULT_KEPT_MAPPINGS`] unless a driver's settings say).
    pub kept_mapping_bytes: usize,
}

/// What every connection of a node shares (see the module's text).
pub struct NodeCore {
    /// Who the node is.
    pub me: Endpoint,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// The limits of an established connection (spec §9).
    pub limits: Limits,
    /// What peers can make the node hold (spec §9.1).
    pub bounds: Bounds,
    /// The preamble the node sends: version 3 only, or from 2 or 1 by its user's consent.
    pub preamble: Preamble,
    /// Bytes and messages received and not yet taken by the application.
    pub budget: Arc<Budget>,
    /// Warm buffers for large received frames.
    pub recv_pool: RecvPool,
    /// Peers' segments mapped here.
    pub mappings: Arc<MappingCache>,
    /// The nonces the node recently sent as a dialer (spec §5.7 step 3).
    pub dialer_nonces: Arc<DialerNonces>,
    /// The leases of the buffers the node sent as tickets; every connection answers the
    /// holders' requests from it.
    pub leases: Arc<LeaseTable>,
    /// The connections the node dialed to reach ticket owners and keeps, by the owner's
    /// node id (spec §9.1: at most `bounds.max_owner_connections`).
    pub owner_dials: std::sync::Mutex<crate::dialing::OwnerDials<String>>,
    /// The holds on other nodes' buffers that ended here, each owing its owner an
    /// `unlease` (at most `ended_holds::MAX_ENDED_HOLDS`).
    pub ended_holds: crate::ended_holds::EndedHolds,
    /// Ids of the ticket requests the node sends.
    next_request: AtomicU64,
}

impl NodeCore {
    /// A node's shared state, empty.
    pub fn new(settings: CoreSettings) -> NodeCore {
        let bounds = settings.bounds;
        NodeCore {
            me: settings.me,
            secret: settings.secret,
            limits: settings.limits,
            preamble: settings.preamble,
            budget: Budget::new(
                bounds.max_buffered_bytes,
                bounds.max_buffered_bytes_per_peer,
                bounds.min_buffered_bytes_per_peer,
                bounds.max_buffered_messages_per_peer,
            ),
            recv_pool: RecvPool::new(settings.recv_pool_bytes),
            mappings: Arc::new(MappingCache::new(settings.kept_mapping_bytes)),
            dialer_nonces: Arc::new(DialerNonces::new(bounds.handshake_timeout)),
            leases: Arc::new(LeaseTable::new(settings.leases, bounds.max_holders_per_lease)),
            next_request: AtomicU64::new(1),
            owner_dials: std::sync::Mutex::new(crate::dialing::OwnerDials::new(bounds.max_owner_connections)),
            ended_holds: Default::default(),
            bounds,
        }
    }

    /// A claim this node received is held from now on: counted until its hold ends, so
    /// that a connection dialed to its owner is kept meanwhile (spec §9.1).
    pub fn hold(&self, claim: &handoff_wire::TicketClaim) {
        self.dials().held(claim.owner.clone());
    }

    /// The hold on `claim` ended here (its last handle was dropped): its owner's connection
    /// may be let go, and the owner is owed an `unlease`; whether one was queued in
    /// [`ended_holds`](Self::ended_holds) for the driver to send (at most
    /// `ended_holds::MAX_ENDED_HOLDS`: past them, the hold ends by its deadline).
    pub fn end_hold(&self, claim: &handoff_wire::TicketClaim) -> bool {
        self.dials().let_go(&claim.owner);
        self.ended_holds.push(claim)
    }

    /// This node's last connection to node `node_id` ended: a kept connection to it (as a
    /// ticket owner) is no longer kept, and every hold it had on our leases ends (§7.7).
    /// Returns how many holds ended.
    pub fn last_connection_ended(&self, node_id: &str) -> usize {
        self.dials().ended(&node_id.to_string());
        self.leases.drop_holder(node_id)
    }

    /// The kept owner connections (a panic elsewhere while they were held leaves them usable).
    pub fn dials(&self) -> std::sync::MutexGuard<'_, crate::dialing::OwnerDials<String>> {
        self.owner_dials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The id of the node's next ticket request.
    pub fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// The handshake of a fresh connection that we dialed or accepted (`role`), at `now`
    /// on the driver's clock: the node's ident as `implementation` with its addresses, and a
    /// fresh nonce.
    pub fn handshake_config(
        &self,
        role: Role,
        implementation: &str,
        listen: Option<String>,
        unix: Option<String>,
        now: Instant,
    ) -> Config {
        Config {
            ident: crate::peers::ident_of(&self.me, implementation, listen, unix),
            secret: self.secret.clone(),
            limits: self.limits,
            preamble: self.preamble,
            role,
            nonce: crate::identity::random_bytes(),
            deadline: now + self.bounds.handshake_timeout,
            progress_timeout: self.bounds.progress_timeout,
            dialed: self.dialer_nonces.clone(),
        }
    }

    /// The receiving half of a connection established with node `peer_id`, a same-host
    /// one (shared memory) if `shm`: the node's limits, receive buffers, budget (charged to
    /// `account`), lease table and mapping cache; `known_type` checks each message's type
    /// name.
    pub fn inbound(&self, shm: bool, known_type: TypeCheck, account: Arc<Account>, peer_id: &str) -> Inbound {
        Inbound::new(
            Receiving::new(self.limits, shm).with_device_memory(self.me.has_capability(handoff_wire::CAP_CUDA)),
            known_type,
            self.recv_pool.clone(),
            self.bounds.progress_timeout,
        )
        .with_budget(self.budget.clone(), account)
        .with_owner(self.leases.clone(), peer_id, &self.me.node_id)
        .with_mappings(self.mappings.clone())
    }

    /// Gives back what was idle long enough (the process's segment pool too); how long
    /// until the next sweep ([`IdleTimes::sweep`]).
    pub fn sweep_idle(&self, times: &IdleTimes, now: Instant) -> Duration {
        times.sweep(SegmentPool::global(), &self.mappings, &self.recv_pool, now)
    }

    /// What the node (and the process's segment pool) holds only for reuse.
    pub fn held_for_reuse(&self) -> HeldForReuse {
        HeldForReuse::of(SegmentPool::global(), &self.mappings, &self.recv_pool)
    }

    /// Gives back now everything the node (and the process's segment pool) holds only for
    /// reuse ([`idle::give_back`]); what it held.
    pub fn give_back(&self) -> HeldForReuse {
        idle::give_back(SegmentPool::global(), &self.mappings, &self.recv_pool)
    }
}

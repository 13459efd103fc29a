//! Who a node is: node ids, the process instance id and the host identity.

use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// `N` bytes from the operating system's random source, for everything a peer must not
/// guess or see twice: node and process ids, handshake nonces, ticket tokens.
///
/// Not a user-space generator such as `rand`'s thread-local one: a forked child inherits
/// that generator's state, and parent and child then draw the same "random" bytes (the
/// same nonce in two handshakes, the same tokens for two owners' leases). Python forks
/// processes that have this engine loaded (Dask's workers, `multiprocessing`).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source failed");
    out
}

/// A fresh random 128-bit id, lower-case hex.
pub fn random_id() -> String {
    hex::encode(random_bytes::<16>())
}

/// The random id of this process instance, the same for every node in the process; a
/// forked child gets its own.
pub fn process_id() -> &'static str {
    static ID: Mutex<Option<(u32, &'static str)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut id = ID.lock().unwrap_or_else(|p| p.into_inner());
    match *id {
        Some((of, id)) if of == pid => id,
        _ => {
            // One small string per process instance (a fork makes a new one).
            let fresh: &'static str = Box::leak(random_id().into_boxed_str());
            *id = Some((pid, fresh));
            fresh
        }
    }
}

/// The host identity of this machine: a hash of the kernel's machine id, its boot id and
/// this process's network namespace (`spec/WIRE.md` §5.2).
///
/// Two processes on one machine (and one boot) in one network namespace get the same
/// value; processes in different network namespaces (containers, the hosts of
/// `scripts/netlab`) get different values and talk over TCP. The environment variable
/// `HANDOFF_HOST_ID` overrides it, as does `NodeBuilder::host_id`, so that tests can make
/// several "hosts" in one namespace.
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("HANDOFF_HOST_ID") {
        if !id.is_empty() {
            return id;
        }
    }
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let machine = read("/etc/machine-id");
        let machine = if machine.is_empty() {
            read("/var/lib/dbus/machine-id")
        } else {
            machine
        };
        let boot = read("/proc/sys/kernel/random/boot_id");
        let hostname = if machine.is_empty() && boot.is_empty() {
            read("/etc/hostname")
        } else {
            String::new()
        };
        let netns = std::fs::read_link("/proc/self/ns/net")
            .ok()
            .and_then(|target| target.to_str().map(str::to_string))
            .unwrap_or_default();
        derive_host_id(&machine, &boot, &hostname, &netns)
    })
    .clone()
}

/// The reference derivation of §5.2 from its inputs: the lower-case hex of the first 8 bytes
/// of `SHA-256("handoff-host-id\0" | machine | 00 | boot [| hostname] | 00 | netns)`, where
/// `hostname` is used only when `machine` and `boot` are both empty.
pub fn derive_host_id(machine: &str, boot: &str, hostname: &str, netns: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"handoff-host-id\0");
    h.update(machine.as_bytes());
    h.update([0]);
    h.update(boot.as_bytes());
    if machine.is_empty() && boot.is_empty() {
        h.update(hostname.as_bytes());
    }
    h.update([0]);
    h.update(netns.as_bytes());
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::derive_host_id;

    /// The worked examples of `spec/WIRE.md` §5.2; the Python peer checks the same ones.
    #[test]
    fn the_reference_derivation_gives_the_specs_examples() {
        let machine = "0123456789abcdef0123456789abcdef";
        let boot = "5f2c1b7e-9a3d-4c8e-b1f0-2d6e8a4c9b37";
        assert_eq!(
            derive_host_id(machine, boot, "", "net:[4026531840]"),
            "911174bd877e6514"
        );
        assert_eq!(
            derive_host_id(machine, boot, "", "net:[4026532999]"),
            "194d7c9652d9d136"
        );
        assert_eq!(derive_host_id("", "", "box7", "net:[4026531840]"), "988b8172d433bebc");
        // The hostname counts only when machine and boot ids are both missing.
        assert_eq!(
            derive_host_id(machine, boot, "box7", "net:[4026531840]"),
            derive_host_id(machine, boot, "", "net:[4026531840]")
        );
    }
}

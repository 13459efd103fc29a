//! Who a node is: node ids, the process instance id and the host identity.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// A fresh random 128-bit id, lower-case hex.
pub fn random_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The random id of this process instance, the same for every node in the process.
pub fn process_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(random_id)
}

/// The host identity of this machine: a hash of the kernel's machine id and boot id.
///
/// Two processes on one machine (and one boot) get the same value; the environment
/// variable `HANDOFF_HOST_ID` overrides it, as does `NodeBuilder::host_id`, so that tests
/// can make several "hosts" on one machine.
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
        let mut h = Sha256::new();
        h.update(b"handoff-host-id\0");
        h.update(machine.as_bytes());
        h.update([0]);
        h.update(boot.as_bytes());
        if machine.is_empty() && boot.is_empty() {
            h.update(read("/etc/hostname").as_bytes());
        }
        hex::encode(&h.finalize()[..8])
    })
    .clone()
}

//! The nodes of this process, by name, for `inproc://` connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::state::NodeInner;
use crate::{Error, Result};

fn nodes() -> &'static Mutex<HashMap<String, Weak<NodeInner>>> {
    static NODES: OnceLock<Mutex<HashMap<String, Weak<NodeInner>>>> = OnceLock::new();
    NODES.get_or_init(Default::default)
}

/// Adds a starting node; fails if a live node of this process has its name.
pub(crate) fn register(node: &Arc<NodeInner>) -> Result<()> {
    let mut map = nodes().lock().expect("directory lock");
    if let Some(existing) = map.get(&node.ctx.me.name).and_then(Weak::upgrade) {
        if !existing.ctx.is_shut_down() {
            return Err(Error::Config(format!(
                "a node named {:?} already runs in this process",
                node.ctx.me.name
            )));
        }
    }
    map.insert(node.ctx.me.name.clone(), Arc::downgrade(node));
    Ok(())
}

/// The live node named `name`, if any.
pub(crate) fn lookup(name: &str) -> Option<Arc<NodeInner>> {
    nodes()
        .lock()
        .expect("directory lock")
        .get(name)
        .and_then(Weak::upgrade)
        .filter(|n| !n.ctx.is_shut_down())
}

/// Removes `node` (not a newer node of the same name).
pub(crate) fn unregister(name: &str, node: &NodeInner) {
    let mut map = nodes().lock().expect("directory lock");
    if let Some(existing) = map.get(name) {
        if std::ptr::eq(existing.as_ptr(), node) {
            map.remove(name);
        }
    }
}

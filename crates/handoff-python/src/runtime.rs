//! The extension's one tokio runtime: a single worker thread, started on first use, that
//! runs the connections of option (a).

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, started on the first call.
pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("handoff-native-io")
            .enable_io()
            .enable_time()
            .build()
            .expect("handoff._native: the tokio runtime could not start (no thread or no epoll)")
    })
}

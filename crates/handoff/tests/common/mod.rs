//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::time::Duration;

use handoff::{Buffer, Message};
use serde::{Deserialize, Serialize};

/// A message of several buffers, each a frame.
#[derive(Serialize, Deserialize)]
pub struct Frames {
    pub parts: Vec<Buffer>,
}
impl Message for Frames {
    const TYPE_NAME: &'static str = "test.Frames";
}

/// Polls `f` every 5 ms until it holds, failing the test after 10 s.
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

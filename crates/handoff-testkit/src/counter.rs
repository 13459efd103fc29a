//! Request counts kept by the test servers.

use std::sync::{Arc, Mutex};

/// Counts of requests by method, and bytes of response bodies sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// GET requests (whole or ranged).
    pub get: u64,
    /// HEAD requests.
    pub head: u64,
    /// PUT requests.
    pub put: u64,
    /// Any other method (PROPFIND, POST, DELETE, ...).
    pub other: u64,
    /// Bytes of GET response bodies (file server only; the proxy does not parse responses).
    pub bytes_sent: u64,
}

/// A shared request counter, with a log of `METHOD path` lines.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    inner: Arc<Mutex<(RequestCounts, Vec<String>)>>,
}

impl RequestCounter {
    /// Records one request.
    pub fn record(&self, method: &str, path: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match method {
            "GET" => g.0.get += 1,
            "HEAD" => g.0.head += 1,
            "PUT" => g.0.put += 1,
            _ => g.0.other += 1,
        }
        g.1.push(format!("{method} {path}"));
    }

    /// Adds bytes sent.
    pub fn add_bytes(&self, n: u64) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.bytes_sent += n;
    }

    /// The counts so far.
    pub fn counts(&self) -> RequestCounts {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// The GET requests whose path contains `needle`.
    pub fn gets_of(&self, needle: &str) -> usize {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.1.iter()
            .filter(|l| l.starts_with("GET ") && l.contains(needle))
            .count()
    }

    /// Every request seen, as `METHOD path`.
    pub fn log(&self) -> Vec<String> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1.clone()
    }

    /// Forgets everything counted so far.
    pub fn reset(&self) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
    }
}

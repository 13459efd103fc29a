//! The Rust examples of docs/datasets.md, compiled and run as doc tests (`cargo test --doc`, part of
//! `./scripts/test`), so that what a reader copies from the guide works. Only built for rustdoc's tests.

/// docs/datasets.md, the guide to datasets and caches.
#[doc = include_str!("../../../docs/datasets.md")]
pub struct DatasetsGuide;

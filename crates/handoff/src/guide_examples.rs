//! The Rust examples of README.md and docs/rust.md, compiled and run as doc tests (`cargo test --doc`,
//! part of `./scripts/test`), so that what a reader copies from them works. Only built for rustdoc's tests.

/// README.md's Rust example.
#[doc = include_str!("../../../README.md")]
pub struct Readme;

/// docs/rust.md, the Rust library's guide.
#[doc = include_str!("../../../docs/rust.md")]
pub struct RustGuide;

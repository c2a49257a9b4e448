//! berth's fuzz targets as plain functions, `fn(&[u8])`, that panic when a
//! property fails. `fuzz_targets/NAME.rs` hands libFuzzer's input to
//! `NAME`; `tests/fuzz_seeds.rs` in the main crate includes the same module
//! (`src/targets/`) and replays every file of `fuzz/seeds/NAME/` through it
//! on the stable toolchain.

#[path = "targets/mod.rs"]
mod targets;

pub use targets::*;

//! Shared test helpers: temp data dirs, stores on a fake clock, task specs,
//! and running the real `berth` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use berth::clock::FakeClock;
use berth::store::{Options, Store};
use berth::task::TaskSpec;

pub const T0: u64 = 1_800_000_000_000;

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .expect("tempdir")
}

/// Opens `dir` on a fake clock.
pub fn open(dir: &Path, clock: &FakeClock) -> Store {
    Store::open(dir, Options::default(), Arc::new(clock.clone())).expect("open store")
}

pub fn spec(queue: &str, name: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        kind: "ModuleRun".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// The `berth` binary built for these tests.
pub fn berth_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_berth"))
}

/// Runs `berth --data-dir DIR ARGS...`.
pub fn berth(dir: &Path, args: &[&str]) -> Output {
    Command::new(berth_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run berth")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts two texts are equal, showing a line diff when they are not.
pub fn assert_text_eq(actual: &str, expected: &str) {
    if actual == expected {
        return;
    }
    let mut diff = String::new();
    let (a, e): (Vec<_>, Vec<_>) = (actual.lines().collect(), expected.lines().collect());
    for i in 0..a.len().max(e.len()) {
        let (x, y) = (a.get(i).copied(), e.get(i).copied());
        if x != y {
            diff.push_str(&format!(
                "line {}:\n  expected: {:?}\n  actual:   {:?}\n",
                i + 1,
                y,
                x
            ));
        }
    }
    panic!("texts differ:\n{diff}\n--- actual ---\n{actual}");
}

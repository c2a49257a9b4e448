//! The bodies of berth's fuzz targets: one `pub fn NAME(data: &[u8])` per
//! decoder or parser, which panics when a property does not hold. Nothing
//! here depends on libFuzzer: the same functions run under `cargo fuzz`
//! (`fuzz/fuzz_targets/NAME.rs`) and, on the stable toolchain, in
//! `tests/fuzz_seeds.rs`, which includes this module by path and replays
//! every file of `fuzz/seeds/NAME/`.
//!
//! This module installs a counting global allocator ([`alloc::Counting`]) in
//! whatever binary includes it, so that targets can assert how much memory a
//! decoder took.

pub mod alloc;
mod batch;
mod codec;
mod commit_record;
mod config;
mod control;
mod gzip;
mod log_files;
mod store_files;
mod store_ops;
mod transfer;
mod units;

pub use batch::batch;
pub use codec::codec;
pub use commit_record::commit_record;
pub use config::config;
pub use control::control;
pub use gzip::gzip;
pub use log_files::log_files;
pub use store_files::store_files;
pub use store_ops::store_ops;
pub use transfer::transfer;
pub use units::units;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

/// A target's body: it panics when a property does not hold.
pub type Target = fn(&[u8]);

/// Every target by name: the names of `fuzz/fuzz_targets/*.rs` and of the
/// folders in `fuzz/seeds/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("batch", batch),
    ("codec", codec),
    ("commit_record", commit_record),
    ("config", config),
    ("control", control),
    ("gzip", gzip),
    ("log_files", log_files),
    ("store_files", store_files),
    ("store_ops", store_ops),
    ("transfer", transfer),
    ("units", units),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// A new temporary folder for a data dir: in memory (`/dev/shm`) where there
/// is one, as sled's files cost nothing to write there.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    match std::path::Path::new("/dev/shm") {
        shm if shm.is_dir() => b.tempdir_in(shm),
        _ => b.tempdir(),
    }
    .expect("a temp dir")
}

static KEPT: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_kept() {
    let dirs = std::mem::take(&mut *KEPT.lock().unwrap_or_else(|p| p.into_inner()));
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A temporary folder that lives as long as the process (a store that
/// serves every input): removed when the process exits normally (the
/// fuzzer's end, the test harness's end), left behind by a crash.
pub fn process_dir(prefix: &str) -> std::path::PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: atexit(3) registers a function that takes no arguments.
    ONCE.call_once(|| unsafe {
        libc::atexit(remove_kept);
    });
    let dir = temp_dir(prefix).keep();
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(dir.clone());
    dir
}

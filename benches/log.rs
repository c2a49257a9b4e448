//! The log and what is made of it: how fast `berth export` and `berth
//! import` go, and how well a log's commit records compress with zstd (as
//! archive segments and export files hold them) against gzip.
//!
//! Run with `cargo bench --bench log`. Every figure is one line:
//! `bench: NAME VALUE UNIT`; a name fragment after `--` runs only the
//! figures whose names contain it. Each group of figures is one
//! self-contained function with its own data dirs (under the system temp
//! dir; set TMPDIR to measure a real disk).

#[path = "log/disk.rs"]
mod disk;
#[path = "log/replay.rs"]
mod replay;

/// The allocator the `berth` binary uses (tuned, below, only for what a daemon does: `berth::alloc`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::Instant;

use berth::ops::{self, Ctx, Selection};
use berth::store::{Options, Placement, Store};
use berth::task::TaskSpec;
use serde_json::json;

pub fn figure(name: &str, value: f64, unit: &str) {
    let v = if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    };
    println!("bench: {name} {v} {unit}");
}

/// Tasks in the export/import run.
const TASKS: usize = 20_000;
/// Tasks per commit while filling the source data dir.
const PER_COMMIT: usize = 500;
/// Runs of each timed step (the best is reported).
const RUNS: usize = 3;

/// A status-like JSON payload of about 2 KiB: module values with numbers
/// that differ from task to task. (2 KiB, not 4: an import is one commit,
/// and 20,000 tasks of 4 KiB would not fit in one commit record, whose
/// limit is `codec::MAX_RECORD_BYTES`; each task is in it twice.)
fn payload(rng: &mut fastrand::Rng, i: usize) -> serde_json::Value {
    let values: Vec<serde_json::Value> = (0..24)
        .map(|k| {
            json!({
                "name": format!("module-{k}"),
                "replicas": rng.u32(1..9),
                "revision": rng.u64(1..1_000_000),
                "checksum": format!("{:016x}", rng.u64(..)),
            })
        })
        .collect();
    json!({ "task": i, "cluster": "edge", "values": values })
}

fn open(dir: &Path) -> Store {
    Store::open(dir, Options::default(), berth::clock::system()).expect("Store::open")
}

/// A data dir with `TASKS` tasks over 10 queues, `PER_COMMIT` per commit.
fn fill(dir: &Path) -> Store {
    let store = open(dir);
    let mut rng = fastrand::Rng::with_seed(7);
    let budget = *store.budget();
    for chunk in 0..TASKS / PER_COMMIT {
        let mut w = store.write();
        for j in 0..PER_COMMIT {
            let i = chunk * PER_COMMIT + j;
            let spec = TaskSpec {
                queue: format!("queue-{}", i % 10),
                kind: "ModuleRun".into(),
                name: format!("task-{i}"),
                payload: payload(&mut rng, i),
                ..Default::default()
            };
            let task = spec.into_task(w.now(), &budget).expect("a task");
            w.enqueue(task, Some(Placement::Last)).expect("enqueue");
        }
        w.commit().expect("commit");
    }
    store
}

/// `export_mib_per_s` and `import_mib_per_s`: MiB of the export file per
/// second, exporting `TASKS` live tasks and importing them into a fresh data
/// dir (one commit); best of `RUNS`.
fn export_import(want: &dyn Fn(&str) -> bool) {
    let export = want("export_mib_per_s") || want("export_file_mib");
    if !export && !want("import_mib_per_s") {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let source = root.path().join("source");
    let store = fill(&source);
    let file = root.path().join("all.bex");
    let ctx = Ctx::direct(Some(&store), None);
    let mut best = f64::MAX;
    for _ in 0..RUNS {
        let t = Instant::now();
        ops::export(&ctx, &file, &Selection::default()).expect("export");
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mib = std::fs::metadata(&file).expect("the file").len() as f64 / (1 << 20) as f64;
    if export {
        figure("export_mib_per_s", mib / best, "MiB/s");
        figure("export_file_mib", mib, "MiB");
    }
    if !want("import_mib_per_s") {
        return;
    }
    let mut best = f64::MAX;
    for run in 0..RUNS {
        let target = open(&root.path().join(format!("target-{run}")));
        let t = Instant::now();
        let v = ops::import(&Ctx::direct(Some(&target), None), &file, None).expect("import");
        best = best.min(t.elapsed().as_secs_f64());
        assert_eq!(v["tasks"], TASKS);
    }
    figure("import_mib_per_s", mib / best, "MiB/s");
}

/// `archive_ratio_zstd` and `archive_ratio_gzip`: the raw size of the
/// commit records (`e` keys) of a `TASKS`-task run (the enqueues of
/// [`fill`]), each with its length as archive segments hold them, over
/// their size compressed with zstd level 3 (what segments and exports use)
/// and with gzip at its default level.
fn archive_ratios(want: &dyn Fn(&str) -> bool) {
    if !want("archive_ratio_zstd") && !want("archive_ratio_gzip") && !want("archive_raw_mib") {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("source");
    drop(fill(&dir));
    let store = Store::open(&dir, Options::default(), berth::clock::system()).expect("open");
    let records = store.log_bytes_upto(u64::MAX).expect("the log's records");
    drop(store);
    assert_eq!(records.len(), TASKS / PER_COMMIT);
    let raw = berth::frame::pack(&records);
    let zstd = berth::frame::compress(&raw, 3).expect("zstd").len();
    let gzip = berth::budget::gzip(&raw).len();
    figure(
        "archive_raw_mib",
        raw.len() as f64 / (1 << 20) as f64,
        "MiB",
    );
    if want("archive_ratio_zstd") {
        figure("archive_ratio_zstd", raw.len() as f64 / zstd as f64, "x");
    }
    if want("archive_ratio_gzip") {
        figure("archive_ratio_gzip", raw.len() as f64 / gzip as f64, "x");
    }
}

fn main() {
    // As every `berth` process, before anything allocates much.
    berth::alloc::no_huge_pages();
    // `cargo bench` passes `--bench`; a non-flag argument selects the
    // figures whose names contain it; a group of figures measured together
    // (named by the prefix they share) runs when the argument is part of
    // that prefix or begins with it.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let group = |prefix: &str| {
        filter
            .as_deref()
            .is_none_or(|f| prefix.contains(f) || f.starts_with(prefix))
    };
    // The allocator as the commands have it (`export`, `import`, `replay`)...
    export_import(&want);
    archive_ratios(&want);
    if group("replay_") {
        replay::run();
    }
    // ... and as `berth run` tunes it, for what a daemon does.
    berth::alloc::tune();
    if group("checkpoint_") {
        disk::checkpoint();
    }
    // The longest: a million tasks.
    if group("disk_") {
        disk::disk();
    }
}

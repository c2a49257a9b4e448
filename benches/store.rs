//! Store throughput: sync-mode enqueue against a bare sled insert+flush
//! yardstick, group commit with many producers, and payload compression;
//! and (module `scale`) a data dir of a million queued tasks: batch enqueue,
//! open, `queue list` and disk size.
//!
//! Run with `cargo bench --bench store`. Every figure is one line:
//! `bench: NAME VALUE UNIT`. Each throughput measurement runs for a fixed
//! wall time; the scale figures take minutes (`cargo bench --bench store --
//! _1m_` runs only them; see `scale` for `BERTH_BENCH_SCALE_N`).

#[path = "store/scale.rs"]
mod scale;

/// The allocator the `berth` binary uses, tuned as it is (`berth::alloc`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth::budget::{Blob, Budget};
use berth::store::{Durability, Options, Placement, Store};
use berth::task::TaskSpec;
use serde_json::json;

/// Wall time of each timed run.
const RUN: Duration = Duration::from_millis(2500);
/// Untimed warm-up before each run.
const WARMUP: Duration = Duration::from_millis(300);
/// Runs of 1 and of 8 producers, in alternation.
const ROUNDS: usize = 3;

/// The median of some figures (the upper one of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn figure(name: &str, value: f64, unit: &str) {
    let v = if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    };
    println!("bench: {name} {v} {unit}");
}

/// A fresh data dir under the system temp dir (set TMPDIR to measure another
/// disk; a tmpfs /tmp makes every flush free).
fn data_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("creating a temp dir")
}

/// The yardstick: bare sled, one ~200-byte insert and one flush per op.
fn sled_raw_insert_flush() -> f64 {
    let dir = data_dir();
    let db = sled::open(dir.path().join("db")).expect("sled::open");
    let mut value = vec![0u8; 200];
    fastrand::Rng::with_seed(1).fill(&mut value);
    let mut key = 0u64;
    per_second(|| {
        key += 1;
        value[..8].copy_from_slice(&key.to_le_bytes());
        db.insert(key.to_be_bytes(), &value[..]).expect("insert");
        db.flush().expect("flush");
    })
}

/// Runs `op` for [`WARMUP`], then counts its runs for [`RUN`]: runs/s.
fn per_second(mut op: impl FnMut()) -> f64 {
    let warm = Instant::now();
    while warm.elapsed() < WARMUP {
        op();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        op();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn open_store(dir: &std::path::Path, power_safe: bool) -> Store {
    Store::open(
        dir,
        Options {
            durability: Durability::Sync,
            power_safe,
            // `BERTH_BENCH_NO_WAL=1`: without the write-ahead log (a sled
            // flush per commit, the path before 2026-12-06).
            write_ahead_log: std::env::var_os("BERTH_BENCH_NO_WAL").is_none(),
            ..Options::default()
        },
        berth::clock::system(),
    )
    .expect("Store::open")
}

fn enqueue_one(store: &Store, i: u64) {
    enqueue_task(store, format!("task-{i}"), json!({ "i": i }));
}

/// Enqueues one task into `main` in a commit of its own, and waits for it.
fn enqueue_task(store: &Store, name: String, payload: serde_json::Value) {
    let spec = TaskSpec {
        queue: "main".into(),
        kind: "ModuleRun".into(),
        name,
        payload,
        ..Default::default()
    };
    let task = spec
        .into_task(store.clock().now_ms(), store.budget())
        .expect("into_task");
    let mut w = store.write();
    w.enqueue(task, Some(Placement::Last)).expect("enqueue");
    w.commit().expect("commit");
}

/// One producer, one `sync` commit per task, each task with a 200 KiB JSON
/// payload of random letters (gzip keeps about three quarters of it, so
/// sled stores the leaf that holds it as a blob file): tasks/s.
fn enqueue_sync_200kib() -> f64 {
    let dir = data_dir();
    let store = open_store(dir.path(), true);
    let mut rng = fastrand::Rng::with_seed(7);
    let text: String = (0..200 * 1024).map(|_| rng.alphanumeric()).collect();
    let mut i = 0u64;
    per_second(|| {
        i += 1;
        enqueue_task(
            &store,
            format!("large-{i}"),
            json!({ "i": i, "blob": text }),
        );
    })
}

/// `producers` threads, each enqueuing one task per commit and waiting for
/// its ack before the next. Returns (tasks/s, commits per flush).
/// `power_safe` false measures the path without fsync (kill -9 safe only).
fn enqueue_sync(producers: usize, power_safe: bool) -> (f64, f64) {
    let dir = data_dir();
    let store = open_store(dir.path(), power_safe);
    let stop = AtomicBool::new(false);
    let counting = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let barrier = Barrier::new(producers + 1);
    let (elapsed, flushes) = std::thread::scope(|s| {
        for p in 0..producers {
            let (store, stop, counting, done, barrier) =
                (&store, &stop, &counting, &done, &barrier);
            s.spawn(move || {
                // As the daemon's connection threads do (`threads`).
                berth::threads::short_slice("a producer");
                barrier.wait();
                let mut i = (p as u64) << 40;
                while !stop.load(Ordering::Relaxed) {
                    enqueue_one(store, i);
                    i += 1;
                    if counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        barrier.wait();
        std::thread::sleep(WARMUP);
        let flushes_before = store.flush_count();
        let start = Instant::now();
        counting.store(true, Ordering::Relaxed);
        std::thread::sleep(RUN);
        counting.store(false, Ordering::Relaxed);
        let elapsed = start.elapsed();
        let flushes = store.flush_count() - flushes_before;
        stop.store(true, Ordering::Relaxed);
        (elapsed, flushes)
    });
    let n = done.load(Ordering::Relaxed);
    (
        n as f64 / elapsed.as_secs_f64(),
        n as f64 / flushes.max(1) as f64,
    )
}

/// About 1 MiB of status-like JSON: modules with names, flags, numbers,
/// versions and checksums (the checksums keep it from compressing trivially).
fn realistic_json(target: usize) -> serde_json::Value {
    let mut rng = fastrand::Rng::with_seed(42);
    let words = [
        "cert-manager",
        "ingress-nginx",
        "prometheus",
        "node-local-dns",
        "cni-cilium",
        "control-plane-manager",
        "descheduler",
        "log-shipper",
        "user-authn",
        "flow-schema",
    ];
    let mut items = Vec::new();
    let mut len = 2;
    let mut i = 0u64;
    while len < target {
        let hex: String = (0..40)
            .map(|_| char::from_digit(rng.u32(0..16), 16).unwrap())
            .collect();
        let phase = ["Ready", "Pending", "Failed"][rng.usize(0..3)];
        let item = json!({
            "module": format!("{}-{}", words[rng.usize(0..words.len())], i),
            "enabled": rng.bool(),
            "phase": phase,
            "weight": rng.u32(0..1000),
            "replicas": rng.u8(1..6),
            "version": format!("v1.{}.{}", rng.u8(0..40), rng.u8(0..20)),
            "checksum": hex,
            "flags": {"helm": rng.bool(), "hooks": rng.u8(0..12), "crds": rng.bool()},
            "tags": ["edge", format!("zone-{}", rng.u8(0..8))],
            "updatedAt": 1_700_000_000_000u64 + rng.u64(0..10_000_000_000),
        });
        len += serde_json::to_vec(&item).unwrap().len() + 1;
        items.push(item);
        i += 1;
    }
    json!(items)
}

/// MiB of JSON input per second through `Blob::from_json` (serialize + gzip).
fn compress_1mib_json() -> f64 {
    let value = realistic_json(1 << 20);
    let raw_len = serde_json::to_vec(&value).unwrap().len();
    let budget = Budget::default();
    let blob = Blob::from_json("payload", &value, &budget).expect("from_json");
    assert!(blob.compressed, "a 1 MiB payload must be compressed");
    let per_s = per_second(|| {
        std::hint::black_box(Blob::from_json("payload", &value, &budget).unwrap());
    });
    figure(
        "compress_1mib_json_ratio",
        raw_len as f64 / blob.bytes.len() as f64,
        "x",
    );
    raw_len as f64 * per_s / (1 << 20) as f64
}

fn main() {
    berth::alloc::tune();
    // Started by `scale` as its open child: do that and exit.
    scale::child_main();
    // `cargo bench` passes `--bench`; a non-flag argument selects the
    // figures whose names contain it (ratios print when both sides ran).
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));

    // The raw yardstick first, in a fresh process: sled's process-wide
    // concurrency control switches to a read-write lock for good once any
    // batch has been applied.
    let raw = want("sled_raw_insert_flush").then(|| {
        let raw = sled_raw_insert_flush();
        figure("sled_raw_insert_flush", raw, "tasks/s");
        raw
    });
    // 1 and 8 producers in alternation, ROUNDS times: the disk's latency
    // drifts by twofold within minutes here, so each figure is the median
    // of its runs, and `enqueue_sync_8_vs_1` the median of the ratios of
    // runs made side by side.
    let name = |n: usize| format!("enqueue_sync_{n}_producer{}", if n == 1 { "" } else { "s" });
    let mut by_n = Vec::new();
    let mut ratios = Vec::new();
    let paired: Vec<usize> = [1, 8].into_iter().filter(|n| want(&name(*n))).collect();
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); paired.len()];
    for _ in 0..ROUNDS {
        for (i, n) in paired.iter().enumerate() {
            runs[i].push(enqueue_sync(*n, true));
        }
        if let [one, eight] = &runs[..] {
            ratios.push(eight[eight.len() - 1].0 / one[one.len() - 1].0);
        }
    }
    for (n, runs) in paired.iter().zip(&runs) {
        let rate = median(runs.iter().map(|r| r.0).collect());
        figure(&name(*n), rate, "tasks/s");
        figure(
            &format!("enqueue_sync_{n}_commits_per_flush"),
            median(runs.iter().map(|r| r.1).collect()),
            "commits",
        );
        by_n.push((*n, rate));
    }
    if !ratios.is_empty() {
        figure("enqueue_sync_8_vs_1", median(ratios), "x");
    }
    if want(&name(64)) {
        let (rate, per_flush) = enqueue_sync(64, true);
        figure(&name(64), rate, "tasks/s");
        figure("enqueue_sync_64_commits_per_flush", per_flush, "commits");
        by_n.push((64, rate));
    }
    // The same without berth's fsyncs (sled's sync_file_range, and its own
    // fdatasync at most once per 512 KiB of log before it may reuse log
    // space: safe against a process crash, not a power cut), to show what
    // power safety costs.
    for n in [1usize, 8] {
        let name = format!(
            "enqueue_sync_{n}_producer{}_no_fsync",
            if n == 1 { "" } else { "s" }
        );
        if !want(&name) {
            continue;
        }
        let (rate, _) = enqueue_sync(n, false);
        figure(&name, rate, "tasks/s");
        if let Some((_, safe)) = by_n.iter().find(|(m, _)| *m == n) {
            figure(&format!("power_safe_cost_{n}"), rate / safe, "x");
        }
    }
    if want("enqueue_sync_200kib") {
        figure("enqueue_sync_200kib", enqueue_sync_200kib(), "tasks/s");
    }
    if want("compress_1mib_json") {
        figure("compress_1mib_json", compress_1mib_json(), "MiB/s");
    }
    let one = by_n.iter().find(|(n, _)| *n == 1).map(|(_, r)| *r);
    if let (Some(raw), Some(one)) = (raw, one) {
        figure("enqueue_sync_1_vs_raw", one / raw, "x");
    }
    if let (Some(one), Some((_, rate))) = (one, by_n.iter().find(|(n, _)| *n == 64)) {
        figure("enqueue_sync_64_vs_1", rate / one, "x");
    }
    if scale::NAMES.iter().any(|n| want(n)) {
        scale::run(&want);
    }
}

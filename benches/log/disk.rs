//! The log's disk and checkpoint figures (part of `cargo bench --bench log`):
//!
//! - `disk_after_100k_mib`, `disk_after_500k_mib`, `disk_after_1m_mib`: the
//!   data dir's size (archive and checkpoints included) after that many
//!   no-op tasks with 4 KiB payloads ran to completion (`batched`) under
//!   the default retention (a pass after every 10,000 tasks, as a daemon
//!   under that load would run one every minute), and
//!   `disk_growth_1m_vs_100k` (x);
//! - `checkpoint_100k_live_ms`: a checkpoint of 100,000 live tasks, and
//!   `checkpoint_commit_max_ms`: the longest commit of a writer that
//!   commits all along meanwhile (how long the checkpoint stalls writers),
//!   beside `commit_max_without_checkpoint_ms`, the same writer's longest
//!   commit without a checkpoint.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::retention::{self, Retention};
use berth::store::{Durability, Options, Placement, Store};
use berth::task::TaskSpec;
use serde_json::json;

const QUEUES: usize = 10;
const CHUNK: usize = 10_000;

use super::figure;

fn open_store(dir: &Path, durability: Durability) -> Arc<Store> {
    Arc::new(
        Store::open(
            dir,
            Options {
                durability,
                ..Options::default()
            },
            berth::clock::system(),
        )
        .expect("Store::open"),
    )
}

/// Bytes of every file under `dir`.
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            total += if meta.is_dir() {
                du(&e.path())
            } else {
                meta.len()
            };
        }
    }
    total
}

/// A 4 KiB payload, different for every task (a JSON object with a text of
/// letters and digits, as a handler's input might be).
fn payload(rng: &mut fastrand::Rng, i: usize) -> serde_json::Value {
    let text: String = (0..4000).map(|_| rng.alphanumeric()).collect();
    json!({ "i": i, "data": text })
}

pub fn disk() {
    let dir = tempfile::tempdir().expect("temp dir");
    // `batched` (flushed every 100 ms): what is measured is the disk the
    // data dir takes, which the flush mode does not change; `sync` makes
    // the million tasks take several times longer.
    let store = open_store(
        dir.path(),
        Durability::Batched {
            interval: Duration::from_millis(100),
        },
    );
    let mut h = Handlers::new();
    h.register("Noop", |_ctx: &TaskContext| Outcome::success());
    let engine = Engine::new(
        store.clone(),
        h,
        EngineConfig {
            parallel_queues: QUEUES,
            ..EngineConfig::default()
        },
    )
    .expect("Engine::new");
    let r = Retention::default();
    let mut rng = fastrand::Rng::with_seed(1);
    let mut done = 0;
    let mut at_100k = 0.0;
    let start = Instant::now();
    for (target, name) in [
        (100_000, "disk_after_100k_mib"),
        (500_000, "disk_after_500k_mib"),
        (1_000_000, "disk_after_1m_mib"),
    ] {
        while done < target {
            for b in 0..CHUNK / 1000 {
                let specs: Vec<TaskSpec> = (0..1000)
                    .map(|j| {
                        let i = done + b * 1000 + j;
                        TaskSpec {
                            queue: format!("q{}", i % QUEUES),
                            kind: "Noop".into(),
                            name: format!("task-{i}"),
                            payload: payload(&mut rng, i),
                            ..Default::default()
                        }
                    })
                    .collect();
                engine.enqueue_batch(specs).expect("enqueue_batch");
            }
            engine.run_until_idle().expect("run_until_idle");
            retention::pass(&store, &r).expect("a retention pass");
            done += CHUNK;
            if done % 100_000 == 0 {
                where_it_is(dir.path(), &store, done, start);
            }
        }
        let mib = du(dir.path()) as f64 / (1 << 20) as f64;
        figure(name, mib, "MiB");
        if target == 100_000 {
            at_100k = mib;
        }
        if target == 1_000_000 {
            figure("disk_growth_1m_vs_100k", mib / at_100k, "x");
        }
    }
}

/// Says on stderr where the data dir's bytes are.
fn where_it_is(dir: &Path, store: &Store, done: usize, start: Instant) {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let part = |p: &str| mib(du(&dir.join(p)));
    let db_file = std::fs::metadata(dir.join("db/db")).map_or(0, |m| m.len());
    eprintln!(
        "{done} tasks in {:.0} s: {:.0} MiB (log from event {}, {} finished kept): \
         db/db {:.0}, db/blobs {:.0}, archive {:.0}, checkpoints {:.0} MiB",
        start.elapsed().as_secs_f64(),
        mib(du(dir)),
        store.log_start().unwrap_or(0),
        store.history().len(),
        mib(db_file),
        part("db/blobs"),
        part("archive"),
        part("checkpoints"),
    );
}

pub fn checkpoint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_store(dir.path(), Durability::Sync);
    let mut rng = fastrand::Rng::with_seed(2);
    for b in 0..100 {
        let specs: Vec<TaskSpec> = (0..1000)
            .map(|j| {
                let i = b * 1000 + j;
                TaskSpec {
                    queue: format!("q{}", i % QUEUES),
                    kind: "Noop".into(),
                    name: format!("task-{i}"),
                    payload: json!({ "i": i, "tag": rng.u64(..) }),
                    ..Default::default()
                }
            })
            .collect();
        berth::submit::enqueue_batch(&store, specs).expect("enqueue_batch");
    }
    // The longest commit of a writer that commits all along, first for
    // 600 ms alone, then beside a checkpoint.
    let writer = |store: Arc<Store>, stop: Arc<AtomicBool>| {
        std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let spec = TaskSpec {
                    queue: "w".into(),
                    kind: "Noop".into(),
                    name: format!("w-{n}"),
                    ..Default::default()
                };
                berth::submit::enqueue_one(&store, spec, Placement::Last).expect("enqueue");
                longest = longest.max(t.elapsed());
                n += 1;
            }
            (longest, n)
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let alone = writer(store.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::SeqCst);
    let (longest_alone, _) = alone.join().expect("writer");
    let stop = Arc::new(AtomicBool::new(false));
    let beside = writer(store.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let snap = store.snapshot().expect("snapshot");
    berth::checkpoint::write(dir.path(), &snap).expect("write the checkpoint");
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let (longest, commits) = beside.join().expect("writer");
    eprintln!(
        "checkpoint of {} live tasks in {took:?}; {commits} commits beside it, the longest \
         {longest:?} (alone: {longest_alone:?})",
        snap.model.live.len()
    );
    figure("checkpoint_100k_live_ms", took.as_secs_f64() * 1000.0, "ms");
    figure(
        "checkpoint_commit_max_ms",
        longest.as_secs_f64() * 1000.0,
        "ms",
    );
    figure(
        "commit_max_without_checkpoint_ms",
        longest_alone.as_secs_f64() * 1000.0,
        "ms",
    );
}

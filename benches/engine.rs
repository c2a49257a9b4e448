//! Engine throughput and latency: a same-weight group of sleeping tasks
//! spread over the parallel queues, end-to-end no-op tasks in sync mode, a
//! group of 10,000 no-op tasks against the same tasks as singles (whether a
//! group's cost grows linearly with its size), and the CPU an idle engine
//! burns.
//!
//! Run with `cargo bench --bench engine`. Every figure is one line:
//! `bench: NAME VALUE UNIT`. No logger is installed, so the engine's
//! per-task `log::info!` calls cost next to nothing.

/// The allocator the `berth` binary uses, tuned as it is (`berth::alloc`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::store::{Durability, Options, Store};
use berth::task::TaskSpec;
use serde_json::json;

/// Runs of the group figure; the best and the median are printed.
const GROUP_RUNS: usize = 3;
/// Children in the group, and how long each sleeps.
const GROUP_TASKS: usize = 100;
const GROUP_SLEEP: Duration = Duration::from_millis(50);
/// How long a running engine idles before the group arrives: not a multiple
/// of the loop's 100 ms idle poll.
const RUNNING_SETTLE: Duration = Duration::from_millis(350);
/// Parallel queues (and named queues in the end-to-end figure).
const QUEUES: usize = 10;
/// Tasks in the end-to-end figure, and how many go in one `enqueue_batch`.
const E2E_TASKS: usize = 100_000;
const E2E_BATCH: usize = 10_000;
/// No-op tasks in the big group figure and in its singles counterpart.
const BIG_GROUP_TASKS: usize = 10_000;
/// Wall time over which idle CPU is measured, after a short settle.
const IDLE_RUN: Duration = Duration::from_secs(5);
const IDLE_SETTLE: Duration = Duration::from_millis(500);

fn figure(name: &str, value: f64, unit: &str) {
    let v = if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    };
    println!("bench: {name} {v} {unit}");
}

/// A fresh data dir under the system temp dir (set TMPDIR to measure another
/// disk; a tmpfs /tmp makes every flush free).
fn data_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("creating a temp dir")
}

fn open_store(dir: &std::path::Path) -> Arc<Store> {
    Arc::new(
        Store::open(
            dir,
            Options {
                durability: Durability::Sync,
                // `BERTH_BENCH_NO_WAL=1`: without the write-ahead log (a sled
                // flush per commit, the path before 2026-12-06).
                write_ahead_log: std::env::var_os("BERTH_BENCH_NO_WAL").is_none(),
                ..Options::default()
            },
            berth::clock::system(),
        )
        .expect("Store::open"),
    )
}

fn engine(store: &Arc<Store>, handlers: Handlers) -> Engine {
    Engine::new(
        store.clone(),
        handlers,
        EngineConfig {
            parallel_queues: QUEUES,
            ..EngineConfig::default()
        },
    )
    .expect("Engine::new")
}

/// Handlers whose one kind, `Sleep`, sleeps 50 ms and succeeds.
fn sleep_handlers() -> Handlers {
    let mut h = Handlers::new();
    h.register("Sleep", |_ctx: &TaskContext| {
        std::thread::sleep(GROUP_SLEEP);
        Outcome::success()
    });
    h
}

/// 100 specs of one weight in one queue: one group.
fn group_specs() -> Vec<TaskSpec> {
    (0..GROUP_TASKS)
        .map(|i| TaskSpec {
            queue: "main".into(),
            kind: "Sleep".into(),
            // Short names: the parent is named "Parallel run for m0, m1, ..."
            // and a task name may be at most 512 bytes (100 children: 505).
            name: format!("m{i}"),
            weight: Some(1),
            ..Default::default()
        })
        .collect()
}

/// One group of 100 sleeping children: seconds from just before the enqueue
/// to `run_until_idle` returning. Ideal: 100 / 10 queues x 50 ms = 0.5 s.
fn group_once() -> f64 {
    let dir = data_dir();
    let store = open_store(dir.path());
    let engine = engine(&store, sleep_handlers());
    let specs = group_specs();
    let start = Instant::now();
    let ids = engine.enqueue_batch(specs).expect("enqueue_batch");
    let summary = engine.run_until_idle().expect("run_until_idle");
    let wall = start.elapsed().as_secs_f64();
    assert_eq!(ids.len(), 1, "one group parent");
    // Every child plus the parent.
    assert_eq!(summary.tally.succeeded, GROUP_TASKS as u64 + 1);
    assert_eq!(store.queued_total(), 0);
    wall
}

/// The same group handed to an engine that is already running (and idle):
/// seconds from just before the enqueue until the group has left its queue.
/// The enqueue lands between two of the loop's idle polls, as it would in a
/// daemon, so a dispatch that waits for the next poll shows here.
fn group_running_once() -> f64 {
    let dir = data_dir();
    let store = open_store(dir.path());
    let engine = engine(&store, sleep_handlers());
    let stop = engine.stop_handle();
    std::thread::scope(|s| {
        let runner = s.spawn(|| engine.run());
        std::thread::sleep(RUNNING_SETTLE);
        let start = Instant::now();
        engine.enqueue_batch(group_specs()).expect("enqueue_batch");
        while store.queued_total() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let wall = start.elapsed().as_secs_f64();
        stop.stop();
        let summary = runner
            .join()
            .expect("engine thread panicked")
            .expect("engine.run");
        assert_eq!(summary.tally.succeeded, GROUP_TASKS as u64 + 1);
        wall
    })
}

fn best_and_median(name: &str, run: fn() -> f64) {
    let mut runs: Vec<f64> = (0..GROUP_RUNS).map(|_| run()).collect();
    runs.sort_by(f64::total_cmp);
    figure(name, runs[0], "s");
    figure(&format!("{name}_median"), runs[runs.len() / 2], "s");
}

/// Runs of the end-to-end figure: the disk's latency and the neighbours'
/// load drift by a quarter or more from one run to the next on a small VM
/// (single runs of one build: 19,784-29,930 tasks/s), so the figures are
/// those of the median run.
const E2E_RUNS: usize = 3;

/// One end-to-end run's figures.
struct E2eRun {
    enqueue: f64,
    run: f64,
    tasks_per_flush: f64,
    flush_mean_us: f64,
    flushing_share: f64,
}

/// 100,000 no-op tasks over 10 named queues in sync mode, [`E2E_RUNS`]
/// times, each on a fresh data dir. Prints the figures of the run whose
/// rate is the median: the enqueue rate, the run rate (enqueue excluded),
/// how many tasks each flush carried and how long the flushes took; every
/// run's rates go to stderr.
fn e2e_noop_sync() {
    let mut runs: Vec<E2eRun> = (0..E2E_RUNS).map(|_| e2e_noop_sync_once()).collect();
    eprintln!(
        "e2e_noop_sync: runs of {:?} tasks/s",
        runs.iter()
            .map(|r| r.run.round() as u64)
            .collect::<Vec<_>>()
    );
    runs.sort_by(|a, b| a.run.total_cmp(&b.run));
    let m = &runs[runs.len() / 2];
    figure("e2e_noop_sync_enqueue", m.enqueue, "tasks/s");
    figure("e2e_noop_sync", m.run, "tasks/s");
    figure("e2e_noop_sync_tasks_per_flush", m.tasks_per_flush, "tasks");
    figure("e2e_noop_sync_flush_mean_us", m.flush_mean_us, "us");
    figure("e2e_noop_sync_flushing_share", m.flushing_share, "x");
}

fn e2e_noop_sync_once() -> E2eRun {
    let dir = data_dir();
    let store = open_store(dir.path());
    let mut h = Handlers::new();
    h.register("Noop", |_ctx: &TaskContext| Outcome::success());
    let engine = engine(&store, h);
    let specs = |batch: usize| -> Vec<TaskSpec> {
        (0..E2E_BATCH)
            .map(|j| {
                let i = batch * E2E_BATCH + j;
                TaskSpec {
                    queue: format!("q{}", i % QUEUES),
                    kind: "Noop".into(),
                    name: format!("task-{i}"),
                    payload: json!({ "i": i }),
                    ..Default::default()
                }
            })
            .collect()
    };
    let batches: Vec<Vec<TaskSpec>> = (0..E2E_TASKS / E2E_BATCH).map(specs).collect();

    let start = Instant::now();
    for b in batches {
        engine.enqueue_batch(b).expect("enqueue_batch");
    }
    let enqueue = start.elapsed().as_secs_f64();
    assert_eq!(store.queued_total(), E2E_TASKS);

    let flushes_before = store.flush_count();
    let flush_time_before = store.flush_stats().sum_seconds;
    let start = Instant::now();
    let summary = engine.run_until_idle().expect("run_until_idle");
    let run = start.elapsed().as_secs_f64();
    let flushes = store.flush_count() - flushes_before;
    let flush_time = store.flush_stats().sum_seconds - flush_time_before;
    assert_eq!(summary.tally.succeeded, E2E_TASKS as u64);
    assert_eq!(summary.tally.failed_attempts, 0);
    assert_eq!(store.queued_total(), 0);
    assert!(store.live_tasks().is_empty(), "every task moved to history");

    E2eRun {
        enqueue: E2E_TASKS as f64 / enqueue,
        run: E2E_TASKS as f64 / run,
        tasks_per_flush: E2E_TASKS as f64 / flushes.max(1) as f64,
        flush_mean_us: flush_time * 1e6 / flushes.max(1) as f64,
        flushing_share: flush_time / run,
    }
}

/// Writes one 4 KiB block `n` times at an offset already written and
/// synced, each followed by an `fdatasync`, in a file in the bench's temp
/// dir: the cheapest durable write this disk offers (no file size or
/// extent to journal). Returns the median latency in microseconds.
fn disk_fdatasync_us(n: usize) -> f64 {
    use std::os::unix::fs::FileExt;
    let dir = data_dir();
    let file = std::fs::File::create(dir.path().join("floor")).expect("creating the floor file");
    let block = vec![0x5a_u8; 4096];
    file.write_all_at(&vec![0; 1 << 20], 0).expect("writing");
    file.sync_all().expect("fsync");
    let mut took: Vec<f64> = (0..n)
        .map(|i| {
            let t = Instant::now();
            file.write_all_at(&block, (i % 256) as u64 * 4096)
                .expect("writing");
            file.sync_data().expect("fdatasync");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    took.sort_by(f64::total_cmp);
    took[n / 2]
}

/// The yardstick for `e2e_noop_sync`: a queue runs its head alone and
/// starts the next one only once that start is durable, so each queue
/// advances at most one task per flush. With the disk's cheapest flush and
/// nothing else, 10 queues run at most 10 / that flush's latency.
fn e2e_floor() {
    let us = disk_fdatasync_us(2_000);
    figure("disk_fdatasync_us", us, "us");
    figure(
        "e2e_noop_sync_disk_ceiling",
        QUEUES as f64 * 1e6 / us,
        "tasks/s",
    );
}

fn noop_handlers() -> Handlers {
    let mut h = Handlers::new();
    h.register("Noop", |_ctx: &TaskContext| Outcome::success());
    h
}

/// 10,000 no-op specs of one weight in `main`: one group, whose parent runs
/// in `main` and whose children the engine spreads over the parallel queues.
fn big_group_specs() -> Vec<TaskSpec> {
    (0..BIG_GROUP_TASKS)
        .map(|i| TaskSpec {
            queue: "main".into(),
            kind: "Noop".into(),
            name: format!("g{i}"),
            payload: json!({ "i": i }),
            weight: Some(1),
            ..Default::default()
        })
        .collect()
}

/// The same 10,000 no-op tasks as singles: round robin over
/// `parallel_queue_0..9`, no weight (a spec without a weight never groups).
fn singles_specs() -> Vec<TaskSpec> {
    (0..BIG_GROUP_TASKS)
        .map(|i| TaskSpec {
            queue: berth::queues::parallel_queue(i % QUEUES),
            kind: "Noop".into(),
            name: format!("g{i}"),
            payload: json!({ "i": i }),
            ..Default::default()
        })
        .collect()
}

/// Enqueues `specs` in one `enqueue_batch` and runs to idle. Returns
/// (enqueue seconds, run seconds); asserts that `expect_ids` ids came back
/// and that `expect_succeeded` tasks succeeded, none failed, none is left.
fn noop_batch_run(specs: Vec<TaskSpec>, expect_ids: usize, expect_succeeded: u64) -> (f64, f64) {
    let dir = data_dir();
    let store = open_store(dir.path());
    let engine = engine(&store, noop_handlers());
    let start = Instant::now();
    let ids = engine.enqueue_batch(specs).expect("enqueue_batch");
    let enqueue = start.elapsed().as_secs_f64();
    assert_eq!(ids.len(), expect_ids);
    let (start, cpu0, flushes0) = (Instant::now(), process_cpu(), store.flush_count());
    let summary = engine.run_until_idle().expect("run_until_idle");
    let run = start.elapsed().as_secs_f64();
    eprintln!(
        "run to idle: {run:.3} s wall, {:.3} s cpu, {} flushes",
        (process_cpu() - cpu0).as_secs_f64(),
        store.flush_count() - flushes0
    );
    assert_eq!(summary.tally.succeeded, expect_succeeded);
    assert_eq!(summary.tally.failed_attempts, 0);
    assert_eq!(summary.tally.dead_letters, 0);
    assert_eq!(store.queued_total(), 0);
    assert!(store.live_tasks().is_empty(), "every task moved to history");
    (enqueue, run)
}

/// How many times the 10,000-task group and singles runs are each taken
/// (in turns, so that a slower minute of this VM slows both alike).
const BIG_RUNS: usize = 3;

/// One group of 10,000 no-op children (one parent id; the children and the
/// parent all succeed): (enqueue, run) seconds.
fn group_10000_noop() -> (f64, f64) {
    let n = BIG_GROUP_TASKS;
    noop_batch_run(big_group_specs(), 1, n as u64 + 1)
}

/// The same 10,000 no-op tasks as singles over the 10 parallel queues.
fn singles_10000_noop() -> (f64, f64) {
    let n = BIG_GROUP_TASKS;
    noop_batch_run(singles_specs(), n, n as u64)
}

/// Prints `NAME_enqueue_s` and `NAME_wall` (the best of `runs`, each a
/// pair of seconds) and returns the best run.
fn best_pair(name: &str, runs: &[(f64, f64)]) -> f64 {
    let best = |f: fn(&(f64, f64)) -> f64| runs.iter().map(f).fold(f64::INFINITY, f64::min);
    figure(&format!("{name}_enqueue_s"), best(|r| r.0), "s");
    let run = best(|r| r.1);
    figure(&format!("{name}_wall"), run, "s");
    run
}

/// User + system CPU time of the whole process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0, "getrusage");
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Percent of one core used by a running engine with nothing to do.
fn idle_cpu() -> f64 {
    let dir = data_dir();
    let store = open_store(dir.path());
    let mut h = Handlers::new();
    h.register("Noop", |_ctx: &TaskContext| Outcome::success());
    let engine = engine(&store, h);
    let stop = engine.stop_handle();
    std::thread::scope(|s| {
        let runner = s.spawn(|| engine.run());
        std::thread::sleep(IDLE_SETTLE);
        let (cpu0, wall0) = (process_cpu(), Instant::now());
        std::thread::sleep(IDLE_RUN);
        let (cpu, wall) = (process_cpu() - cpu0, wall0.elapsed());
        stop.stop();
        runner
            .join()
            .expect("engine thread panicked")
            .expect("engine.run");
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    })
}

fn main() {
    berth::alloc::tune();
    // `cargo bench` passes `--bench`; a non-flag argument selects the
    // figures whose names contain it.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));

    if want("group_100x50ms_wall") {
        best_and_median("group_100x50ms_wall", group_once);
    }
    if want("group_100x50ms_running_wall") {
        best_and_median("group_100x50ms_running_wall", group_running_once);
    }
    if want("e2e_noop_sync") {
        e2e_noop_sync();
    }
    if want("disk_fdatasync_us") || want("e2e_noop_sync_disk_ceiling") {
        e2e_floor();
    }
    // The ratio prints when both sides ran (`-- 10000` selects both).
    let (mut groups, mut singles) = (Vec::new(), Vec::new());
    for _ in 0..BIG_RUNS {
        if want("group_10000_noop_wall") {
            groups.push(group_10000_noop());
        }
        if want("singles_10000_noop_wall") {
            singles.push(singles_10000_noop());
        }
    }
    let group = (!groups.is_empty()).then(|| best_pair("group_10000_noop", &groups));
    let singles = (!singles.is_empty()).then(|| best_pair("singles_10000_noop", &singles));
    if let (Some(g), Some(s)) = (group, singles) {
        figure("group_vs_singles_10000", g / s, "x");
    }
    if want("idle_cpu") {
        figure("idle_cpu", idle_cpu(), "%");
    }
}

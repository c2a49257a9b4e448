//! `berth metrics`: what berth can say about itself, as metric families
//! (rendered as Prometheus text by `metrics::render`).
//!
//! From the store, the same with a daemon and without one:
//!
//! - the counters, which the store keeps with every commit (see
//!   `store/counters.rs`): tasks enqueued, merged, finished (by outcome),
//!   removed and retried, attempts started and ended (by outcome), and the
//!   histograms of attempt durations and of the wait from enqueue to first
//!   start. They count from the event where counting began
//!   (`berth_counters_since_event`), and survive restarts;
//! - gauges read now: queue lengths, tasks for other nodes, the oldest wait
//!   per queue, running tasks, group children waiting, the store's size on
//!   disk and the free space, events in the log.
//!
//! Through a daemon it adds what only the running daemon knows: that it
//! runs, since when, its steps and the time of the last one, and its
//! flushes and their durations.

use std::collections::{BTreeMap, HashMap};

use super::{Ctx, OpError};
use crate::metrics::Family;
use crate::queues::{MAIN, parallel_queue};
use crate::routing::Node;
use crate::store::Store;
use crate::store::counters::{self, Counts, KindCounts};
use crate::task::{Status, Task};

/// Every family, in a fixed order.
pub fn metrics(ctx: &Ctx<'_>) -> Result<Vec<Family>, OpError> {
    let mut out = Vec::new();
    let node = super::list::node_of(ctx);
    info(&mut out, node.as_ref());
    daemon(&mut out, ctx);
    if let Some(store) = ctx.store {
        counted(&mut out, store);
        gauges(&mut out, ctx, store, node.as_ref())?;
    }
    Ok(out)
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn info(out: &mut Vec<Family>, node: Option<&Node>) {
    let mut f = Family::gauge("berth_build_info", "The berth build (always 1).");
    f.add(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    out.push(f);
    if let Some(n) = node {
        let mut f = Family::gauge(
            "berth_node_info",
            "This node's name and tags, as routing uses them (always 1).",
        );
        let tags = n.tags.join(",");
        f.add(
            &[("node", n.name.as_deref().unwrap_or("")), ("tags", &tags)],
            1.0,
        );
        out.push(f);
    }
}

/// What only a running daemon knows.
fn daemon(out: &mut Vec<Family>, ctx: &Ctx<'_>) {
    let live = ctx.engine.map(|e| e.live());
    let mut up = Family::gauge(
        "berth_daemon_running",
        "1 while a daemon runs the engine on this data dir, else 0.",
    );
    up.add(
        &[],
        if live.is_some_and(|l| l.running) {
            1.0
        } else {
            0.0
        },
    );
    out.push(up);
    let (Some(live), Some(engine)) = (live, ctx.engine) else {
        return;
    };
    let mut f = Family::gauge(
        "berth_daemon_start_time_seconds",
        "When the daemon started, in seconds since the epoch.",
    );
    f.add(&[], secs(live.started_ms));
    out.push(f);
    let mut f = Family::counter(
        "berth_engine_steps_total",
        "Scheduler steps written (each one store commit of completions and starts).",
    );
    f.add(&[], live.steps as f64);
    out.push(f);
    if let Some(at) = live.last_step_ms {
        let mut f = Family::gauge(
            "berth_last_step_timestamp_seconds",
            "When the scheduler last wrote a step successfully, in seconds since the epoch.",
        );
        f.add(&[], secs(at));
        out.push(f);
    }
    let flushes = engine.store().flush_stats();
    let mut f = Family::histogram(
        "berth_store_flush_duration_seconds",
        "How long each flush of the store took since the daemon started: the write-ahead log's write and fdatasync, or, with write_ahead_log = false, sled's flush and berth's fsyncs.",
    );
    f.add_histogram(
        &[],
        &flushes.cumulative(),
        flushes.sum_seconds,
        flushes.count,
    );
    out.push(f);
    let mut f = Family::counter(
        "berth_store_flush_errors_total",
        "Flushes that failed since the daemon started (the store then stops writing).",
    );
    f.add(&[], flushes.failed as f64);
    out.push(f);
}

/// The final status word of a finished task, as the outcome label says it.
fn outcome_of(status: &str) -> &str {
    match status {
        "failed" => "dead_letter",
        s => s,
    }
}

fn value(c: &KindCounts, name: &str) -> f64 {
    c.values.get(name).copied().unwrap_or(0) as f64
}

/// A counter family with one sample per kind: its count of `counter`.
fn per_kind(counts: &Counts, name: &str, help: &str, counter: &str) -> Family {
    let mut f = Family::counter(name, help);
    for (kind, c) in counts {
        f.add(&[("kind", kind)], value(c, counter));
    }
    f
}

/// The counters the store keeps.
fn counted(out: &mut Vec<Family>, store: &Store) {
    let counting = store.counting();
    let counts = &counting.counts;
    let mut since = Family::gauge(
        "berth_counters_since_event",
        "The event of the log where the store's counters began counting (1: the whole log).",
    );
    since.add(&[], counting.since as f64);
    out.push(since);
    counted_tasks(out, counts);
    counted_attempts(out, counts);
}

/// What became of tasks.
fn counted_tasks(out: &mut Vec<Family>, counts: &Counts) {
    out.push(per_kind(
        counts,
        "berth_tasks_enqueued_total",
        "Tasks enqueued (singles, group parents and children, follow-ups), by kind.",
        counters::ENQUEUED,
    ));
    out.push(per_kind(
        counts,
        "berth_tasks_merged_total",
        "Enqueues merged into a waiting task with the same compaction key, by kind.",
        counters::MERGED,
    ));
    let mut f = Family::counter(
        "berth_tasks_finished_total",
        "Tasks that went to the history, by kind and outcome: succeeded, dead_letter (failed \
         with its attempts used up), cancelled, expired.",
    );
    for (kind, c) in counts {
        let mut outcomes: BTreeMap<&str, f64> =
            ["succeeded", "dead_letter", "cancelled", "expired"]
                .into_iter()
                .map(|o| (o, 0.0))
                .collect();
        for (name, n) in &c.values {
            if let Some(status) = name.strip_prefix(counters::FINISHED) {
                *outcomes.entry(outcome_of(status)).or_default() += *n as f64;
            }
        }
        for (outcome, n) in outcomes {
            f.add(&[("kind", kind), ("outcome", outcome)], n);
        }
    }
    out.push(f);
    out.push(per_kind(
        counts,
        "berth_tasks_removed_total",
        "Tasks removed, by kind: by task remove, and finished tasks pruned from the history \
         by retention.",
        counters::REMOVED,
    ));
    out.push(per_kind(
        counts,
        "berth_tasks_retried_total",
        "Dead letters put back into their queues (task retry), by kind.",
        counters::RETRIED,
    ));
}

/// Attempts, and how long they and the waits before them took.
fn counted_attempts(out: &mut Vec<Family>, counts: &Counts) {
    out.push(per_kind(
        counts,
        "berth_attempts_started_total",
        "Attempts started, by kind.",
        counters::STARTED,
    ));
    let mut f = Family::counter(
        "berth_attempts_total",
        "Attempts that ended, by kind and outcome: succeeded, failed (also attempts a restart \
         found interrupted, and those a stop interrupted at the end of its grace period), \
         requeued (asked to repeat or to be kept).",
    );
    for (kind, c) in counts {
        for (outcome, name) in [
            ("succeeded", counters::ATTEMPT_SUCCEEDED),
            ("failed", counters::ATTEMPT_FAILED),
            ("requeued", counters::ATTEMPT_REQUEUED),
        ] {
            f.add(&[("kind", kind), ("outcome", outcome)], value(c, name));
        }
    }
    out.push(f);
    for (name, help, hist) in [
        (
            "berth_attempt_duration_seconds",
            "How long attempts ran, from their start to their end as the store recorded them, by kind.",
            counters::ATTEMPT_MS,
        ),
        (
            "berth_task_wait_seconds",
            "How long tasks waited from their enqueue to their first start, by kind.",
            counters::WAIT_MS,
        ),
    ] {
        let mut f = Family::histogram(name, help);
        for (kind, c) in counts {
            if let Some(h) = c.histograms.get(hist) {
                f.add_ms_histogram(&[("kind", kind)], h);
            }
        }
        out.push(f);
    }
}

/// What the live tasks say now, per queue.
#[derive(Default)]
struct Scan {
    running: u64,
    waiting_for_parent: u64,
    /// Queue → tasks in it that are not for this node.
    elsewhere: BTreeMap<String, u64>,
    /// Queue → the earliest enqueue time of a task in it that waits for
    /// this node (queued, not running).
    oldest: BTreeMap<String, u64>,
}

fn scan(store: &Store, node: Option<&Node>) -> Scan {
    let mut placed: HashMap<u64, String> = HashMap::new();
    for (q, _) in store.queues() {
        for id in store.queue_ids(&q) {
            placed.insert(id, q.clone());
        }
    }
    let live: HashMap<u64, Task> = store
        .live_tasks()
        .into_iter()
        .flatten()
        .map(|t| (t.id, t))
        .collect();
    // A group parent stays `queued` while its children run: once its group
    // has started, it does not wait.
    let group_started = |t: &Task| {
        !t.children.is_empty()
            && crate::ttl::group_started(
                t.children
                    .iter()
                    .map(|c| live.get(c).map(|t| (t, placed.contains_key(c)))),
            )
    };
    let mut s = Scan::default();
    for t in live.values() {
        let Some(queue) = placed.get(&t.id) else {
            s.waiting_for_parent += 1;
            continue;
        };
        match t.status {
            Status::Running => s.running += 1,
            Status::Queued if node.is_some_and(|n| n.accepts(t).is_err()) => {
                *s.elsewhere.entry(queue.clone()).or_default() += 1;
            }
            Status::Queued if group_started(t) => {}
            Status::Queued => {
                let e = s.oldest.entry(queue.clone()).or_insert(t.queued_at);
                *e = (*e).min(t.queued_at);
            }
            _ => {}
        }
    }
    s
}

fn gauges(
    out: &mut Vec<Family>,
    ctx: &Ctx<'_>,
    store: &Store,
    node: Option<&Node>,
) -> Result<(), OpError> {
    let parallel = match ctx.engine {
        Some(e) => e.config().parallel_queues,
        None => ctx.parallel_queues(store)?,
    };
    let mut lengths: BTreeMap<String, usize> = std::iter::once(MAIN.to_string())
        .chain((0..parallel).map(parallel_queue))
        .map(|q| (q, 0))
        .collect();
    lengths.extend(store.queues());
    let mut f = Family::gauge(
        "berth_queue_length",
        "Tasks in each queue (running, waiting, and those for other nodes).",
    );
    for (q, n) in &lengths {
        f.add(&[("queue", q)], *n as f64);
    }
    out.push(f);
    let s = scan(store, node);
    let mut f = Family::gauge(
        "berth_queue_tasks_for_other_nodes",
        "Tasks in each queue that are not for this node (by their target or tags): they wait for \
         their node (or an export) and never run here.",
    );
    for q in lengths.keys() {
        f.add(
            &[("queue", q)],
            s.elsewhere.get(q).copied().unwrap_or(0) as f64,
        );
    }
    out.push(f);
    let now = store.clock().now_ms();
    let mut f = Family::gauge(
        "berth_queue_oldest_wait_seconds",
        "How long the task that has waited longest in each queue (queued for this node, not \
         running) has waited since its enqueue; 0 when none waits.",
    );
    for q in lengths.keys() {
        let age = s.oldest.get(q).map_or(0, |t| now.saturating_sub(*t));
        f.add(&[("queue", q)], secs(age));
    }
    out.push(f);
    let mut f = Family::gauge("berth_tasks_running", "Tasks whose attempt runs now.");
    f.add(&[], s.running as f64);
    out.push(f);
    let mut f = Family::gauge(
        "berth_tasks_waiting_for_parent",
        "Group children that wait outside every queue until their parent reaches its head.",
    );
    f.add(&[], s.waiting_for_parent as f64);
    out.push(f);
    let mut f = Family::counter("berth_store_events_total", "Events in the store's log.");
    f.add(&[], store.next_seq().saturating_sub(1) as f64);
    out.push(f);
    let mut f = Family::gauge(
        "berth_store_size_bytes",
        "Disk space the store's database (DIR/db) takes.",
    );
    f.add(&[], disk_usage(&store.dir().join("db")) as f64);
    out.push(f);
    if let Ok(Some(free)) = store.free_space() {
        let mut f = Family::gauge(
            "berth_disk_free_bytes",
            "Free space on the data dir's filesystem (for an unprivileged writer).",
        );
        f.add(&[], free as f64);
        out.push(f);
    }
    let mut f = Family::gauge(
        "berth_disk_reserve_bytes",
        "Free space kept for running tasks to record how they end ([disk] reserve; 0: no guard).",
    );
    f.add(&[], store.disk_reserve() as f64);
    out.push(f);
    Ok(())
}

/// The disk space the files under `dir` take (allocated blocks).
fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_usage(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

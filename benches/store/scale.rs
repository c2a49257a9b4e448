//! A million queued tasks: what a batch enqueue, an open and `queue list`
//! cost at that scale, and how much disk the tasks take.
//!
//! The figures come from one data dir, built under the system temp dir (set
//! TMPDIR to measure another disk) three times over (one at a time, each
//! removed before the next is built; `BERTH_BENCH_SCALE_BUILDS` sets how
//! many): the enqueue figures are those of the build whose flatness is the
//! median, the others are measured on the last build's data dir, removed at
//! the end. A data dir holds
//! 1,000,000 queued no-op tasks (kind `Noop`, payload `{"i": i}`, name
//! `task-{i}`), ALL in queue `main`, so that `queue list` shows one queue of
//! a million tasks. They are enqueued with `berth::submit::enqueue_batch` in
//! batches of 10,000 on a store opened with `Durability::Sync` and the
//! power-safe default options; each batch is timed (building its specs is
//! not). Then the store is closed, and:
//!
//! - `enqueue_batch_1m_first_100k`, `enqueue_batch_1m_last_100k` (tasks/s):
//!   the rate of the first and of the last 10 batches;
//!   `enqueue_batch_1m_flatness` (x) is last / first (1 is flat);
//!   `enqueue_batch_1m_second_100k` (tasks/s), the rate of batches 11 to
//!   20, and `enqueue_batch_1m_flatness_after_first` (x), last / second:
//!   a batch's key writes wait in the store's overlay (up to 10,000 not
//!   yet written, `overlay::MAX_PENDING`) and the applier threads write
//!   them to sled during the next batches, so the applier sets the pace
//!   (after the first 30,000-40,000 tasks, which go faster on a tree small
//!   enough for sled's cache): a batch waits until it has written enough of
//!   its round (before, a batch that found the overlay full waited for the
//!   whole round to end: 0.36-0.63 s for the slowest batch of a run,
//!   against 0.13-0.18 s since, and about 0.09 s for most batches). With
//!   the bound at 100,000 (until 2026-12-06) the first 100,000 tasks went
//!   at the commit path's speed, about 1.5 times the applier's, and the
//!   ratio measured that head start rather than the tree's size. On
//!   stderr the run also prints the rate of every window of 10 batches and
//!   the times of the first 20 batches, in ms: the first batch finds the
//!   overlay empty and takes about half the time of a later one, the next
//!   few a little more, and from about the 5th on a batch takes about
//!   15 % less than at the millionth task (measured 2026-12-06 in seven
//!   runs: 30-34, 36-49 and 33-53 ms for the first three, 45-65 for the
//!   5th to the 10th, about 60-75 on average in the last 100,000);
//! - `data_dir_1m_mib`: the data dir's size on disk (allocated blocks, as
//!   `du` counts them), after the store is closed;
//! - `open_1m_live_s`, `open_1m_live_rss_mib`: a fresh child process (this
//!   bench binary, re-executed with `BERTH_BENCH_CHILD=open`) does what the
//!   daemon does before it serves: `Store::open` as the daemon, with `Sync`
//!   durability, then `Engine::new` (10 parallel queues, a no-op handler)
//!   and `Store::track_deadlines`. The seconds are the child's own, from just
//!   before the open to just after the deadlines; the MiB are its peak RSS
//!   (`getrusage`'s `ru_maxrss`), so they are the open's alone;
//! - `queue_list_1m_ms`: `berth --data-dir DIR queue list`, no daemon
//!   running, from spawn to exit, stdout read through a pipe (a read-only
//!   command copies `db/` privately first: that is part of what a user
//!   pays). With it `queue_list_1m_lines`, `queue_list_1m_stdout_mib` and
//!   `queue_list_1m_rss_mib` (the child's peak RSS, its `VmHWM` read while it runs).
//!
//! `BERTH_BENCH_SCALE_N` (a multiple of 10,000; default 1,000,000) shrinks
//! the data dir while developing; the figures keep their names, and the
//! first and last windows become a tenth of the batches each when that is
//! fewer than 10. `BERTH_BENCH_SCALE_KEEP=DIR` copies the data dir to DIR
//! (`cp -a`) before it is removed, to profile an open or a command on it.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::store::{Durability, Options, Role, Store};
use berth::task::TaskSpec;
use serde_json::json;

use super::figure;

/// Every figure of this module: the scale run starts when the filter
/// selects any of them.
pub const NAMES: [&str; 12] = [
    "enqueue_batch_1m_first_100k",
    "enqueue_batch_1m_last_100k",
    "enqueue_batch_1m_flatness",
    "enqueue_batch_1m_second_100k",
    "enqueue_batch_1m_flatness_after_first",
    "data_dir_1m_mib",
    "open_1m_live_s",
    "open_1m_live_rss_mib",
    "queue_list_1m_ms",
    "queue_list_1m_lines",
    "queue_list_1m_stdout_mib",
    "queue_list_1m_rss_mib",
];

/// Tasks in the data dir, and per `enqueue_batch`.
const TASKS: usize = 1_000_000;
const BATCH: usize = 10_000;
/// Builds of the data dir whose median flatness is reported.
const BUILDS: usize = 3;
/// Batches in the first and in the last window of the flatness figure.
const WINDOW_BATCHES: usize = 10;
/// Parallel queues of the engine the open child builds.
const QUEUES: usize = 10;

/// The environment variables of the open child.
const CHILD: &str = "BERTH_BENCH_CHILD";
const CHILD_DIR: &str = "BERTH_BENCH_CHILD_DIR";
const CHILD_TASKS: &str = "BERTH_BENCH_CHILD_TASKS";

const MIB: f64 = (1 << 20) as f64;

/// A count from the environment variable `name` (`default` when unset),
/// which `ok` must accept (it says what it must be).
fn env_count(name: &str, default: usize, ok: impl Fn(usize) -> Result<(), String>) -> usize {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    let n: usize = v.parse().unwrap_or_else(|e| panic!("{name}={v:?}: {e}"));
    if let Err(why) = ok(n) {
        panic!("{name}={n}: {why}");
    }
    n
}

fn tasks() -> usize {
    env_count("BERTH_BENCH_SCALE_N", TASKS, |n| {
        (n >= BATCH && n.is_multiple_of(BATCH))
            .then_some(())
            .ok_or(format!("must be a multiple of {BATCH}"))
    })
}

/// `BERTH_BENCH_NO_WAL=1`: without the write-ahead log (a sled flush per
/// commit), as the rest of the store bench.
fn with_wal() -> bool {
    std::env::var_os("BERTH_BENCH_NO_WAL").is_none()
}

/// How many times the data dir is built: `BERTH_BENCH_SCALE_BUILDS`, 3 by
/// default (a single build's flatness varies by about 0.1 from run to run).
fn builds() -> usize {
    env_count("BERTH_BENCH_SCALE_BUILDS", BUILDS, |b| {
        (b >= 1)
            .then_some(())
            .ok_or("must be at least 1".to_string())
    })
}

/// The child's side: when this process was started as the open child, does
/// the open, prints `ELAPSED_S RSS_KIB` on stdout and exits.
pub fn child_main() {
    match std::env::var(CHILD).as_deref() {
        Ok("open") => {}
        Ok(other) => panic!("{CHILD}={other:?}: unknown child"),
        Err(_) => return,
    }
    let dir = std::env::var(CHILD_DIR).expect(CHILD_DIR);
    let n: usize = std::env::var(CHILD_TASKS)
        .expect(CHILD_TASKS)
        .parse()
        .expect(CHILD_TASKS);
    let start = Instant::now();
    let store = Store::open(
        Path::new(&dir),
        Options {
            durability: Durability::Sync,
            role: Role::Daemon,
            create: false,
            write_ahead_log: with_wal(),
            ..Options::default()
        },
        berth::clock::system(),
    )
    .expect("Store::open");
    let opened = start.elapsed().as_secs_f64();
    let opened_rss = vm_hwm_kib("self").expect("VmHWM of this process");
    let mut handlers = Handlers::new();
    handlers.register("Noop", |_ctx: &TaskContext| Outcome::success());
    let engine = Engine::new(
        Arc::new(store),
        handlers,
        EngineConfig {
            parallel_queues: QUEUES,
            ..EngineConfig::default()
        },
    )
    .expect("Engine::new");
    let built = start.elapsed().as_secs_f64();
    engine.store().track_deadlines();
    let elapsed = start.elapsed().as_secs_f64();
    // Where the time and the memory went, for the parent's stderr.
    eprintln!(
        "scale: open child: Store::open {opened:.2} s (peak RSS {} MiB), \
         Engine::new {:.2} s, track_deadlines {:.2} s",
        opened_rss / 1024,
        built - opened,
        elapsed - built
    );
    // Checked after the clock stops: the open must have found every task.
    assert_eq!(engine.store().queued_total(), n, "queued tasks after open");
    println!(
        "{elapsed} {}",
        vm_hwm_kib("self").expect("VmHWM of this process")
    );
    std::process::exit(0);
}

/// The peak RSS in KiB of process `pid` (or `self`): `VmHWM`, the high
/// water mark of its memory since it exec'd. (Not `ru_maxrss`: Linux gives
/// a child the RSS its parent had when it forked, and this bench's parent
/// holds the million-task store it built.) None once it has exited.
fn vm_hwm_kib(pid: &str) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What one build's batch times say about the batch enqueue.
struct Windows {
    first: f64,
    last: f64,
    second: f64,
}

impl Windows {
    fn flatness(&self) -> f64 {
        self.last / self.first
    }
}

/// The rates of one build's first, second and last windows, with every
/// window's rate and the first batches' times on stderr.
fn windows(build: usize, batches: &[f64]) -> Windows {
    let window = WINDOW_BATCHES.min(batches.len() / 10).max(1);
    let rate = |b: &[f64]| (b.len() * BATCH) as f64 / b.iter().sum::<f64>();
    eprintln!(
        "scale: build {build}: tasks/s by window of {} batches: {:?}",
        window,
        batches
            .chunks(window)
            .map(|w| rate(w).round() as u64)
            .collect::<Vec<_>>()
    );
    // The first batches one by one: where the first window's head start
    // comes from (the first batch finds the overlay empty; the next few
    // write to a tree small enough for sled's cache and the CPU's).
    eprintln!(
        "scale: build {build}: ms per batch, first {}: {:?}",
        batches.len().min(2 * WINDOW_BATCHES),
        batches
            .iter()
            .take(2 * WINDOW_BATCHES)
            .map(|b| (b * 1000.0).round() as u64)
            .collect::<Vec<_>>()
    );
    Windows {
        first: rate(&batches[..window]),
        last: rate(&batches[batches.len() - window..]),
        second: rate(&batches[window..(2 * window).min(batches.len())]),
    }
}

/// Builds the data dir [`builds`] times and prints the figures `want`
/// selects: the window figures of the build whose flatness is the median,
/// the others measured on the last build's data dir.
pub fn run(want: &dyn Fn(&str) -> bool) {
    let n = tasks();
    let builds = builds();
    let mut runs = Vec::with_capacity(builds);
    let mut dir = None;
    for b in 1..=builds {
        // The build before is removed first: one data dir on disk at a time.
        drop(dir.take());
        let d = tempfile::tempdir().expect("creating a temp dir");
        runs.push(windows(b, &build(d.path(), n)));
        dir = Some(d);
    }
    let dir = dir.expect("at least one build");
    runs.sort_by(|a, b| a.flatness().total_cmp(&b.flatness()));
    eprintln!(
        "scale: enqueue_batch_1m_flatness of the {builds} builds: {:?}",
        runs.iter()
            .map(|r| (r.flatness() * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    let median = &runs[runs.len() / 2];
    if want("enqueue_batch_1m_first_100k") {
        figure("enqueue_batch_1m_first_100k", median.first, "tasks/s");
    }
    if want("enqueue_batch_1m_last_100k") {
        figure("enqueue_batch_1m_last_100k", median.last, "tasks/s");
    }
    if want("enqueue_batch_1m_flatness") {
        figure("enqueue_batch_1m_flatness", median.flatness(), "x");
    }
    if want("enqueue_batch_1m_second_100k") {
        figure("enqueue_batch_1m_second_100k", median.second, "tasks/s");
    }
    if want("enqueue_batch_1m_flatness_after_first") {
        figure(
            "enqueue_batch_1m_flatness_after_first",
            median.last / median.second,
            "x",
        );
    }
    if want("data_dir_1m_mib") {
        figure(
            "data_dir_1m_mib",
            disk_bytes(dir.path()) as f64 / MIB,
            "MiB",
        );
    }
    if want("open_1m_live_s") || want("open_1m_live_rss_mib") {
        let (secs, rss_kib) = open_child(dir.path(), n);
        if want("open_1m_live_s") {
            figure("open_1m_live_s", secs, "s");
        }
        if want("open_1m_live_rss_mib") {
            figure("open_1m_live_rss_mib", rss_kib as f64 / 1024.0, "MiB");
        }
    }
    if NAMES
        .iter()
        .any(|f| f.starts_with("queue_list_1m") && want(f))
    {
        let l = queue_list(dir.path(), n);
        if want("queue_list_1m_ms") {
            figure("queue_list_1m_ms", l.secs * 1000.0, "ms");
        }
        if want("queue_list_1m_lines") {
            figure("queue_list_1m_lines", l.lines as f64, "lines");
        }
        if want("queue_list_1m_stdout_mib") {
            figure(
                "queue_list_1m_stdout_mib",
                l.stdout_bytes as f64 / MIB,
                "MiB",
            );
        }
        if want("queue_list_1m_rss_mib") {
            figure("queue_list_1m_rss_mib", l.rss_kib as f64 / 1024.0, "MiB");
        }
    }
    if let Ok(keep) = std::env::var("BERTH_BENCH_SCALE_KEEP") {
        let status = Command::new("cp")
            .args(["-a", &dir.path().display().to_string(), &keep])
            .status()
            .expect("cp");
        assert!(status.success(), "copying the data dir to {keep}");
        eprintln!("scale: kept a copy in {keep}");
    }
    eprintln!("scale: removing {}", dir.path().display());
}

/// Enqueues `n` tasks into `main` in batches of 10,000 and closes the
/// store. Returns each batch's seconds.
fn build(dir: &Path, n: usize) -> Vec<f64> {
    let store = Store::open(
        dir,
        Options {
            durability: Durability::Sync,
            write_ahead_log: with_wal(),
            ..Options::default()
        },
        berth::clock::system(),
    )
    .expect("Store::open");
    let mut times = Vec::with_capacity(n / BATCH);
    let started = Instant::now();
    for b in 0..n / BATCH {
        let specs: Vec<TaskSpec> = (b * BATCH..(b + 1) * BATCH)
            .map(|i| TaskSpec {
                queue: "main".into(),
                kind: "Noop".into(),
                name: format!("task-{i}"),
                payload: json!({ "i": i }),
                ..Default::default()
            })
            .collect();
        let start = Instant::now();
        let ids = berth::submit::enqueue_batch(&store, specs).expect("enqueue_batch");
        times.push(start.elapsed().as_secs_f64());
        assert_eq!(ids.len(), BATCH);
        let done = (b + 1) * BATCH;
        if done.is_multiple_of(100_000) || done == n {
            eprintln!(
                "scale: {done}/{n} enqueued in {:.1} s (last batch {:.2} s)",
                started.elapsed().as_secs_f64(),
                times[b]
            );
        }
    }
    assert_eq!(store.queued_total(), n);
    drop(store);
    times
}

/// Bytes allocated on disk under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("read_dir entry");
        let m = e.metadata().expect("metadata");
        total += m.blocks() * 512;
        if m.is_dir() {
            total += disk_bytes(&e.path());
        }
    }
    total
}

/// Runs the open child; returns its seconds and its peak RSS in KiB.
fn open_child(dir: &Path, n: usize) -> (f64, i64) {
    eprintln!("scale: opening {n} tasks in a child process");
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .env(CHILD, "open")
        .env(CHILD_DIR, dir)
        .env(CHILD_TASKS, n.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("running the open child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the open child failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let mut words = stdout.split_whitespace();
    let mut next = || {
        words
            .next()
            .unwrap_or_else(|| panic!("open child: {stdout:?}"))
    };
    let secs: f64 = next().parse().expect("open child's seconds");
    let rss: i64 = next().parse().expect("open child's RSS");
    (secs, rss)
}

struct Listed {
    secs: f64,
    lines: usize,
    stdout_bytes: usize,
    rss_kib: i64,
}

/// `berth --data-dir DIR queue list`, timed from spawn to exit, its stdout
/// counted as it streams, its peak RSS from `VmHWM` while it runs.
fn queue_list(dir: &Path, n: usize) -> Listed {
    eprintln!("scale: berth queue list on {n} tasks");
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--data-dir")
        .arg(dir)
        .args(["queue", "list"])
        .env_remove("BERTH_CONFIG")
        .env_remove("BERTH_DATA_DIR")
        .env_remove("BERTH_NOW")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning berth queue list");
    let mut stdout = child.stdout.take().expect("piped stdout");
    // Its peak RSS, read every 5 ms until it exits (the last reading is
    // within 5 ms of its end; `VmHWM` only grows).
    let pid = child.id().to_string();
    let watch = std::thread::spawn(move || {
        let mut peak = 0;
        while let Some(kib) = vm_hwm_kib(&pid) {
            peak = kib;
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        peak
    });
    let (mut lines, mut bytes) = (0, 0);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let k = stdout.read(&mut buf).expect("reading queue list's stdout");
        if k == 0 {
            break;
        }
        bytes += k;
        lines += buf[..k].iter().filter(|&&c| c == b'\n').count();
    }
    let status = child.wait().expect("waiting for berth queue list");
    let secs = start.elapsed().as_secs_f64();
    assert!(status.success(), "berth queue list failed: {status}");
    let rss_kib = watch.join().expect("the RSS watcher");
    // How many lines a million tasks deserve is `queue list`'s business (it
    // may summarize); it must at least print something.
    assert!(lines > 0, "queue list printed nothing for {n} tasks");
    Listed {
        secs,
        lines,
        stdout_bytes: bytes,
        rss_kib,
    }
}

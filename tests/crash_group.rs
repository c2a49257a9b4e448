//! A kill -9 in the middle of a group re-runs only the unfinished children.
//!
//! A child process (this test binary, re-executed to run only
//! `crash_group_child` with `BERTH_GROUP_CHILD_DIR` set) enqueues a group of
//! six children (`c0`..`c5`, one weight) and a later single task (`after`),
//! and runs the engine with a handler that finishes `c0`..`c2` at once and
//! blocks `c3`..`c5` forever. Once the three are durably in the history and
//! the other three have started, it prints `READY`; the test SIGKILLs it,
//! reopens the data dir and checks that recovery put back exactly `c3`..`c5`,
//! that only they run again (once each), that the group then finishes and
//! its queue moves on to `after`, and that the event log agrees with the
//! state.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::store::{INTERRUPTED, Options, Store};
use berth::task::{Status, Task, TaskSpec};

const DIR_VAR: &str = "BERTH_GROUP_CHILD_DIR";
const CHILD_TEST: &str = "crash_group_child";
const QUEUE: &str = "main";
/// Kill cycles, each on a fresh data dir.
const CYCLES: usize = 3;
/// Children that finish before the kill, and children that are running at it.
const DONE: [&str; 3] = ["c0", "c1", "c2"];
const BLOCKED: [&str; 3] = ["c3", "c4", "c5"];
/// How long the test waits for the child to be ready, and for the engine to
/// go idle after the restart.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// A child that is never killed (its parent test died) ends itself.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

fn open(dir: &Path) -> Store {
    // `Options::default()` is `sync` durability.
    Store::open(dir, Options::default(), berth::clock::system())
        .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()))
}

fn specs() -> Vec<TaskSpec> {
    let mut specs: Vec<TaskSpec> = DONE
        .iter()
        .chain(BLOCKED.iter())
        .map(|n| TaskSpec {
            weight: Some(10),
            ..common::spec(QUEUE, n)
        })
        .collect();
    specs.push(TaskSpec {
        weight: Some(20),
        ..common::spec(QUEUE, "after")
    });
    specs
}

/// Writes one line to stdout in one write, flushed.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| out.flush())
        .expect("writing to stdout");
}

fn task(store: &Store, id: u64) -> Option<Task> {
    store
        .task(id)
        .unwrap_or_else(|e| panic!("reading task {id}: {e}"))
}

/// The child: does nothing unless re-executed by the test below.
#[test]
fn crash_group_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    // libtest has printed "test crash_group_child ... " without a newline.
    say("");
    // Never outlive a parent that died without killing us.
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        std::process::exit(3);
    });

    let store = Arc::new(open(Path::new(&dir)));
    let mut h = Handlers::new();
    h.register("ModuleRun", |ctx: &TaskContext| {
        say(&format!("RUN {} {}", ctx.task.name, ctx.attempt));
        if BLOCKED.contains(&ctx.task.name.as_str()) {
            loop {
                std::thread::park();
            }
        }
        Outcome::success()
    });
    let engine = Engine::new(store.clone(), h, EngineConfig::default()).expect("engine");
    let ids = engine.enqueue_batch(specs()).expect("enqueue_batch");
    let parent = task(&store, ids[0]).expect("the group parent");
    assert_eq!(parent.children.len(), 6, "one group of six: {parent:?}");
    let children = parent.children.clone();

    let watcher = {
        let store = store.clone();
        std::thread::spawn(move || {
            let status = |i: usize| task(&store, children[i]).map(|t| t.status);
            loop {
                // A commit's key writes are plain inserts, so a reader can
                // see a task between two of them (even missing): only the
                // final statuses count.
                let done = (0..3).all(|i| status(i) == Some(Status::Succeeded));
                let running = (3..6).all(|i| status(i) == Some(Status::Running));
                if done && running {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            // What we read may be applied but not yet durable. Taking the
            // write lock waits out a commit between its writes and its
            // group-commit ticket; the flush then covers every write seen.
            drop(store.write());
            store.flush().expect("flush");
            say("READY");
        })
    };
    let summary = engine.run();
    drop(watcher);
    panic!("the engine stopped, which it never should here: {summary:?}");
}

/// Kills and reaps the child if the test panics while it runs.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(dir: &Path) -> Guard {
    let child = common::child_test(CHILD_TEST)
        .env(DIR_VAR, dir)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");
    Guard(child)
}

/// What the child printed before it was killed.
struct ChildRun {
    /// Every line, for messages.
    transcript: Vec<String>,
    /// (name, attempt) per `RUN` line, in order.
    runs: Vec<(String, u32)>,
    killed_after: Duration,
}

fn parse_run(line: &str) -> Option<(String, u32)> {
    let rest = line.strip_prefix("RUN ")?;
    let (name, attempt) = rest.rsplit_once(' ')?;
    Some((name.to_string(), attempt.parse().ok()?))
}

/// Runs the child until it is ready, then kills it `delay` later.
fn run_child(dir: &Path, delay: Duration) -> ChildRun {
    let mut guard = spawn_child(dir);
    let child = &mut guard.0;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || common::forward_lines(stdout, tx));
    let stderr_reader = common::read_in_background(child.stderr.take().expect("piped stderr"));

    let mut transcript = Vec::new();
    let mut runs = Vec::new();
    let mut ready = false;
    let spawned = Instant::now();
    let deadline = spawned + READY_TIMEOUT;
    let all_blocked_started = |runs: &Vec<(String, u32)>| {
        BLOCKED
            .iter()
            .all(|b| runs.iter().any(|(n, _)| n.as_str() == *b))
    };
    while !(ready && all_blocked_started(&runs)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if line == "READY" {
                    ready = true;
                } else if let Some(run) = parse_run(&line) {
                    runs.push(run);
                }
                transcript.push(line);
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = stderr_reader.join().unwrap_or_default();
                panic!(
                    "the child was not ready ({e:?} after {:?}); it printed:\n{}\n\
                     its stderr:\n{stderr}",
                    spawned.elapsed(),
                    transcript.join("\n")
                );
            }
        }
    }
    let since = Instant::now();
    std::thread::sleep(delay);
    child.kill().expect("killing the child");
    let killed_after = since.elapsed();
    let status = child.wait().expect("waiting for the child");
    reader.join().expect("stdout reader");
    for line in rx.try_iter() {
        if let Some(run) = parse_run(&line) {
            runs.push(run);
        }
        transcript.push(line);
    }
    let stderr = stderr_reader.join().unwrap_or_default();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the child ended before it was killed ({status}); it printed:\n{}\n\
             its stderr:\n{stderr}",
            transcript.join("\n")
        );
    }
    ChildRun {
        transcript,
        runs,
        killed_after,
    }
}

#[test]
fn kill_9_mid_group_reruns_only_unfinished_children() {
    let seed = std::env::var("BERTH_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    for cycle in 0..CYCLES {
        let delay = Duration::from_millis(rng.u64(0..50));
        crash_cycle(&format!("seed {seed}, cycle {cycle}"), delay);
    }
    eprintln!(
        "{CYCLES} group kill cycles in {:?} (seed {seed})",
        started.elapsed()
    );
}

fn crash_cycle(what: &str, delay: Duration) {
    let tmp = common::tempdir();
    let dir = tmp.path().join("data");
    let run = run_child(&dir, delay);
    let ctx = format!("{what}, killed {:?} after READY", run.killed_after);
    let printed = run.transcript.join("\n");

    // Before the kill: every child started once, `after` never did.
    let mut child_runs: Vec<(String, u32)> = run.runs.clone();
    child_runs.sort();
    let want: Vec<(String, u32)> = DONE
        .iter()
        .chain(BLOCKED.iter())
        .map(|n| (n.to_string(), 1))
        .collect();
    assert_eq!(
        child_runs, want,
        "{ctx}: the child should have run c0..c5 once each and nothing else; it printed:\n{printed}"
    );

    // Reopen: recovery puts back exactly the children that were running.
    let store = Arc::new(open(&dir));
    assert!(
        store.corrupt_records().is_empty(),
        "{ctx}: corrupt records: {:?}",
        store.corrupt_records()
    );
    let main = store.queue_ids(QUEUE);
    assert_eq!(
        main.len(),
        2,
        "{ctx}: queue {QUEUE} should hold the group and `after`: {main:?}"
    );
    let (parent_id, after_id) = (main[0], main[1]);
    let parent = task(&store, parent_id).expect("the group parent");
    assert_eq!(parent.status, Status::Queued, "{ctx}: {parent:?}");
    let after = task(&store, after_id).expect("`after`");
    assert_eq!(after.name, "after", "{ctx}");
    assert_eq!(after.attempts, 0, "{ctx}: `after` ran before the kill");
    let by_name: BTreeMap<String, u64> = parent
        .children
        .iter()
        .map(|id| (task(&store, *id).expect("a child").name, *id))
        .collect();
    let id_of = |n: &str| by_name[n];
    assert_eq!(
        by_name.keys().map(String::as_str).collect::<Vec<_>>(),
        ["c0", "c1", "c2", "c3", "c4", "c5"],
        "{ctx}"
    );

    let mut recovered = store.recovered().to_vec();
    recovered.sort_unstable();
    let mut want_recovered: Vec<u64> = BLOCKED.iter().map(|n| id_of(n)).collect();
    want_recovered.sort_unstable();
    assert_eq!(
        recovered, want_recovered,
        "{ctx}: recovery should put back exactly c3, c4, c5"
    );
    for n in DONE {
        let t = task(&store, id_of(n)).unwrap();
        assert_eq!(t.status, Status::Succeeded, "{ctx}: {n} before the restart");
        assert!(
            store.live_task(t.id).unwrap().is_none(),
            "{ctx}: {n} should be in the history"
        );
    }
    for n in BLOCKED {
        let t = task(&store, id_of(n)).unwrap();
        assert_eq!(
            (t.status, t.attempts, t.failures, t.last_failure.as_deref()),
            (Status::Queued, 1, 1, Some(INTERRUPTED)),
            "{ctx}: {n} after recovery"
        );
        assert!(
            store
                .queue_of(t.id)
                .is_some_and(|q| q.starts_with("parallel_queue_")),
            "{ctx}: {n} should still be in its parallel queue"
        );
    }
    let diffs = berth::store::verify::verify(&store)
        .unwrap_or_else(|e| panic!("{ctx}: replaying the log failed: {e}"));
    assert!(
        diffs.is_empty(),
        "{ctx}: log and state disagree after recovery: {diffs:#?}"
    );

    // Run to idle with a handler that records what runs.
    let ran: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let mut h = Handlers::new();
    {
        let ran = ran.clone();
        h.register("ModuleRun", move |ctx: &TaskContext| {
            ran.lock()
                .unwrap()
                .push((ctx.task.name.clone(), ctx.attempt));
            Outcome::success()
        });
    }
    let config = EngineConfig {
        grace: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    let engine = Engine::new(store.clone(), h, config).expect("engine");
    let stop = engine.stop_handle();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let summary = std::thread::scope(|s| {
        let watchdog = s.spawn(move || {
            if done_rx.recv_timeout(IDLE_TIMEOUT).is_err() {
                stop.stop();
                true
            } else {
                false
            }
        });
        let summary = engine.run_until_idle();
        let _ = done_tx.send(());
        let timed_out = watchdog.join().expect("watchdog");
        assert!(
            !timed_out,
            "{ctx}: the engine did not go idle within {IDLE_TIMEOUT:?}; ran {:?}",
            ran.lock().unwrap()
        );
        summary
    })
    .unwrap_or_else(|e| panic!("{ctx}: run_until_idle: {e}"));
    let ran = ran.lock().unwrap().clone();

    // Only the unfinished children ran again, once each, then `after`.
    let mut children_ran: Vec<(String, u32)> =
        ran.iter().filter(|(n, _)| n != "after").cloned().collect();
    children_ran.sort();
    let want: Vec<(String, u32)> = BLOCKED.iter().map(|n| (n.to_string(), 2)).collect();
    assert_eq!(
        children_ran, want,
        "{ctx}: after the restart only c3, c4, c5 should run, once each (attempt 2); ran {ran:?}"
    );
    assert_eq!(
        ran.last(),
        Some(&("after".to_string(), 1)),
        "{ctx}: `after` should run once, after every child; ran {ran:?}"
    );
    assert_eq!(ran.len(), 4, "{ctx}: ran {ran:?}");
    assert_eq!(summary.abandoned, 0, "{ctx}: {summary:?}");
    assert_eq!(
        (
            summary.tally.succeeded,
            summary.tally.failed_attempts,
            summary.tally.dead_letters
        ),
        (5, 0, 0),
        "{ctx}: three children, the group and `after` succeed: {summary:?}"
    );

    // Final state.
    for n in DONE {
        let t = task(&store, id_of(n)).unwrap();
        assert_eq!(
            (t.status, t.attempts, t.failures, t.last_failure.as_deref()),
            (Status::Succeeded, 1, 0, None),
            "{ctx}: {n} at the end"
        );
    }
    for n in BLOCKED {
        let t = task(&store, id_of(n)).unwrap();
        assert_eq!(
            (t.status, t.attempts, t.failures, t.last_failure.as_deref()),
            (Status::Succeeded, 2, 1, Some(INTERRUPTED)),
            "{ctx}: {n} at the end"
        );
        assert!(
            store.live_task(t.id).unwrap().is_none(),
            "{ctx}: {n} should be in the history"
        );
    }
    let parent = task(&store, parent_id).unwrap();
    assert_eq!(parent.status, Status::Succeeded, "{ctx}: {parent:?}");
    assert!(
        store.live_task(parent_id).unwrap().is_none(),
        "{ctx}: the parent should be in the history"
    );
    let after = task(&store, after_id).unwrap();
    assert_eq!(
        (after.status, after.attempts),
        (Status::Succeeded, 1),
        "{ctx}: {after:?}"
    );
    assert!(
        parent.finished_at.unwrap() <= after.started_at.unwrap(),
        "{ctx}: `after` started before the group finished"
    );
    assert_eq!(store.queued_total(), 0, "{ctx}: {:?}", store.queues());
    let diffs = berth::store::verify::verify(&store)
        .unwrap_or_else(|e| panic!("{ctx}: replaying the log failed: {e}"));
    assert!(
        diffs.is_empty(),
        "{ctx}: log and state disagree at the end: {diffs:#?}"
    );
    assert!(
        store.corrupt_records().is_empty(),
        "{ctx}: corrupt records: {:?}",
        store.corrupt_records()
    );
    drop(engine);
}

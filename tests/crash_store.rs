//! A real crash test: a child process enqueues in `sync` mode and prints each
//! id only after its commit returned; the test SIGKILLs it at a random moment,
//! reopens the data dir and checks that every acknowledged id survived, in
//! order, with no gaps, and that the event log agrees with the state.
//!
//! The child is this test binary itself, re-executed to run only
//! `crash_child` with `BERTH_CRASH_CHILD_DIR` set.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use berth::store::{Durability, Options, Store};
use berth::task::TaskSpec;
use common::producer;

const DIR_VAR: &str = "BERTH_CRASH_CHILD_DIR";
const THREADS_VAR: &str = "BERTH_CRASH_CHILD_THREADS";
const QUEUE: &str = "main";
/// Kill cycles in a normal run; `BERTH_CRASH_CYCLES` sets another number
/// (for a soak run), `BERTH_CRASH_SEED` replays a failing run's delays.
const CYCLES: usize = 30;

fn open(dir: &Path) -> Store {
    Store::open(
        dir,
        Options {
            durability: Durability::Sync,
            ..Options::default()
        },
        berth::clock::system(),
    )
    .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()))
}

/// Enqueues forever, printing each id after its commit returned. Every
/// third task carries 20 KB, so its commit record is stored in pieces
/// (`store/records.rs`), and a kill can land between them.
fn produce(store: &Store, thread: usize) -> ! {
    producer::produce(store, |i| TaskSpec {
        queue: QUEUE.into(),
        kind: "CrashTest".into(),
        name: format!("t{thread}-{i}"),
        payload: match i % 3 {
            0 => serde_json::json!({ "thread": thread, "i": i, "pad": "x".repeat(20_000) }),
            _ => serde_json::json!({ "thread": thread, "i": i }),
        },
        ..Default::default()
    })
}

/// The child: does nothing unless re-executed by `kill_9_during_sync_enqueue`.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let threads: usize = std::env::var(THREADS_VAR)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let store = open(Path::new(&dir));
    producer::end_libtest_line();
    std::thread::scope(|s| {
        for t in 1..threads {
            let store = &store;
            s.spawn(move || produce(store, t));
        }
        produce(&store, 0)
    });
}

fn spawn_child(dir: &Path, threads: usize) -> Child {
    common::child_test("crash_child")
        .env(DIR_VAR, dir)
        .env(THREADS_VAR, threads.to_string())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child")
}

struct Cycle {
    printed: Vec<u64>,
    stderr: String,
    killed_after: Duration,
}

/// Runs one child with `threads` producers and kills it `delay` after its
/// first acknowledged id.
fn run_child(dir: &Path, threads: usize, delay: Duration) -> Cycle {
    let mut child = spawn_child(dir, threads);
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || producer::read_ids(stdout, tx));
    let stderr_reader = common::read_in_background(child.stderr.take().expect("piped stderr"));

    let mut printed = Vec::new();
    let first = rx.recv_timeout(Duration::from_secs(60));
    let killed_after = match first {
        Ok(id) => {
            printed.push(id);
            let since = Instant::now();
            std::thread::sleep(delay);
            child.kill().expect("killing the child");
            since.elapsed()
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr_reader.join().unwrap_or_default();
            panic!("the child printed no id ({e:?}); its stderr:\n{stderr}");
        }
    };
    let status = child.wait().expect("waiting for the child");
    reader.join().expect("stdout reader");
    printed.extend(rx.try_iter());
    let stderr = stderr_reader.join().unwrap_or_default();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the child ended before it was killed ({status}); its stderr:\n{stderr}"
        );
    }
    #[cfg(not(unix))]
    let _ = status;
    Cycle {
        printed,
        stderr,
        killed_after,
    }
}

#[test]
fn kill_9_during_sync_enqueue() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let seed = std::env::var("BERTH_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let cycles: usize = std::env::var("BERTH_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CYCLES);
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    // Tasks known to be in the queue after the previous cycle.
    let mut known = 0u64;

    for cycle in 0..cycles {
        let threads = [1, 1, 4, 2][cycle % 4];
        let delay = Duration::from_millis(rng.u64(5..150));
        let run = run_child(&dir, threads, delay);
        let ctx = format!(
            "seed {seed}, cycle {cycle}, {threads} producer(s), killed {:?} after the first ack",
            run.killed_after
        );

        let store = open(&dir);
        assert!(
            store.corrupt_records().is_empty(),
            "{ctx}: corrupt records: {:?}",
            store.corrupt_records()
        );
        let queue = store.queue_ids(QUEUE);
        let total = queue.len() as u64;

        // Ids are allocated under the write lock in commit order and nothing
        // is ever removed, so the queue is exactly 1..=total: no gaps, no
        // reordering, whatever survived is a prefix of the commits.
        if let Some(pos) = queue.iter().zip(1u64..).position(|(id, want)| *id != want) {
            panic!(
                "{ctx}: the queue is not 1..={total}: position {pos} holds {} \
                 (around it: {:?})",
                queue[pos],
                &queue[pos.saturating_sub(3)..(pos + 4).min(queue.len())]
            );
        }
        assert!(
            total >= known,
            "{ctx}: the queue shrank from {known} to {total} tasks"
        );

        // Every acknowledged id survived.
        let mut printed = run.printed.clone();
        if threads == 1 {
            // One producer prints in commit order: exactly the next ids.
            let expected: Vec<u64> = (known + 1..=known + printed.len() as u64).collect();
            assert_eq!(
                printed, expected,
                "{ctx}: the child acknowledged ids out of order or with gaps"
            );
        }
        printed.sort_unstable();
        printed.dedup();
        assert_eq!(
            printed.len(),
            run.printed.len(),
            "{ctx}: an id was acknowledged twice"
        );
        let max_printed = *printed.last().expect("at least one id was printed");
        assert!(
            printed[0] > known,
            "{ctx}: id {} was acknowledged again (known: 1..={known})",
            printed[0]
        );
        assert!(
            max_printed <= total,
            "{ctx}: id {max_printed} was acknowledged but lost: the queue ends at {total}\n\
             child stderr:\n{}",
            run.stderr
        );
        // Each producer has at most one commit in flight that may have been
        // written but not yet printed.
        let unprinted = (total - known) - printed.len() as u64;
        assert!(
            unprinted <= threads as u64,
            "{ctx}: {unprinted} ids in the queue were never acknowledged \
             ({threads} producer(s) can have at most {threads} in flight)"
        );
        for id in [known + 1, total] {
            let task = store
                .live_task(id)
                .unwrap_or_else(|e| panic!("{ctx}: reading task {id}: {e}"))
                .unwrap_or_else(|| panic!("{ctx}: task {id} is queued but has no record"));
            assert_eq!(task.queue, QUEUE, "{ctx}");
        }

        // The log agrees with the state.
        let diffs = berth::store::verify::verify(&store)
            .unwrap_or_else(|e| panic!("{ctx}: replaying the log failed: {e}"));
        assert!(
            diffs.is_empty(),
            "{ctx}: log and state disagree: {diffs:#?}"
        );
        assert_eq!(store.next_seq() - 1, total, "{ctx}: one event per enqueue");

        known = total;
        drop(store);
    }
    assert!(known > cycles as u64, "too few tasks written: {known}");
    eprintln!(
        "{cycles} kill cycles, {known} tasks, {:?} (seed {seed})",
        started.elapsed()
    );
}

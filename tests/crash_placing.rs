//! A kill -9 while a large group's children are being placed (a chunk of
//! `PLACE_PER_STEP` per step): after the restart every child is placed
//! exactly once over the whole log, runs to success exactly once, and the
//! group finishes.
//!
//! A child process (this test binary, re-executed to run only
//! `crash_placing_child` with `BERTH_PLACING_CHILD_DIR` set) enqueues one
//! group of `CHILDREN` no-op children and runs the engine, printing `RUN`
//! as each child starts. The test kills it with SIGKILL a few milliseconds
//! after the first `RUN` (the first chunk is durable then, and the next
//! chunks are being placed), reopens the data dir and runs it to idle.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth::engine::{Engine, EngineConfig, Handlers, Outcome, PLACE_PER_STEP, TaskContext};
use berth::store::{EventKind, Options, Store, verify};
use berth::task::{Status, TaskSpec};

const DIR_VAR: &str = "BERTH_PLACING_CHILD_DIR";
const CHILD_TEST: &str = "crash_placing_child";
/// Four chunks and a half.
const CHILDREN: usize = 4 * PLACE_PER_STEP + PLACE_PER_STEP / 2;
/// Kill delays after the first start, one cycle each.
const DELAYS_MS: [u64; 3] = [0, 4, 15];

fn open(dir: &Path) -> Store {
    Store::open(dir, Options::default(), berth::clock::system())
        .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()))
}

/// The child: does nothing unless re-executed by the test below.
#[test]
fn crash_placing_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    // libtest has printed "test crash_placing_child ... " without a newline.
    println!();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(3);
    });
    let store = Arc::new(open(Path::new(&dir)));
    let mut h = Handlers::new();
    h.register("ModuleRun", |ctx: &TaskContext| {
        let mut out = std::io::stdout().lock();
        let _ = out
            .write_all(format!("RUN {}\n", ctx.task.id).as_bytes())
            .and_then(|()| out.flush());
        Outcome::success()
    });
    let engine = Engine::new(store, h, EngineConfig::default()).expect("engine");
    let specs: Vec<TaskSpec> = (0..CHILDREN)
        .map(|i| TaskSpec {
            weight: Some(1),
            ..common::spec("main", &format!("c{i}"))
        })
        .collect();
    engine.enqueue_batch(specs).expect("enqueue_batch");
    let summary = engine.run();
    panic!("the engine stopped, which it never should here: {summary:?}");
}

/// Runs the child until its first `RUN`, then kills it `delay` later.
fn run_and_kill(dir: &Path, delay: Duration) {
    let (status, stderr) = common::kill_after_line(
        common::child_test(CHILD_TEST).env(DIR_VAR, dir),
        "child task start",
        |l| l.starts_with("RUN "),
        delay,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the child ended before it was killed ({status}); stderr:\n{stderr}"
    );
}

/// How many times the log places and marks succeeded each task.
fn placements_and_successes(store: &Store) -> (BTreeMap<u64, u32>, BTreeMap<u64, u32>) {
    let (mut placed, mut succeeded) = (BTreeMap::new(), BTreeMap::new());
    for ev in store.events_from(1) {
        match ev.expect("a readable event").kind {
            EventKind::Placed { id, .. } => *placed.entry(id).or_insert(0) += 1,
            EventKind::Succeeded { id, .. } => *succeeded.entry(id).or_insert(0) += 1,
            _ => {}
        }
    }
    (placed, succeeded)
}

#[test]
fn kill_9_while_a_group_is_placed_places_and_runs_each_child_once() {
    let mut partial = 0;
    for delay in DELAYS_MS {
        let tmp = common::tempdir();
        let dir = tmp.path().join("data");
        run_and_kill(&dir, Duration::from_millis(delay));
        let ctx = format!("killed {delay} ms after the first start");

        let store = Arc::new(open(&dir));
        assert!(
            store.corrupt_records().is_empty(),
            "{ctx}: corrupt records: {:?}",
            store.corrupt_records()
        );
        let parent_id = store.queue_ids("main")[0];
        let children = store.task(parent_id).unwrap().expect("the parent").children;
        assert_eq!(children.len(), CHILDREN, "{ctx}");
        let (placed, _) = placements_and_successes(&store);
        let placed_at_kill = children.iter().filter(|c| placed.contains_key(c)).count();
        if placed_at_kill < CHILDREN {
            partial += 1;
        }
        eprintln!("{ctx}: {placed_at_kill} of {CHILDREN} children placed at the kill");

        let mut h = Handlers::new();
        h.register("ModuleRun", |_: &TaskContext| Outcome::success());
        let engine = Engine::new(store.clone(), h, EngineConfig::default()).expect("engine");
        engine.run_until_idle().expect("run_until_idle");

        let parent = store.task(parent_id).unwrap().expect("the parent");
        assert_eq!(parent.status, Status::Succeeded, "{ctx}: {parent:?}");
        let (placed, succeeded) = placements_and_successes(&store);
        for &c in children.iter() {
            let t = store.task(c).unwrap().expect("a child");
            assert_eq!(t.status, Status::Succeeded, "{ctx}: child {c}");
            assert_eq!(placed.get(&c), Some(&1), "{ctx}: child {c} placed once");
            assert_eq!(
                succeeded.get(&c),
                Some(&1),
                "{ctx}: child {c} succeeded once"
            );
        }
        let diffs = verify::verify(&store).expect("replaying the log");
        assert!(
            diffs.is_empty(),
            "{ctx}: log and state disagree: {diffs:#?}"
        );
    }
    eprintln!(
        "{partial} of {} kills came while the group was being placed",
        DELAYS_MS.len()
    );
}

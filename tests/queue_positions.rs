//! Queue positions kept in the live tasks' records (store format 7): a
//! renumbered queue rewrites its tasks and keeps its order across opens,
//! and a format-6 dir (positions in `q` keys) is folded at open, also after
//! a crash halfway through, also when its last (format-6) record is
//! re-applied by a later open, and is read as it is without writing. (A
//! kill -9 during a fold: `tests/crash_fold.rs`.)

mod common;

use std::path::Path;
use std::sync::Arc;

use berth::clock::FakeClock;
use berth::codec;
use berth::store::{Options, Placement, Store, keys, stored};
use berth::submit;
use berth::task::TaskSpec;
use common::format6::{inspect, make_format_6, queues};
use common::{T0, assert_log_agrees, open, spec, tempdir};

fn add(store: &Store, queue: &str, name: &str, p: Placement) -> u64 {
    submit::enqueue_one(store, spec(queue, name), p).expect("enqueue")
}

#[test]
fn a_renumbered_queue_keeps_its_order_across_opens() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let want = {
        let s = open(dir.path(), &clock);
        let first = add(&s, "main", "first", Placement::Last);
        add(&s, "main", "last", Placement::Last);
        add(&s, "other", "x", Placement::Last);
        // Each one right behind `first` halves the gap: 32 of them leave
        // no integer between, and the queue is renumbered.
        for i in 0..70 {
            add(&s, "main", &format!("n{i}"), Placement::After(first));
        }
        let q = queues(&s);
        assert_eq!(q["main"].len(), 72);
        assert_eq!(q["main"][0], first);
        assert_log_agrees(&s);
        q
    };
    let s = open(dir.path(), &clock);
    assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
    assert_eq!(queues(&s), want);
    assert_log_agrees(&s);
}

fn read_only(dir: &Path, clock: &FakeClock) -> Store {
    let opts = Options {
        read_only: true,
        ..Options::default()
    };
    Store::open(dir, opts, Arc::new(clock.clone())).expect("open to read")
}

#[test]
fn a_format_6_dir_is_folded_at_open_and_stays_so() {
    // All of it, or half (what a crash between two of the fold's batches
    // leaves: some positions folded, the others still in `q` keys).
    for half in [false, true] {
        let dir = tempdir();
        let clock = FakeClock::new(T0);
        let (want, group_child) = {
            let s = open(dir.path(), &clock);
            let mut ids = Vec::new();
            for i in 0..6 {
                ids.push(add(&s, "main", &format!("m{i}"), Placement::Last));
            }
            add(&s, "other", "o", Placement::First);
            // A group: its children wait in no queue.
            let specs: Vec<TaskSpec> = (0..3)
                .map(|i| TaskSpec {
                    weight: Some(1),
                    ..spec("main", &format!("c{i}"))
                })
                .collect();
            let parent = submit::enqueue_batch(&s, specs).unwrap()[0];
            let child = s.task(parent).unwrap().unwrap().children[0];
            let mut w = s.write();
            w.start(ids[0]).unwrap();
            w.commit().unwrap();
            add(&s, "main", "front", Placement::Before(ids[1]));
            (queues(&s), child)
        };
        assert!(make_format_6(dir.path(), |id| !half || id % 2 == 0, true, 6) > 0);
        // Reading leaves the dir as it is, and sees the same queues.
        {
            let s = read_only(dir.path(), &clock);
            assert_eq!(queues(&s), want, "half: {half}");
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
        }
        let (format, q) = inspect(dir.path());
        assert_eq!(format, 6);
        assert!(q > 0);
        {
            let s = open(dir.path(), &clock);
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
            // The running task was put back to wait: still the head.
            assert_eq!(queues(&s), want, "half: {half}");
            assert!(s.task(group_child).unwrap().is_some());
            assert_log_agrees(&s);
        }
        assert_eq!(
            inspect(dir.path()),
            (keys::STORE_FORMAT, 0),
            "every position folded"
        );
        // Opened again: the recovery's commit (a `failed` event: the order
        // does not change) is the last record now. Made a format-6 one (as
        // if no commit had followed the fold), it is re-applied at every
        // open, and writes its task's record alone: the task keeps the
        // position the fold gave it.
        assert_eq!(
            make_format_6(dir.path(), |_| false, false, keys::STORE_FORMAT),
            0
        );
        for _ in 0..2 {
            let s = open(dir.path(), &clock);
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
            assert_eq!(queues(&s), want, "half: {half}");
            assert_log_agrees(&s);
        }
        assert_eq!(inspect(dir.path()), (keys::STORE_FORMAT, 0));
    }
}

/// A `q` key that names a task that is not live, or gives a task a second
/// position, is reported as corrupt and left as it is; the task keeps the
/// position its own record holds.
#[test]
fn a_queue_key_that_cannot_be_folded_is_reported() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (a, b) = {
        let s = open(dir.path(), &clock);
        (
            add(&s, "main", "a", Placement::Last),
            add(&s, "main", "b", Placement::Last),
        )
    };
    let (stray, second) = (keys::queue_key("main", 99), keys::queue_key("main", -99));
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        db.insert(&stray, codec::encode(&12345u64)).unwrap();
        db.insert(&second, codec::encode(&b)).unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    let reasons: Vec<String> = s
        .corrupt_records()
        .iter()
        .map(|c| format!("{}: {}", c.key, c.reason))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("q/main/99") && r.contains("not live")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("q/main/-99") && r.contains("more than one")),
        "{reasons:?}"
    );
    assert_eq!(s.queue_ids("main"), vec![a, b]);
    drop(s);
    assert_eq!(inspect(dir.path()).1, 2, "left as they are");
}

/// A renumber rewrites every task of the queue; when one of their records
/// is damaged (its position still reads, so it holds its place), the
/// enqueue that needed the renumber is refused, naming the record, and the
/// order is as it was.
#[test]
fn a_renumber_over_a_damaged_record_is_refused_whole() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (first, bad, last) = {
        let s = open(dir.path(), &clock);
        let ids = (
            add(&s, "main", "first", Placement::Last),
            add(&s, "main", "bad", Placement::Last),
            add(&s, "main", "last", Placement::Last),
        );
        // A later commit, so that bad's is not the record re-applied at open.
        add(&s, "other", "x", Placement::Last);
        ids
    };
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        let key = keys::id_key(keys::TASK, bad);
        let mut v = db.get(key).unwrap().unwrap().to_vec();
        let parts = stored::split(&v);
        let at = v.len() - parts.record.len() / 2;
        v[at] ^= 0x40;
        db.insert(key, v).unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    let key = format!("t/{bad}");
    assert!(s.corrupt_records().iter().any(|c| c.key == key));
    assert_eq!(s.queue_ids("main"), vec![first, bad, last]);
    let mut refused = None;
    for i in 0..40 {
        let before = s.queue_ids("main");
        match submit::enqueue_one(&s, spec("main", &format!("n{i}")), Placement::After(first)) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(s.queue_ids("main"), before, "the order is as it was");
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let e = refused.expect("a renumber was needed within 40 enqueues");
    assert!(e.contains(&key) && e.contains("corrupt"), "{e}");
    // What needs no renumber still goes.
    let n = add(&s, "main", "tail", Placement::Last);
    assert_eq!(s.queue_ids("main").last(), Some(&n));
}

/// A running head keeps its place: `First` goes right behind it (behind
/// every running task at the front), a place before it is refused, and the
/// log records where the task went, so a replay agrees.
#[test]
fn first_goes_behind_a_running_head_and_before_it_is_refused() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    let b = add(&s, "main", "b", Placement::Last);
    // Nothing runs: first is first.
    let c = add(&s, "main", "c", Placement::First);
    assert_eq!(s.queue_ids("main"), [c, a, b]);
    let mut w = s.write();
    w.start(c).unwrap();
    w.commit().unwrap();
    let d = add(&s, "main", "d", Placement::First);
    assert_eq!(s.queue_ids("main"), [c, d, a, b]);
    let e = submit::enqueue_one(&s, spec("main", "e"), Placement::Before(c)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "task {c} is running; cannot place a task before it (a running task keeps its \
             place at the head; --first puts a task right behind it)"
        )
    );
    // Before a waiting task, as asked.
    let f = add(&s, "main", "f", Placement::Before(d));
    assert_eq!(s.queue_ids("main"), [c, f, d, a, b]);
    assert_log_agrees(&s);
}

/// A group parent stays `queued` while its children run, but once its
/// group has started (a child placed) it holds its place as a running head
/// does: `First` goes behind it and a place before it is refused. Before
/// that it is a waiting task like any other.
#[test]
fn a_started_group_keeps_its_place_at_the_head() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let specs = ["g1", "g2"]
        .iter()
        .map(|n| TaskSpec {
            weight: Some(1),
            ..spec("main", n)
        })
        .collect();
    let parent = submit::enqueue_batch(&s, specs).unwrap()[0];
    let children = s.task(parent).unwrap().unwrap().children;
    // Not started: first is first.
    let a = add(&s, "main", "a", Placement::First);
    assert_eq!(s.queue_ids("main"), [a, parent]);
    let mut w = s.write();
    w.place(children[0], "parallel_queue_0", Placement::Last)
        .unwrap();
    w.commit().unwrap();
    let mut w = s.write();
    w.remove(a).unwrap();
    w.commit().unwrap();
    let b = add(&s, "main", "b", Placement::First);
    assert_eq!(s.queue_ids("main"), [parent, b], "behind the started group");
    let e = submit::enqueue_one(&s, spec("main", "c"), Placement::Before(parent)).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "task {parent} is running; cannot place a task before it"
        )),
        "{e}"
    );
    assert_log_agrees(&s);
}

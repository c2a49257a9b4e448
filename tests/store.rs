//! The store: order operations and their persistence, the event log's
//! agreement with the state, recovery, corruption, the size budget, the lock.

mod common;

use berth::clock::{Clock, FakeClock};
use berth::store::{
    AttemptLog, AttemptOutcome, EventKind, INTERRUPTED, OpenError, Options, OutputTail, Placement,
    Store, WriteError, verify,
};
use berth::submit;
use berth::task::Status;
use common::{T0, assert_log_agrees, open, spec, tempdir};

fn add(store: &Store, queue: &str, name: &str, p: Placement) -> u64 {
    submit::enqueue_one(store, spec(queue, name), p).expect("enqueue")
}

/// Tasks a and b in `main`, then c in `other` (so that b's is not the last
/// record: opening re-applies the last record's writes, which would repair
/// b); then `tamper` rewrites b's stored value behind berth's back.
fn two_tasks_then_tamper_b(
    dir: &std::path::Path,
    clock: &FakeClock,
    tamper: impl FnOnce(u64, Vec<u8>) -> Vec<u8>,
) -> (u64, u64) {
    let (a, b);
    {
        let s = open(dir, clock);
        a = add(&s, "main", "a", Placement::Last);
        b = add(&s, "main", "b", Placement::Last);
        add(&s, "other", "c", Placement::Last);
    }
    let db = sled::open(dir.join("db")).unwrap();
    let key = berth::store::keys::id_key(berth::store::keys::TASK, b);
    let v = db.get(key).unwrap().unwrap().to_vec();
    db.insert(key, tamper(b, v)).unwrap();
    db.flush().unwrap();
    (a, b)
}

/// A log of the attempt `w` sees running for `id`, with some output.
fn log_of(w: &mut berth::store::WriteTxn<'_>, id: u64, outcome: AttemptOutcome) -> AttemptLog {
    let t = w.task(id).unwrap().clone();
    let b = berth::budget::Budget::default();
    let out = format!("attempt {} of {}\n", t.attempts, t.name);
    AttemptLog {
        attempt: t.attempts,
        started_at: t.started_at.unwrap_or(0),
        ended_at: w.now(),
        outcome,
        exit_code: Some(1),
        signal: None,
        stdout: OutputTail::new(out.len() as u64, out.as_bytes(), &b),
        stderr: OutputTail::new(3, b"err", &b),
    }
}

#[test]
fn every_order_operation_and_its_persistence() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (a, b, c, d, e);
    {
        let s = open(dir.path(), &clock);
        a = add(&s, "main", "a", Placement::Last);
        b = add(&s, "main", "b", Placement::Last);
        c = add(&s, "main", "c", Placement::First);
        d = add(&s, "main", "d", Placement::After(c));
        e = add(&s, "main", "e", Placement::Before(b));
        assert!(a < b && b < c && c < d && d < e, "ids increase");
        assert_eq!(s.queue_ids("main"), vec![c, d, a, e, b]);
        assert_eq!(s.head("main"), Some(c));
        assert_eq!(s.queue_len("main"), 5);
        let mut w = s.write();
        w.remove(a).unwrap();
        w.commit().unwrap();
        assert_eq!(s.queue_ids("main"), vec![c, d, e, b]);
        assert_log_agrees(&s);
    }
    let s = open(dir.path(), &clock);
    assert_eq!(
        s.queue_ids("main"),
        vec![c, d, e, b],
        "order survives reopening"
    );
    assert_eq!(s.head("main"), Some(c));
    assert_eq!(s.queue_len("main"), 4);
    // Ids are never reused, even after the highest was removed.
    let mut w = s.write();
    w.remove(e).unwrap();
    w.commit().unwrap();
    drop(s);
    let s = open(dir.path(), &clock);
    let f = add(&s, "main", "f", Placement::Last);
    assert!(f > e);
    assert_log_agrees(&s);
}

#[test]
fn anchors_in_other_queues_and_missing_tasks_are_refused_without_writing() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    let seq = s.next_seq();
    let err = submit::enqueue_one(&s, spec("other", "x"), Placement::After(a)).unwrap_err();
    assert!(
        err.to_string()
            .contains("is in queue 'main', not in 'other'"),
        "{err}"
    );
    let err = submit::enqueue_one(&s, spec("main", "x"), Placement::Before(999)).unwrap_err();
    assert!(
        err.to_string().contains("task 999 is not in any queue"),
        "{err}"
    );
    assert_eq!(s.next_seq(), seq, "nothing was logged");
    assert_eq!(s.queue_ids("main"), vec![a]);
    assert_eq!(s.queue_len("other"), 0);
}

/// Every task `s` holds as a transaction reads it (through the warm
/// records, `store/warm.rs`) is the stored record, decoded.
fn assert_reads_are_stored(s: &Store, ids: &[u64]) {
    let mut w = s.write();
    let seen: Vec<_> = ids.iter().map(|id| w.task(*id).unwrap().clone()).collect();
    drop(w);
    for (id, seen) in ids.iter().zip(seen) {
        assert_eq!(s.task(*id).unwrap(), Some(seen), "task {id}");
    }
}

#[test]
fn the_log_agrees_with_the_state_after_every_operation() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let mut rng = fastrand::Rng::with_seed(0xBE27);
    let queues = ["main", "parallel_queue_0", "named.q"];
    let mut live: Vec<u64> = Vec::new();
    for step in 0..400 {
        clock.advance_ms(rng.u64(1..2000));
        let q = queues[rng.usize(..queues.len())];
        let before = live.clone();
        let mut w = s.write();
        match rng.u8(..12) {
            0..=3 => {
                let p = match (rng.u8(..4), w.head(q)) {
                    (1, _) => Placement::First,
                    (2, Some(h)) => Placement::After(h),
                    (3, Some(h)) => Placement::Before(h),
                    _ => Placement::Last,
                };
                let t = spec(q, &format!("t{step}"))
                    .into_task(clock.now_ms(), s.budget())
                    .unwrap();
                live.push(w.enqueue(t, Some(p)).unwrap());
            }
            4 | 5 => {
                if let Some(h) = w.head(q) {
                    if w.task(h).unwrap().status == Status::Queued {
                        w.start(h).unwrap();
                    } else if rng.bool() {
                        let message = format!("boom {step}");
                        let log = log_of(
                            &mut w,
                            h,
                            AttemptOutcome::Failed {
                                message: message.clone(),
                            },
                        );
                        w.log_attempt(h, log).unwrap();
                        w.fail(h, message, Some(rng.u64(0..5000))).unwrap();
                    } else {
                        let log = log_of(&mut w, h, AttemptOutcome::Succeeded);
                        w.log_attempt(h, log).unwrap();
                        w.succeed(h, None).unwrap();
                        w.to_history(h, Status::Succeeded).unwrap();
                        live.retain(|x| *x != h);
                    }
                }
            }
            6 => {
                if !live.is_empty() {
                    let id = live.swap_remove(rng.usize(..live.len()));
                    w.remove(id).unwrap();
                }
            }
            7 => {
                if let Some(h) = w.head(q) {
                    w.requeue(h, Some(clock.now_ms() + 100)).unwrap();
                }
            }
            10 => {
                if !live.is_empty() {
                    let id = live.swap_remove(rng.usize(..live.len()));
                    let c = w.cancel(id, &|_| false).unwrap();
                    assert_eq!(c.ids, vec![id]);
                }
            }
            11 => {
                // Many attempts of one head, so that old logs are dropped.
                if let Some(h) = w.head(q) {
                    for _ in 0..rng.usize(1..8) {
                        if w.task(h).unwrap().status == Status::Queued {
                            w.start(h).unwrap();
                        }
                        let log = log_of(&mut w, h, AttemptOutcome::Repeat);
                        w.log_attempt(h, log).unwrap();
                        w.requeue(h, None).unwrap();
                    }
                }
            }
            _ => {
                if let Some(h) = w.head(q) {
                    w.fail(h, "dead".into(), None).unwrap();
                    w.to_history(h, Status::Failed).unwrap();
                    live.retain(|x| *x != h);
                }
            }
        }
        // Now and then a transaction is dropped: it changes nothing.
        if rng.u8(..10) == 0 {
            drop(w);
            live = before;
        } else {
            w.commit().unwrap();
        }
        assert_log_agrees(&s);
        // As the engine does after a step: the task behind each one
        // running is read ahead; a transaction then reads them as stored.
        s.warm_next(live.iter().copied());
        assert_reads_are_stored(&s, &live);
    }
    assert!(s.next_seq() > 300, "the run really changed things");
    let logged: Vec<_> = s.all_attempts().into_iter().map(Result::unwrap).collect();
    assert!(logged.len() > 40, "{} attempt logs", logged.len());
    drop(s);
    let s = open(dir.path(), &clock);
    assert_log_agrees(&s);
}

#[test]
fn a_task_keeps_the_logs_of_its_last_twenty_attempts_and_removing_it_drops_them() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    let b = add(&s, "main", "b", Placement::Last);
    for n in 1..=25u32 {
        clock.advance_ms(10);
        let mut w = s.write();
        w.start(a).unwrap();
        let log = log_of(
            &mut w,
            a,
            AttemptOutcome::Failed {
                message: format!("no {n}"),
            },
        );
        w.log_attempt(a, log).unwrap();
        w.fail(a, format!("no {n}"), None).unwrap();
        w.commit().unwrap();
        assert_log_agrees(&s);
    }
    let logs = s.attempts(a).unwrap();
    let numbers: Vec<u32> = logs.iter().map(|l| l.attempt).collect();
    assert_eq!(numbers, (6..=25).collect::<Vec<_>>());
    assert_eq!(
        logs[19].outcome,
        AttemptOutcome::Failed {
            message: "no 25".into()
        }
    );
    let out = logs[19].stdout.bytes(s.budget()).unwrap();
    assert_eq!(out, b"attempt 25 of a\n");
    assert!(s.attempts(b).unwrap().is_empty());
    // They survive reopening, and the log still agrees.
    drop(s);
    let s = open(dir.path(), &clock);
    assert_eq!(s.attempts(a).unwrap().len(), 20);
    assert_eq!(s.attempt_numbers(a).unwrap().len(), 20);
    assert_log_agrees(&s);
    // A log for a task that is not live is refused.
    let mut w = s.write();
    w.to_history(b, Status::Failed).unwrap();
    let log = AttemptLog::interrupted(1, None, T0);
    assert!(matches!(
        w.log_attempt(b, log),
        Err(WriteError::WrongState { .. })
    ));
    w.commit().unwrap();
    // A log must be for the task's current attempt.
    let mut w = s.write();
    let mut log = AttemptLog::interrupted(24, None, T0);
    assert_eq!(
        w.log_attempt(a, log.clone()).unwrap_err().to_string(),
        format!("task {a} is at attempt 25, not 24; cannot log that attempt")
    );
    log.attempt = 25;
    w.log_attempt(a, log).unwrap();
    drop(w);
    let mut w = s.write();
    w.remove(a).unwrap();
    w.commit().unwrap();
    assert!(s.attempts(a).unwrap().is_empty());
    assert!(s.all_attempts().is_empty());
    assert_log_agrees(&s);
    // A log and a removal in one transaction leave no log behind.
    let c = add(&s, "main", "c", Placement::Last);
    let mut w = s.write();
    w.start(c).unwrap();
    w.log_attempt(c, AttemptLog::interrupted(1, None, T0))
        .unwrap();
    w.remove(c).unwrap();
    w.commit().unwrap();
    assert!(s.all_attempts().is_empty());
    assert_log_agrees(&s);
}

#[test]
fn cancelling_ends_a_task_or_a_group_and_refuses_what_it_cannot() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    let specs = vec![
        berth::task::TaskSpec {
            weight: Some(5),
            ..spec("main", "x")
        },
        berth::task::TaskSpec {
            weight: Some(5),
            ..spec("main", "y")
        },
    ];
    let parent = submit::enqueue_batch(&s, specs).unwrap()[0];
    let children = s.task(parent).unwrap().unwrap().children;
    let mut w = s.write();
    // A group child alone, a finished task and a missing one are refused.
    let e = w.cancel(children[0], &|_| false).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "task {} is part of group {parent}; cannot cancel it alone (cancel its group instead)",
            children[0]
        )
    );
    assert!(matches!(
        w.cancel(99, &|_| false),
        Err(WriteError::NoSuchTask(99))
    ));
    // A running child: the group waits for it; the other ends at once.
    let c = w.cancel(parent, &|id| id == children[1]).unwrap();
    assert_eq!(c.ids, vec![children[0], children[1], parent]);
    assert_eq!(c.running, vec![children[1]]);
    assert_eq!(w.task(children[0]).unwrap().status, Status::Cancelled);
    assert!(w.is_live(parent).unwrap());
    w.cancel_one(children[1]).unwrap();
    w.cancel_one(parent).unwrap();
    let c = w.cancel(a, &|_| false).unwrap();
    assert_eq!((c.ids, c.running), (vec![a], vec![]));
    w.commit().unwrap();
    for id in [a, parent, children[0], children[1]] {
        let t = s.history_task(id).unwrap().unwrap();
        assert_eq!(t.status, Status::Cancelled);
        assert_eq!(t.finished_at, Some(T0));
    }
    assert_eq!(s.queue_len("main"), 0);
    let mut w = s.write();
    assert_eq!(
        w.cancel(a, &|_| false).unwrap_err().to_string(),
        format!("task {a} is finished (cancelled); cannot cancel it")
    );
    drop(w);
    assert_log_agrees(&s);
}

#[test]
fn a_dropped_transaction_changes_nothing() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    {
        let mut w = s.write();
        let t = spec("main", "b").into_task(T0, s.budget()).unwrap();
        w.enqueue(t, Some(Placement::First)).unwrap();
        w.remove(a).unwrap();
    }
    assert_eq!(s.queue_ids("main"), vec![a]);
    assert_log_agrees(&s);
}

#[test]
fn a_batch_with_one_bad_entry_writes_nothing_and_names_it() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let mut bad = spec("main", "y");
    bad.tags = vec!["no spaces allowed".into()];
    let err = submit::enqueue_batch(&s, vec![spec("main", "x"), bad]).unwrap_err();
    assert!(
        err.to_string().starts_with("entry 2 of 2, field tags:"),
        "{err}"
    );
    assert_eq!(s.queue_len("main"), 0);
    assert_eq!(s.next_seq(), 1);
    let ids = submit::enqueue_batch(&s, vec![spec("main", "x"), spec("main", "y")]).unwrap();
    assert_eq!(s.queue_ids("main"), ids);
}

/// A group of `names` in `main`, each child placed in a parallel queue of
/// its own, the first two started: (the parent, the children).
fn group_with_two_running(s: &Store, names: &[&str]) -> (u64, std::sync::Arc<[u64]>) {
    let specs = names
        .iter()
        .map(|n| berth::task::TaskSpec {
            weight: Some(1),
            ..spec("main", n)
        })
        .collect();
    let parent = submit::enqueue_batch(s, specs).unwrap()[0];
    let children = s.task(parent).unwrap().unwrap().children;
    let mut w = s.write();
    for (i, &c) in children.iter().enumerate() {
        w.place(c, &format!("parallel_queue_{i}"), Placement::Last)
            .unwrap();
    }
    w.start(children[0]).unwrap();
    w.start(children[1]).unwrap();
    w.commit().unwrap();
    (parent, children)
}

/// A group child running at a crash counts on its parent in recovery's own
/// commit, whoever opens the dir next: a command with no engine at all
/// (here a bare open) leaves the parent with the failure and its error
/// line, as a daemon would.
#[test]
fn a_child_running_at_a_crash_counts_on_its_parent_at_any_open() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (parent, children);
    {
        let s = open(dir.path(), &clock);
        (parent, children) = group_with_two_running(&s, &["echo", "mcplay", "upmeter"]);
        // Dropping the store with two children running is what a crash
        // leaves on disk.
    }
    let s = open(dir.path(), &clock);
    assert_eq!(s.recovered(), &children[..2]);
    let p = s.task(parent).unwrap().unwrap();
    assert_eq!(p.status, Status::Queued);
    assert_eq!(
        p.failures, 2,
        "both interrupted attempts count on the parent"
    );
    let errors = p.last_failure.clone().unwrap_or_default();
    assert!(
        errors.contains(&format!("- echo: {INTERRUPTED}"))
            && errors.contains(&format!("- mcplay: {INTERRUPTED}"))
            && !errors.contains("upmeter"),
        "{errors}"
    );
    assert_log_agrees(&s);
    drop(s);
    // Counted once: a second open finds nothing to recover or count.
    let s = open(dir.path(), &clock);
    assert_eq!(s.task(parent).unwrap().unwrap().failures, 2);
}

/// A group cancel waits for its running children: their siblings that did
/// not run end at once, the rest when their handlers return. A crash in
/// between leaves a live group with a cancelled child, which only a cancel
/// makes: the next open ends that cancel, as it would have ended (before,
/// the running children ran again and the group ended a dead letter).
#[test]
fn a_group_cancel_under_way_at_a_crash_ends_at_the_next_open() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (parent, children);
    {
        let s = open(dir.path(), &clock);
        (parent, children) = group_with_two_running(&s, &["r1", "r2", "r3"]);
        let (r1, r2) = (children[0], children[1]);
        let mut w = s.write();
        let c = w.cancel(parent, &|x| x == r1 || x == r2).unwrap();
        assert_eq!(c.running, [r1, r2]);
        w.commit().unwrap();
        assert_eq!(
            s.task(children[2]).unwrap().unwrap().status,
            Status::Cancelled
        );
        // The handlers of r1 and r2 never return: the process dies.
    }
    let s = open(dir.path(), &clock);
    for &id in children.iter().chain([&parent]) {
        let t = s.task(id).unwrap().unwrap();
        assert_eq!(t.status, Status::Cancelled, "task {id} {}", t.name);
        assert_eq!(s.queue_of(id), None, "task {id} left its queue");
    }
    let outcomes: Vec<_> = s
        .attempts(children[0])
        .unwrap()
        .iter()
        .map(|l| l.outcome.clone())
        .collect();
    assert_eq!(outcomes, [AttemptOutcome::Interrupted]);
    assert_eq!(s.queued_total(), 0);
    assert_log_agrees(&s);
    drop(s);
    let s = open(dir.path(), &clock);
    assert_eq!(s.task(parent).unwrap().unwrap().status, Status::Cancelled);
}

#[test]
fn a_task_running_at_a_crash_goes_back_to_the_head_with_a_failure() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (a, b);
    {
        let s = open(dir.path(), &clock);
        a = add(&s, "main", "a", Placement::Last);
        b = add(&s, "main", "b", Placement::Last);
        let mut w = s.write();
        w.start(a).unwrap();
        w.commit().unwrap();
        // Dropping the store without finishing `a` is what a crash leaves on disk.
    }
    let s = open(dir.path(), &clock);
    assert_eq!(s.recovered(), &[a]);
    let t = s.task(a).unwrap().unwrap();
    assert_eq!(t.status, Status::Queued);
    assert_eq!(t.failures, 1);
    assert_eq!(t.last_failure.as_deref(), Some(INTERRUPTED));
    assert_eq!(s.queue_ids("main"), vec![a, b]);
    let events: Vec<_> = s.events_from(1).map(Result::unwrap).collect();
    assert!(matches!(events[events.len() - 1].kind, EventKind::Failed { id, .. } if id == a));
    assert!(matches!(
        &events[events.len() - 2].kind,
        EventKind::AttemptLogged { id, log } if *id == a && log.outcome == AttemptOutcome::Interrupted
    ));
    let logs = s.attempts(a).unwrap();
    assert_eq!(logs.len(), 1);
    assert_eq!((logs[0].attempt, logs[0].started_at), (1, T0));
    assert_eq!(logs[0].outcome, AttemptOutcome::Interrupted);
    assert_log_agrees(&s);
    drop(s);
    // Recovery is done once: a second open finds nothing to recover.
    let s = open(dir.path(), &clock);
    assert!(s.recovered().is_empty());
    assert_eq!(s.task(a).unwrap().unwrap().failures, 1);
}

#[test]
fn a_corrupt_record_is_reported_with_its_key_not_trusted() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    // Flip one byte of task b's record.
    let (a, b) = two_tasks_then_tamper_b(dir.path(), &clock, |_, mut v| {
        let mid = v.len() / 2;
        v[mid] ^= 0x40;
        v
    });
    let s = open(dir.path(), &clock);
    let key = format!("t/{b}");
    assert!(
        s.corrupt_records()
            .iter()
            .any(|c| c.key == key && c.reason.contains("checksum")),
        "{:?}",
        s.corrupt_records()
    );
    let err = s.task(b).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("record {key} is corrupt")),
        "{err}"
    );
    assert_eq!(
        s.queue_ids("main"),
        vec![a, b],
        "the corrupt task is still listed"
    );
    let view = berth::report::snapshot(&s, 0, usize::MAX, &|_| String::new());
    assert!(
        view[0].tasks[1]
            .description
            .starts_with(&format!("<corrupt task {b}: record {key} is corrupt"))
    );
    assert!(
        verify::verify(&s).is_err(),
        "verify refuses to trust the corrupt record"
    );
}

#[test]
fn a_summary_that_is_not_its_records_is_reported() {
    use berth::store::stored::{self, Summary};
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    // Give task b a summary (well framed, checksummed) that says it
    // expires, which its record does not.
    let (a, b) = two_tasks_then_tamper_b(dir.path(), &clock, |b, v| {
        let parts = stored::split(&v);
        let (position, record) = (parts.position.unwrap(), parts.record);
        assert!(parts.summary.is_some(), "written with a summary");
        let lie = berth::codec::encode(&Summary {
            id: b,
            running: false,
            deadline: Some(T0 + 1),
        });
        let mut tampered = vec![0, 0x80 | u8::try_from(position.len()).unwrap()];
        tampered.extend_from_slice(position);
        tampered.push(u8::try_from(lie.len()).unwrap());
        tampered.extend_from_slice(&lie);
        tampered.extend_from_slice(record);
        assert_eq!(stored::split(&tampered).record, record);
        tampered
    });
    let s = open(dir.path(), &clock);
    let key = format!("t/{b}");
    let err = s.task(b).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("record {key} is corrupt")) && err.contains("summary"),
        "{err}"
    );
    assert_eq!(
        s.task(a).unwrap().map(|t| t.id),
        Some(a),
        "a is read as before"
    );
    assert_eq!(s.queue_ids("main"), vec![a, b], "b keeps its place");
    let report = verify::verify(&s).unwrap_err().to_string();
    assert!(report.contains(&key), "{report}");
}

#[test]
fn large_payloads_are_compressed_and_over_budget_ones_refused() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let rows: Vec<_> = (0..20_000)
        .map(|i| serde_json::json!({"module": format!("m{i}"), "enabled": true}))
        .collect();
    let mut big = spec("main", "big");
    big.payload = serde_json::json!(rows);
    let id = submit::enqueue_one(&s, big.clone(), Placement::Last).unwrap();
    let t = s.task(id).unwrap().unwrap();
    assert!(t.payload.compressed);
    assert_eq!(
        t.payload.to_json("payload", s.budget()).unwrap(),
        big.payload
    );

    let mut rng = fastrand::Rng::with_seed(3);
    let noise: String = (0..4 << 20).map(|_| rng.alphanumeric()).collect();
    let mut huge = spec("main", "huge");
    huge.payload = serde_json::json!(noise);
    let seq = s.next_seq();
    let err = submit::enqueue_one(&s, huge, Placement::Last).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("MiB after compression; the object budget is 1.5 MiB"),
        "{msg}"
    );
    assert!(err.is_bad_input());
    assert_eq!(s.next_seq(), seq);
    assert_eq!(s.queue_len("main"), 1);
}

#[test]
fn a_data_dir_in_use_is_refused_with_a_clear_error() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let _held = Store::open(
        dir.path(),
        Options {
            role: berth::store::Role::Daemon,
            ..Options::default()
        },
        std::sync::Arc::new(clock.clone()),
    )
    .unwrap();
    let err = Store::open(dir.path(), Options::default(), std::sync::Arc::new(clock)).unwrap_err();
    assert!(matches!(err, OpenError::InUse { .. }));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "data dir {} is in use by another berth process",
            dir.path().display()
        )),
        "{msg}"
    );
}

#[test]
fn sync_commits_from_many_threads_share_flushes() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let before = s.flush_count();
    std::thread::scope(|sc| {
        for t in 0..8 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..40 {
                    add(s, "main", &format!("t{t}-{i}"), Placement::Last);
                }
            });
        }
    });
    assert_eq!(s.queue_len("main"), 320);
    let flushes = s.flush_count() - before;
    assert!(flushes <= 320, "at most one flush per commit ({flushes})");
    assert_log_agrees(&s);
}

#[test]
fn wrong_state_transitions_are_refused() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let a = add(&s, "main", "a", Placement::Last);
    let mut w = s.write();
    let e = w.succeed(a, None).unwrap_err();
    assert!(matches!(e, WriteError::WrongState { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("task {a} is queued; cannot mark it succeeded")
    );
}

#[test]
fn opening_re_applies_a_commit_whose_writes_were_cut_short() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (a, b);
    {
        let s = open(dir.path(), &clock);
        a = add(&s, "main", "a", Placement::Last);
        b = add(&s, "main", "b", Placement::Last);
    }
    {
        // What a crash between the commit record and its writes leaves behind:
        // the record of b's commit is there, its task key (and with it, its
        // queue position) is not.
        let db = sled::open(dir.path().join("db")).unwrap();
        db.remove(berth::store::keys::id_key(berth::store::keys::TASK, b))
            .unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    assert_eq!(s.queue_ids("main"), vec![a, b]);
    assert_eq!(s.task(b).unwrap().unwrap().name, "b");
    assert_log_agrees(&s);
}

#[test]
fn opening_re_applies_every_commit_after_the_applied_mark() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let ids: Vec<u64>;
    {
        let s = open(dir.path(), &clock);
        ids = (0..5)
            .map(|i| add(&s, "main", &format!("t{i}"), Placement::Last))
            .collect();
        let mut w = s.write();
        w.start(ids[0]).unwrap();
        w.succeed(ids[0], None).unwrap();
        w.to_history(ids[0], Status::Succeeded).unwrap();
        w.commit().unwrap();
    }
    {
        // What a crash leaves when the applier had not yet written the last
        // four commits: their records are there, their keys and the mark are not.
        use berth::store::keys;
        let db = sled::open(dir.path().join("db")).unwrap();
        db.insert(keys::META_APPLIED, berth::codec::encode(&1u64))
            .unwrap();
        for id in &ids[1..] {
            db.remove(keys::id_key(keys::TASK, *id)).unwrap();
        }
        db.remove(keys::id_key(keys::HISTORY, ids[0])).unwrap();
        db.insert(keys::id_key(keys::TASK, ids[0]), b"stale".to_vec())
            .unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
    assert_eq!(s.queue_ids("main"), ids[1..].to_vec());
    assert_eq!(s.task(ids[0]).unwrap().unwrap().status, Status::Succeeded);
    assert_log_agrees(&s);
}

/// A format-3 dir kept its counters in the default tree; opening it moves
/// them to their own tree (format 4) with the same values, and the log
/// still agrees with the state. Also after a crash between the copy and the
/// delete (both trees hold them, the format still 3).
#[test]
fn opening_a_format_3_dir_moves_its_counters_to_their_tree() {
    for crash_midway in [false, true] {
        let dir = tempdir();
        let clock = FakeClock::new(T0);
        let counts = {
            let store = open(dir.path(), &clock);
            let a = add(&store, "main", "a", Placement::Last);
            add(&store, "main", "b", Placement::Last);
            let mut w = store.write();
            w.start(a).unwrap();
            w.succeed(a, None).unwrap();
            w.commit().unwrap();
            let c = store.counting().counts;
            assert!(!c.is_empty(), "a finished task is counted");
            c
        };
        // Make it format 3 as a format-3 build left it.
        {
            let db = sled::open(dir.path().join("db")).expect("sled");
            let counters = db.open_tree("counters").unwrap();
            let mut n = 0;
            for item in counters.iter() {
                let (k, v) = item.unwrap();
                assert_eq!(k[0], b'c');
                db.insert(&k, v).unwrap();
                if !crash_midway {
                    counters.remove(&k).unwrap();
                }
                n += 1;
            }
            assert!(n > 0);
            db.insert(b"mformat", berth::codec::encode(&3u64)).unwrap();
            db.flush().unwrap();
        }
        let store = open(dir.path(), &clock);
        assert_eq!(store.counting().counts, counts);
        assert_log_agrees(&store);
        drop(store);
        let db = sled::open(dir.path().join("db")).expect("sled");
        assert_eq!(
            db.scan_prefix(b"c").count(),
            0,
            "moved out of the default tree"
        );
        let format = db.get(b"mformat").unwrap().unwrap();
        assert_eq!(
            berth::codec::decode::<u64>(&format),
            Ok(berth::store::keys::STORE_FORMAT)
        );
    }
}

/// The pieces of the log's last record that are not whole (what a sled
/// batch cut by a write error leaves: its commit was never acknowledged)
/// are removed at open, with a warning, and the next commit takes its
/// number; the same pieces before another record are a corrupt record,
/// reported and kept.
#[test]
fn a_torn_last_record_is_removed_at_open_and_a_torn_one_before_others_is_reported() {
    use berth::store::keys;
    fn piece_key(seq: u64, i: u32) -> Vec<u8> {
        let mut k = keys::id_key(keys::EVENT, seq).to_vec();
        k.extend_from_slice(&i.to_be_bytes());
        k
    }
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let ids: Vec<u64> = {
        let s = open(dir.path(), &clock);
        (0..3)
            .map(|i| add(&s, "main", &format!("t{i}"), Placement::Last))
            .collect()
    };
    let torn = |seq: u64, pieces: &[u32]| {
        let db = sled::open(dir.path().join("db")).unwrap();
        for &i in pieces {
            db.insert(piece_key(seq, i), vec![7u8; 6144]).unwrap();
        }
        db.flush().unwrap();
    };
    // Events 1 to 3 are the three enqueues: pieces of event 4 on, last.
    torn(4, &[0, 2]);
    let mut ids = ids;
    {
        let s = open(dir.path(), &clock);
        assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
        assert_eq!(s.next_seq(), 4, "the torn record's number is free again");
        assert_eq!(s.queue_ids("main"), ids);
        ids.push(add(&s, "main", "after", Placement::Last));
        assert_eq!(s.next_seq(), 5);
        assert_log_agrees(&s);
    }
    // Only the first piece of a record (the applier writes a record's
    // pieces one by one): torn just the same.
    torn(5, &[0]);
    {
        let s = open(dir.path(), &clock);
        assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
        assert_eq!(s.next_seq(), 5, "the torn record's number is free again");
        assert_eq!(s.queue_ids("main"), ids);
        assert_log_agrees(&s);
    }
    // Pieces of event 2 sit between whole records: corruption, which
    // `verify` reports (open reads only the records after the applied mark).
    torn(2, &[0, 2]);
    let s = open(dir.path(), &clock);
    let why = verify::verify(&s)
        .expect_err("a corrupt record")
        .to_string();
    assert!(
        why.contains("e/2") && why.contains("piece 2 where piece 1"),
        "{why}"
    );
    drop(s);
    let db = sled::open(dir.path().join("db")).unwrap();
    assert!(
        db.get(piece_key(2, 0)).unwrap().is_some(),
        "kept, not removed"
    );
}

/// A group parent's children list is stored once under `g` ‖ its id and
/// its record carries the marker `[0]`; a parent stored whole (as builds
/// before format 5 did) reads back the same and is stored apart at its
/// next change; removing the group removes the list.
#[test]
fn a_parents_children_are_stored_once_apart_and_go_with_it() {
    use berth::store::keys;
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let g_key = |id: u64| keys::id_key(b'g', id);
    let specs: Vec<_> = (0..5)
        .map(|i| berth::task::TaskSpec {
            weight: Some(1),
            ..spec("main", &format!("c{i}"))
        })
        .collect();
    let (parent, children) = {
        let s = open(dir.path(), &clock);
        let ids = submit::enqueue_batch(&s, specs).unwrap();
        let parent = ids
            .iter()
            .copied()
            .find(|id| !s.task(*id).unwrap().unwrap().children.is_empty())
            .expect("a group parent");
        let children = s.task(parent).unwrap().unwrap().children;
        assert_eq!(children.len(), 5);
        for c in children.iter() {
            assert_eq!(s.task(*c).unwrap().unwrap().parent, Some(parent));
        }
        (parent, children)
    };
    let value = |db: &sled::Db| db.get(keys::id_key(keys::TASK, parent)).unwrap().unwrap();
    let stored = |db: &sled::Db| -> berth::task::Task {
        berth::store::stored::decode(keys::TASK, &value(db)).unwrap()
    };
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        assert_eq!(&stored(&db).children[..], [0], "the record has the marker");
        let list: Vec<u64> =
            berth::codec::decode(&db.get(g_key(parent)).unwrap().unwrap()).unwrap();
        assert_eq!(list[..], children[..]);
        // As a format-4 build stored it: whole, and no `g` key (in its
        // queue position, which a format-4 build kept in a `q` key).
        let mut whole = stored(&db);
        whole.children = children.clone();
        let v = value(&db);
        let position = berth::store::stored::split(&v).position.unwrap();
        db.insert(
            keys::id_key(keys::TASK, parent),
            berth::store::stored::with_position(position, &berth::codec::encode(&whole)),
        )
        .unwrap();
        db.remove(g_key(parent)).unwrap();
        db.flush().unwrap();
    }
    {
        let s = open(dir.path(), &clock);
        assert_eq!(s.task(parent).unwrap().unwrap().children, children);
        let mut w = s.write();
        w.update_group(parent, "renamed".into(), 0, None).unwrap();
        w.commit().unwrap();
        assert_log_agrees(&s);
    }
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        assert_eq!(&stored(&db).children[..], [0], "stored apart at its change");
        assert!(db.get(g_key(parent)).unwrap().is_some());
    }
    let s = open(dir.path(), &clock);
    assert_eq!(s.task(parent).unwrap().unwrap().children, children);
    let mut w = s.write();
    w.remove(parent).unwrap();
    w.commit().unwrap();
    assert_log_agrees(&s);
    drop(s);
    let db = sled::open(dir.path().join("db")).unwrap();
    assert!(
        db.get(g_key(parent)).unwrap().is_none(),
        "the list went with the group"
    );
}

/// A cut of the log right after the commits it covers: it waits for the
/// applier to write them (open re-applies only what follows `mapplied`),
/// then takes out exactly the records up to the checkpoint, and the log
/// begins right after it. A cut that would not end at the checkpoint is
/// refused whole.
#[test]
fn a_log_cut_is_whole_and_waits_for_the_applier() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let s = open(dir.path(), &clock);
    let ids: Vec<u64> = (0..30)
        .map(|i| add(&s, "main", &format!("t{i}"), Placement::Last))
        .collect();
    // One record of several events.
    let mut w = s.write();
    w.start(ids[0]).unwrap();
    w.succeed(ids[0], None).unwrap();
    w.to_history(ids[0], Status::Succeeded).unwrap();
    w.commit().unwrap();
    let upto = s.next_seq() - 1;
    add(&s, "main", "after", Placement::Last);
    add(&s, "main", "last", Placement::Last);
    // Not a record's end: nothing to cut.
    assert!(s.log_cut(upto - 1).unwrap().is_none());
    let cut = s.log_cut(upto).unwrap().expect("a cut");
    assert!(
        s.applied_mark().unwrap() >= upto - 2,
        "the cut records are applied"
    );
    assert_eq!(cut.records.len(), 31);
    assert_eq!(s.cut_log(cut).unwrap(), 31);
    assert_eq!(s.log_start().unwrap(), upto + 1);
    let records = s.log_records().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].first_seq, upto + 1);
    // The log's last record stays, whatever the cut asks for.
    let end = s.next_seq() - 1;
    let cut = s.log_cut(end).unwrap();
    assert!(cut.is_none(), "{cut:?}");
    drop(s);
    // Reopened: the state is whole (what the cut took was applied).
    let s = open(dir.path(), &clock);
    assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
    assert_eq!(s.queue_ids("main").len(), 31);
    assert_eq!(s.task(ids[0]).unwrap().unwrap().status, Status::Succeeded);
}

/// A dead letter put back by `task retry` is queued anew: queued at the
/// retry's time, not started since, so `task list --since` finds it and its
/// wait counts from the retry. Its attempts keep counting. The log agrees,
/// and so does the state after reopening.
#[test]
fn a_retried_dead_letter_is_queued_anew() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let id;
    {
        let s = open(dir.path(), &clock);
        id = add(&s, "main", "a", Placement::Last);
        clock.advance_ms(1_000);
        let mut w = s.write();
        w.start(id).unwrap();
        w.commit().unwrap();
        clock.advance_ms(1_000);
        let mut w = s.write();
        w.fail(id, "boom".into(), None).unwrap();
        w.to_history(id, Status::Failed).unwrap();
        w.commit().unwrap();
        clock.advance_ms(3_600_000);
        let mut w = s.write();
        w.retry(id, Placement::Last).unwrap();
        w.commit().unwrap();
        assert_log_agrees(&s);
    }
    let s = open(dir.path(), &clock);
    let t = s.task(id).unwrap().expect("live again");
    assert_eq!(t.status, Status::Queued);
    assert_eq!(t.queued_at, T0 + 3_602_000, "queued at the retry");
    assert_eq!(
        (t.started_at, t.finished_at, t.retry_at),
        (None, None, None)
    );
    assert_eq!((t.attempts, t.failures), (1, 0));
    assert_eq!(s.queue_ids("main"), vec![id]);
    assert_log_agrees(&s);
    drop(s);
    // `task list --since` a minute before the retry finds it.
    let since = berth::units::format_time(T0 + 3_542_000);
    let o = std::process::Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["task", "list", "-o", "json", "--since", &since])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<u64> = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .collect();
    assert_eq!(ids, vec![id], "{rows}");
}

/// A data dir written by the last build before `RetriedAnew` (store format
/// 9; `tests/fixtures/v9-retried`): its dead letter 1, retried there, keeps
/// the times of its last run as that build recorded (the old `Retried`
/// event replays as it did), and `verify` agrees. A retry made now queues
/// dead letter 2 anew, beside it in the same log, which still verifies;
/// the open upgraded the store format.
#[test]
fn a_retry_recorded_by_an_older_build_replays_as_it_did() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v9-retried");
    let root = tempdir();
    let dir = root.path().join("data");
    common::copy_fixture_data(&fixture.join("data"), &dir);
    let list = |dir: &std::path::Path| -> serde_json::Value {
        let o = std::process::Command::new(common::berth_bin())
            .arg("--data-dir")
            .arg(dir)
            .args(["task", "list", "-o", "json"])
            .env("BERTH_NOW", "2030-01-01T00:00:00Z")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture.join("expected-list.json")).expect("expected"),
    )
    .expect("json");
    assert_eq!(
        common::rows_before_took_ms(list(&dir)),
        expected,
        "read as the older build listed it"
    );
    let one = common::task_json(&dir, 1);
    assert_eq!(one["status"], "queued");
    assert!(
        one["started_at"]
            .as_u64()
            .is_some_and(|s| s > one["queued_at"].as_u64().unwrap()),
        "the old retry kept the times of its last run: {one}"
    );
    // `verify` agrees, having replayed `events`.
    let verifies = |events: u64| {
        let o = common::berth(&dir, &["verify"]);
        let out = common::stdout(&o);
        assert!(o.status.success(), "{out}{}", common::stderr(&o));
        assert!(out.contains(&format!("{events} events replayed")), "{out}");
    };
    verifies(11);

    let before = berth::clock::system().now_ms();
    let o = common::berth(&dir, &["task", "retry", "2"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let two = common::task_json(&dir, 2);
    assert_eq!(two["status"], "queued");
    assert!(
        two["queued_at"].as_u64().is_some_and(|q| q >= before),
        "{two}"
    );
    assert_eq!(two["started_at"], serde_json::Value::Null, "{two}");
    assert_eq!(common::task_json(&dir, 1), one, "task 1 unchanged");
    verifies(12);
    let log = common::stdout(&common::berth(&dir, &["log"]));
    let retried = log.lines().filter(|l| l.contains(" retried ")).count();
    assert_eq!(retried, 2, "{log}");
    let db = sled::open(dir.join("db")).expect("sled");
    let format = db.get(b"mformat").expect("read").expect("mformat");
    assert_eq!(
        berth::codec::decode::<u64>(&format),
        Ok(berth::store::keys::STORE_FORMAT)
    );
}

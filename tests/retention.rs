//! Retention: the history expires by age and count, the log is cut only
//! after a checkpoint and moves to the archive, the archive is trimmed with
//! its base moving forward, and `verify` stays clean through all of it and
//! across a reopen; a real daemon prunes its history on its own.

mod common;

use std::time::Duration;

use berth::archive;
use berth::checkpoint;
use berth::clock::FakeClock;
use berth::retention::{self, Retention};
use berth::store::verify::{self, Model, ReplayError};
use berth::store::{EventKind, Placement, Store};
use berth::submit;
use berth::task::Status;
use common::daemon::{Daemon, write_root};
use common::{T0, berth, enqueue_id, open, spec, stdout, tempdir, wait_for};

const DAY_MS: u64 = 24 * 3600 * 1000;

/// Enqueues `n` tasks in `queue` and runs each to success, one commit per
/// step as the engine does; their ids.
fn run_tasks(store: &Store, clock: &FakeClock, queue: &str, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut s = spec(queue, &format!("t{i}"));
        s.payload = serde_json::json!({"i": i, "pad": "x".repeat(200)});
        let id = submit::enqueue_one(store, s, Placement::Last).expect("enqueue");
        clock.advance_ms(10);
        let mut w = store.write();
        w.start(id).expect("start");
        w.commit().expect("commit");
        let mut w = store.write();
        w.succeed(id, None).expect("succeed");
        w.to_history(id, Status::Succeeded).expect("to history");
        w.commit().expect("commit");
        // The next task's enqueue comes later than this one's end.
        clock.advance_ms(1);
        ids.push(id);
    }
    ids
}

/// The replayed model equals the store's state (a short message if not).
fn assert_same(replayed: &Model, store: &Store) {
    let state = verify::current(store).expect("the state");
    let fields = [
        ("live", replayed.live == state.live),
        ("history", replayed.history == state.history),
        ("queues", replayed.queues == state.queues),
        ("attempts", replayed.attempts == state.attempts),
        ("counts", replayed.counts == state.counts),
        ("last_seq", replayed.last_seq == state.last_seq),
        ("count_from", replayed.count_from == state.count_from),
    ];
    for (name, same) in fields {
        assert!(
            same,
            "{name} differs (replayed: {} live, {} finished, last event {}, counting from {}; \
             state: {} live, {} finished, last event {}, counting from {})",
            replayed.live.len(),
            replayed.history.len(),
            replayed.last_seq,
            replayed.count_from,
            state.live.len(),
            state.history.len(),
            state.last_seq,
            state.count_from
        );
    }
}

fn assert_clean(store: &Store) {
    assert_eq!(
        retention::verify(store, &mut |_, _| {}).expect("verify"),
        Vec::<String>::new()
    );
}

/// Every event, from the archive (which begins at event 1 here) and the
/// store's log.
fn all_events(store: &Store) -> Vec<berth::store::Event> {
    let segments = archive::list(&store.dir().join(archive::DIR)).expect("segments");
    let mut out: Vec<_> = archive::read_all(&segments)
        .expect("read the archive")
        .into_iter()
        .flat_map(|r| r.events)
        .collect();
    let next = out.last().map_or(1, |e| e.seq + 1);
    out.extend(store.events_from(next).map(|e| e.expect("event")));
    out
}

/// The state rebuilt from the archive's base (or event 1), its segments
/// and the store's log, as `berth replay` does.
fn replay_everything(store: &Store) -> Model {
    let dir = store.dir();
    let segments = archive::list(&dir.join(archive::DIR)).expect("segments");
    let mut model = match segments.first() {
        Some(s) if s.first_seq > 1 => {
            let p = checkpoint::path_of(dir, s.first_seq - 1).expect("the archive's base");
            checkpoint::read(&p).expect("base").model
        }
        _ => Model {
            count_from: store.counting().since,
            ..Model::default()
        },
    };
    for rec in archive::read_all(&segments).expect("read the archive") {
        for ev in rec.events {
            if ev.seq > model.last_seq {
                model.apply(ev).expect("apply an archived event");
            }
        }
    }
    for ev in store.events_from(model.last_seq + 1) {
        model.apply(ev.expect("event")).expect("apply a log event");
    }
    model
}

#[test]
fn history_expires_by_age_and_by_count_with_an_event() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let old = run_tasks(&store, &clock, "main", 3);
    clock.advance_ms(6 * DAY_MS);
    let newer = run_tasks(&store, &clock, "main", 4);
    let r = Retention {
        history_max: 3,
        ..Retention::default()
    };
    // Day 6: the count limit removes the oldest four (3 old, 1 newer).
    let report = retention::pass(&store, &r).expect("pass");
    assert_eq!(report.pruned, 4);
    let kept: Vec<u64> = store.history().into_iter().map(|t| t.unwrap().id).collect();
    assert_eq!(kept, newer[1..].to_vec());
    // Day 8: the age limit (7 days) has nothing more (they are 2 days old).
    clock.advance_ms(2 * DAY_MS);
    assert_eq!(retention::pass(&store, &r).expect("pass").pruned, 0);
    // Day 14: all of them are older than 7 days.
    clock.advance_ms(6 * DAY_MS);
    assert_eq!(retention::pass(&store, &r).expect("pass").pruned, 3);
    assert!(store.history().is_empty());
    // Each went with a `removed` event.
    // (Some are in the archive by now: the log's default age is one day.)
    let removed: Vec<u64> = all_events(&store)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Removed { id } => Some(id),
            _ => None,
        })
        .collect();
    let mut all = old.clone();
    all.extend(&newer);
    assert_eq!(removed, all);
    // berth_tasks_removed_total counts them (it counts `removed` events),
    // and its help says so.
    let families =
        berth::ops::metrics(&berth::ops::Ctx::direct(Some(&store), None)).expect("metrics");
    let f = families
        .iter()
        .find(|f| f.name == "berth_tasks_removed_total")
        .expect("the family");
    let total: f64 = f.samples.iter().map(|s| s.value).sum();
    assert_eq!(total, all.len() as f64);
    assert!(
        f.help.contains("task remove") && f.help.contains("retention"),
        "{}",
        f.help
    );
    assert_clean(&store);
}

#[test]
fn the_log_is_cut_only_after_a_checkpoint_and_verify_stays_clean() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let r = Retention {
        log_size: 16 << 10,
        ..Retention::default()
    };
    {
        let store = open(dir.path(), &clock);
        run_tasks(&store, &clock, "main", 100);
        // Over the size limit, but no checkpoint yet: nothing is cut; a
        // checkpoint is written for the next pass.
        let first = retention::pass(&store, &r).expect("pass");
        assert_eq!(first.cut_upto, None);
        let ck = first.checkpoint.expect("a checkpoint");
        assert_eq!(store.log_start().unwrap(), 1);
        run_tasks(&store, &clock, "main", 100);
        let second = retention::pass(&store, &r).expect("pass");
        assert_eq!(second.cut_upto, Some(ck), "cut at the checkpoint");
        assert!(second.archived_records > 0);
        assert_eq!(store.log_start().unwrap(), ck + 1);
        // The plain replay from event 1 cannot work any more, and says why.
        assert_eq!(
            verify::verify(&store),
            Err(ReplayError::NeedsCheckpoint { start: ck + 1 })
        );
        assert_clean(&store);
        // Archive + log rebuild the same state.
        assert_same(&replay_everything(&store), &store);
    }
    // After a reopen: still clean, and new work keeps it so.
    let store = open(dir.path(), &clock);
    assert_clean(&store);
    run_tasks(&store, &clock, "main", 50);
    retention::pass(&store, &r).expect("pass");
    assert_clean(&store);
    assert_same(&replay_everything(&store), &store);
    // The binary's verify says where it started.
    drop(store);
    let o = berth(dir.path(), &["verify"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(
        stdout(&o).contains("from the checkpoint of event"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn the_archive_is_trimmed_and_its_base_moves_forward() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let r = Retention {
        log_size: 8 << 10,
        archive_size: 24 << 10,
        ..Retention::default()
    };
    let mut deleted = 0;
    for _ in 0..12 {
        run_tasks(&store, &clock, "main", 40);
        let report = retention::pass(&store, &r).expect("pass");
        deleted += report.segments_deleted;
        // A cut is whole: the log begins right after it, and the archive's
        // segments follow one another without a gap or an overlap.
        let start = store.log_start().unwrap();
        let first = store.log_records().unwrap()[0].first_seq;
        assert_eq!(first, start, "the log's first record begins at its start");
        if let Some(upto) = report.cut_upto {
            assert_eq!(start, upto + 1);
        }
        let segments = archive::list(&dir.path().join(archive::DIR)).unwrap();
        for w in segments.windows(2) {
            assert_eq!(w[1].first_seq, w[0].last_seq + 1, "{segments:?}");
        }
        if let Some(s) = segments.last() {
            assert_eq!(s.last_seq + 1, start, "{segments:?}");
        }
    }
    assert!(deleted > 0, "no segment was deleted");
    let segments = archive::list(&dir.path().join(archive::DIR)).unwrap();
    let first = segments.first().expect("segments").first_seq;
    assert!(first > 1);
    // The base is there; checkpoints are few: the base, the log's start,
    // and perhaps one newer.
    assert!(checkpoint::path_of(dir.path(), first - 1).is_some());
    let checkpoints = checkpoint::list(dir.path()).unwrap();
    assert!(checkpoints.len() <= 3, "{checkpoints:?}");
    let bytes: u64 = segments.iter().map(|s| s.bytes).sum();
    assert!(bytes <= 24 << 10, "{bytes} bytes of segments");
    assert_clean(&store);
    assert_same(&replay_everything(&store), &store);
    // `berth replay` starts from the base or a newer checkpoint, and knows
    // what is no longer kept; `berth log` begins at the first event kept.
    let last = store.next_seq() - 1;
    drop(store);
    let json = |args: &[&str]| -> serde_json::Value {
        let o = berth(dir.path(), args);
        assert!(o.status.success(), "{args:?}: {}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    assert_eq!(
        json(&["replay", "-o", "json"]),
        json(&["queue", "list", "-o", "json"])
    );
    // Every task there ran to the end: from a checkpoint in the middle,
    // the state has no queued task either.
    let mid = (first + last) / 2;
    assert_eq!(
        json(&["replay", "--seq", &mid.to_string(), "-o", "json"]),
        json(&["queue", "list", "-o", "json"])
    );
    let o = berth(dir.path(), &["replay", "--seq", &(first - 2).to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("no longer kept"),
        "{}",
        common::stderr(&o)
    );
    let log = json(&["log", "-o", "json"]);
    let seqs: Vec<u64> = log
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert_eq!(seqs.first(), Some(&first));
    assert_eq!(seqs.last(), Some(&last));
    assert_eq!(seqs.len() as u64, last - first + 1);

    // A moment before the first event kept: the base checkpoint's state is
    // the answer from the time of its event on, which it records; before
    // that, the moment is before the checkpoint's event, no longer kept.
    // The file's own time does not matter then (dated far ahead here).
    let first_at = log[0]["time"]
        .as_str()
        .and_then(|t| berth::units::parse_time(t, 0).ok())
        .expect("the first event's time");
    let base = checkpoint::path_of(dir.path(), first - 1).expect("the base checkpoint");
    let date = |path: &std::path::Path, ms: u64| {
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| {
                f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
            })
            .expect("dating the base checkpoint");
    };
    date(&base, first_at + 3_600_000);
    let base_at = checkpoint::read(&base)
        .expect("the base checkpoint")
        .at
        .expect("the time of its event");
    // (The fake clock moves between two tasks: the two are apart.)
    assert!(base_at < first_at, "{base_at} not before {first_at}");
    let at = |ms: u64| json(&["replay", "--at", &ms.to_string(), "-o", "json"]);
    let at_seq = |seq: u64| json(&["replay", "--seq", &seq.to_string(), "-o", "json"]);
    let too_early = |ms: u64, known: &str| {
        let o = berth(dir.path(), &["replay", "--at", &ms.to_string()]);
        assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
        let e = common::stderr(&o);
        assert!(e.contains("no longer kept"), "{e}");
        assert!(e.contains(&format!("after event {}", first - 1)), "{e}");
        assert!(e.contains(known), "{e}");
    };
    assert_eq!(at(first_at - 1)["queues"], at_seq(first - 1)["queues"]);
    assert_eq!(at(base_at)["queues"], at_seq(first - 1)["queues"]);
    assert_eq!(at(first_at)["queues"], at_seq(first)["queues"]);
    too_early(base_at - 1, "(the time of that event)");
    // A checkpoint without its event's time (what builds before its format
    // version 2 wrote) is known to hold from when its file was written,
    // after its event: dated 5 ms before the first event kept here.
    let snap = checkpoint::read(&base).expect("the base checkpoint");
    checkpoint::write(dir.path(), &berth::store::Snapshot { at: None, ..snap })
        .expect("the base without its time");
    date(&base, first_at - 5);
    assert_eq!(at(first_at - 1)["queues"], at_seq(first - 1)["queues"]);
    assert_eq!(at(first_at)["queues"], at_seq(first)["queues"]);
    too_early(first_at - 6, "(when its checkpoint was written)");

    // `verify` reads the whole archive too (a replay from the log's start
    // reads none of it), and exits 1 when it is damaged or has a hole.
    let start = {
        let store = open(dir.path(), &clock);
        store.log_start().expect("log start")
    };
    let o = berth(dir.path(), &["verify"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let read_whole = format!("the archive's events {first} to {} read whole", start - 1);
    assert!(stdout(&o).contains(&read_whole), "{}", stdout(&o));
    let victim = &segments[segments.len() / 2].path;
    let good = std::fs::read(victim).expect("read");
    let mut bad = good.clone();
    let at = bad.len() - 10;
    bad[at] ^= 0x10;
    std::fs::write(victim, &bad).expect("damage");
    let verify_refuses = |says: &str| {
        let o = berth(dir.path(), &["verify"]);
        assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
        let e = common::stderr(&o);
        assert!(e.contains("the archive cannot be read whole"), "{e}");
        assert!(e.contains(says), "{e}");
    };
    verify_refuses(&format!(
        "{}: a damaged berth archive segment (",
        victim.display()
    ));
    std::fs::remove_file(victim).expect("remove");
    if victim != &segments[0].path {
        verify_refuses("the log has a gap");
    }
    std::fs::write(victim, &good).expect("restore");
    // Every checkpoint is read, not only those a replay from the log's start needs.
    let newest = checkpoint::list(dir.path())
        .expect("checkpoints")
        .last()
        .expect("a checkpoint")
        .1
        .clone();
    assert_ne!(newest, base);
    let kept = std::fs::read(&newest).expect("read");
    std::fs::write(&newest, &kept[..kept.len() - 1]).expect("cut the newest checkpoint");
    verify_refuses("a damaged berth checkpoint");
    std::fs::write(&newest, &kept).expect("restore");
    // No archive at all behind a cut log: it is missing.
    let archive = dir.path().join(archive::DIR);
    let aside = dir.path().join("archive-aside");
    std::fs::rename(&archive, &aside).expect("move the archive away");
    verify_refuses(&format!(
        "the store's log begins after event {}, but the archive holds no segment",
        start - 1
    ));
    std::fs::rename(&aside, &archive).expect("put it back");
    let o = berth(dir.path(), &["verify"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    std::fs::write(&base, b"junk").expect("damage the base");
    verify_refuses("not a berth checkpoint");
}

/// A store whose archive retention has trimmed: its first segment begins
/// after event 1, on its base checkpoint. The store, closed; the first
/// event kept, the last event, and a task of main enqueued before the
/// first event kept that ran after it.
fn trimmed(dir: &std::path::Path, clock: &FakeClock) -> (u64, u64, u64) {
    let store = open(dir, clock);
    let held = submit::enqueue_one(&store, spec("main", "held"), Placement::Last).expect("held");
    // Small limits until a segment was deleted, then an archive that
    // grows until it has two segments.
    let mut r = Retention {
        log_size: 8 << 10,
        archive_size: 24 << 10,
        ..Retention::default()
    };
    let mut rounds = 0;
    let segments = loop {
        run_tasks(&store, clock, "main", 40);
        if retention::pass(&store, &r).expect("pass").segments_deleted > 0 {
            // (The fake clock is ahead of the files' times by more than
            // the default archive age.)
            r.archive_size = Retention::default().archive_size;
            r.archive_age = Duration::from_secs(10 * 365 * 24 * 3600);
        }
        let segments = archive::list(&dir.join(archive::DIR)).expect("segments");
        if segments.len() >= 2 && segments[0].first_seq > 1 {
            break segments;
        }
        rounds += 1;
        assert!(rounds < 40, "{segments:?}");
    };
    let first = segments[0].first_seq;
    assert!(first > 1 && checkpoint::path_of(dir, first - 1).is_some());
    let mut w = store.write();
    w.start(held).expect("start");
    w.commit().expect("commit");
    let mut w = store.write();
    w.succeed(held, None).expect("succeed");
    w.to_history(held, Status::Succeeded).expect("to history");
    w.commit().expect("commit");
    (first, store.next_seq() - 1, held)
}

/// `berth log` as JSON, which must succeed.
fn log_json(dir: &std::path::Path, args: &[&str]) -> Vec<serde_json::Value> {
    let o = berth(dir, &[&["log", "-o", "json"], args].concat());
    assert!(o.status.success(), "{args:?}: {}", common::stderr(&o));
    serde_json::from_slice(&o.stdout).expect("json")
}

/// `berth log --queue` knows the queue of the tasks the base checkpoint's
/// state holds, whose `enqueued` events are no longer kept.
#[test]
fn the_log_of_a_queue_knows_the_tasks_of_the_base_checkpoint() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (_, _, held) = trimmed(dir.path(), &clock);
    let log = |args: &[&str]| log_json(dir.path(), args);
    let all = log(&[]);
    // Every task is in main, also those enqueued before the first event
    // kept (their queue is the base checkpoint's).
    assert_eq!(log(&["--queue", "main"]), all);
    let task = held.to_string();
    let about = log(&["--task", &task]);
    let events: Vec<&str> = about.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(events, ["started", "succeeded", "moved-to-history"]);
    assert_eq!(log(&["--task", &task, "--queue", "main"]), about);
    assert!(log(&["--task", &task, "--queue", "other"]).is_empty());
}

/// `berth log` prints the history from where the data dir keeps it: from
/// event 1, or from the archive's base checkpoint once retention trimmed
/// it. Anywhere else (no archive behind a cut log, a base that is gone, a
/// first segment whose header is damaged) is an error naming what is
/// wrong, exit 1, as it is for `replay` and `verify`.
#[test]
fn the_log_begins_where_the_kept_history_begins_and_nowhere_else() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (first, last, _) = trimmed(dir.path(), &clock);
    let all = log_json(dir.path(), &[]);
    assert_eq!(all.first().and_then(|e| e["seq"].as_u64()), Some(first));
    assert_eq!(all.len() as u64, last - first + 1);

    let hashes = common::file_hashes(dir.path());
    let last = last.to_string();
    let every: [&[&str]; 3] = [&["log"], &["replay", "--seq", &last], &["verify"]];
    let refused_by = |commands: &[&[&str]], says: &str| {
        for &args in commands {
            let o = berth(dir.path(), args);
            assert_eq!(
                o.status.code(),
                Some(1),
                "{args:?} ({says}): {}",
                common::stderr(&o)
            );
            assert!(o.stdout.is_empty() || args[0] == "verify", "{args:?}");
            let e = common::stderr(&o);
            assert!(e.contains(says), "{args:?}: {e}");
        }
    };
    let refused = |says: &str| refused_by(&every, says);
    // No archive behind the cut log.
    let archive = dir.path().join(archive::DIR);
    let aside = dir.path().join("archive-aside");
    std::fs::rename(&archive, &aside).expect("move the archive away");
    refused("but the archive holds no segment, not even the newest one");
    refused("the archive is missing");
    std::fs::rename(&aside, &archive).expect("put it back");
    // The base checkpoint gone.
    let base = checkpoint::path_of(dir.path(), first - 1).expect("the base");
    let kept = std::fs::read(&base).expect("read the base");
    std::fs::remove_file(&base).expect("remove the base");
    refused(&format!(
        "{}: the state before the first event kept (event {first}) is needed, and missing",
        base.display()
    ));
    std::fs::write(&base, &kept).expect("put it back");
    // One bit flipped in the first segment's header (the file's checksum
    // covers it): the segment is named, and why. In its first event, which
    // says where the history begins, for every command; in its last event
    // for those that read the archive (a replay from a checkpoint reads no
    // segment before it).
    let segments = archive::list(&archive).expect("segments");
    let oldest = &segments[0].path;
    for (at, commands) in [(13, &every[..]), (21, &[every[0], every[2]][..])] {
        let good = std::fs::read(oldest).expect("read");
        let mut bad = good.clone();
        bad[at] ^= 0x02;
        std::fs::write(oldest, &bad).expect("damage");
        refused_by(
            commands,
            &format!(
                "{}: a damaged berth archive segment (checksum mismatch",
                oldest.display()
            ),
        );
        std::fs::write(oldest, &good).expect("restore");
    }
    // Nothing was written: the log, replay and verify only read.
    assert_eq!(common::file_hashes(dir.path()), hashes);
    assert_eq!(log_json(dir.path(), &[]), all);
}

/// A retention pass does not trim an archive whose first segment's header
/// is damaged: which checkpoint is the base is not known then. The pass
/// fails naming the segment, and deletes nothing.
#[test]
fn retention_does_not_trim_around_a_damaged_segment() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    trimmed(dir.path(), &clock);
    let archive = dir.path().join(archive::DIR);
    let oldest = archive::list(&archive).expect("segments")[0].path.clone();
    let mut bytes = std::fs::read(&oldest).expect("read");
    bytes[13] ^= 0x02;
    std::fs::write(&oldest, &bytes).expect("damage");
    let files = |d: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let (segments, checkpoints) = (files(&archive), files(&checkpoint::dir_of(dir.path())));
    let store = open(dir.path(), &clock);
    // Limits the archive is far over: every segment but the newest would go.
    let r = Retention {
        log_size: 8 << 10,
        archive_size: 1,
        ..Retention::default()
    };
    let e = retention::pass(&store, &r)
        .expect_err("refused")
        .to_string();
    assert!(e.contains(&oldest.display().to_string()), "{e}");
    assert!(e.contains("checksum mismatch"), "{e}");
    assert_eq!(files(&archive), segments);
    assert_eq!(files(&checkpoint::dir_of(dir.path())), checkpoints);
}

#[test]
fn a_daemon_prunes_its_history_on_its_own() {
    let root = tempdir();
    write_root(
        root.path(),
        "#!/bin/sh\ncat >/dev/null\n",
        "[retention]\nhistory_max = 2\nevery = \"1s\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\n",
    );
    let mut d = Daemon::start_in(root.path());
    let ids: Vec<u64> = (0..5)
        .map(|i| {
            enqueue_id(
                &d.dir,
                &[
                    "--queue",
                    "main",
                    "--kind",
                    "Sh",
                    "--name",
                    &format!("t{i}"),
                ],
            )
        })
        .collect();
    let history = |dir: &std::path::Path| -> Vec<u64> {
        let o = berth(dir, &["task", "list", "--status", "history", "-o", "json"]);
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("json");
        rows.iter().filter_map(|r| r["id"].as_u64()).collect()
    };
    wait_for("the history to keep the newest two", || {
        history(&d.dir) == ids[3..].to_vec()
    });
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).0.code(), Some(0));
    let o = berth(&d.dir, &["verify"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
}

/// kill -9 of a daemon whose retention cuts its log every second, while
/// clients enqueue: after every restart `verify` is clean (from the
/// checkpoint of the log's start), and every acknowledged task is there,
/// in the history, or was removed by retention with its event in the log
/// or the archive.
#[test]
fn kill_9_while_retention_cuts_the_log_loses_nothing() {
    let root = tempdir();
    write_root(
        root.path(),
        "#!/bin/sh\ncat >/dev/null\n",
        "[retention]\nhistory_max = 20\nlog_size = \"4KiB\"\nevery = \"1s\"\n\
         [handlers.Sh]\ncommand = [\"./hook.sh\"]\n",
    );
    let dir = root.path().join("data");
    let mut acked: Vec<u64> = Vec::new();
    let mut rng = fastrand::Rng::with_seed(7);
    for cycle in 0..5 {
        let mut d = Daemon::start_in(root.path());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producer = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut ids: Vec<u64> = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let o = std::process::Command::new(common::berth_bin())
                        .arg("--data-dir")
                        .arg(&dir)
                        .args(["enqueue", "--queue", "main", "--kind", "Sh"])
                        .args(["--name", &format!("c{cycle}-{n}")])
                        .env("BERTH_TIMEOUT", "2s")
                        .output()
                        .expect("run berth");
                    if o.status.success()
                        && let Ok(id) = String::from_utf8_lossy(&o.stdout).trim().parse()
                    {
                        ids.push(id);
                    }
                }
                ids
            })
        };
        // Let retention cut the log at least once in this cycle, then kill
        // at a random moment.
        let segments = || archive::list(&dir.join(archive::DIR)).map_or(0, |s| s.len());
        let before = segments();
        wait_for("retention to archive part of the log", || {
            segments() > before
        });
        std::thread::sleep(Duration::from_millis(rng.u64(0..1500)));
        d.signal(libc::SIGKILL);
        d.wait_exit(Duration::from_secs(10));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        acked.extend(producer.join().expect("the producer"));
        let o = berth(&dir, &["verify"]);
        assert!(
            o.status.success(),
            "cycle {cycle}: {}{}",
            stdout(&o),
            common::stderr(&o)
        );
    }
    assert!(
        acked.len() > 20,
        "only {} enqueues acknowledged",
        acked.len()
    );
    let store = berth::store::Store::open(
        &dir,
        berth::store::Options {
            read_only: true,
            ..Default::default()
        },
        berth::clock::system(),
    )
    .expect("open to read");
    let mut known = std::collections::BTreeSet::new();
    let mut removed = std::collections::BTreeSet::new();
    for ev in all_events(&store) {
        match ev.kind {
            EventKind::Enqueued { task, .. } => {
                known.insert(task.id);
            }
            EventKind::Removed { id } => {
                removed.insert(id);
            }
            _ => {}
        }
    }
    for id in &acked {
        assert!(
            known.contains(id),
            "acknowledged task {id} has no enqueued event"
        );
        let there = matches!(store.task(*id), Ok(Some(_)));
        assert!(
            there || removed.contains(id),
            "acknowledged task {id} is gone without a removed event"
        );
    }
    eprintln!(
        "5 kill -9 cycles: {} acknowledged tasks, {} removed by retention, log starts at event {}",
        acked.len(),
        removed.len(),
        store.log_start().unwrap_or(0)
    );
}

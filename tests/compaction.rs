//! Compaction (addon-operator's compacted queues): an enqueue with a
//! compaction key merges into the task of the same kind and key that waits
//! in the same queue; it takes the newer payload and keeps its place. A
//! daemon restarted with the same `--enqueue` file adds nothing that still
//! waits.

mod common;

use std::path::Path;
use std::process::Command;

use berth::clock::FakeClock;
use berth::store::counters::{ENQUEUED, MERGED};
use berth::store::{Placement, Store};
use berth::task::{Status, TaskSpec};
use common::daemon::{Daemon, write_root};
use common::{T0, assert_log_agrees, stderr, stdout, tempdir, wait_for};
use serde_json::json;

fn keyed(queue: &str, kind: &str, name: &str, key: Option<&str>, v: i64) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        kind: kind.into(),
        name: name.into(),
        compaction_key: key.map(str::to_string),
        payload: json!({ "v": v }),
        ..Default::default()
    }
}

fn payload(store: &Store, id: u64) -> serde_json::Value {
    let t = store.task(id).unwrap().unwrap();
    t.payload.to_json("payload", store.budget()).unwrap()
}

fn count(store: &Store, kind: &str, name: &str) -> u64 {
    store
        .counting()
        .counts
        .get(kind)
        .and_then(|c| c.values.get(name).copied())
        .unwrap_or(0)
}

#[test]
fn a_keyed_enqueue_merges_into_the_waiting_task_and_keeps_its_place() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = common::open(dir.path(), &clock);
    let one = |s: TaskSpec, p: Placement| berth::submit::enqueue_one(&store, s, p).unwrap();
    let a = one(keyed("main", "Hook", "a", Some("k"), 1), Placement::Last);
    let b = one(keyed("main", "Hook", "b", None, 1), Placement::Last);
    // Same kind, key and queue: merged, even asked to go first.
    let again = one(
        keyed("main", "Hook", "a-again", Some("k"), 2),
        Placement::First,
    );
    assert_eq!(again, a);
    assert_eq!(
        payload(&store, a),
        json!({"v": 2}),
        "the newer payload wins"
    );
    let t = store.task(a).unwrap().unwrap();
    assert_eq!(t.name, "a", "everything else is the waiting task's");
    assert_eq!(store.queue_ids("main"), vec![a, b], "it keeps its place");
    // Another kind, another queue, another key, no key: not merged.
    let other_kind = one(keyed("main", "Other", "x", Some("k"), 3), Placement::Last);
    let other_queue = one(keyed("side", "Hook", "x", Some("k"), 3), Placement::Last);
    let other_key = one(keyed("main", "Hook", "x", Some("k2"), 3), Placement::Last);
    let no_key = one(keyed("main", "Hook", "x", None, 3), Placement::Last);
    let ids = [other_kind, other_queue, other_key, no_key];
    assert!(ids.iter().all(|id| *id > b), "{ids:?}");
    assert_eq!(count(&store, "Hook", MERGED), 1);
    assert_eq!(count(&store, "Hook", ENQUEUED), 5);
    assert_log_agrees(&store);

    // A running task is not merged into: the new one queues behind it.
    let mut w = store.write();
    w.start(a).unwrap();
    w.commit().unwrap();
    let behind = one(keyed("main", "Hook", "a-3", Some("k"), 4), Placement::Last);
    assert_ne!(behind, a);
    assert_eq!(payload(&store, a), json!({"v": 2}));
    // A failed attempt puts it back to wait (for its retry): merged into again.
    let mut w = store.write();
    w.fail(a, "boom".into(), Some(60_000)).unwrap();
    w.commit().unwrap();
    let merged = one(keyed("main", "Hook", "a-4", Some("k"), 5), Placement::Last);
    assert_eq!(merged, a, "the earliest waiting task with the key");
    let t = store.task(a).unwrap().unwrap();
    assert_eq!((t.failures, t.retry_at), (1, Some(T0 + 60_000)));
    assert_eq!(payload(&store, a), json!({"v": 5}));
    assert_eq!(payload(&store, behind), json!({"v": 4}));
    // A finished task is not merged into.
    let mut w = store.write();
    w.to_history(a, Status::Succeeded).unwrap();
    w.commit().unwrap();
    let next = one(keyed("main", "Hook", "a-5", Some("k"), 6), Placement::Last);
    assert_eq!(next, behind, "the next one waiting with the key");
    assert_eq!(count(&store, "Hook", MERGED), 3);
    assert_log_agrees(&store);
    // The counts survive a reopen and still agree with the log.
    drop(store);
    let store = common::open(dir.path(), &clock);
    assert_eq!(count(&store, "Hook", MERGED), 3);
    assert_log_agrees(&store);
}

/// A batch like a startup file: singles and a group, every entry keyed.
fn startup() -> Vec<TaskSpec> {
    let w = |name: &str, weight: i64, v: i64| TaskSpec {
        weight: Some(weight),
        ..keyed(
            "main",
            "ModuleRun",
            name,
            Some(&format!("module/{name}")),
            v,
        )
    };
    vec![
        w("crd", 10, 1),
        w("echo", 20, 1),
        w("mcplay", 20, 1),
        w("dns", 30, 1),
        // The same key twice in one batch: the second merges into the first.
        w("dns", 40, 2),
    ]
}

#[test]
fn a_batch_merges_entry_by_entry_and_groups_merge_whole() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = common::open(dir.path(), &clock);
    let first = berth::submit::enqueue_batch(&store, startup()).unwrap();
    assert_eq!(first.len(), 4, "crd, the group, dns, dns again: {first:?}");
    assert_eq!(first[2], first[3], "the second dns merged into the first");
    let group = store.task(first[1]).unwrap().unwrap();
    assert_eq!(group.name, "Parallel run for echo, mcplay");
    assert_eq!(payload(&store, first[2]), json!({"v": 2}));
    let live_before = store.live_tasks().len();
    let events_before = store.next_seq();

    // The same batch again: everything merges, nothing is added.
    let mut again = startup();
    for s in &mut again {
        s.payload = json!({"v": 7});
    }
    let second = berth::submit::enqueue_batch(&store, again).unwrap();
    assert_eq!(second, first, "the same ids, in the same order");
    assert_eq!(store.live_tasks().len(), live_before);
    assert_eq!(
        store.next_seq() - events_before,
        5,
        "one merged event per entry"
    );
    for child in group.children.iter() {
        assert_eq!(payload(&store, *child), json!({"v": 7}));
    }
    assert_eq!(count(&store, "ModuleRun", MERGED), 6);
    assert_eq!(count(&store, "ModuleRun", ENQUEUED), 4);

    // A group whose children changed is a new group.
    let mut changed = startup();
    changed[2].compaction_key = Some("module/mcplay-2".into());
    let third = berth::submit::enqueue_batch(&store, changed).unwrap();
    assert_ne!(third[1], first[1]);
    assert_eq!(third[0], first[0]);
    // A dispatched group is not merged into either.
    let mut w = store.write();
    w.place(group.children[0], "parallel_queue_0", Placement::Last)
        .unwrap();
    w.commit().unwrap();
    let fourth = berth::submit::enqueue_batch(&store, startup()).unwrap();
    assert_ne!(fourth[1], first[1]);
    assert_log_agrees(&store);
}

/// A batch that fails validation changes nothing, merges included.
#[test]
fn a_refused_batch_merges_nothing() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = common::open(dir.path(), &clock);
    let first = berth::submit::enqueue_batch(&store, startup()).unwrap();
    let mut bad = startup();
    for s in &mut bad {
        s.payload = json!({"v": 9});
    }
    bad.push(keyed("no spaces", "ModuleRun", "x", None, 1));
    assert!(berth::submit::enqueue_batch(&store, bad).is_err());
    assert_eq!(payload(&store, first[0]), json!({"v": 1}));
    assert_eq!(count(&store, "ModuleRun", MERGED), 1);
    assert_log_agrees(&store);
}

const HOOK: &str = r#"#!/bin/sh
cat >/dev/null
case "$BERTH_TASK_NAME" in
  hold) while [ ! -e release ]; do sleep 0.02; done ;;
esac
echo '"ok"'
"#;

const STARTUP: &str = r#"[
  {"queue": "main", "kind": "Sh", "name": "hold", "weight": 1, "compaction_key": "hold"},
  {"queue": "main", "kind": "Sh", "name": "crd", "weight": 10, "compaction_key": "crd"},
  {"queue": "main", "kind": "Sh", "name": "echo", "weight": 20, "compaction_key": "echo"},
  {"queue": "main", "kind": "Sh", "name": "mcplay", "weight": 20, "compaction_key": "mcplay"},
  {"queue": "main", "kind": "Sh", "name": "dns", "weight": 30, "compaction_key": "dns"}
]"#;

fn ids_and_status(dir: &Path) -> Vec<(u64, String)> {
    let o = common::berth(dir, &["task", "list", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("rows");
    rows.iter()
        .map(|r| {
            (
                r["id"].as_u64().unwrap_or(0),
                r["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn restarting_with_the_same_enqueue_file_adds_nothing_that_still_waits() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"data\"\ngrace = \"1s\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\n",
    );
    let file = root.path().join("startup.json");
    std::fs::write(&file, STARTUP).expect("startup file");
    let dir = root.path().join("data");
    let enqueue = ["--enqueue", &file.to_string_lossy()];
    let enqueue: Vec<&str> = enqueue.iter().map(|s| s as &str).collect();

    // First start: the holder runs, the rest waits behind it.
    let mut d = Daemon::start(&cfg, &dir, &enqueue);
    wait_for("the holder to run", || {
        stdout(&common::berth(&dir, &["task", "show", "1"])).contains("status: running")
    });
    let before = ids_and_status(&dir);
    assert_eq!(before.len(), 6, "5 entries and a group parent: {before:?}");
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(std::time::Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(
        d.log_text()
            .contains("5 entries, 0 merged into tasks that were waiting"),
        "{}",
        d.log_text()
    );

    // Second start with the same file: every entry merges (the holder was
    // put back to wait at the start), nothing is added; released, it all runs.
    std::fs::write(root.path().join("release"), "").expect("release");
    let run = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["run", "--until-idle", "--config"])
        .arg(&cfg)
        .args(&enqueue)
        .env("RUST_LOG", "info")
        .output()
        .expect("berth run");
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert!(
        stderr(&run).contains(
            "5 entries, 5 merged into tasks that were waiting (same compaction key), 0 new"
        ),
        "{}",
        stderr(&run)
    );
    let after = ids_and_status(&dir);
    let ids = |v: &[(u64, String)]| v.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    assert_eq!(ids(&after), ids(&before), "no task was added");
    assert!(after.iter().all(|(_, s)| s == "succeeded"), "{after:?}");
    let store = Store::open(&dir, Default::default(), berth::clock::system()).expect("open");
    assert_eq!(count(&store, "Sh", MERGED), 5);
    assert_eq!(count(&store, "Sh", ENQUEUED), 5);
    drop(store);

    // Once they have run, the next start queues them again: they wait no
    // more, and a startup batch is meant to run at every start.
    let run = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["run", "--until-idle", "--config"])
        .arg(&cfg)
        .args(&enqueue)
        .env("RUST_LOG", "info")
        .output()
        .expect("berth run");
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("5 entries, 0 merged"),
        "{}",
        stderr(&run)
    );
    assert_eq!(ids_and_status(&dir).len(), 12);
    let v = common::berth(&dir, &["verify"]);
    assert!(v.status.success(), "{}", stderr(&v));
}

/// A merge is logged once, when it is done: an `enqueue --after` without a
/// daemon is first tried on a read-only open (whose commit is refused), and
/// that rehearsal does not log the merge too.
#[test]
fn a_merge_through_the_cli_is_logged_once() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let enqueue = |extra: &[&str]| {
        Command::new(common::berth_bin())
            .arg("--data-dir")
            .arg(&d)
            .args([
                "enqueue",
                "--queue",
                "main",
                "--kind",
                "Hook",
                "--name",
                "hook",
                "--compaction-key",
                "hook/main",
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .output()
            .expect("run berth")
    };
    let first = enqueue(&[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let o = enqueue(&["--after", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "1", "merged into task 1");
    let text = stderr(&o);
    assert_eq!(
        text.matches("Hook hook merged into waiting task 1").count(),
        1,
        "{text}"
    );
}

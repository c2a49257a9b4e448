//! Time to live: a task not started within its TTL expires (`expired`, in
//! the history, with its events), and its queue moves on; a task that
//! started runs to its end; a group expires with its parent until it has
//! started; the TTL survives a restart; `queue list`, `task show`, `task
//! list`, the metrics and `verify` know it; bad TTLs are refused. And a data
//! dir written before TTLs existed (record version 1) reads back the same,
//! verifies, and runs.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth::backoff::Backoff;
use berth::clock::FakeClock;
use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::store::{EventKind, Options, Placement, Store, verify};
use berth::task::{Status, TaskSpec};
use common::daemon::{Daemon, write_root, write_script};
use common::{T0, berth, stderr, stdout, task_json, tempdir, wait_for};

fn spec(name: &str, ttl: Option<u64>) -> TaskSpec {
    TaskSpec {
        queue: "main".into(),
        kind: "K".into(),
        name: name.into(),
        ttl: ttl.map(Duration::from_millis),
        ..Default::default()
    }
}

fn open(dir: &Path, clock: &FakeClock) -> Arc<Store> {
    Arc::new(Store::open(dir, Options::default(), Arc::new(clock.clone())).expect("open"))
}

fn engine(store: &Arc<Store>, h: Handlers, cfg: EngineConfig) -> Engine {
    Engine::new(store.clone(), h, cfg).expect("engine")
}

fn ok_handlers() -> Handlers {
    let mut h = Handlers::new();
    h.register("K", |_: &TaskContext| Outcome::success());
    h
}

fn status(store: &Store, id: u64) -> Status {
    store.task(id).expect("read").expect("a task").status
}

fn assert_verifies(store: &Store) {
    let diffs = verify::verify(store).expect("the log replays");
    assert!(diffs.is_empty(), "{diffs:#?}");
}

/// The kinds of the events about task `id`, in order.
fn events_of(store: &Store, id: u64) -> Vec<&'static str> {
    store
        .events_from(1)
        .map(|e| e.expect("a readable event"))
        .filter(|e| e.kind.task_id() == id)
        .map(|e| e.kind.name())
        .collect()
}

#[test]
fn a_task_past_its_ttl_expires_in_the_step_and_its_queue_moves_on() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let add = |s| berth::submit::enqueue_one(&store, s, Placement::Last).expect("enqueue");
    let late = add(spec("late", Some(10_000)));
    let next = add(spec("next", None));
    let in_time = add(spec("in-time", Some(60_000)));
    clock.advance_ms(10_000); // exactly the TTL: due
    let e = engine(&store, ok_handlers(), EngineConfig::default());
    e.run_until_idle().expect("run");
    let t = store
        .history_task(late)
        .expect("read")
        .expect("in the history");
    assert_eq!(t.status, Status::Expired);
    assert_eq!(t.attempts, 0);
    assert_eq!(t.started_at, None);
    assert_eq!(t.finished_at, Some(T0 + 10_000));
    assert_eq!(
        events_of(&store, late),
        ["enqueued", "expired", "moved-to-history"]
    );
    assert_eq!(status(&store, next), Status::Succeeded);
    assert_eq!(status(&store, in_time), Status::Succeeded);
    // The expiry and the move to the history are one commit.
    let with_expired = store
        .events_from(1)
        .map(|e| e.expect("event"))
        .find(|e| matches!(e.kind, EventKind::Expired { .. }))
        .expect("an expired event");
    let moved = store
        .events_from(with_expired.seq + 1)
        .next()
        .expect("an event after it")
        .expect("readable");
    assert!(matches!(
        moved.kind,
        EventKind::MovedToHistory { id, status: Status::Expired } if id == late
    ));
    assert_eq!(store.queue_len("main"), 0);
    let counts = &store.counting().counts["K"];
    assert_eq!(counts.values.get("finished.expired"), Some(&1));
    assert_eq!(counts.values.get("finished.succeeded"), Some(&2));
    assert_verifies(&store);
}

#[test]
fn a_task_that_started_within_its_ttl_runs_to_its_end_and_so_does_its_retry() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let mut h = Handlers::new();
    let c = clock.clone();
    // Runs for 5 s: far past its TTL, and past the next task's.
    h.register("K", move |_: &TaskContext| {
        c.advance_ms(5_000);
        Outcome::success()
    });
    h.register("Flaky", |ctx: &TaskContext| {
        if ctx.attempt == 1 {
            Outcome::fail("not yet")
        } else {
            Outcome::success()
        }
    });
    // No backoff: the clock only moves when `K` moves it.
    let cfg = EngineConfig {
        backoff: Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            max_attempts: 0,
        },
        ..Default::default()
    };
    // Each in its own queue: both start in the first step, within their TTLs.
    let long = berth::submit::enqueue_one(&store, spec("long", Some(1_000)), Placement::Last)
        .expect("enqueue");
    let flaky = berth::submit::enqueue_one(
        &store,
        TaskSpec {
            kind: "Flaky".into(),
            queue: "other".into(),
            ..spec("flaky", Some(1_000))
        },
        Placement::Last,
    )
    .expect("enqueue");
    let e = engine(&store, h, cfg);
    e.run_until_idle().expect("run");
    assert_eq!(status(&store, long), Status::Succeeded);
    // Failed once, waited for its backoff while the clock passed its TTL
    // (the other handler moved it 5 s): it had started, so it ran again.
    let f = store.task(flaky).expect("read").expect("task");
    assert_eq!((f.status, f.attempts), (Status::Succeeded, 2));
    assert_verifies(&store);
}

#[test]
fn a_group_expires_with_its_parent_until_it_has_started() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let entry = |name: &str, weight: i64| TaskSpec {
        weight: Some(weight),
        ..spec(name, Some(2_000))
    };
    // Two groups of two; one queue runs them in order, one parallel queue
    // runs each group's children one after the other.
    let ids = berth::submit::enqueue_batch(
        &store,
        vec![
            entry("a1", 1),
            entry("a2", 1),
            entry("b1", 2),
            entry("b2", 2),
        ],
    )
    .expect("batch");
    let (group_a, group_b) = (ids[0], ids[1]);
    let children = |g: u64| store.task(g).expect("read").expect("task").children;
    let (a, b) = (children(group_a), children(group_b));
    let mut h = Handlers::new();
    let c = clock.clone();
    // a1 takes 3 s: past every TTL. a2 waits behind it in the parallel
    // queue, but its group has started, so it runs; group b has not
    // started by then (group a holds `main`), so it expires whole.
    h.register("K", move |ctx: &TaskContext| {
        if ctx.task.name == "a1" {
            c.advance_ms(3_000);
        }
        Outcome::success()
    });
    let cfg = EngineConfig {
        parallel_queues: 1,
        ..Default::default()
    };
    engine(&store, h, cfg).run_until_idle().expect("run");
    for id in [group_a, a[0], a[1]] {
        assert_eq!(status(&store, id), Status::Succeeded, "task {id}");
    }
    for id in [b[0], b[1], group_b] {
        assert_eq!(status(&store, id), Status::Expired, "task {id}");
        assert!(store.history_task(id).expect("read").is_some());
    }
    assert_eq!(
        events_of(&store, group_b),
        ["enqueued", "expired", "moved-to-history"]
    );
    assert_verifies(&store);
}

#[test]
fn a_task_for_another_node_expires_by_its_ttl_too() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = open(dir.path(), &clock);
    let there = berth::submit::enqueue_one(
        &store,
        TaskSpec {
            target: Some("edge-2".into()),
            ..spec("there", Some(1_000))
        },
        Placement::Last,
    )
    .expect("enqueue");
    let stays = berth::submit::enqueue_one(
        &store,
        TaskSpec {
            target: Some("edge-2".into()),
            ..spec("stays", None)
        },
        Placement::Last,
    )
    .expect("enqueue");
    let cfg = EngineConfig {
        node: Some("edge-1".into()),
        ..Default::default()
    };
    let e = engine(&store, ok_handlers(), cfg);
    e.run_until_idle().expect("run");
    assert_eq!(status(&store, there), Status::Queued, "not due yet");
    clock.advance_ms(1_000);
    e.run_until_idle().expect("run");
    assert_eq!(status(&store, there), Status::Expired);
    assert_eq!(status(&store, stays), Status::Queued);
    assert_verifies(&store);
}

#[test]
fn a_running_engine_wakes_up_at_the_deadline() {
    // An auto-advancing fake clock jumps to the loop's next wake-up instead
    // of waiting: the task expires at exactly its deadline only if the loop
    // wakes up for it (without that, nothing would move the clock).
    let dir = tempdir();
    let clock = FakeClock::auto_advancing(T0);
    let store = open(dir.path(), &clock);
    // For another node: it never starts here, so only its TTL ends it.
    let id = berth::submit::enqueue_one(
        &store,
        TaskSpec {
            target: Some("edge-2".into()),
            ..spec("there", Some(30_000))
        },
        Placement::Last,
    )
    .expect("enqueue");
    let e = Arc::new(engine(
        &store,
        ok_handlers(),
        EngineConfig {
            node: Some("edge-1".into()),
            ..Default::default()
        },
    ));
    let stop = e.stop_handle();
    let runner = {
        let e = e.clone();
        std::thread::spawn(move || e.run())
    };
    wait_for("the expiry", || status(&store, id) == Status::Expired);
    stop.stop();
    runner.join().expect("the loop").expect("run");
    let t = store
        .history_task(id)
        .expect("read")
        .expect("in the history");
    assert_eq!(t.finished_at, Some(T0 + 30_000));
    assert_verifies(&store);
}

#[test]
fn a_v1_task_record_decodes_without_a_ttl_and_re_encodes_as_v1() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/codec/gen-task-1");
    let data = std::fs::read(&fixture).expect("the seed");
    // The codec seed's first byte selects the type and framing (see
    // fuzz/src/targets/codec.rs); 0x80 | 0 is a whole framed task record.
    let (sel, record) = data.split_first().expect("bytes");
    assert_eq!(sel & 0x07, 0, "a task seed");
    let record = if sel & 0x80 == 0 {
        let mut v = record.to_vec();
        v.extend_from_slice(&crc32fast::hash(record).to_le_bytes());
        v
    } else {
        record.to_vec()
    };
    assert_eq!(record[0], 1, "a version-1 record");
    let t: berth::task::Task = berth::codec::decode(&record).expect("decodes");
    assert_eq!(t.ttl_ms, None);
    assert_eq!(berth::codec::encode_as(&t, 1).expect("a v1 form"), record);
    let v2 = berth::codec::encode(&t);
    assert_eq!(v2[0], 2);
    assert_eq!(
        berth::codec::decode::<berth::task::Task>(&v2).expect("v2"),
        t
    );
    let mut with_ttl = t.clone();
    with_ttl.ttl_ms = Some(5);
    assert!(berth::codec::encode_as(&with_ttl, 1).is_err());
    assert_eq!(
        berth::codec::decode::<berth::task::Task>(&berth::codec::encode(&with_ttl)).expect("v2"),
        with_ttl
    );
}

// ---- the v1 fixture ----

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-data-dir")
}

/// Copies the fixture's data dir to `to` (inflating `db/db.gz`).
fn copy_fixture(to: &Path) {
    common::copy_fixture_data(&fixture().join("data"), to);
}

#[test]
fn a_data_dir_from_before_ttls_reads_back_the_same_verifies_and_runs() {
    let root = tempdir();
    let dir = root.path().join("data");
    copy_fixture(&dir);
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("expected.json")).expect("expected.json"),
    )
    .expect("json");
    for (id, want) in expected["tasks"].as_object().expect("tasks") {
        let mut got = task_json(&dir, id.parse().expect("an id"));
        let m = got.as_object_mut().expect("an object");
        assert_eq!(
            m.remove("ttl_ms"),
            Some(serde_json::Value::Null),
            "task {id}"
        );
        assert_eq!(
            m.remove("expires_at"),
            Some(serde_json::Value::Null),
            "task {id}"
        );
        assert_eq!(&got, want, "task {id} reads back differently");
    }
    let o = berth(&dir, &["task", "list", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(common::rows_before_took_ms(list), expected["list"]);
    let o = berth(&dir, &["verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("35 events replayed"), "{}", stdout(&o));

    // The archive segment of the same records decodes, record for record
    // as the data dir holds them.
    let (_, archived) =
        berth::archive::read_segment(&fixture().join("archive/seg-00000000000000000001.bsg"))
            .expect("the v1 segment reads");
    {
        let clock = FakeClock::new(T0);
        let store = Store::open(
            &dir,
            Options {
                read_only: true,
                ..Options::default()
            },
            Arc::new(clock),
        )
        .expect("open to read");
        let events: Vec<_> = archived.iter().flat_map(|r| r.events.clone()).collect();
        let stored: Vec<_> = store.events_from(1).map(|e| e.expect("event")).collect();
        assert_eq!(events, stored);
    }

    // The tasks left run, on a node they are for; new records are version
    // 2 among the old ones, and the log still verifies.
    write_script(
        &root.path().join("hook.sh"),
        "#!/bin/sh\ncat >/dev/null\necho ok\n",
    );
    let cfg = write_root(
        root.path(),
        "#!/bin/sh\ncat >/dev/null\necho ok\n",
        "data_dir = \"data\"\nnode = \"edge-9\"\ntags = [\"x\"]\nparallel_queues = 2\n\
         [handlers.ModuleRun]\ncommand = [\"./hook.sh\"]\n",
    );
    let mut d = Daemon::start(&cfg, &dir, &["--until-idle"]);
    let (st, _) = d.wait_exit(Duration::from_secs(30));
    assert!(st.success(), "{}", d.log_text());
    for id in [3, 7, 8, 9, 10, 12] {
        assert_eq!(task_json(&dir, id)["status"], "succeeded", "task {id}");
    }
    let o = berth(&dir, &["verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    // The daemon's open upgraded the store format (nothing else).
    let db = sled::open(dir.join("db")).expect("sled");
    let format = db.get(b"mformat").expect("read").expect("mformat");
    assert_eq!(
        berth::codec::decode::<u64>(&format),
        Ok(berth::store::keys::STORE_FORMAT)
    );
}

// ---- a real daemon ----

/// A handler that prints its name and, for a task named `block*`, waits
/// until the file ROOT/release exists.
const HOOK: &str = "#!/bin/sh\ncat >/dev/null\ncase \"$BERTH_TASK_NAME\" in\n  block*) while [ ! -e \"$(dirname \"$0\")/release\" ]; do sleep 0.02; done;;\nesac\necho \"ran $BERTH_TASK_NAME\"\n";

fn config(extra: &str) -> String {
    format!("data_dir = \"data\"\n{extra}\n[handlers.ModuleRun]\ncommand = [\"./hook.sh\"]\n")
}

fn enqueue(dir: &Path, name: &str, ttl: Option<&str>) -> u64 {
    let mut args = vec!["--queue", "main", "--kind", "ModuleRun", "--name", name];
    if let Some(t) = ttl {
        args.extend(["--ttl", t]);
    }
    common::enqueue_id(dir, &args)
}

#[test]
fn a_daemon_expires_a_waiting_task_and_runs_the_next_one() {
    let root = tempdir();
    let cfg = write_root(root.path(), HOOK, &config(""));
    let dir = root.path().join("data");
    let d = Daemon::start(&cfg, &dir, &[]);
    // The head has a TTL too, but it starts at once: it runs to its end.
    let block = enqueue(&dir, "block", Some("300ms"));
    wait_for("the head to run", || {
        task_json(&dir, block)["status"] == "running"
    });
    let short = enqueue(&dir, "short", Some("300ms"));
    let next = enqueue(&dir, "next", None);
    let t = task_json(&dir, short);
    assert_eq!(t["ttl_ms"], 300);
    assert_eq!(
        t["expires_at"],
        t["queued_at"].as_u64().expect("queued_at") + 300
    );
    wait_for("the expiry", || {
        task_json(&dir, short)["status"] == "expired"
    });
    let t = task_json(&dir, short);
    assert_eq!(t["attempts"], 0);
    assert_eq!(t["expires_at"], serde_json::Value::Null);
    let queued_at = t["queued_at"].as_u64().expect("queued_at");
    let finished = t["finished_at"].as_u64().expect("finished_at");
    assert!(
        finished >= queued_at + 300,
        "expired {} ms early",
        queued_at + 300 - finished
    );
    let o = berth(&dir, &["queue", "list"]);
    assert!(!stdout(&o).contains(":short"), "{}", stdout(&o));
    assert!(stdout(&o).contains("ModuleRun:main:next"), "{}", stdout(&o));
    std::fs::write(root.path().join("release"), "").expect("release");
    wait_for("the next task", || {
        task_json(&dir, next)["status"] == "succeeded"
    });
    assert_eq!(task_json(&dir, block)["status"], "succeeded");

    let o = berth(&dir, &["task", "list", "--status", "expired"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains(" short ") && text.contains("expired"),
        "{text}"
    );
    let o = berth(&dir, &["task", "show", &short.to_string()]);
    let text = stdout(&o);
    assert!(text.contains("status: expired\n"), "{text}");
    assert!(text.contains("ttl: 300ms\n"), "{text}");
    let o = berth(&dir, &["metrics"]);
    assert!(
        stdout(&o).contains("berth_tasks_finished_total{kind=\"ModuleRun\",outcome=\"expired\"} 1"),
        "{}",
        stdout(&o)
    );
    drop(d);
    let o = berth(&dir, &["verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn a_ttl_survives_a_kill_and_the_restart_expires_the_task_on_time() {
    let root = tempdir();
    let cfg = write_root(root.path(), HOOK, &config(""));
    let dir = root.path().join("data");
    let mut d = Daemon::start(&cfg, &dir, &[]);
    let block = enqueue(&dir, "block", None);
    wait_for("the head to run", || {
        task_json(&dir, block)["status"] == "running"
    });
    let later = enqueue(&dir, "later", Some("2s"));
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(10));
    // Without a daemon nothing expires; `task show` says it is due (the
    // helper's now is 2030).
    let o = berth(&dir, &["task", "show", &later.to_string()]);
    let text = stdout(&o);
    assert!(text.contains("status: queued\n"), "{text}");
    assert!(text.contains("due to expire"), "{text}");
    let t = task_json(&dir, later);
    let deadline = t["queued_at"].as_u64().expect("queued_at") + 2_000;
    let _d = Daemon::start(&cfg, &dir, &[]);
    wait_for("the expiry after the restart", || {
        task_json(&dir, later)["status"] == "expired"
    });
    let t = task_json(&dir, later);
    let finished = t["finished_at"].as_u64().expect("finished_at");
    assert!(
        finished >= deadline,
        "expired {} ms early",
        deadline - finished
    );
    // The restart took less than the TTL, so the daemon waited for the
    // deadline: it expired within a second of it, not at some later poll.
    assert!(
        finished - deadline < 1_000,
        "expired {} ms late",
        finished - deadline
    );
    // Recovery put the head back (interrupted), and it runs again: `later`
    // waited behind it and expired there.
    let b = task_json(&dir, block);
    assert_eq!(
        (&b["status"], &b["attempts"]),
        (&serde_json::json!("running"), &serde_json::json!(2))
    );
}

#[test]
fn bad_ttls_are_refused_naming_the_flag_or_entry_and_field() {
    let root = tempdir();
    let dir = root.path().join("data");
    for bad in ["soon", "0s", "-5m", "200y", "1500us"] {
        let flag = format!("--ttl={bad}");
        let o = berth(
            &dir,
            &[
                "enqueue", "--queue", "main", "--kind", "K", "--name", "n", &flag,
            ],
        );
        assert_eq!(o.status.code(), Some(2), "--ttl {bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("--ttl"), "{}", stderr(&o));
    }
    // What would be cut to whole milliseconds is refused, not truncated.
    let o = berth(
        &dir,
        &[
            "enqueue", "--queue", "main", "--kind", "K", "--name", "n", "--ttl", "1500us",
        ],
    );
    assert!(
        stderr(&o).contains(
            "invalid value '1500us' for '--ttl <TTL>': '1500us' must be a whole number of \
             milliseconds"
        ),
        "{}",
        stderr(&o)
    );
    let batch = root.path().join("b.json");
    for (bad, says) in [
        ("\"soon\"", "not a duration"),
        ("\"0ms\"", "at least 1ms"),
        (
            "\"1500us\"",
            "'1500us': must be a whole number of milliseconds",
        ),
        ("600", "invalid type"),
    ] {
        std::fs::write(
            &batch,
            format!(
                "[{{\"queue\":\"main\",\"kind\":\"K\",\"name\":\"a\"}},\
                 {{\"queue\":\"main\",\"kind\":\"K\",\"name\":\"b\",\"ttl\":{bad}}}]"
            ),
        )
        .expect("write");
        let o = berth(
            &dir,
            &["enqueue", "--batch", batch.to_str().expect("utf-8")],
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("entry 2 of 2, field ttl") && e.contains(says),
            "{e}"
        );
    }
    assert!(!dir.exists(), "a refused enqueue created the data dir");
    // A good one is taken, and a batch groups only entries with one TTL.
    std::fs::write(
        &batch,
        "[{\"queue\":\"main\",\"kind\":\"K\",\"name\":\"a\",\"weight\":1,\"ttl\":\"10m\"},\
          {\"queue\":\"main\",\"kind\":\"K\",\"name\":\"b\",\"weight\":1,\"ttl\":\"10m\"},\
          {\"queue\":\"main\",\"kind\":\"K\",\"name\":\"c\",\"weight\":1}]",
    )
    .expect("write");
    let o = berth(
        &dir,
        &["enqueue", "--batch", batch.to_str().expect("utf-8")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u64> = stdout(&o)
        .lines()
        .map(|l| l.parse().expect("an id"))
        .collect();
    assert_eq!(ids.len(), 2, "a group of a and b, then c alone: {ids:?}");
    let parent = task_json(&dir, ids[0]);
    assert_eq!(parent["ttl_ms"], 600_000);
    assert_eq!(parent["children"].as_array().map(Vec::len), Some(2));
    assert_eq!(task_json(&dir, ids[1])["ttl_ms"], serde_json::Value::Null);
}

//! Offline replay with the real binary: `berth replay` rebuilds exactly
//! what `berth queue list` showed at any moment of a real daemon's run,
//! `berth log` prints every event once and its filters select the right
//! ones, archived history replays from event 1, damaged or missing history
//! is an error, and neither command changes a byte of the data dir.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use berth::clock;
use berth::store::{AttemptLog, AttemptOutcome, Options, OutputTail, Placement, Store};
use berth::task::{Status, TaskSpec};
use common::daemon::{Daemon, write_script};
use common::{berth, stderr, stdout, tempdir, wait_for};
use serde_json::Value;

/// The handler: it says it started (`NAME.started.ATTEMPT`), waits for
/// `NAME.go.ATTEMPT`, and fails if `NAME.fail.ATTEMPT` exists.
const HOOK: &str = r#"#!/bin/sh
g="$GATES/$BERTH_TASK_NAME"
: > "$g.started.$BERTH_ATTEMPT"
while [ ! -e "$g.go.$BERTH_ATTEMPT" ]; do sleep 0.01; done
if [ -e "$g.fail.$BERTH_ATTEMPT" ]; then echo "boom $BERTH_TASK_NAME $BERTH_ATTEMPT" >&2; exit 1; fi
echo "done $BERTH_TASK_NAME"
"#;

struct Run {
    root: PathBuf,
    dir: PathBuf,
    gates: PathBuf,
}

impl Run {
    fn new(root: &Path) -> Run {
        let gates = root.join("gates");
        std::fs::create_dir_all(&gates).expect("gates");
        write_script(&root.join("hook.sh"), HOOK);
        std::fs::write(
            root.join("berth.toml"),
            format!(
                "data_dir = \"data\"\nparallel_queues = 3\n\
                 [retry]\ninitial = \"20ms\"\nmax = \"20ms\"\nmax_attempts = 2\n\
                 [handlers.Gate]\ncommand = [\"./hook.sh\"]\nenv = {{ GATES = \"{}\" }}\n",
                gates.display()
            ),
        )
        .expect("config");
        Run {
            root: root.to_path_buf(),
            dir: root.join("data"),
            gates,
        }
    }

    fn berth(&self, args: &[&str]) -> Output {
        berth(&self.dir, args)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.berth(args);
        assert!(o.status.success(), "berth {args:?}: {}", stderr(&o));
        stdout(&o)
    }

    fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("berth {args:?}: {e}:\n{text}"))
    }

    fn started(&self, name: &str, attempt: u32) -> bool {
        self.gates
            .join(format!("{name}.started.{attempt}"))
            .exists()
    }

    fn wait_started(&self, name: &str, attempt: u32) {
        wait_for(&format!("{name} attempt {attempt} to start"), || {
            self.started(name, attempt)
        });
    }

    fn go(&self, name: &str, attempt: u32) {
        std::fs::write(self.gates.join(format!("{name}.go.{attempt}")), b"").expect("gate");
    }

    fn fail(&self, name: &str, attempt: u32) {
        std::fs::write(self.gates.join(format!("{name}.fail.{attempt}")), b"").expect("gate");
        self.go(name, attempt);
    }

    /// The tasks (by name) in the queue list, in each queue.
    fn queues(&self) -> BTreeMap<String, Vec<String>> {
        let v = self.json(&["queue", "list", "-o", "json"]);
        let mut out = BTreeMap::new();
        for q in v["active"].as_array().expect("active") {
            let names = q["tasks"]
                .as_array()
                .expect("tasks")
                .iter()
                .map(|t| t["name"].as_str().unwrap_or("").to_string())
                .collect();
            out.insert(q["name"].as_str().unwrap_or("").to_string(), names);
        }
        out
    }
}

/// `queue list -o json` with every queue's live status blanked: the only
/// part a replay cannot know (a replayed queue has no runtime status, as a
/// data dir read without a daemon has none).
fn without_statuses(mut v: Value) -> Value {
    for part in ["active", "empty"] {
        if let Some(qs) = v[part].as_array_mut() {
            for q in qs {
                q["status"] = Value::String(String::new());
            }
        }
    }
    v
}

/// A moment of the run: what `queue list` showed, and the last event then.
struct Moment {
    what: &'static str,
    queues: Value,
    seq: u64,
    time: String,
}

fn capture(run: &Run, what: &'static str) -> Moment {
    let queues = run.json(&["queue", "list", "-o", "json"]);
    let log = run.json(&["log", "-o", "json"]);
    let last = log.as_array().and_then(|a| a.last()).expect("events");
    let m = Moment {
        what,
        queues,
        seq: last["seq"].as_u64().expect("seq"),
        time: last["time"].as_str().expect("time").to_string(),
    };
    // Through the daemon too: the replay of its own store now.
    let now = run.json(&["replay", "-o", "json"]);
    assert_eq!(
        now,
        without_statuses(m.queues.clone()),
        "{what}: replay through the daemon"
    );
    // Nothing happened meanwhile: the moment is a stable one.
    assert_eq!(
        run.json(&["queue", "list", "-o", "json"]),
        m.queues,
        "{what}: the state moved while it was captured"
    );
    m
}

/// Runs `args` and checks that no file under `dir` changed.
fn unchanged(dir: &Path, args: &[&str]) -> Output {
    let before = common::file_hashes(dir);
    let o = berth(dir, args);
    assert_eq!(
        common::file_hashes(dir),
        before,
        "berth {args:?} changed the data dir"
    );
    o
}

fn seqs(log: &Value) -> Vec<u64> {
    log.as_array()
        .expect("an array")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect()
}

#[test]
fn replay_rebuilds_every_moment_of_a_real_run_and_log_tells_it() {
    let tmp = tempdir();
    let run = Run::new(tmp.path());
    let batch = tmp.path().join("batch.json");
    let entry = |name: &str, queue: &str, weight: u32| serde_json::json!({"queue": queue, "kind": "Gate", "name": name, "weight": weight});
    let specs = serde_json::json!([
        entry("single", "main", 10),
        entry("flaky", "main", 20),
        entry("c1", "main", 30),
        entry("c2", "main", 30),
        entry("c3", "main", 30),
        entry("c4", "main", 30),
        entry("dead", "other", 10),
    ]);
    std::fs::write(&batch, specs.to_string()).expect("batch");
    run.ok(&["enqueue", "--batch", batch.to_str().expect("utf-8")]);
    let mut daemon = Daemon::start(&run.root.join("berth.toml"), &run.dir, &[]);
    let mut moments = Vec::new();

    // 1: single and dead run (their first attempts).
    run.wait_started("single", 1);
    run.wait_started("dead", 1);
    moments.push(capture(&run, "single and dead running"));
    run.go("single", 1);
    run.fail("dead", 1);

    // 2: flaky's first attempt runs; dead's second (after its backoff).
    run.wait_started("flaky", 1);
    run.wait_started("dead", 2);
    moments.push(capture(&run, "flaky running, dead on its second attempt"));
    run.fail("flaky", 1);
    run.fail("dead", 2);

    // 3: flaky's second attempt runs; dead is a dead letter.
    run.wait_started("flaky", 2);
    wait_for("dead to leave its queue", || {
        !run.queues().contains_key("other")
    });
    moments.push(capture(&run, "flaky retried, dead letter"));
    run.go("flaky", 2);

    // 4: the group: three children run in the three parallel queues, the
    // fourth waits behind one of them.
    let children = ["c1", "c2", "c3", "c4"];
    wait_for("three children to start", || {
        children.iter().filter(|c| run.started(c, 1)).count() == 3
    });
    moments.push(capture(&run, "group: three running, one queued"));
    // A child alone in its queue ends; the one queued behind another
    // stays queued.
    let queues = run.queues();
    let alone = queues
        .iter()
        .filter(|(q, _)| q.starts_with("parallel_queue_"))
        .find(|(_, names)| names.len() == 1)
        .map(|(_, names)| names[0].clone())
        .expect("a child alone in its queue");
    run.fail(&alone, 1);
    wait_for("the child to fail and start again", || {
        run.started(&alone, 2)
    });
    moments.push(capture(&run, "group: one child failed once"));
    run.go(&alone, 2);
    wait_for("the child to finish", || {
        !run.queues().values().flatten().any(|n| *n == alone)
    });
    moments.push(capture(&run, "group: one done, two running, one queued"));

    // The rest runs out.
    for c in children {
        run.go(c, 1);
    }
    wait_for("every queue to empty", || run.queues().is_empty());
    daemon.signal(libc::SIGTERM);
    let (status, _) = daemon.wait_exit(std::time::Duration::from_secs(20));
    assert!(status.success(), "the daemon: {status}");

    // Every moment, by its event number and by its time, with no daemon.
    for m in &moments {
        let by_seq = run.json(&["replay", "--seq", &m.seq.to_string(), "-o", "json"]);
        assert_eq!(
            by_seq,
            without_statuses(m.queues.clone()),
            "{}: --seq",
            m.what
        );
        let by_time = run.json(&["replay", "--at", &m.time, "-o", "json"]);
        assert_eq!(by_time, by_seq, "{}: --at {}", m.what, m.time);
    }
    // The moments differ from one another (each shows something new).
    for w in moments.windows(2) {
        assert_ne!(w[0].queues, w[1].queues, "{} and {}", w[0].what, w[1].what);
    }
    // The end: exactly what queue list shows now, text and JSON.
    assert_eq!(
        run.ok(&["replay", "-o", "json"]),
        run.ok(&["queue", "list", "-o", "json"])
    );
    assert_eq!(run.ok(&["replay"]), run.ok(&["queue", "list"]));
    assert!(run.ok(&["verify"]).starts_with("ok:"));

    // The log: every event once, in order; text has one line each.
    let log = run.json(&["log", "-o", "json"]);
    let all = seqs(&log);
    let last = *all.last().expect("events");
    assert_eq!(all, (1..=last).collect::<Vec<_>>());
    assert_eq!(run.ok(&["log"]).lines().count() as u64, last);
    let entries = log.as_array().expect("array");
    let id_of = |name: &str| {
        entries
            .iter()
            .find(|e| {
                e["event"] == "enqueued"
                    && e["details"]
                        .as_str()
                        .is_some_and(|d| d.ends_with(&format!("name {name}")))
            })
            .and_then(|e| e["task"].as_u64())
            .unwrap_or_else(|| panic!("no enqueued event for {name}"))
    };
    let dead = id_of("dead");

    // --task: the dead letter's whole story.
    let story = run.json(&["log", "--task", &dead.to_string(), "-o", "json"]);
    let events: Vec<&str> = story
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["event"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        events,
        [
            "enqueued",
            "started",
            "attempt-logged",
            "failed",
            "started",
            "attempt-logged",
            "failed",
            "moved-to-history"
        ]
    );
    assert!(
        story[3]["details"]
            .as_str()
            .is_some_and(|d| d.contains("boom dead 1")),
        "{story}"
    );
    assert_eq!(story[7]["details"], "status failed");
    // --queue other: only the dead letter was there.
    assert_eq!(run.json(&["log", "--queue", "other", "-o", "json"]), story);
    // --queue parallel_queue_N: the children placed there, from their
    // placement on, and nothing else.
    let mut placed_total = 0;
    for n in 0..3 {
        let q = format!("parallel_queue_{n}");
        let part = run.json(&["log", "--queue", &q, "-o", "json"]);
        let mut placed = std::collections::BTreeSet::new();
        for e in part.as_array().expect("array") {
            let task = e["task"].as_u64().expect("task");
            if e["event"] == "placed" {
                assert_eq!(e["details"], format!("into queue {q}"));
                placed.insert(task);
            }
            assert!(placed.contains(&task), "{q}: {e} before its placement");
        }
        placed_total += placed.len();
    }
    assert_eq!(placed_total, 4);
    // --since/--until: the events in a window of time, as the full log says.
    let (from, to) = (&entries[5]["time"], &entries[last as usize - 6]["time"]);
    let window = run.json(&[
        "log",
        "--since",
        from.as_str().expect("time"),
        "--until",
        to.as_str().expect("time"),
        "-o",
        "json",
    ]);
    let expected: Vec<&Value> = entries
        .iter()
        .filter(|e| e["time"].as_str() >= from.as_str() && e["time"].as_str() <= to.as_str())
        .collect();
    assert_eq!(
        window.as_array().expect("array").iter().collect::<Vec<_>>(),
        expected
    );
    assert!(
        expected.len() >= last as usize - 10,
        "{} events",
        expected.len()
    );

    // A moment before the first event: the empty state, said on stderr.
    let o = run.berth(&["replay", "--at", "2000-01-01T00:00:00Z", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is before the first event (event 1 at"),
        "{}",
        stderr(&o)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["summary"]["totalTasks"], 0);
    assert_eq!(v["empty"].as_array().map(Vec::len), Some(4));
    // After the last: the last state, said on stderr.
    let o = run.berth(&["replay", "--seq", &(last + 100).to_string(), "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("is after the last event (event {last} at")));
    assert_eq!(stdout(&o), run.ok(&["queue", "list", "-o", "json"]));
    // Bad moments are bad input.
    let o = run.berth(&["replay", "--at", "yesterday"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--at: 'yesterday' is not a time"),
        "{}",
        stderr(&o)
    );
    let o = run.berth(&["replay", "--at", "1h", "--seq", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run.berth(&["log", "--since", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// A data dir with some history: successes, a failure and a retry, a dead
/// letter put back, a group, a removal.
fn history(dir: &Path) -> u64 {
    let store = Store::open(dir, Options::default(), clock::system()).expect("open");
    let spec = |queue: &str, name: &str| TaskSpec {
        queue: queue.into(),
        kind: "Work".into(),
        name: name.into(),
        ..Default::default()
    };
    let add = |s| berth::submit::enqueue_one(&store, s, Placement::Last).expect("enqueue");
    let b = *store.budget();
    let tail = |t: &str| OutputTail::new(t.len() as u64, t.as_bytes(), &b);
    let attempt = |id: u64, n: u32, ok: bool| {
        let mut w = store.write();
        w.start(id).expect("start");
        let outcome = match ok {
            true => AttemptOutcome::Succeeded,
            false => AttemptOutcome::Failed {
                message: "boom".into(),
            },
        };
        let log = AttemptLog {
            attempt: n,
            started_at: 1_800_000_000_000,
            ended_at: 1_800_000_000_500,
            outcome,
            exit_code: Some(i32::from(!ok)),
            signal: None,
            stdout: tail("out\n"),
            stderr: tail(""),
        };
        w.log_attempt(id, log).expect("log");
        if ok {
            w.succeed(id, None).expect("succeed");
            w.to_history(id, Status::Succeeded).expect("history");
        } else {
            w.fail(id, "boom".into(), None).expect("fail");
        }
        w.commit().expect("commit");
    };
    for round in 0..8 {
        let a = add(spec("main", &format!("a{round}")));
        let b = add(spec("other", &format!("b{round}")));
        attempt(a, 1, false);
        attempt(a, 2, true);
        attempt(b, 1, false);
        let mut w = store.write();
        w.to_history(b, Status::Failed).expect("dead letter");
        w.commit().expect("commit");
        if round % 2 == 0 {
            let mut w = store.write();
            w.retry(b, Placement::Last).expect("retry");
            w.commit().expect("commit");
        }
        let group: Vec<TaskSpec> = ["x", "y"]
            .iter()
            .map(|n| TaskSpec {
                weight: Some(5),
                ..spec("main", &format!("{n}{round}"))
            })
            .collect();
        let ids = berth::submit::enqueue_batch(&store, group).expect("batch");
        if round % 3 == 1 {
            let mut w = store.write();
            w.remove(ids[0]).expect("remove");
            w.commit().expect("commit");
        }
    }
    store.next_seq() - 1
}

/// Moves the commit records of events 1..`upto` out of the store's log
/// into archive segments of about `per` records each, as retention will.
/// Returns the segments' paths.
fn archive_log(dir: &Path, upto: u64, per: usize) -> Vec<PathBuf> {
    let db = sled::open(dir.join("db")).expect("sled");
    // Each record's keys (one, or its pieces: `e` seq piece) and bytes.
    let mut records: Vec<(Vec<Vec<u8>>, Vec<u8>)> = Vec::new();
    for item in db.scan_prefix([b'e']) {
        let (k, v) = item.expect("record");
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&k[1..9]);
        if u64::from_be_bytes(seq) >= upto {
            break;
        }
        match records.last_mut() {
            Some((keys, bytes)) if k.len() == 13 && keys[0][..9] == k[..9] => {
                keys.push(k.to_vec());
                bytes.extend_from_slice(&v);
            }
            _ => records.push((vec![k.to_vec()], v.to_vec())),
        }
    }
    let mut paths = Vec::new();
    for chunk in records.chunks(per) {
        let decoded: Vec<berth::store::event::CommitRecord> = chunk
            .iter()
            .map(|(_, v)| berth::codec::decode(v).expect("decode"))
            .collect();
        let first = decoded[0].events[0].seq;
        let last = decoded
            .last()
            .and_then(|r| r.events.last())
            .expect("events")
            .seq;
        let bytes: Vec<Vec<u8>> = chunk.iter().map(|(_, v)| v.clone()).collect();
        paths.push(
            berth::archive::write_segment(&dir.join(berth::archive::DIR), first, last, &bytes)
                .expect("segment"),
        );
    }
    // The last archived record stays in the store too: the two overlap.
    for (keys, _) in &records[..records.len() - 1] {
        for k in keys {
            db.remove(k).expect("remove");
        }
    }
    db.flush().expect("flush");
    // The store's log now starts with the last archived record.
    let first = db
        .scan_prefix([b'e'])
        .next()
        .expect("a record")
        .expect("read")
        .0;
    assert_eq!(first.to_vec(), records[records.len() - 1].0[0]);
    assert!(records.len() > 1);
    paths
}

fn copy_dir(from: &Path, to: &Path) {
    let o = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .expect("cp");
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn an_archived_history_replays_from_event_1_and_damage_is_an_error() {
    let tmp = tempdir();
    let intact = tmp.path().join("intact");
    let last = history(&intact);
    assert!(last > 100, "{last} events");
    let dir = tmp.path().join("archived");
    copy_dir(&intact, &dir);
    // Segments of 7 records for the first ~2/3 of the log; the last of
    // them also stays in the store (an overlap).
    let segments = archive_log(&dir, last * 2 / 3, 7);
    assert!(segments.len() >= 5, "{} segments", segments.len());

    // Every moment is the same from the archive as from the intact log.
    let replay = |d: &Path, seq: u64| {
        let o = berth(d, &["replay", "--seq", &seq.to_string(), "-o", "json"]);
        assert!(o.status.success(), "replay --seq {seq}: {}", stderr(&o));
        stdout(&o)
    };
    for seq in (0..=last).step_by(7).chain([last]) {
        assert_eq!(replay(&dir, seq), replay(&intact, seq), "at event {seq}");
    }
    assert_eq!(
        stdout(&berth(&dir, &["replay", "-o", "json"])),
        stdout(&berth(&dir, &["queue", "list", "-o", "json"]))
    );
    // The log is whole: event 1 to the last, once each, the same as intact.
    let log = |d: &Path, args: &[&str]| {
        let o = unchanged(d, &[&["log", "-o", "json"], args].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).expect("json")
    };
    let whole = log(&dir, &[]);
    assert_eq!(seqs(&whole), (1..=last).collect::<Vec<_>>());
    assert_eq!(whole, log(&intact, &[]));
    assert_eq!(
        log(&dir, &["--queue", "other"]),
        log(&intact, &["--queue", "other"])
    );
    // Reading never wrote: not the store, not the archive.
    let o = unchanged(&dir, &["replay", "--seq", "40"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // A damaged segment: a clear error naming it, exit 1.
    let victim = &segments[2];
    let good = std::fs::read(victim).expect("read");
    let mut bad = good.clone();
    bad[60] ^= 0x10;
    std::fs::write(victim, &bad).expect("write");
    for args in [&["replay"][..], &["log"][..]] {
        let o = unchanged(&dir, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(&victim.display().to_string()), "{e}");
        assert!(e.contains("checksum mismatch"), "{e}");
    }
    // A missing segment: a gap, naming the events and where they are from.
    std::fs::write(victim, &good).expect("restore");
    std::fs::remove_file(victim).expect("remove");
    let o = unchanged(&dir, &["replay", "-o", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("the log has a gap"), "{e}");
    assert!(e.contains(&segments[1].display().to_string()), "{e}");
    assert!(e.contains(&segments[3].display().to_string()), "{e}");
    assert!(e.contains("are missing"), "{e}");
    let o = unchanged(&dir, &["log"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("the log has a gap"), "{}", stderr(&o));
}

#[test]
fn reading_beside_a_running_daemon_writes_nothing() {
    let tmp = tempdir();
    let run = Run::new(tmp.path());
    // Without the write-ahead log, a daemon's commit is on disk in sled's
    // files when it returns; with it, sled is flushed up to a second later
    // in the background, and the log's next segment is zeroed beside it,
    // which a comparison of the files would see. (The other tests here run
    // their daemons with the log, as a daemon runs by default.)
    let config = run.root.join("berth.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("write_ahead_log = false\n{text}")).expect("config");
    run.ok(&[
        "enqueue", "--queue", "main", "--kind", "Gate", "--name", "held",
    ]);
    let _daemon = Daemon::start(&config, &run.dir, &[]);
    run.wait_started("held", 1);
    // The daemon is idle now (its one task waits on a gate): nothing it
    // does changes the files, so any change would be the commands'.
    for args in [
        &["replay", "-o", "json"][..],
        &["replay", "--seq", "1"][..],
        &["log"][..],
        &["log", "-o", "json", "--task", "1"][..],
    ] {
        let o = unchanged(&run.dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let log = run.json(&["log", "-o", "json"]);
    assert_eq!(seqs(&log), vec![1, 2]);
    assert_eq!(log[1]["event"], "started");
    run.go("held", 1);
}

//! One path per operation: every command gives the same output and exit
//! code through a daemon as without one.
//!
//! Two copies of one data dir: commands run on copy A with no daemon and on
//! copy B through a daemon, one after the other, and their stdout, stderr
//! and exit codes are compared. The daemon must not change B by itself: the
//! head of every queue the test uses is a `Hold` task whose handler waits
//! for a file that never comes, and the test looks only at the tasks behind
//! it. What may differ is what the daemon alone knows: queue statuses, and
//! the holders' state.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use berth::clock;
use berth::store::{AttemptLog, AttemptOutcome, Options, OutputTail, Placement, Store};
use berth::task::Status;
use berth::task::TaskSpec;
use common::daemon::Daemon;
use common::{berth, stderr, stdout};

fn spec(queue: &str, kind: &str, name: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        kind: kind.into(),
        name: name.into(),
        description: Some("doStartup".into()),
        payload: serde_json::json!({"name": name}),
        ..Default::default()
    }
}

/// The node the daemon runs as (its config says so too).
fn this_node() -> berth::routing::Node {
    berth::routing::Node {
        name: Some("edge-1".into()),
        tags: vec!["gluster".into()],
    }
}

/// The shared starting state: holders at the head of `main` and `other`,
/// tasks behind them (a single, a group of two), one dead letter whose two
/// attempts are logged (stderr lines), one finished task whose attempt
/// logged progress lines on stdout, and two tasks that are not for this node
/// (its target, its tags), which the node recorded by the last daemon makes
/// known without a daemon too.
fn prepare(dir: &Path) {
    let store = Store::open(dir, Options::default(), clock::system()).expect("open");
    let add =
        |s: TaskSpec| berth::submit::enqueue_one(&store, s, Placement::Last).expect("enqueue");
    add(spec("main", "Hold", "holder-main"));
    add(spec("other", "Hold", "holder-other"));
    add(spec("main", "Work", "single"));
    let mut group: Vec<TaskSpec> = ["echo", "mcplay"]
        .iter()
        .map(|n| TaskSpec {
            weight: Some(30),
            ..spec("main", "Work", n)
        })
        .collect();
    group.push(TaskSpec {
        weight: Some(40),
        ..spec("main", "Work", "after-group")
    });
    berth::submit::enqueue_batch(&store, group).expect("batch");
    let dead = add(spec("other", "Work", "dead-letter"));
    let b = *store.budget();
    let tail = |text: &str| OutputTail::new(text.len() as u64, text.as_bytes(), &b);
    for attempt in 1..=2 {
        let mut w = store.write();
        w.start(dead).expect("start");
        let message = "helm upgrade failed".to_string();
        let log = AttemptLog {
            attempt,
            started_at: 1_800_000_000_000 + u64::from(attempt) * 10_000,
            ended_at: 1_800_000_001_500 + u64::from(attempt) * 10_000,
            outcome: AttemptOutcome::Failed {
                message: message.clone(),
            },
            exit_code: Some(1),
            signal: None,
            stdout: tail(""),
            stderr: tail("rendering chart\nhelm upgrade failed\n"),
        };
        w.log_attempt(dead, log).expect("log");
        w.fail(dead, message, None).expect("fail");
        if attempt == 2 {
            w.to_history(dead, Status::Failed).expect("history");
        }
        w.commit().expect("commit");
    }
    let done = add(spec("other", "Work", "finished"));
    let mut w = store.write();
    w.start(done).expect("start");
    let log = AttemptLog {
        attempt: 1,
        started_at: 1_800_000_100_000,
        ended_at: 1_800_000_100_250,
        outcome: AttemptOutcome::Succeeded,
        exit_code: Some(0),
        signal: None,
        stdout: tail("progress 1/2\nprogress 2/2\n"),
        stderr: tail(""),
    };
    w.log_attempt(done, log).expect("log");
    w.succeed(done, None).expect("succeed");
    w.to_history(done, Status::Succeeded).expect("history");
    w.commit().expect("commit");
    add(TaskSpec {
        target: Some("edge-2".into()),
        ..spec("other", "Work", "for-edge-2")
    });
    add(TaskSpec {
        tags: vec!["gpu".into()],
        ..spec("other", "Work", "needs-gpu")
    });
    store.set_node(&this_node()).expect("record the node");
}

fn config(root: &Path) -> PathBuf {
    let cfg = root.join("berth.toml");
    std::fs::write(
        &cfg,
        "node = \"edge-1\"\ntags = [\"gluster\"]\n\
         [handlers.Hold]\ncommand = [\"sh\", \"-c\", \"while [ ! -e never ]; do sleep 0.05; done\"]\n\
         [handlers.Work]\ncommand = [\"true\"]\n",
    )
    .expect("config");
    cfg
}

/// What may differ between the two: queue statuses, which only a daemon
/// has (`status: '...'` in a queue's header, and each queue's `status` in
/// `queue list -o json`), and the state of the holders, which run under the
/// daemon only.
fn normalize(text: &str) -> String {
    if text.starts_with("# HELP berth_") {
        return normalize_metrics(text);
    }
    if let Ok(mut v @ serde_json::Value::Object(_)) = serde_json::from_str(text) {
        for part in ["active", "empty"] {
            if let Some(queues) = v[part].as_array_mut() {
                for q in queues {
                    q["status"] = "<live>".into();
                    // The holders run under the daemon only.
                    for t in q["tasks"].as_array_mut().into_iter().flatten() {
                        if t["kind"] == "Hold" {
                            t["status"] = "<holder>".into();
                            t["attempts"] = "<holder>".into();
                        }
                    }
                }
            }
        }
        return v.to_string();
    }
    text.lines()
        .map(
            |l| match (l.starts_with("Queue '"), l.find(", status: '")) {
                (true, Some(i)) => format!("{}, status: <live>", &l[..i]),
                _ => l.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// The metric families that the store alone decides (not the daemon's own,
/// nor those that change with time or disk use), without the holders'
/// samples: those must be the same with and without a daemon.
fn normalize_metrics(text: &str) -> String {
    const FROM_THE_STORE: [&str; 15] = [
        "berth_build_info",
        "berth_node_info",
        "berth_counters_since_event",
        "berth_tasks_enqueued_total",
        "berth_tasks_merged_total",
        "berth_attempts_started_total",
        "berth_attempts_total",
        "berth_tasks_finished_total",
        "berth_tasks_removed_total",
        "berth_tasks_retried_total",
        "berth_attempt_duration_seconds",
        "berth_task_wait_seconds",
        "berth_queue_length",
        "berth_queue_tasks_for_other_nodes",
        "berth_tasks_waiting_for_parent",
    ];
    text.lines()
        .filter(|l| !l.contains("kind=\"Hold\""))
        .filter(|l| {
            let name = l
                .trim_start_matches("# HELP ")
                .trim_start_matches("# TYPE ")
                .split([' ', '{'])
                .next()
                .unwrap_or_default();
            FROM_THE_STORE.iter().any(|f| {
                name.strip_prefix(f)
                    .is_some_and(|rest| ["", "_bucket", "_sum", "_count"].contains(&rest))
            })
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn compare(a: &Path, b: &Path, args: &[&str]) -> Output {
    let direct = berth(a, args);
    let through = berth(b, args);
    assert_eq!(
        direct.status.code(),
        through.status.code(),
        "{args:?}: exit codes differ\nwithout: {}\nthrough: {}",
        stderr(&direct),
        stderr(&through)
    );
    common::assert_text_eq(&normalize(&stdout(&through)), &normalize(&stdout(&direct)));
    common::assert_text_eq(
        &stderr(&through).replace(&b.display().to_string(), "DIR"),
        &stderr(&direct).replace(&a.display().to_string(), "DIR"),
    );
    direct
}

#[test]
fn every_command_answers_the_same_with_and_without_a_daemon() {
    let root = common::tempdir();
    let a = root.path().join("copy-a");
    prepare(&a);
    let b = root.path().join("copy-b");
    let o = Command::new("cp")
        .arg("-a")
        .arg(&a)
        .arg(&b)
        .output()
        .expect("cp");
    assert!(o.status.success());
    let mut daemon = Daemon::start(&config(root.path()), &b, &[]);
    common::wait_for("the holders to run", || {
        stdout(&berth(&b, &["task", "show", "1", "-o", "json"])).contains("\"running\"")
    });

    // Reads.
    compare(&a, &b, &["queue", "list"]);
    compare(&a, &b, &["queue", "list", "-o", "json"]);
    compare(&a, &b, &["queue", "list", "--show-empty"]);
    for id in ["3", "4", "5", "6", "7", "8", "9"] {
        compare(&a, &b, &["task", "show", id]);
        compare(&a, &b, &["task", "show", id, "-o", "json"]);
    }
    assert_eq!(
        compare(&a, &b, &["task", "show", "99"]).status.code(),
        Some(1)
    );
    // The holders run under the daemon only: list the others.
    compare(
        &a,
        &b,
        &["task", "list", "--kind", "Work", "--kind", "ParallelWork"],
    );
    compare(&a, &b, &["task", "list", "--kind", "Work", "-o", "json"]);
    compare(&a, &b, &["task", "list", "--status", "dead"]);
    compare(
        &a,
        &b,
        &["task", "list", "--status", "waiting", "--name", "m*"],
    );
    assert_eq!(
        compare(&a, &b, &["task", "list", "--status", "nope"])
            .status
            .code(),
        Some(2)
    );
    // Attempt logs.
    let log = compare(&a, &b, &["task", "log", "8"]);
    common::assert_text_eq(
        &stdout(&log),
        "=== attempt 1: started 2027-01-15T08:00:10.000Z, took 1.5s, failed: helm upgrade failed, exit code 1\n\
         --- stdout (empty)\n\
         --- stderr (36 B)\n\
         rendering chart\nhelm upgrade failed\n\
         === attempt 2: started 2027-01-15T08:00:20.000Z, took 1.5s, failed: helm upgrade failed, exit code 1\n\
         --- stdout (empty)\n\
         --- stderr (36 B)\n\
         rendering chart\nhelm upgrade failed\n",
    );
    for (args, code) in [
        (&["task", "log", "8", "-o", "json"][..], 0),
        (&["task", "log", "8", "--attempt", "2"], 0),
        (&["task", "log", "8", "--attempt", "3"], 1),
        (&["task", "log", "9"], 0),
        (&["task", "log", "9", "--follow"], 0), // finished: what is recorded
        (&["task", "log", "9", "--follow", "-o", "json"], 0),
        (&["task", "log", "3"], 0), // never ran
        (&["task", "log", "99"], 1),
    ] {
        assert_eq!(compare(&a, &b, args).status.code(), Some(code), "{args:?}");
    }
    assert!(stdout(&berth(&a, &["task", "log", "9"])).contains("progress 1/2\nprogress 2/2\n"));
    // Routing: why tasks wait, and those for a node.
    let elsewhere = compare(&a, &b, &["task", "list", "--status", "elsewhere"]);
    assert!(
        stdout(&elsewhere).contains("for node edge-2")
            && stdout(&elsewhere).contains("needs tag gpu"),
        "{}",
        stdout(&elsewhere)
    );
    compare(
        &a,
        &b,
        &["task", "list", "--target", "edge-2", "-o", "json"],
    );
    // Metrics: what the store decides is the same.
    let m = compare(&a, &b, &["metrics"]);
    assert!(
        stdout(&m).contains("berth_queue_tasks_for_other_nodes{queue=\"other\"} 2\n"),
        "{}",
        stdout(&m)
    );

    // Writes, and errors of every class.
    let big = root.path().join("big.json");
    let mut rng = fastrand::Rng::with_seed(3);
    let noise: String = (0..2_500_000).map(|_| rng.alphanumeric()).collect();
    std::fs::write(&big, format!("\"{noise}\"")).expect("big payload");
    let big = big.to_string_lossy().to_string();
    let enq = |queue: &str, extra: &[&str]| {
        let mut v = vec!["enqueue", "--queue", queue, "--kind", "Work"];
        v.extend_from_slice(extra);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    for (args, code) in [
        (enq("main", &["--name", "after-single", "--after", "3"]), 0),
        (
            enq("main", &["--name", "before-single", "--before", "3"]),
            0,
        ),
        (enq("main", &["--name", "wrong-anchor", "--after", "2"]), 2),
        (enq("main", &["--name", "no-anchor", "--after", "999"]), 2),
        (enq("no spaces allowed", &["--name", "bad-queue"]), 2),
        (
            enq("main", &["--name", "too-big", "--payload-file", &big]),
            2,
        ),
        // Compaction: the second merges into the first, and prints its id.
        (
            enq("other", &["--name", "keyed", "--compaction-key", "k"]),
            0,
        ),
        (
            enq(
                "other",
                &["--name", "keyed-2", "--compaction-key", "k", "--first"],
            ),
            0,
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(compare(&a, &b, &args).status.code(), Some(code), "{args:?}");
    }
    // (Text: the JSON has the enqueue times, which differ between the copies.)
    let keyed = compare(&a, &b, &["task", "list", "--name", "keyed*"]);
    assert_eq!(
        stdout(&keyed).lines().count(),
        2,
        "the keyed enqueues merged: {}",
        stdout(&keyed)
    );
    let batch = root.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"other","kind":"Work","name":"x","weight":5},
            {"queue":"other","kind":"Work","name":"y","weight":5}]"#,
    )
    .expect("batch");
    // A batch of one group prints its parent's id; its children follow it.
    let grouped = compare(&a, &b, &["enqueue", "--batch", &batch.to_string_lossy()]);
    let parent: u64 = stdout(&grouped).trim().parse().expect("the group's id");
    let (p, c1, c2) = (parent.to_string(), parent + 1, parent + 2);
    std::fs::write(
        &batch,
        r#"[{"queue":"other","kind":"Work","name":"ok"},{"queue":"other"}]"#,
    )
    .expect("batch");
    assert_eq!(
        compare(&a, &b, &["enqueue", "--batch", &batch.to_string_lossy()])
            .status
            .code(),
        Some(2)
    );
    let batch_ids = stdout(&berth(&a, &["task", "show", &p, "-o", "json"]));
    assert!(
        batch_ids.contains(&format!("\"children\": [\n    {c1},\n    {c2}\n  ]")),
        "{batch_ids}"
    );
    let child = c1.to_string();
    for (args, code) in [
        (&["task", "remove", "5"][..], 1), // a group child alone: refused
        (&["task", "remove", "4"], 0),     // its parent, with the children
        (&["task", "remove", "77"], 1),
        (&["task", "remove", "9"], 1), // finished: needs --history
        (&["task", "remove", "9", "--history"], 0),
        (&["task", "retry", "3"], 1), // not a dead letter
        (&["task", "retry", "8"], 0), // the dead letter
        // Cancel: refused for what is missing, finished or a group child.
        (&["task", "cancel", "99"], 1),
        (&["task", "cancel", &child], 1),
        (&["task", "cancel", "3"], 0), // a queued task
        (&["task", "cancel", "3"], 1), // now finished
        (&["task", "log", "3"], 0),
    ] {
        assert_eq!(compare(&a, &b, args).status.code(), Some(code), "{args:?}");
    }
    let o = compare(&a, &b, &["task", "cancel", &p]); // a waiting group
    assert_eq!(stdout(&o), format!("cancelled {c1} {c2} {p}\n"));
    let o = compare(&a, &b, &["task", "remove", &p]);
    assert_eq!(
        stderr(&o),
        format!(
            "berth: task {p} is finished (cancelled); removing it deletes its record and its \
             attempt logs: add --history to do that (berth task remove {p} --history)\n"
        )
    );
    compare(&a, &b, &["queue", "list", "-o", "json"]);
    compare(&a, &b, &["metrics"]);
    // The holder of `other`: queued in A, running in B (its handler is
    // stopped there); the answer is the same.
    let o = compare(&a, &b, &["task", "cancel", "2"]);
    assert_eq!(stdout(&o), "cancelled 2\n");
    assert!(stdout(&berth(&b, &["task", "log", "2"])).contains(", cancelled"));
    // Both logs agree with their states.
    let o = berth(&b, &["task", "cancel", "1"]);
    assert_eq!(stdout(&o), "cancelled 1\n", "{}", stderr(&o));
    daemon.signal(libc::SIGTERM);
    daemon.wait_exit(std::time::Duration::from_secs(40));
    for dir in [&a, &b] {
        let o = berth(dir, &["verify"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

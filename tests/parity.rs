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
use berth::store::{Options, Placement, Store};
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

/// The shared starting state: holders at the head of `main` and `other`,
/// tasks behind them (a single, a group of two), and one dead letter.
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
    let mut w = store.write();
    w.start(dead).expect("start");
    w.fail(dead, "helm upgrade failed".into(), None)
        .expect("fail");
    w.to_history(dead, Status::Failed).expect("history");
    w.commit().expect("commit");
}

fn config(root: &Path) -> PathBuf {
    let cfg = root.join("berth.toml");
    std::fs::write(
        &cfg,
        "[handlers.Hold]\ncommand = [\"sh\", \"-c\", \"while [ ! -e never ]; do sleep 0.05; done\"]\n\
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
    let _daemon = Daemon::start(&config(root.path()), &b, &[]);
    common::wait_for("the holders to run", || {
        stdout(&berth(&b, &["task", "show", "1", "-o", "json"])).contains("\"running\"")
    });

    // Reads.
    compare(&a, &b, &["queue", "list"]);
    compare(&a, &b, &["queue", "list", "-o", "json"]);
    compare(&a, &b, &["queue", "list", "--show-empty"]);
    for id in ["3", "4", "5", "6", "7", "8"] {
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
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(compare(&a, &b, &args).status.code(), Some(code), "{args:?}");
    }
    let batch = root.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"other","kind":"Work","name":"x","weight":5},
            {"queue":"other","kind":"Work","name":"y","weight":5}]"#,
    )
    .expect("batch");
    compare(&a, &b, &["enqueue", "--batch", &batch.to_string_lossy()]);
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
    compare(&a, &b, &["task", "remove", "5"]); // a group child alone: refused
    compare(&a, &b, &["task", "remove", "4"]); // its parent, with the children
    compare(&a, &b, &["task", "remove", "77"]);
    compare(&a, &b, &["task", "retry", "3"]); // not a dead letter
    compare(&a, &b, &["task", "retry", "8"]); // the dead letter
    compare(&a, &b, &["queue", "list", "-o", "json"]);
}

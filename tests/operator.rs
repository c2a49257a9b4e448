//! The operator's commands through the real binary: attempt logs, a result
//! through `BERTH_RESULT`, `task log --follow`, `task cancel` of running,
//! queued and grouped tasks, and `task remove`'s refusals. Where a command
//! can run both ways, it runs with a daemon and without one and must answer
//! the same; the log must agree with the state after every scenario.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, write_root};
use common::{alive, berth, enqueue_id, read_pid, stderr, stdout, task_json, tempdir, wait_for};

/// The handlers every scenario here uses. `Hang` runs until it is stopped
/// and leaves a grandchild in its process group; both write their pids.
const CONFIG: &str = r#"
data_dir = "data"
parallel_queues = 2
grace = "2s"

[retry]
initial = "100ms"
max = "100ms"
max_attempts = 1

[handlers.Fail]
command = ["sh", "-c", "echo 'connecting to the cluster'; echo 'rendering chart' >&2; echo 'helm upgrade failed: cannot patch' >&2; exit 3"]

[handlers.Progress]
command = ["sh", "-c", "echo 'progress 1/2'; echo 'progress 2/2'; echo '{\"replicas\": 2}' > \"$BERTH_RESULT\""]

[handlers.Plain]
command = ["sh", "-c", "echo 'no progress here' >&2; echo '{\"plain\": true}'"]

[handlers.Steps]
command = ["sh", "-c", "echo 'step 1'; while [ ! -e go.$BERTH_TASK_ID ]; do sleep 0.02; done; echo 'step 2'; echo 'almost' >&2; echo 'step 3'"]

[handlers.Hang]
command = ["sh", "-c", "sleep 1000 & echo $! > child.$BERTH_TASK_ID; echo $$ > pid.$BERTH_TASK_ID; echo 'hanging'; wait"]

[handlers.Stubborn]
command = ["sh", "-c", "trap '' TERM; echo $$ > pid.$BERTH_TASK_ID; while true; do sleep 0.05; done"]

[handlers.Lone]
command = ["sh", "-c", "echo $$ > pid.$BERTH_TASK_ID; exec sleep 1000"]

[handlers.Ok]
command = ["true"]
"#;

fn root() -> (tempfile::TempDir, PathBuf) {
    let root = tempdir();
    write_root(root.path(), "#!/bin/sh\n", CONFIG);
    let data = root.path().join("data");
    (root, data)
}

fn enqueue(dir: &Path, queue: &str, kind: &str, name: &str) -> u64 {
    enqueue_id(dir, &["--queue", queue, "--kind", kind, "--name", name])
}

fn status(dir: &Path, id: u64) -> String {
    task_json(dir, id)["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn assert_verify(dir: &Path) {
    let o = berth(dir, &["verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// The pid a handler of task `id` wrote to ROOT/`file`.ID, once it has.
fn pid_of(root: &Path, file: &str, id: u64) -> i32 {
    let path = root.join(format!("{file}.{id}"));
    wait_for(&format!("{}", path.display()), || read_pid(&path).is_some());
    read_pid(&path).expect("pid")
}

/// Runs `args` on `dir` and returns (exit code, stdout, stderr).
fn run(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let o = berth(dir, args);
    (o.status.code(), stdout(&o), stderr(&o))
}

#[test]
fn attempt_logs_keep_stderr_of_a_failure_and_stdout_progress_the_same_with_and_without_a_daemon() {
    let (root, data) = root();
    let fail = enqueue(&data, "main", "Fail", "echo");
    let progress = enqueue(&data, "other", "Progress", "kube-dns");
    let plain = enqueue(&data, "third", "Plain", "chrony");
    let o = Command::new(common::berth_bin())
        .args(["run", "--until-idle", "--config"])
        .arg(root.path().join("berth.toml"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("berth run");
    assert_eq!(o.status.code(), Some(1), "a dead letter: {}", stderr(&o));

    // The failed attempt: its stderr lines, its stdout, the exit code.
    let (code, text, _) = run(&data, &["task", "log", &fail.to_string()]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("=== attempt 1: started 20")
            && lines[0].ends_with(", failed: helm upgrade failed: cannot patch, exit code 3"),
        "{text}"
    );
    assert_eq!(
        &lines[1..],
        [
            "--- stdout (26 B)",
            "connecting to the cluster",
            "--- stderr (50 B)",
            "rendering chart",
            "helm upgrade failed: cannot patch",
        ]
    );
    // The successful one: progress on stdout, the result from BERTH_RESULT.
    let (_, text, _) = run(&data, &["task", "log", &progress.to_string()]);
    assert!(
        text.contains(", succeeded, exit code 0\n--- stdout (26 B)\nprogress 1/2\nprogress 2/2\n--- stderr (empty)\n"),
        "{text}"
    );
    assert_eq!(
        task_json(&data, progress)["result"],
        serde_json::json!({"replicas": 2})
    );
    // Without a result file, stdout is the result, as before.
    assert_eq!(
        task_json(&data, plain)["result"],
        serde_json::json!({"plain": true})
    );
    let j: serde_json::Value =
        serde_json::from_str(&run(&data, &["task", "log", &plain.to_string(), "-o", "json"]).1)
            .expect("json");
    assert_eq!(j["attempts"][0]["stdout"], "{\"plain\": true}\n");
    assert_eq!(j["attempts"][0]["stderr"], "no progress here\n");
    assert_eq!(j["attempts"][0]["outcome"], "succeeded");
    assert_eq!(j["attempts"][0]["exit_code"], 0);
    assert_verify(&data);

    // The same answers through a daemon.
    let fail_s = fail.to_string();
    let progress_s = progress.to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["task", "log", &fail_s],
        vec!["task", "log", &fail_s, "-o", "json"],
        vec!["task", "log", &fail_s, "--attempt", "1"],
        vec!["task", "log", &fail_s, "--attempt", "2"],
        vec!["task", "log", &progress_s, "--follow"],
        vec!["task", "log", &progress_s],
        vec!["task", "remove", &progress_s],
        vec!["task", "cancel", &progress_s],
    ];
    let direct: Vec<_> = commands.iter().map(|c| run(&data, c)).collect();
    let daemon = Daemon::start_in(root.path());
    for (c, d) in commands.iter().zip(&direct) {
        assert_eq!(&run(&data, c), d, "{c:?}");
    }
    assert_eq!(direct[3].0, Some(1));
    assert_eq!(
        direct[3].2,
        format!("berth: task {fail} has no record of attempt 2 (only attempt 1 is recorded)\n")
    );
    assert_eq!(direct[6].0, Some(1));
    assert!(direct[6].2.contains("--history"), "{}", direct[6].2);
    assert_eq!(direct[7].0, Some(1));
    // Removing a finished task with --history, through the daemon.
    assert_eq!(
        run(&data, &["task", "remove", &progress_s, "--history"]),
        (Some(0), format!("removed {progress}\n"), String::new())
    );
    drop(daemon);
    assert_verify(&data);
}

/// `berth task log ID --follow EXTRA...` on `data`: the process, its
/// stdout's lines as they come, and its stderr once it has exited.
fn follow(
    data: &Path,
    id: u64,
    extra: &[&str],
) -> (
    std::process::Child,
    mpsc::Receiver<String>,
    std::thread::JoinHandle<String>,
) {
    let mut follower = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(data)
        .args(["task", "log", &id.to_string(), "--follow"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berth task log --follow");
    let (tx, lines) = mpsc::channel();
    let out = follower.stdout.take().expect("stdout");
    std::thread::spawn(move || common::forward_lines(out, tx));
    let err = common::read_in_background(follower.stderr.take().expect("stderr"));
    (follower, lines, err)
}

#[test]
fn follow_prints_the_running_attempts_output_as_it_comes_and_exits_when_it_ends() {
    let (root, data) = root();
    let daemon = Daemon::start_in(root.path());
    let id = enqueue(&data, "main", "Steps", "steps");
    let (mut follower, lines, err) = follow(&data, id, &[]);
    let next = |what: &str| {
        lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no line {what} within 20 s"))
    };
    // The handler printed its first step and waits for go.ID: the follower
    // shows that step while the task still runs.
    let header = next("header");
    assert!(
        header.starts_with("=== attempt 1: started ") && header.ends_with(", running"),
        "{header}"
    );
    assert_eq!(next("marker"), "--- stdout");
    assert_eq!(next("step 1"), "step 1");
    assert_eq!(status(&data, id), "running");
    assert!(follower.try_wait().expect("try_wait").is_none());
    std::fs::write(root.path().join(format!("go.{id}")), "").expect("go");
    let mut rest = Vec::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(20)) {
        rest.push(l);
    }
    // Its stdout is closed: it has exited (or is exiting).
    let code = follower.wait().expect("wait").code();
    assert_eq!(code, Some(0), "{}", err.join().unwrap_or_default());
    let rest = rest.join("\n");
    // The rest came live or from the record; each byte once.
    assert_eq!(rest.matches("step 2").count(), 1, "{rest}");
    assert_eq!(rest.matches("step 3").count(), 1, "{rest}");
    assert_eq!(rest.matches("almost").count(), 1, "{rest}");
    assert!(rest.contains("--- stderr\nalmost"), "{rest}");
    let last = rest.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("=== attempt 1: started ") && last.ends_with(", succeeded, exit code 0"),
        "{rest}"
    );
    // Without a daemon, --follow prints what is recorded and exits.
    drop(daemon);
    let (code, text, _) = run(&data, &["task", "log", &id.to_string(), "--follow"]);
    assert_eq!(code, Some(0));
    assert!(
        text.ends_with("--- stdout (21 B)\nstep 1\nstep 2\nstep 3\n--- stderr (7 B)\nalmost\n"),
        "{text}"
    );
    assert_verify(&data);
}

/// `--follow -o json`: the running attempt's output as `stream` lines, and
/// what it printed after the last poll too, before the attempt's record:
/// each byte once, whether it came live or from the record.
#[test]
fn follow_in_json_streams_every_byte_once_then_the_record() {
    let (root, data) = root();
    let daemon = Daemon::start_in(root.path());
    let id = enqueue(&data, "main", "Steps", "steps");
    let (mut follower, lines, err) = follow(&data, id, &["-o", "json"]);
    let mut got: Vec<serde_json::Value> = Vec::new();
    let mut next = |what: &str| {
        let l = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no line {what} within 20 s"));
        let v: serde_json::Value = serde_json::from_str(&l).expect("a JSON line");
        got.push(v.clone());
        v
    };
    let running = next("running");
    assert_eq!(running["running"], true);
    assert_eq!(next("step 1")["text"], "step 1\n");
    // Then the handler goes on and ends at once, most often between two
    // polls: the rest of its output is in the record.
    std::fs::write(root.path().join(format!("go.{id}")), "").expect("go");
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(20)) {
        got.push(serde_json::from_str(&l).expect("a JSON line"));
    }
    let code = follower.wait().expect("wait").code();
    assert_eq!(code, Some(0), "{}", err.join().unwrap_or_default());
    let text = |name: &str| -> String {
        got.iter()
            .filter(|v| v["stream"] == name)
            .map(|v| v["text"].as_str().unwrap_or_default())
            .collect()
    };
    assert_eq!(text("stdout"), "step 1\nstep 2\nstep 3\n", "{got:?}");
    assert_eq!(text("stderr"), "almost\n", "{got:?}");
    let last = got.last().expect("a record");
    assert_eq!(last["outcome"], "succeeded", "{got:?}");
    assert_eq!(
        last["started_at"], running["started_at"],
        "the running line and the record give one start"
    );
    drop(daemon);
    assert_verify(&data);
}

#[test]
fn cancel_stops_a_running_handler_and_its_process_group_and_the_queue_moves_on() {
    let (root, data) = root();
    let mut daemon = Daemon::start_in(root.path());
    let hang = enqueue(&data, "main", "Hang", "hang");
    let next = enqueue(&data, "main", "Ok", "next");
    let pid = pid_of(root.path(), "pid", hang);
    let child = pid_of(root.path(), "child", hang);
    assert!(alive(pid) && alive(child));
    // A running task cannot be removed; the message says what to do.
    let (code, _, err) = run(&data, &["task", "remove", &hang.to_string()]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        format!("berth: task {hang} is running; cancel it first (berth task cancel {hang})\n")
    );
    assert_eq!(
        run(&data, &["task", "cancel", &hang.to_string()]),
        (Some(0), format!("cancelled {hang}\n"), String::new())
    );
    // The whole process group is gone, the task is cancelled, and the next
    // task in its queue has run.
    wait_for("the handler and its child to die", || {
        !alive(pid) && !alive(child)
    });
    assert_eq!(status(&data, hang), "cancelled");
    wait_for("the next task to run", || {
        status(&data, next) == "succeeded"
    });
    let (_, text, _) = run(&data, &["task", "log", &hang.to_string()]);
    assert!(
        text.contains(", cancelled, killed by signal 15\n--- stdout (8 B)\nhanging\n"),
        "{text}"
    );
    // A handler that ignores SIGTERM gets SIGKILL after its grace (5 s).
    let stubborn = enqueue(&data, "main", "Stubborn", "stubborn");
    let pid = pid_of(root.path(), "pid", stubborn);
    let started = Instant::now();
    assert_eq!(
        run(&data, &["task", "cancel", &stubborn.to_string()]).0,
        Some(0)
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(4900) && took < Duration::from_secs(15),
        "{took:?}"
    );
    assert!(!alive(pid));
    let (_, text, _) = run(&data, &["task", "log", &stubborn.to_string()]);
    assert!(text.contains(", cancelled, killed by signal 9\n"), "{text}");
    daemon.signal(libc::SIGTERM);
    let (s, _) = daemon.wait_exit(Duration::from_secs(20));
    assert_eq!(s.code(), Some(0));
    assert_verify(&data);
}

#[test]
fn cancel_takes_a_queued_task_at_once_and_a_running_group_with_its_children() {
    let (root, data) = root();
    let daemon = Daemon::start_in(root.path());
    // `other`: a running holder and a queued task behind it.
    let holder = enqueue(&data, "other", "Lone", "holder");
    let queued = enqueue(&data, "other", "Ok", "queued");
    // `main`: a group of three (two run in the two parallel queues, one
    // waits behind them), then a single task.
    let batch = root.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"main","kind":"Hang","name":"a","weight":10},
            {"queue":"main","kind":"Hang","name":"b","weight":10},
            {"queue":"main","kind":"Hang","name":"c","weight":10},
            {"queue":"main","kind":"Ok","name":"after","weight":20}]"#,
    )
    .expect("batch");
    let o = berth(&data, &["enqueue", "--batch", &batch.to_string_lossy()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u64> = stdout(&o).lines().map(|l| l.parse().unwrap()).collect();
    let (parent, after) = (ids[0], ids[1]);
    let children: Vec<u64> = task_json(&data, parent)["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    let pids: Vec<(i32, i32)> = children[..2]
        .iter()
        .map(|c| {
            (
                pid_of(root.path(), "pid", *c),
                pid_of(root.path(), "child", *c),
            )
        })
        .collect();
    pid_of(root.path(), "pid", holder);
    assert_eq!(status(&data, children[2]), "queued");

    // A queued task: at once; its queue's holder runs on.
    assert_eq!(
        run(&data, &["task", "cancel", &queued.to_string()]),
        (Some(0), format!("cancelled {queued}\n"), String::new())
    );
    assert_eq!(status(&data, queued), "cancelled");
    assert_eq!(status(&data, holder), "running");
    // A group child alone is refused.
    let (code, _, err) = run(&data, &["task", "cancel", &children[0].to_string()]);
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("is part of group {parent}")), "{err}");
    // And so is its removal, running as it is: not "cancel it first", which
    // the cancel just refused.
    let child = children[0];
    assert_eq!(
        run(&data, &["task", "remove", &child.to_string()]),
        (
            Some(1),
            String::new(),
            format!(
                "berth: task {child} is part of group {parent}; cannot remove it alone (remove \
                 the group instead)\n"
            )
        )
    );
    assert_eq!(status(&data, child), "running");
    // The group: the running children are stopped, the waiting one ends at
    // once, then the parent; `main` moves on.
    let (code, out, err) = run(&data, &["task", "cancel", &parent.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!(
            "cancelled {} {} {} {parent}\n",
            children[0], children[1], children[2]
        )
    );
    for (pid, child) in &pids {
        wait_for("a child's process group to die", || {
            !alive(*pid) && !alive(*child)
        });
    }
    for id in children.iter().chain([&parent]) {
        assert_eq!(status(&data, *id), "cancelled", "task {id}");
    }
    let (_, text, _) = run(&data, &["task", "log", &children[0].to_string()]);
    assert!(
        text.contains(", cancelled, killed by signal 15\n"),
        "{text}"
    );
    let (_, text, _) = run(&data, &["task", "log", &children[2].to_string()]);
    assert_eq!(
        text,
        format!("task {} has no attempt recorded (cancelled)\n", children[2])
    );
    wait_for("the task after the group to run", || {
        status(&data, after) == "succeeded"
    });
    let list = run(&data, &["queue", "list"]).1;
    assert!(
        list.contains("Queue 'other': length 1, status: 'run first task'"),
        "{list}"
    );
    assert_eq!(
        run(&data, &["task", "cancel", &holder.to_string()]).0,
        Some(0)
    );
    drop(daemon);
    assert_verify(&data);
}

#[test]
fn without_a_daemon_a_task_left_running_by_a_crash_is_cancelled_directly() {
    let (root, data) = root();
    let mut daemon = Daemon::start_in(root.path());
    let id = enqueue(&data, "main", "Lone", "lone");
    let pid = pid_of(root.path(), "pid", id);
    assert_eq!(status(&data, id), "running");
    daemon.signal(libc::SIGKILL);
    daemon.wait_exit(Duration::from_secs(20));
    wait_for("the handler to die with the daemon", || !alive(pid));
    assert_eq!(
        run(&data, &["task", "cancel", &id.to_string()]),
        (Some(0), format!("cancelled {id}\n"), String::new())
    );
    assert_eq!(status(&data, id), "cancelled");
    let (_, text, _) = run(&data, &["task", "log", &id.to_string()]);
    assert!(
        text.starts_with("=== attempt 1: started ") && text.contains(", interrupted\n"),
        "{text}"
    );
    assert_verify(&data);
}

/// A group parent runs no attempt of its own: `task log` says so, and
/// names the children whose logs hold its attempts (on stderr, so `-o
/// json` stays one document); a single says only that none is recorded.
#[test]
fn task_log_of_a_group_parent_names_its_children() {
    let root = tempdir();
    let dir = root.path().join("data");
    let batch = root.path().join("b.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"main","kind":"K","name":"a","weight":1},
            {"queue":"main","kind":"K","name":"b","weight":1}]"#,
    )
    .expect("batch");
    let o = common::berth(
        &dir,
        &["enqueue", "--batch", batch.to_str().expect("utf-8")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let note = "berth: task 1 is a group parent: its children run the attempts (berth task \
                log CHILD for each of 2, 3)";
    let (code, text, err) = run(&dir, &["task", "log", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(text, "task 1 has no attempt recorded (queued)\n");
    assert!(err.contains(note), "{err}");
    // Without a daemon, --follow prints what is recorded (nothing) and exits.
    let (code, text, err) = run(&dir, &["task", "log", "1", "--follow"]);
    assert_eq!((code, text.as_str()), (Some(0), ""), "{err}");
    assert!(err.contains(note), "{err}");
    let (code, text, err) = run(&dir, &["task", "log", "1", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).expect("json")["attempts"],
        serde_json::json!([])
    );
    let (_, _, err) = run(&dir, &["task", "log", "2"]);
    assert!(!err.contains("group parent"), "{err}");
}

//! The real `berth run` daemon: command handlers through the CLI and the
//! control socket, SIGTERM and restart, bad configs and bad requests.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::{Daemon, write_root};
use common::{
    alive, berth, berth_bin, enqueue_id, read_pid, stderr, stdout, task_json, tempdir, wait_for,
};

const HANDLER: &str = r#"#!/bin/sh
# ok: prints a result; fail: helm-like error; slow: sleeps; repeat: exit 75 once.
case "$BERTH_TASK_NAME" in
  ok) cat >/dev/null; echo "{\"node\":\"$BERTH_NODE\",\"attempt\":$BERTH_ATTEMPT}" ;;
  fail) echo "some noise" >&2; echo "helm upgrade failed: cannot patch \"mcplay\"" >&2; exit 3 ;;
  slow) sleep 30 ;;
  repeat) if [ "$BERTH_ATTEMPT" -lt 2 ]; then exit 75; fi; echo '"again"' ;;
  grace) sleep 0.5; echo '"done"' ;;
  hang) echo $$ > "hang.pid"; exec sleep 30 ;;
  hangr) echo "$BERTH_RESULT" > "hang.result"; echo $$ > "hang.pid"; exec sleep 30 ;;
  fds) printf '"%s"' "$(ls -l /proc/$$/fd | awk '{print $NF}' | tr '\n' ' ')" ;;
esac
"#;

fn write_config(root: &Path, extra: &str) -> PathBuf {
    write_root(
        root,
        HANDLER,
        &format!(
            "data_dir = \"data\"\nnode = \"edge-7\"\ngrace = \"10s\"\n[retry]\ninitial = \"1s\"\nmax_attempts = 2\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"2s\"\n{extra}"
        ),
    )
}

fn enqueue(dir: &Path, name: &str) -> u64 {
    enqueue_id(
        dir,
        &[
            "--queue",
            name,
            "--kind",
            "Sh",
            "--name",
            name,
            "--payload",
            "{\"x\":1}",
        ],
    )
}

#[test]
fn command_handlers_succeed_fail_time_out_and_repeat() {
    let root = tempdir();
    write_config(root.path(), "");
    let d = Daemon::start_in(root.path());
    let ok = enqueue(&d.dir, "ok");
    let fail = enqueue(&d.dir, "fail");
    let slow = enqueue(&d.dir, "slow");
    let rep = enqueue(&d.dir, "repeat");
    let done = |id| {
        task_json(&d.dir, id)["status"] != "queued" && task_json(&d.dir, id)["status"] != "running"
    };
    wait_for("all four to finish", || {
        [ok, fail, slow, rep].iter().all(|id| done(*id))
    });
    let t = task_json(&d.dir, ok);
    assert_eq!(t["status"], "succeeded");
    assert_eq!(t["result"]["node"], "edge-7");
    let t = task_json(&d.dir, fail);
    assert_eq!(t["status"], "failed", "two attempts used: a dead letter");
    assert_eq!(
        t["last_failure"],
        "helm upgrade failed: cannot patch \"mcplay\""
    );
    let t = task_json(&d.dir, slow);
    assert_eq!(t["last_failure"], "timed out after 2s");
    let t = task_json(&d.dir, rep);
    assert_eq!(
        (
            t["status"].as_str(),
            t["failures"].as_u64(),
            t["attempts"].as_u64()
        ),
        (Some("succeeded"), Some(0), Some(2))
    );
    assert_eq!(t["result"], "again");
    // Handlers inherit none of berth's files: not the database, the lock or the socket.
    let fds = enqueue(&d.dir, "fds");
    wait_for("the fd listing", || {
        task_json(&d.dir, fds)["status"] == "succeeded"
    });
    let listing = task_json(&d.dir, fds)["result"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        listing.contains("pipe:"),
        "the handler listed its fds: {listing}"
    );
    for leaked in ["berth.sock", "berth.lock", "/data/db", "socket:"] {
        assert!(
            !listing.contains(leaked),
            "handler inherited {leaked}: {listing}"
        );
    }
    // A dead letter can be retried through the daemon.
    let o = berth(&d.dir, &["task", "retry", &fail.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for("the retry to fail again", || {
        task_json(&d.dir, fail)["attempts"] == 4
    });
}

/// The `se.slice` (ns) of each thread of process `pid` named `name`, where
/// the kernel shows it.
fn slices(pid: i32, name: &str) -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| {
            let sched = std::fs::read_to_string(t.path().join("sched")).ok()?;
            let line = sched
                .lines()
                .find(|l| l.trim_start().starts_with("se.slice"))?;
            line.split(':').nth(1)?.trim().parse().ok()
        })
        .collect()
}

#[test]
fn a_connection_thread_asks_for_a_short_time_slice() {
    let root = tempdir();
    write_config(root.path(), "");
    let d = Daemon::start_in(root.path());
    if slices(d.pid(), "berth-applier").is_empty() {
        eprintln!("skipped: this kernel shows no se.slice in /proc/PID/task/TID/sched");
        return;
    }
    // An open connection has its thread while it waits for a request.
    let s = UnixStream::connect(d.socket()).unwrap();
    wait_for("the connection's thread", || {
        !slices(d.pid(), "berth-conn").is_empty()
    });
    // The short slice (0.1 ms, `threads::short_slice`); the applier, which
    // nobody waits for, keeps the default.
    let applier = slices(d.pid(), "berth-applier");
    assert!(
        !applier.is_empty() && applier.iter().all(|ns| *ns != 100_000),
        "the applier's slice: {applier:?}"
    );
    assert_eq!(slices(d.pid(), "berth-conn"), [100_000]);
    drop(s);
}

#[test]
fn the_socket_is_private_and_survives_bad_requests() {
    let root = tempdir();
    write_config(root.path(), "");
    let d = Daemon::start_in(root.path());
    let sock = d.dir.join("berth.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut s = UnixStream::connect(&sock).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    s.write_all(b"{\"op\":\"no_such_op\"}\n").unwrap();
    r.read_line(&mut line).unwrap();
    assert!(
        line.contains("\"code\":2") && line.contains("malformed request"),
        "{line}"
    );
    line.clear();
    s.write_all(b"not json at all\n").unwrap();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("malformed request"), "{line}");
    line.clear();
    s.write_all(b"{\"op\":\"queue_list\"}\n").unwrap();
    r.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("{\"result\":["),
        "the same connection still works: {line}"
    );
    // An oversized request is refused and the daemon keeps serving others.
    let mut big = UnixStream::connect(&sock).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut answer = String::new();
    for _ in 0..70 {
        if big.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = BufReader::new(big).read_line(&mut answer);
    assert!(
        answer.is_empty() || answer.contains("request is over"),
        "{answer}"
    );
    assert_eq!(enqueue(&d.dir, "ok"), 1);
    let o = berth(&d.dir, &["queue", "list", "-o", "json"]);
    assert!(o.status.success());
    // The daemon runs without transparent huge pages (`berth::alloc`).
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    match status.lines().find(|l| l.starts_with("THP_enabled:")) {
        Some(line) => assert!(line.ends_with('0'), "{line}"),
        None => eprintln!("skipped the huge pages check: no THP_enabled in /proc status"),
    }
}

#[test]
fn sigterm_waits_for_running_tasks_and_a_restart_loses_nothing() {
    let root = tempdir();
    write_config(root.path(), "");
    let mut d = Daemon::start_in(root.path());
    let g = enqueue(&d.dir, "grace");
    // Two queued behind it in the same queue.
    let behind: Vec<u64> = (0..2)
        .map(|_| {
            enqueue_id(
                &d.dir,
                &["--queue", "grace", "--kind", "Sh", "--name", "ok"],
            )
        })
        .collect();
    wait_for("the grace task to run", || {
        task_json(&d.dir, g)["status"] == "running"
    });
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "graceful stop exits 0: {status:?}");
    // Offline now: the CLI opens the data dir directly, same output.
    let t = task_json(&d.dir, g);
    assert_eq!(
        t["status"], "succeeded",
        "the running task was allowed to finish"
    );
    for id in &behind {
        assert_eq!(task_json(&d.dir, *id)["status"], "queued");
    }
    let list = stdout(&berth(&d.dir, &["queue", "list"]));
    assert!(
        list.contains("Queue 'grace': length 2, status: ''"),
        "{list}"
    );
    d = Daemon::start_in(root.path());
    wait_for("the rest after restart", || {
        behind
            .iter()
            .all(|id| task_json(&d.dir, *id)["status"] == "succeeded")
    });
    drop(d);
    let o = berth(&root.path().join("data"), &["verify"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_bad_config_names_the_file_line_and_key() {
    let root = tempdir();
    let cfg = write_config(root.path(), "[budget]\nmax_object = \"lots\"\n");
    let o = Command::new(berth_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{}:11: key budget.max_object: 'lots' is not a size",
            cfg.display()
        )),
        "{err}"
    );
    assert!(!root.path().join("data").exists(), "nothing was created");
}

#[test]
fn a_handler_dies_with_a_killed_daemon() {
    let root = tempdir();
    write_config(root.path(), "");
    let mut d = Daemon::start_in(root.path());
    enqueue(&d.dir, "hang");
    let pidfile = root.path().join("hang.pid");
    let mut pid = 0i32;
    wait_for("the handler's pid", || {
        pid = read_pid(&pidfile).unwrap_or(0);
        pid > 0
    });
    assert!(alive(pid));
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(20));
    wait_for("the handler to die with the daemon", || !alive(pid));
}

/// A daemon killed in the middle of an attempt cannot remove the attempt's
/// result file; the next daemon to start removes it.
#[test]
fn a_killed_daemons_result_file_is_removed_by_the_next_daemon() {
    let root = tempdir();
    // A timeout the attempt cannot reach before it is killed.
    let cfg = write_root(
        root.path(),
        HANDLER,
        "data_dir = \"data\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"5m\"\n",
    );
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let in_tmp = |c: &mut Command| {
        c.env("TMPDIR", &tmp);
    };
    let data = root.path().join("data");
    let mut d = Daemon::start_with(&cfg, &data, &[], in_tmp);
    enqueue(&d.dir, "hangr");
    let (pidfile, named) = (
        root.path().join("hang.pid"),
        root.path().join("hang.result"),
    );
    wait_for("the handler's pid", || read_pid(&pidfile).is_some());
    let result = PathBuf::from(std::fs::read_to_string(&named).unwrap().trim());
    assert!(result.starts_with(&tmp), "{}", result.display());
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(20));
    assert!(result.exists(), "a killed daemon leaves its result file");
    std::fs::remove_file(&named).unwrap();
    let mut again = Daemon::start_with(&cfg, &data, &[], in_tmp);
    assert!(
        !result.exists(),
        "the next daemon removed {}",
        result.display()
    );
    again.wait_log("removed 1 result file(s)");
    // The task runs again, with a result file of the new daemon's.
    wait_for("the second attempt's result file", || {
        std::fs::read_to_string(&named).is_ok_and(|t| t.ends_with('\n'))
    });
    let second = std::fs::read_to_string(&named).unwrap();
    assert_ne!(second.trim(), result.to_string_lossy(), "a fresh file");
    again.signal(libc::SIGKILL);
    again.wait_exit(Duration::from_secs(20));
}

/// A second signal exits at once with code 1, and first kills the process
/// group of every running handler: a process a handler started in its group
/// (which the death signal of the handler's first process does not reach)
/// does not outlive the daemon. The task is left running in the store.
#[test]
fn a_second_signal_exits_at_once_and_kills_what_the_handlers_started() {
    let root = tempdir();
    write_root(
        root.path(),
        "#!/bin/sh\nsleep 60 &\necho $! > grandchild.pid\nwait\n",
        "data_dir = \"data\"\ngrace = \"60s\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"60s\"\n",
    );
    let mut d = Daemon::start_in(root.path());
    let id = enqueue(&d.dir, "held");
    let pid_file = root.path().join("grandchild.pid");
    wait_for("the handler's child", || read_pid(&pid_file).is_some());
    let pid = read_pid(&pid_file).expect("its pid");
    assert!(alive(pid));
    d.signal(libc::SIGTERM);
    d.wait_log("stopping");
    d.signal(libc::SIGTERM);
    // Well within the 60 s grace and the 60 s timeout.
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{status:?}");
    wait_for("the handler's child to be killed", || !alive(pid));
    let log = d.log_text();
    assert!(
        log.contains(
            "a second signal (SIGTERM): exiting at once; killed 1 handler process group(s) still running"
        ),
        "{log}"
    );
    assert_eq!(task_json(&d.dir, id)["status"], "running");
}

/// A stop whose grace period runs out stops what still runs at once
/// (SIGKILL to the handler's process group) and records it then: the attempt
/// `interrupted`, with what it printed and the time it really ran, and the
/// task back at the head of its queue with one failure more. Before, the
/// task stayed `running` until the next start, which logged the attempt
/// without its output, as lasting until that start.
#[test]
fn a_grace_period_that_runs_out_records_what_still_ran_as_interrupted() {
    let root = tempdir();
    write_root(
        root.path(),
        "#!/bin/sh\necho \"working on $BERTH_TASK_NAME\"\nsleep 60 &\necho $! > grandchild.pid\nwait\n",
        "data_dir = \"data\"\ngrace = \"1s\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"60s\"\n",
    );
    let mut d = Daemon::start_in(root.path());
    let id = enqueue(&d.dir, "held");
    let behind = enqueue(&d.dir, "held");
    let pid_file = root.path().join("grandchild.pid");
    wait_for("the handler's child", || read_pid(&pid_file).is_some());
    let pid = read_pid(&pid_file).expect("its pid");
    d.signal(libc::SIGTERM);
    // 1 s of grace, then at most `STOP_WAIT` (2 s) for the stopped handler.
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "a stop by a signal exits 0: {status:?}");
    wait_for("the handler's child to be killed", || !alive(pid));
    let log = d.log_text();
    for line in [
        "grace period over; stopping the 1 task(s) still running at once",
        &format!("task {id} Sh held in held stopped at the end of the grace period (attempt 1"),
        "berth stopped: 0 succeeded, 0 failed attempts, 0 dead letters, 1 interrupted, 0 abandoned",
    ] {
        assert!(log.contains(line), "no {line:?} in:\n{log}");
    }

    // Recorded by the stop (this open is read-only: it recovers nothing).
    let t = task_json(&d.dir, id);
    assert_eq!(t["status"], "queued", "{t}");
    assert_eq!(t["failures"], 1, "{t}");
    assert_eq!(
        t["last_failure"],
        berth::engine::stop::STOPPED_AT_GRACE,
        "{t}"
    );
    let o = berth(&d.dir, &["task", "log", &id.to_string(), "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let a = &j["attempts"][0];
    assert_eq!(a["outcome"], "interrupted", "{j}");
    assert_eq!(a["stdout"], "working on held\n", "{j}");
    assert_eq!(a["signal"], libc::SIGKILL, "{j}");
    // Stopped about 1 s after the signal, not at the next open.
    let ms = a["duration_ms"].as_u64().expect("duration_ms");
    assert!(ms < 10_000, "the attempt ran {ms} ms: {j}");
    assert_eq!(task_json(&d.dir, behind)["attempts"], 0);
    // The metrics count it as a failed attempt, with the time it ran.
    let o = berth(&d.dir, &["metrics"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = stdout(&o);
    for line in [
        "berth_attempts_total{kind=\"Sh\",outcome=\"failed\"} 1\n",
        "berth_attempt_duration_seconds_count{kind=\"Sh\"} 1\n",
    ] {
        assert!(m.contains(line), "no {line:?} in:\n{m}");
    }

    // The next start finds nothing to recover, and runs it again.
    let again = Daemon::start_in(root.path());
    assert!(
        !again.log_text().contains("interrupted task(s) put back"),
        "{}",
        again.log_text()
    );
    wait_for("the second attempt", || {
        task_json(&again.dir, id)["attempts"] == 2
    });
    // Still the head of its queue: the task behind it waits.
    assert_eq!(task_json(&again.dir, behind)["attempts"], 0);
}

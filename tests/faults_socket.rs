//! The real `berth run` daemon against bad neighbours: clients that do not
//! read, floods of idle connections, oversized and unfinished requests, a
//! daemon that does not answer, signals (SIGHUP), and requests with unknown
//! fields.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::{berth, berth_bin, forward_lines, stderr, stdout, tempdir, wait_for};

const HANDLER: &str = r#"#!/bin/sh
# short: sleeps a little and succeeds; long: runs until killed.
case "$BERTH_TASK_NAME" in
  short) sleep 0.5; echo '"done"' ;;
  long) exec sleep 60 ;;
  *) echo '"ok"' ;;
esac
"#;

/// A daemon started by a test; killed if the test ends without stopping it.
struct Daemon {
    child: Child,
    dir: PathBuf,
    /// The daemon's log lines (stderr).
    log: Receiver<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.pid());
    }

    /// Waits until a log line contains `text`.
    fn wait_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(e) => panic!("no log line with {text:?}: {e}"),
            }
        }
    }

    /// Waits for the daemon to exit; returns its exit code (None if killed
    /// by a signal) and how long it took.
    fn wait_exit(&mut self, within: Duration) -> (Option<i32>, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.code(), start.elapsed());
            }
            assert!(
                start.elapsed() < within,
                "the daemon did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A field of /proc/PID/status, such as `Threads` or `VmHWM`.
    fn status_field(&self, name: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("/proc/PID/status");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/PID/status"))
    }

    fn threads(&self) -> u64 {
        self.status_field("Threads")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("berth.sock")
    }
}

fn write_config(root: &Path, grace: &str) -> PathBuf {
    let hook = root.join("hook.sh");
    std::fs::write(&hook, HANDLER).expect("write hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = root.join("berth.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"data\"\ngrace = \"{grace}\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"2m\"\n"
        ),
    )
    .expect("write config");
    cfg
}

fn start(root: &Path) -> Daemon {
    start_with(root, |_| {})
}

/// Starts `berth run`; `setup` may adjust the command (limits, environment).
fn start_with(root: &Path, setup: impl FnOnce(&mut Command)) -> Daemon {
    let mut cmd = Command::new(berth_bin());
    cmd.args(["run", "--config"])
        .arg(root.join("berth.toml"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    setup(&mut cmd);
    let mut child = cmd.spawn().expect("start berth run");
    let err = child.stderr.take().expect("stderr");
    let (tx, log) = channel();
    std::thread::spawn(move || forward_lines(err, tx));
    let dir = root.join("data");
    let d = Daemon { child, dir, log };
    d.wait_log("berth running on");
    wait_for("the daemon's socket", || {
        UnixStream::connect(d.socket()).is_ok()
    });
    d
}

fn enqueue(dir: &Path, queue: &str, name: &str) -> u64 {
    let o = berth(
        dir,
        &["enqueue", "--queue", queue, "--kind", "Sh", "--name", name],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("enqueue printed {:?}: {e}", stdout(&o)))
}

fn show(dir: &Path, id: u64) -> serde_json::Value {
    let o = berth(dir, &["task", "show", &id.to_string(), "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("task show -o json prints JSON")
}

/// One request and its answer over a connection.
fn ask(s: &mut UnixStream, line: &str) -> serde_json::Value {
    s.write_all(format!("{line}\n").as_bytes()).expect("send");
    let mut answer = String::new();
    BufReader::new(s.try_clone().expect("clone"))
        .read_line(&mut answer)
        .expect("read the answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("answer {answer:?}: {e}"))
}

#[test]
fn unknown_fields_are_refused_for_every_request() {
    let root = tempdir();
    write_config(root.path(), "2s");
    let d = start(root.path());
    let id = enqueue(&d.dir, "q", "long");
    let mut s = UnixStream::connect(d.socket()).expect("connect");
    for line in [
        r#"{"op":"queue_list","bogus":1}"#.to_string(),
        format!(r#"{{"op":"task_show","id":{id},"bogus":1}}"#),
        format!(r#"{{"op":"task_remove","id":{id},"bogus":1}}"#),
        format!(r#"{{"op":"task_retry","id":{id},"bogus":1}}"#),
        r#"{"op":"enqueue","spec":{"queue":"q","kind":"Sh","name":"x"},"bogus":1}"#.to_string(),
        r#"{"op":"enqueue_batch","tasks":[],"bogus":1}"#.to_string(),
    ] {
        let a = ask(&mut s, &line);
        assert_eq!(a["error"]["code"], 2, "{line}: {a}");
        let msg = a["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("unknown field `bogus`"), "{line}: {a}");
    }
    // Nothing was done: the task is still there, and nothing was added.
    let a = ask(&mut s, r#"{"op":"queue_list"}"#);
    let queues = a["result"].as_array().expect("a queue list");
    let q = queues
        .iter()
        .find(|q| q["name"] == "q")
        .expect("queue q is listed");
    assert_eq!(q["tasks"].as_array().map(Vec::len), Some(1), "{a}");
    assert_eq!(show(&d.dir, id)["id"], id);
}

#[test]
fn sighup_stops_gracefully_like_sigterm() {
    let root = tempdir();
    write_config(root.path(), "10s");
    let mut d = start(root.path());
    let id = enqueue(&d.dir, "q", "short");
    wait_for("the task to run", || {
        show(&d.dir, id)["status"] == "running"
    });
    d.signal(libc::SIGHUP);
    d.wait_log("stopping: no new tasks start");
    let (code, _) = d.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(0), "SIGHUP stops the daemon with code 0");
    // The running task was allowed to finish (the data dir is read offline now).
    assert_eq!(show(&d.dir, id)["status"], "succeeded");
}

#[test]
fn a_second_sighup_exits_at_once() {
    let root = tempdir();
    write_config(root.path(), "60s");
    let mut d = start(root.path());
    let id = enqueue(&d.dir, "q", "long");
    wait_for("the task to run", || {
        show(&d.dir, id)["status"] == "running"
    });
    d.signal(libc::SIGHUP);
    d.wait_log("stopping: no new tasks start");
    let started = Instant::now();
    d.signal(libc::SIGHUP);
    let (code, _) = d.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(1), "a second signal exits at once with code 1");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not after the 60 s grace period"
    );
    // The task was left running; the next open recovers it.
    let t = show(&d.dir, id);
    assert_eq!(
        (t["status"].as_str(), t["failures"].as_u64()),
        (Some("queued"), Some(1)),
        "{t}"
    );
}

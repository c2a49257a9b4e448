//! Handler faults (issue 8, "Survive the edge"), through the real `berth run`
//! unless noted: a timeout bounds the whole attempt whatever the handler's
//! descendants do with its pipes; a result of any size can be read back; a
//! handler that always exits 75 is throttled.

mod common;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, write_root};
use common::{alive, berth, enqueue_id, read_pid, stderr, stdout, task_json, tempdir, wait_for};

/// Each task's name picks what the handler does.
const HANDLER: &str = r#"#!/bin/sh
# A helper in its own session (setsid), so not in the handler's process
# group, that keeps the handler's stdout (and with "stdin" its stdin) open
# for 30 s. It writes its pid to NAME.pid so the test can end it.
held() { setsid sh -c "echo \$\$ > $BERTH_TASK_NAME.pid; exec sleep 30"; }
case "$BERTH_TASK_NAME" in
  timeout) held & sleep 20 ;;
  exits) held & echo '"started"' ;;
  stdin) exec 3<&0; held <&3 & echo '"started"' ;;
  group) sleep 30 & echo $! > group.pid; echo '"started"' ;;
  next) cat >/dev/null; echo '"next ran"' ;;
  huge) head -c 70000000 /dev/zero | tr '\0' a ;;
  escapes) head -c 12000000 /dev/zero | tr '\0' '\001' ;;
  big) head -c 5000000 /dev/zero | tr '\0' b ;;
esac
"#;

/// Writes the handler and a config with the handler's `timeout` and one
/// attempt per task.
fn write_config(root: &Path, timeout: &str) -> PathBuf {
    write_root(
        root,
        HANDLER,
        &format!(
            "data_dir = \"data\"\ngrace = \"10s\"\n[retry]\ninitial = \"1s\"\nmax_attempts = 1\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"{timeout}\"\n"
        ),
    )
}

/// Enqueues a task of kind Sh; `payload` is `--payload JSON` or
/// `--payload-file FILE`.
fn enqueue(dir: &Path, queue: &str, name: &str, payload: [&str; 2]) -> u64 {
    enqueue_id(
        dir,
        &[
            "--queue", queue, "--kind", "Sh", "--name", name, payload[0], payload[1],
        ],
    )
}

const NULL: [&str; 2] = ["--payload", "null"];

fn finished(t: &serde_json::Value) -> bool {
    t["status"] == "succeeded" || t["status"] == "failed"
}

/// How long the last attempt ran, from the stored timestamps.
fn attempt_ms(t: &serde_json::Value) -> u64 {
    let (Some(start), Some(end)) = (t["started_at"].as_u64(), t["finished_at"].as_u64()) else {
        panic!("no start or end time: {t}");
    };
    end - start
}

/// The pipes a process has open.
fn pipes(pid: u32) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the daemon's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.starts_with("pipe:"))
        .collect()
}

/// Kills the helpers the handlers left in their own sessions (berth does
/// not, by design), so the test leaves nothing behind.
struct Helpers(Vec<PathBuf>);

impl Drop for Helpers {
    fn drop(&mut self) {
        for f in &self.0 {
            if let Some(pid) = read_pid(f) {
                // SAFETY: kill(2) on a helper this test's handler started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

#[test]
fn a_timeout_bounds_the_attempt_whatever_the_handlers_helpers_hold() {
    let root = tempdir();
    write_config(root.path(), "3s");
    let _helpers = Helpers(
        ["timeout", "exits", "stdin"]
            .iter()
            .map(|n| root.path().join(format!("{n}.pid")))
            .collect(),
    );
    let d = Daemon::start_in(root.path());
    // Pipes it may have inherited from whoever runs the test.
    let pipes_before = pipes(d.child.id());
    let begin = Instant::now();
    // A handler that runs past its timeout while a helper in another
    // session holds its stdout, and a task behind it in the same queue.
    let timeout = enqueue(&d.dir, "a", "timeout", NULL);
    let next = enqueue(&d.dir, "a", "next", NULL);
    // Handlers that exit at once while such a helper holds stdout, or stdin
    // with a payload larger than the pipe buffer that nobody reads.
    let exits = enqueue(&d.dir, "b", "exits", NULL);
    let big = root.path().join("big.json");
    std::fs::write(&big, format!("\"{}\"", "x".repeat(1 << 20))).expect("write the payload");
    let big = big.to_string_lossy().into_owned();
    let stdin = enqueue(&d.dir, "c", "stdin", ["--payload-file", &big]);
    // A process left in the handler's own process group is killed.
    let group = enqueue(&d.dir, "d", "group", NULL);
    let all = [timeout, next, exits, stdin, group];
    wait_for("every task to finish", || {
        all.iter().all(|id| finished(&task_json(&d.dir, *id)))
    });
    let took = begin.elapsed();

    let t = task_json(&d.dir, timeout);
    assert_eq!(t["status"], "failed", "one attempt: a dead letter: {t}");
    assert_eq!(t["last_failure"], "timed out after 3s");
    let ms = attempt_ms(&t);
    assert!(
        (3000..4500).contains(&ms),
        "the attempt ends at its timeout, not when the helper lets go: {ms} ms"
    );
    let t = task_json(&d.dir, next);
    assert_eq!(t["status"], "succeeded", "the queue moved on: {t}");
    assert_eq!(t["result"], "next ran");
    assert!(
        took < Duration::from_secs(10),
        "the helpers live 30 s; the queue took {took:?}"
    );

    // Exit 0 with stdout (or stdin) still held: the exit status counts,
    // and the attempt ends within the drain window, not at the timeout.
    for id in [exits, stdin] {
        let t = task_json(&d.dir, id);
        assert_eq!(t["status"], "succeeded", "{t}");
        assert_eq!(t["result"], "started");
        let ms = attempt_ms(&t);
        assert!(ms < 2500, "ended {ms} ms after it started: {t}");
    }
    // The helpers are still there: berth did not wait for them to go.
    for n in ["timeout", "exits", "stdin"] {
        let pid = read_pid(&root.path().join(format!("{n}.pid")));
        assert!(pid.is_some_and(alive), "{n}'s helper runs on: {pid:?}");
    }

    // What stays in the handler's process group is killed once it ends.
    let t = task_json(&d.dir, group);
    assert_eq!(t["status"], "succeeded", "{t}");
    assert!(attempt_ms(&t) < 2500, "{t}");
    let pid = read_pid(&root.path().join("group.pid")).expect("the group's sleep wrote its pid");
    wait_for("the sleep left in the group to die", || !alive(pid));

    // berth holds no pipe to any of them any more.
    assert_eq!(
        pipes(d.child.id()),
        pipes_before,
        "the daemon keeps no handler pipes open"
    );
}

/// The engine on an auto-advancing fake clock (no daemon): the store goes
/// before its directory.
struct Setup {
    store: std::sync::Arc<berth::store::Store>,
    clock: berth::clock::FakeClock,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempdir();
    let clock = berth::clock::FakeClock::auto_advancing(common::T0);
    let store = std::sync::Arc::new(common::open(dir.path(), &clock));
    Setup {
        store,
        clock,
        _dir: dir,
    }
}

#[test]
fn a_handler_that_always_repeats_starts_at_most_once_a_second() {
    use berth::clock::Clock;
    use berth::engine::{Engine, EngineConfig, Handlers, Outcome, RunResult, TaskContext};
    use berth::store::Placement;
    use std::sync::{Arc, Mutex};

    let s = setup();
    // (name, attempt, start time) of every run.
    let runs: Arc<Mutex<Vec<(String, u32, u64)>>> = Arc::default();
    let (clock, log) = (s.clock.clone(), runs.clone());
    let mut h = Handlers::new();
    h.register("ModuleRun", move |ctx: &TaskContext| {
        log.lock().unwrap_or_else(|p| p.into_inner()).push((
            ctx.task.name.clone(),
            ctx.attempt,
            clock.now_ms(),
        ));
        // Each task takes as long as its name says (ms of fake time) and
        // asks to repeat until its 10th attempt.
        let ms: u64 = ctx.task.name.parse().unwrap_or(0);
        clock.advance_ms(ms);
        if ctx.attempt < 10 {
            Outcome::new(RunResult::Repeat)
        } else {
            Outcome::success()
        }
    });
    let e = Engine::new(s.store.clone(), h, EngineConfig::default()).expect("engine");
    // One queue, so one runs after the other: instant runs, runs of 400 ms,
    // and runs of 1.5 s (over the interval: repeated at once).
    for name in ["0", "400", "1500"] {
        e.enqueue(common::spec("main", name), Placement::Last)
            .expect("enqueue");
    }
    let sum = e.run_until_idle().expect("run");
    assert_eq!(sum.tally.succeeded, 3);
    assert_eq!(sum.tally.failed_attempts, 0, "a repeat is not a failure");
    let runs = runs.lock().unwrap_or_else(|p| p.into_inner());
    let gaps = |name: &str| -> Vec<u64> {
        let starts: Vec<u64> = runs.iter().filter(|r| r.0 == name).map(|r| r.2).collect();
        assert_eq!(starts.len(), 10, "{name}: ten attempts");
        starts.windows(2).map(|w| w[1] - w[0]).collect()
    };
    assert_eq!(
        gaps("0"),
        vec![1000; 9],
        "an attempt that takes no time is repeated a second after it started"
    );
    assert_eq!(gaps("400"), vec![1000; 9], "so is one of 400 ms");
    assert_eq!(
        gaps("1500"),
        vec![1500; 9],
        "one that ran for 1.5 s is repeated at once"
    );
    let first = runs.first().map_or(0, |r| r.2);
    let last = runs.last().map_or(0, |r| r.2);
    assert!(
        last - first >= 27_000,
        "30 attempts of repeating tasks need at least 27 s: {} ms",
        last - first
    );
    for id in 1..=3 {
        let t = s.store.task(id).expect("read").expect("the task");
        assert_eq!((t.failures, t.attempts), (0, 10));
    }
}

/// `berth task show ID` in both forms, which must succeed.
fn show_both(dir: &Path, id: u64) -> (String, String) {
    let id = id.to_string();
    let json = berth(dir, &["task", "show", &id, "-o", "json"]);
    let text = berth(dir, &["task", "show", &id]);
    for o in [&json, &text] {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    }
    (stdout(&json), stdout(&text))
}

/// The daemon's raw answer to `task_show`.
fn task_show_line(dir: &Path, id: u64) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut s = UnixStream::connect(dir.join("berth.sock")).expect("connect");
    s.write_all(format!("{{\"op\":\"task_show\",\"id\":{id}}}\n").as_bytes())
        .expect("send");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("answer");
    line
}

#[test]
fn any_result_can_be_read_back_the_same_with_and_without_the_daemon() {
    let root = tempdir();
    write_config(root.path(), "1m");
    let mut d = Daemon::start_in(root.path());
    // 70 MB on stdout: over the 64 MiB read limit, cut while it is read.
    let huge = enqueue(&d.dir, "a", "huge", NULL);
    // 12 MB of \x01: read whole, but 72 MB as JSON ("\u0001" each).
    let escapes = enqueue(&d.dir, "b", "escapes", NULL);
    // 5 MB of one letter: fits, stored compressed.
    let big = enqueue(&d.dir, "c", "big", NULL);
    let all = [huge, escapes, big];
    wait_for("the three tasks to finish", || {
        all.iter().all(|id| finished(&task_json(&d.dir, *id)))
    });
    let online: Vec<(String, String)> = all.iter().map(|id| show_both(&d.dir, *id)).collect();
    // The daemon sends a result stored compressed as it is stored.
    let line = task_show_line(&d.dir, big);
    assert!(
        line.len() < 100_000 && line.contains("\"gzip_base64\""),
        "the daemon inflated a 5 MB result: a {} byte answer",
        line.len()
    );
    // Stopped: the CLI reads the data dir itself.
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    assert!(!d.dir.join("berth.sock").exists());
    for (id, (json, text)) in all.iter().zip(&online) {
        let (json_off, text_off) = show_both(&d.dir, *id);
        assert!(
            json == &json_off,
            "task {id}: -o json differs without the daemon"
        );
        assert!(
            text == &text_off,
            "task {id}: the text differs without the daemon"
        );
    }

    let parse = |s: &str| -> serde_json::Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("task show printed {s:.200}: {e}"))
    };
    let t = parse(&online[0].0);
    assert_eq!(t["status"], "succeeded", "{:.300}", online[0].0);
    assert_eq!(t["result"]["truncated"], true);
    assert_eq!(
        t["result"]["reason"],
        "stdout is over the 64 MiB read limit"
    );
    assert_eq!(t["result"]["head"], "a".repeat(64 * 1024));
    let t = parse(&online[1].0);
    assert_eq!(t["status"], "succeeded");
    assert_eq!(t["result"]["truncated"], true);
    assert_eq!(
        t["result"]["reason"],
        "task result is 68.7 MiB; the decompression limit is 64 MiB"
    );
    assert_eq!(t["result"]["head"], "\u{1}".repeat(64 * 1024));
    let t = parse(&online[2].0);
    assert_eq!(t["status"], "succeeded");
    assert_eq!(t["result"], "b".repeat(5_000_000));
    assert!(
        online[2].1.contains("status: succeeded\n"),
        "{:.300}",
        online[2].1
    );
}

/// A handler inherits no descriptor but its three pipes, even one that
/// berth itself inherited without close-on-exec (from a shell, a
/// supervisor): the daemon is started with a file open on descriptor 7,
/// and the handler lists its own descriptors.
#[test]
fn a_handler_inherits_no_descriptor_the_daemon_inherited() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let dir = tempdir();
    let root = dir.path();
    let config = write_root(
        root,
        "#!/bin/sh\nfds=\"\"\nfor f in /proc/$$/fd/*; do fds=\"$fds ${f##*/}\"; done\necho \"\\\"$fds\\\"\"\n",
        "data_dir = \"data\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\n",
    );
    let data = root.join("data");
    let id = enqueue(&data, "main", "fds", NULL);
    let file = std::fs::File::open(&config).expect("opening the config");
    let fd = file.as_raw_fd();
    let mut d = Daemon::spawn_with(&config, &data, &["--until-idle"], |cmd| {
        // SAFETY: dup2 is async-signal-safe; the copy on 7 has no
        // close-on-exec flag, as an inherited descriptor would not.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 7) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let (status, _) = d.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "berth run: {status}\n{}", d.log_text());
    let t = task_json(&data, id);
    assert_eq!(t["status"], "succeeded", "{t}");
    let fds: Vec<i32> = t["result"]
        .as_str()
        .expect("the handler's descriptors")
        .split_whitespace()
        .map(|n| n.parse().expect("a descriptor number"))
        .collect();
    for std_fd in [0, 1, 2] {
        assert!(fds.contains(&std_fd), "{fds:?}");
    }
    assert!(
        !fds.contains(&7),
        "the handler inherited descriptor 7: {fds:?}"
    );
    drop(file);
}

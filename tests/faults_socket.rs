//! The real `berth run` daemon against bad neighbours: clients that do not
//! read, floods of idle connections, oversized and unfinished requests, a
//! daemon that does not answer, signals (SIGHUP), and requests with unknown
//! fields.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, write_root};
use common::{berth, berth_bin, enqueue_id, stderr, stdout, task_json, tempdir, wait_for};

const HANDLER: &str = r#"#!/bin/sh
# short: sleeps a little and succeeds; long: runs until killed.
case "$BERTH_TASK_NAME" in
  short) sleep 0.5; echo '"done"' ;;
  long) exec sleep 60 ;;
  *) echo '"ok"' ;;
esac
"#;

/// A field of /proc/PID/status, such as `Threads` or `VmHWM`.
fn status_field(d: &Daemon, name: &str) -> u64 {
    let text =
        std::fs::read_to_string(format!("/proc/{}/status", d.pid())).expect("/proc/PID/status");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/PID/status"))
}

/// The daemon's threads in one snapshot: its own (all but sled's IO
/// threads and the connection threads) and its connection threads (named
/// `berth-conn`).
fn threads(d: &Daemon) -> (usize, usize) {
    let names = thread_names(d);
    let conn = names.iter().filter(|n| *n == "berth-conn").count();
    let own = names
        .iter()
        .filter(|n| !n.starts_with("sled-io-") && *n != "berth-conn")
        .count();
    (own, conn)
}

/// The daemon's connection threads (named `berth-conn`).
fn connection_threads(d: &Daemon) -> usize {
    threads(d).1
}

/// The names of the daemon's threads. `threads` leaves out sled's IO
/// threads: sled starts its seven at its first log write that is not a
/// flush, whenever the daemon's work makes one, so they are not part of
/// what the connections cost.
fn thread_names(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .expect("/proc/PID/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim().to_string())
        .collect()
}

fn write_config(root: &Path, grace: &str) -> PathBuf {
    write_root(
        root,
        HANDLER,
        &format!(
            "data_dir = \"data\"\ngrace = \"{grace}\"\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\ntimeout = \"2m\"\n"
        ),
    )
}

fn start(root: &Path) -> Daemon {
    start_with(root, |_| {})
}

/// Starts `berth run` on ROOT/berth.toml, with its data dir ROOT/data;
/// `setup` may adjust the command (limits, environment).
fn start_with(root: &Path, setup: impl FnOnce(&mut Command)) -> Daemon {
    let d = Daemon::start_with(&root.join("berth.toml"), &root.join("data"), &[], setup);
    d.wait_log("berth running on");
    d
}

fn enqueue(dir: &Path, queue: &str, name: &str) -> u64 {
    enqueue_id(dir, &["--queue", queue, "--kind", "Sh", "--name", name])
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
fn unknown_fields_and_contradicting_placements_are_refused() {
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
    // Placements that contradict each other (the CLI's flags conflict).
    for line in [
        format!(
            r#"{{"op":"enqueue","spec":{{"queue":"q","kind":"Sh","name":"x"}},"after":{id},"before":{id}}}"#
        ),
        format!(
            r#"{{"op":"enqueue","spec":{{"queue":"q","kind":"Sh","name":"x"}},"first":true,"before":{id}}}"#
        ),
    ] {
        let a = ask(&mut s, &line);
        assert_eq!(a["error"]["code"], 2, "{line}: {a}");
        let msg = a["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("give at most one of first, after and before"),
            "{line}: {a}"
        );
    }
    // Nothing was done: the task is still there, and nothing was added.
    let a = ask(&mut s, r#"{"op":"queue_list"}"#);
    let queues = a["result"].as_array().expect("a queue list");
    let q = queues
        .iter()
        .find(|q| q["name"] == "q")
        .expect("queue q is listed");
    assert_eq!(q["tasks"].as_array().map(Vec::len), Some(1), "{a}");
    assert_eq!(task_json(&d.dir, id)["id"], id);
}

#[test]
fn sighup_stops_gracefully_like_sigterm() {
    let root = tempdir();
    write_config(root.path(), "10s");
    let mut d = start(root.path());
    let id = enqueue(&d.dir, "q", "short");
    wait_for("the task to run", || {
        task_json(&d.dir, id)["status"] == "running"
    });
    d.signal(libc::SIGHUP);
    d.wait_log("stopping: no new tasks start");
    let code = d.wait_exit(Duration::from_secs(20)).0.code();
    assert_eq!(code, Some(0), "SIGHUP stops the daemon with code 0");
    // The running task was allowed to finish (the data dir is read offline now).
    assert_eq!(task_json(&d.dir, id)["status"], "succeeded");
}

#[test]
fn a_second_sighup_exits_at_once() {
    let root = tempdir();
    write_config(root.path(), "60s");
    let mut d = start(root.path());
    let id = enqueue(&d.dir, "q", "long");
    wait_for("the task to run", || {
        task_json(&d.dir, id)["status"] == "running"
    });
    d.signal(libc::SIGHUP);
    d.wait_log("stopping: no new tasks start");
    let started = Instant::now();
    d.signal(libc::SIGHUP);
    let code = d.wait_exit(Duration::from_secs(10)).0.code();
    assert_eq!(code, Some(1), "a second signal exits at once with code 1");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not after the 60 s grace period"
    );
    // The task was left running: reading shows it so, and the next open
    // to write recovers it.
    assert_eq!(task_json(&d.dir, id)["status"], "running");
    let store = berth::store::Store::open(
        &d.dir,
        berth::store::Options::default(),
        berth::clock::system(),
    )
    .expect("open");
    let t = store.task(id).expect("read").expect("the task");
    assert_eq!(
        (t.status, t.failures),
        (berth::task::Status::Queued, 1),
        "{t:?}"
    );
}

/// Lets this test process hold a thousand connections whatever its soft
/// limit on open files.
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        assert!(
            lim.rlim_cur >= want,
            "the open-file limit is {lim:?}",
            lim = lim.rlim_cur
        );
    }
}

/// The daemon's CPU time so far (user + system).
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which ends with ')'): state is field 3,
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .expect("utime and stime")
        .iter()
        .map(|f| f.parse::<u64>().expect("a number of ticks"))
        .sum();
    // SAFETY: sysconf with a constant name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz.max(1))
}

const LIST: &[u8] = b"{\"op\":\"queue_list\"}\n";

#[test]
fn a_client_that_does_not_read_and_a_thousand_idle_connections_cannot_hold_the_daemon() {
    raise_fd_limit(1200);
    let root = tempdir();
    write_config(root.path(), "2s");
    let mut d = start(root.path());
    // A client that sends queue_list over and over and never reads: once its
    // answers fill both socket buffers, the daemon cannot write the next one.
    let mut hog = UnixStream::connect(d.socket()).expect("connect");
    hog.set_write_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut sent = 0u64;
    while hog.write_all(LIST).is_ok() {
        sent += 1;
        assert!(sent < 10_000_000, "the daemon never stopped reading");
    }
    // A thousand connections at once, which never send anything.
    let mut max = threads(&d);
    // A thread just started has the process's name until it sets its own,
    // so a connection thread can count as one of the daemon's for a moment:
    // the total is what is bounded.
    let sample = |max: &mut (usize, usize)| {
        let (own, conn) = threads(&d);
        *max = (max.0.max(own + conn), max.1.max(conn));
    };
    let mut idle = Vec::new();
    for i in 0..1000 {
        idle.push(UnixStream::connect(d.socket()).expect("connect"));
        if i % 50 == 0 {
            sample(&mut max);
        }
    }
    // A normal command still works: its connection takes the place of an
    // idle one. It also comes after all the others, so the daemon has
    // taken every one of them by the time it answers.
    let t = Instant::now();
    let o = berth(&d.dir, &["queue", "list"]);
    let cli_took = t.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Summary:"), "{}", stdout(&o));
    sample(&mut max);
    let (max_threads, max_conn_threads) = max;
    let id = enqueue(&d.dir, "q", "x");
    // One thread per connection, at most 64 of them, plus the few that have
    // let go of their connection and are still ending.
    assert!(
        max_conn_threads <= 64 + 4,
        "{max_conn_threads} connection threads"
    );
    // Every connection past the 64 was closed: to make room (the oldest
    // idle first), or, when none was idle yet (threads still starting under
    // load), after one busy line.
    let closed = idle
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).expect("nonblocking");
            let mut b = [0u8; 256];
            let mut r: &UnixStream = s;
            let mut got = Vec::new();
            loop {
                match r.read(&mut b) {
                    Ok(0) => break got.is_empty() || got.starts_with(b"{\"error\":{\"code\":3"),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(_) => break false,
                }
            }
        })
        .count();
    assert!(
        closed >= 1000 - 64,
        "only {closed} of the idle connections were closed"
    );
    // The task enqueued beside them runs as on a quiet daemon.
    wait_for(
        "the task enqueued beside 1,000 connections to succeed",
        || task_json(&d.dir, id)["status"] == "succeeded",
    );
    // The rest of the daemon (workers, store, engine) is no bigger for the
    // connections than once it has run a task: some of its threads start
    // after its socket answers, so a count taken at the start is too early.
    let (own, _) = threads(&d);
    assert!(
        max_threads <= own + 64 + 4,
        "{max_threads} threads with 1,000 connections open, the daemon's own {own}: {:?}",
        thread_names(&d)
    );
    // The stop ends every connection, the stuck writer too, within the grace period + 2 s.
    let t = Instant::now();
    d.signal(libc::SIGTERM);
    let (status, took) = d.wait_exit(Duration::from_secs(4));
    assert_eq!(status.code(), Some(0));
    eprintln!(
        "threads: the daemon's own {own}, at most {max_threads} ({max_conn_threads} for connections) with 1,000 idle \
         connections and a non-reading client ({sent} requests sent); queue list took {cli_took:?}; \
         the stop took {took:?} ({:?})",
        t.elapsed()
    );
    drop((hog, idle));
}

#[test]
fn when_every_connection_is_busy_the_cli_says_so_with_exit_3() {
    let root = tempdir();
    write_config(root.path(), "2s");
    let mut d = start(root.path());
    // The start's probe connection (and this round trip, which comes after
    // it) must have left before the 64 come, or one of them would be refused.
    let o = berth(&d.dir, &["queue", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for("the daemon's earlier connections to end", || {
        connection_threads(&d) == 0
    });
    // 64 connections in the middle of a request: none is idle.
    let busy: Vec<UnixStream> = (0..64)
        .map(|_| {
            let mut s = UnixStream::connect(d.socket()).expect("connect");
            s.write_all(b"{\"op\":").expect("send");
            s
        })
        .collect();
    // A raw connection gets one busy line and is closed.
    let extra = UnixStream::connect(d.socket()).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut line = String::new();
    BufReader::new(&extra)
        .read_line(&mut line)
        .expect("a busy line");
    assert_eq!(
        line,
        "{\"error\":{\"code\":3,\"message\":\"the daemon is serving 64 connections; try again\"}}\n"
    );
    // The CLI asks again until its time is up, then says so with exit code 3.
    let o = Command::new(berth_bin())
        .arg("--data-dir")
        .arg(&d.dir)
        .args(["queue", "list"])
        .env("BERTH_TIMEOUT", "1s")
        .output()
        .expect("run berth");
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}{}\n{}",
        stdout(&o),
        stderr(&o),
        d.log_text()
    );
    assert_eq!(
        stderr(&o),
        "berth: the daemon is serving 64 connections; try again\n"
    );
    // One request finished: the CLI is served again.
    let mut first = &busy[0];
    first.write_all(b"\"queue_list\"}\n").expect("send");
    drop(busy);
    let o = berth(&d.dir, &["queue", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(4)).0.code(), Some(0));
}

#[test]
fn unfinished_requests_cannot_fill_the_daemons_memory() {
    let root = tempdir();
    write_config(root.path(), "2s");
    let mut d = start(root.path());
    let base = status_field(&d, "VmHWM");
    // Eight clients each send 60 MiB of a request line and no newline.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let sock = d.socket();
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(sock).expect("connect");
                let chunk = vec![b' '; 1 << 20];
                let all_sent = (0..60).all(|_| s.write_all(&chunk).is_ok());
                if all_sent {
                    return Ok(s);
                }
                // Refused: the daemon said why before it closed the connection.
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                Err(line)
            })
        })
        .collect();
    // A client whose 60 MiB all went out may still be refused: its last
    // bytes wait in the socket until the daemon reads them. Ending its line
    // tells which: a held request is answered as a malformed one.
    // (All of them first: an ended line gives its bytes back.)
    let ended: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("a client thread"))
        .collect();
    let mut held = 0;
    let mut refused = Vec::new();
    for c in ended {
        match c {
            Ok(mut s) => {
                let _ = s.write_all(b"\n");
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).expect("an answer");
                if line.contains("\"code\":2") {
                    held += 1;
                } else {
                    refused.push(line);
                }
            }
            Err(line) => refused.push(line),
        }
    }
    let peak = status_field(&d, "VmHWM");
    assert!(held <= 2, "{held} clients held 60 MiB each");
    for line in &refused {
        assert!(
            line.contains("\"code\":3")
                && line.contains("memory for unfinished requests (128 MiB)"),
            "{line}"
        );
    }
    assert!(
        peak - base < 200 << 10,
        "the daemon's peak memory grew by {} MiB",
        (peak - base) >> 10
    );
    eprintln!(
        "8 clients x 60 MiB: {held} held, {} refused; peak RSS {} MiB (at start {} MiB)",
        refused.len(),
        peak >> 10,
        base >> 10
    );
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(4)).0.code(), Some(0));
}

#[test]
fn out_of_file_descriptors_the_daemon_backs_off_instead_of_spinning() {
    let root = tempdir();
    write_config(root.path(), "2s");
    let mut d = start_with(root.path(), |cmd| {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit(2) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 32,
                    rlim_max: 32,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    // Connections in the middle of a request (none idle) until the daemon
    // runs out of file descriptors; the rest wait in the backlog.
    let partial: Vec<UnixStream> = (0..40)
        .map(|_| {
            let mut s = UnixStream::connect(d.socket()).expect("connect");
            s.write_all(b"{").expect("send");
            s
        })
        .collect();
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .map(|fds| fds.count())
            .unwrap_or(0)
    };
    wait_for("the daemon to use all its 32 file descriptors", || {
        open_fds() >= 32
    });
    // Over one second (a measuring window, not a wait for an outcome) the
    // accept loop, backing off, uses next to no CPU.
    let before = cpu_time(d.pid());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let used = cpu_time(d.pid()) - before;
    eprintln!(
        "CPU used out of file descriptors: {used:?} in {:?}",
        t.elapsed()
    );
    assert!(used < Duration::from_millis(250), "{used:?} of CPU in 1 s");
    d.wait_log("control socket: accepting a connection failed: Too many open files");
    // Meanwhile the CLI gives up with a clear message.
    let o = Command::new(berth_bin())
        .arg("--data-dir")
        .arg(&d.dir)
        .args(["queue", "list"])
        .env("BERTH_TIMEOUT", "1s")
        .output()
        .expect("run berth");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("did not answer within 1s"),
        "{}",
        stderr(&o)
    );
    // File descriptors come back: the daemon serves again.
    drop(partial);
    let o = berth(&d.dir, &["queue", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(4)).0.code(), Some(0));
}

#[test]
fn the_cli_gives_up_on_a_daemon_that_does_not_answer() {
    let root = tempdir();
    let dir = root.path().join("data");
    std::fs::create_dir(&dir).expect("mkdir");
    // Something listens on the socket but never answers.
    let _listener = std::os::unix::net::UnixListener::bind(dir.join("berth.sock")).expect("bind");
    let t = Instant::now();
    let mut child = Command::new(berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["task", "show", "1"])
        .env("BERTH_TIMEOUT", "1s")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth");
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("the command still waits after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "berth: the daemon on {} did not answer within 1s (set the limit with --timeout or BERTH_TIMEOUT)\n",
            dir.join("berth.sock").display()
        )
    );
    assert!(took >= Duration::from_secs(1), "{took:?}");
    // A bad timeout is a usage error.
    let o = Command::new(berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["--timeout", "soon", "queue", "list"])
        .output()
        .expect("run berth");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

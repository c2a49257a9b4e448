//! The command line's habits: `--watch` that survives a daemon starting and
//! stopping, `--config` for every command, `-` for standard input, `--help`
//! with the exit codes, and reading that never writes.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::daemon::{Daemon, write_root};
use common::{berth, stderr, stdout, tempdir, wait_for};

const HOOK: &str = "#!/bin/sh\ncat >/dev/null\nwhile [ ! -e never ]; do sleep 0.05; done\n";

/// `queue list -o json --watch --interval 50ms` on `dir`, and its lines as
/// they come.
fn json_watch(dir: &std::path::Path) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut watch = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(dir)
        .args([
            "queue",
            "list",
            "-o",
            "json",
            "--watch",
            "--interval",
            "50ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watch");
    let (tx, frames) = mpsc::channel();
    let out = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || common::forward_lines(out, tx));
    (watch, frames)
}

#[test]
fn watch_goes_on_while_a_daemon_starts_and_stops() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        "[handlers.Hold]\ncommand = [\"./hook.sh\"]\n",
    );
    let dir = root.path().join("data");
    assert!(
        berth(
            &dir,
            &[
                "enqueue", "--queue", "main", "--kind", "Hold", "--name", "h"
            ]
        )
        .status
        .success()
    );
    let (mut watch, frames) = json_watch(&dir);
    let main_status = |line: &str| {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON frame per line");
        v["active"][0]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let next = || {
        frames
            .recv_timeout(Duration::from_secs(20))
            .expect("a frame")
    };
    assert_eq!(main_status(&next()), "");
    let mut daemon = Daemon::start(&cfg, &dir, &[]);
    wait_for("a frame with the daemon's live status", || {
        main_status(&next()) == "run first task"
    });
    daemon.signal(libc::SIGKILL);
    daemon.wait_exit(Duration::from_secs(20));
    wait_for("a frame without a daemon", || {
        main_status(&next()).is_empty()
    });
    assert!(
        watch.try_wait().expect("try_wait").is_none(),
        "the watch ended"
    );
    watch.kill().expect("kill");
    watch.wait().expect("wait");
}

/// `queue list --watch -o json` writes one JSON document per line, an
/// error too: a data dir that is not there yet is `{"error": ...}`, and
/// once it is, the frames list its queues.
#[test]
fn a_json_watch_writes_its_errors_as_json() {
    let root = tempdir();
    let dir = root.path().join("data");
    let (mut watch, frames) = json_watch(&dir);
    let next = || -> serde_json::Value {
        let line = frames
            .recv_timeout(Duration::from_secs(20))
            .expect("a frame");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    };
    let first = next();
    let error = first["error"].as_str().unwrap_or_default();
    assert!(error.contains("does not exist"), "{first}");
    common::enqueue_id(&dir, &["--queue", "main", "--kind", "K", "--name", "a"]);
    wait_for("a frame with the queue", || {
        next()["summary"]["mainQueueTasks"] == 1
    });
    watch.kill().expect("kill");
    watch.wait().expect("wait");
}

/// `queue list --watch | head -1`: once the pipe's reader has gone, the
/// watch ends (exit 0) instead of redrawing into it for ever.
#[test]
fn watch_ends_when_its_reader_goes() {
    use std::io::BufRead;
    let root = tempdir();
    let dir = root.path().join("data");
    common::enqueue_id(&dir, &["--queue", "main", "--kind", "K", "--name", "a"]);
    let mut watch = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["queue", "list", "--watch", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch");
    let mut first = String::new();
    std::io::BufReader::new(watch.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a line");
    assert!(first.starts_with("# "), "a frame's time line: {first:?}");
    // The reader (and the pipe) is dropped here.
    wait_for("the watch to end", || {
        watch.try_wait().expect("try_wait").is_some()
    });
    let o = watch.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn every_command_takes_the_config_and_standard_input() {
    let root = tempdir();
    std::fs::write(
        root.path().join("berth.toml"),
        "data_dir = \"from-config\"\n[budget]\nmax_object = \"64KiB\"\n\
         [handlers.K]\ncommand = [\"true\"]\n",
    )
    .expect("config");
    let run = |args: &[&str], stdin: &str| {
        let mut child = Command::new(common::berth_bin())
            .current_dir(root.path())
            .args(args)
            .env("BERTH_CONFIG", "berth.toml")
            .env_remove("BERTH_DATA_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("berth");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("output")
    };
    // The batch comes from standard input; the data dir from the config.
    let o = run(
        &["enqueue", "--batch", "-"],
        r#"[{"queue":"main","kind":"K","name":"a"}]"#,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(root.path().join("from-config/berth.dir").exists());
    let o = run(
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "p",
            "--payload-file",
            "-",
        ],
        "{\"x\": 1}",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["task", "show", "2", "-o", "json"], "");
    let t: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(t["payload"], serde_json::json!({"x": 1}));
    // The config's budget applies before anything is sent or written.
    let mut rng = fastrand::Rng::with_seed(5);
    let big: String = (0..200_000).map(|_| rng.alphanumeric()).collect();
    let big = format!("\"{big}\"");
    let before = common::file_hashes(&root.path().join("from-config"));
    let o = run(
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "big",
            "--payload-file",
            "-",
        ],
        &big,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the object budget is 64 KiB"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        common::file_hashes(&root.path().join("from-config")),
        before
    );
    // --data-dir wins over the config.
    let o = run(&["--data-dir", "other", "queue", "list"], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("data dir other does not exist"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn reading_never_writes_and_a_folder_that_is_not_a_data_dir_is_refused() {
    let root = tempdir();
    let dir = root.path().join("data");
    assert!(
        berth(
            &dir,
            &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"]
        )
        .status
        .success()
    );
    let before = common::file_hashes(&dir);
    for args in [
        &["queue", "list"][..],
        &["queue", "list", "-o", "json"],
        &["task", "show", "1"],
        &["task", "list"],
        &["verify"],
    ] {
        let o = berth(&dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert_eq!(
            common::file_hashes(&dir),
            before,
            "{args:?} changed the data dir"
        );
    }
    // A read-only copy can be read.
    let ro = root.path().join("ro");
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(&dir)
            .arg(&ro)
            .status()
            .expect("cp")
            .success()
    );
    assert!(
        Command::new("chmod")
            .args(["-R", "a-w"])
            .arg(&ro)
            .status()
            .expect("chmod")
            .success()
    );
    let o = berth(&ro, &["task", "list", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("\"name\": \"a\""));
    // Some other folder: refused, nothing created in it.
    let other = root.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(other.join("notes.txt"), b"mine").expect("file");
    for args in [
        &["queue", "list"][..],
        &["task", "list"],
        &["task", "remove", "1"],
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    ] {
        let o = berth(&other, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).contains("is not a berth data dir"),
            "{}",
            stderr(&o)
        );
        let names: Vec<_> = std::fs::read_dir(&other)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["notes.txt"], "{args:?} wrote into the folder");
    }
    // A file: every command says so.
    let file = root.path().join("afile");
    std::fs::write(&file, b"mine").expect("file");
    for args in [
        &["queue", "list"][..],
        &["task", "remove", "1"],
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    ] {
        let o = berth(&file, args);
        common::assert_refused(
            &o,
            1,
            "afile is a file, not a folder: a data dir is a folder",
        );
        assert_eq!(std::fs::read(&file).expect("read"), b"mine");
    }
}

#[test]
fn check_refuses_a_data_dir_that_run_would_refuse() {
    // `berth check` answers for the data dir `berth run` would use: a file,
    // or a folder with other things in it, is bad input (exit 2) naming
    // where that data dir comes from; `run` refuses it as well, as a config
    // error (exit 2: a supervisor does not restart it into it again). A
    // data dir whose database was lost is a damaged data dir for both
    // (exit 1).
    let root = tempdir();
    let cfg = root.path().join("berth.toml");
    std::fs::write(root.path().join("afile"), b"mine").expect("file");
    let other = root.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(other.join("notes.txt"), b"mine").expect("file");
    let handler = "[handlers.K]\ncommand = [\"true\"]\n";
    let run = |text: &str, args: &[&str]| {
        std::fs::write(&cfg, text).expect("config");
        Command::new(common::berth_bin())
            .current_dir(root.path())
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .output()
            .expect("berth")
    };
    let file_says = "afile is a file, not a folder: a data dir is a folder";
    let o = run(&format!("data_dir = \"afile\"\n{handler}"), &["check"]);
    common::assert_refused(
        &o,
        2,
        &format!(
            "berth.toml:1: key data_dir: {}",
            root.path().join("afile").display()
        ),
    );
    common::assert_refused(&o, 2, file_says);
    let o = run(
        &format!("data_dir = \"afile\"\n{handler}"),
        &["run", "--until-idle"],
    );
    common::assert_refused(&o, 2, "berth.toml:1: key data_dir: ");
    common::assert_refused(&o, 2, file_says);
    let o = run(handler, &["--data-dir", "other", "check"]);
    common::assert_refused(&o, 2, "berth: --data-dir: other is not a berth data dir");
    let o = run(handler, &["--data-dir", "other", "run", "--until-idle"]);
    common::assert_refused(&o, 2, "berth: --data-dir: other is not a berth data dir");
    // From the environment, the variable is named.
    std::fs::write(&cfg, handler).expect("config");
    for cmd in ["check", "run"] {
        let o = Command::new(common::berth_bin())
            .current_dir(root.path())
            .env("BERTH_DATA_DIR", "afile")
            .args(["--config", "berth.toml", cmd])
            .output()
            .expect("berth");
        common::assert_refused(&o, 2, &format!("berth: BERTH_DATA_DIR: {file_says}"));
    }
    assert_eq!(
        std::fs::read(root.path().join("afile")).expect("read"),
        b"mine"
    );
    assert_eq!(
        std::fs::read_dir(&other).expect("ls").count(),
        1,
        "nothing made in the other folder"
    );
    let o = run(&format!("data_dir = \"a\\u0000b\"\n{handler}"), &["check"]);
    common::assert_refused(
        &o,
        2,
        "berth.toml:1: key data_dir: the path contains a NUL byte",
    );
    // A data dir, or one not there yet, is what `run` takes.
    let o = run(handler, &["--data-dir", "new/data", "check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!root.path().join("new").exists(), "check made nothing");
    common::enqueue_id(
        &root.path().join("data"),
        &["--queue", "main", "--kind", "K", "--name", "a"],
    );
    let o = run(&format!("data_dir = \"data\"\n{handler}"), &["check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Its database lost: both say so, with exit 1, and change nothing.
    std::fs::remove_file(root.path().join("data/db/conf")).expect("rm conf");
    let before = common::file_hashes(&root.path().join("data"));
    for cmd in ["check", "run"] {
        let o = run(&format!("data_dir = \"data\"\n{handler}"), &[cmd]);
        common::assert_refused(&o, 1, "held a berth store, but ");
        common::assert_refused(&o, 1, "db/conf is missing: its data was lost");
    }
    assert_eq!(common::file_hashes(&root.path().join("data")), before);
}

#[test]
fn help_describes_every_flag_and_the_exit_codes() {
    let o = Command::new(common::berth_bin())
        .arg("--help")
        .output()
        .expect("help");
    assert!(o.status.success());
    let help = stdout(&o);
    for code in ["0 ", "1 ", "2 ", "3 ", "4 "] {
        assert!(
            help.contains(&format!("\n  {code}")),
            "exit code {code}missing:\n{help}"
        );
    }
    for (args, words) in [
        (
            &["task", "list", "--help"][..],
            &["--status", "dead", "--since", "RFC 3339"][..],
        ),
        (
            &["enqueue", "--help"],
            &["--payload-file", "standard input", "--after"],
        ),
        (&["task", "show", "--help"], &["ID"]),
    ] {
        let o = Command::new(common::berth_bin())
            .args(args)
            .output()
            .expect("help");
        let mut text = String::new();
        o.stdout
            .as_slice()
            .read_to_string(&mut text)
            .expect("utf-8");
        for w in words {
            assert!(text.contains(w), "{args:?} help lacks {w}:\n{text}");
        }
    }
}

#[test]
fn a_config_that_cannot_work_is_refused_with_its_file_line_and_key() {
    let root = tempdir();
    let cfg = root.path().join("berth.toml");
    let cases = [
        (
            "data_dir = \"\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":1: key data_dir: must not be empty",
        ),
        (
            "durability = \"fast\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":1: key durability: 'fast' is not a mode (use \"sync\" or \"batched\")",
        ),
        (
            "node = \"edge 1\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":1: key node: node 'edge 1' has the character ' '",
        ),
        (
            "[handlers.K]\ncommand = [\"pyhton3\"]\n",
            ":2: key handlers.K.command: 'pyhton3' is not found in PATH",
        ),
        (
            "[handlers.K]\ncommand = [\"./hooks/nope.sh\"]\n",
            "/hooks/nope.sh does not exist",
        ),
        (
            "[handlers.K]\ncommand = [\"true\"]\ncwd = \"missing\"\n",
            ":3: key handlers.K.cwd: the folder",
        ),
        (
            "[handlers.K]\ncommand = [\"true\"]\ntimeout = \"0s\"\n",
            ":3: key handlers.K.timeout: must be more than 0",
        ),
        (
            "durability = \"batched\"\nflush_interval = \"0ms\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":2: key flush_interval: must be more than 0",
        ),
        (
            "durability = \"batched\"\nflush_interval = \"1ns\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":2: key flush_interval: must be at least 1ms",
        ),
        (
            "[handlers.K]\ncommand = [\"true\"]\nenv = { Z = \"x\\u0000y\" }\n",
            ":3: key handlers.K.env.Z: the value of Z contains a NUL byte",
        ),
        (
            "[handlers.K]\ncommand = [\"true\"]\nenv = { \"A=B\" = \"x\", \"\" = \"y\" }\n",
            ":3: key handlers.K.env: ",
        ),
        (
            "[handlers.K]\ncommand = [\"true\"]\ncwd = \"/etc/passwd\"\n",
            ":3: key handlers.K.cwd: /etc/passwd is not a folder",
        ),
        (
            "[budget]\nmax_object = \"0.5\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":2: key budget.max_object: '0.5' is not a whole number of bytes",
        ),
        (
            "node = \"edge-1\"\n",
            ": key handlers: no [handlers.KIND] table",
        ),
        (
            "parallel_queues = \"ten\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":1: key parallel_queues: invalid type",
        ),
        (
            "[metrics]\ntextfile = \"folder.prom\"\n[handlers.K]\ncommand = [\"true\"]\n",
            "/folder.prom is a folder, not a file",
        ),
        (
            "[metrics]\ntextfile = \"gone/berth.prom\"\n[handlers.K]\ncommand = [\"true\"]\n",
            ":2: key metrics.textfile: the folder ",
        ),
    ];
    // A textfile path that names a folder: the daemon could never write it.
    std::fs::create_dir(root.path().join("folder.prom")).expect("folder");
    for (text, says) in cases {
        std::fs::write(&cfg, text).expect("config");
        for args in [&["check"][..], &["run", "--until-idle"]] {
            let o = Command::new(common::berth_bin())
                .arg("--config")
                .arg(&cfg)
                .args(args)
                .output()
                .expect("berth");
            assert_eq!(
                o.status.code(),
                Some(2),
                "{text:?} {args:?}: {}",
                stderr(&o)
            );
            let err = stderr(&o);
            assert!(
                err.contains(&cfg.display().to_string()) && err.contains(says),
                "{text:?}: {err}"
            );
            assert!(
                !root.path().join("berth-data").exists(),
                "{text:?} created the data dir"
            );
        }
    }
    std::fs::write(&cfg, "[handlers.K]\ncommand = [\"true\"]\n").expect("config");
    let o = Command::new(common::berth_bin())
        .arg("--config")
        .arg(&cfg)
        .arg("check")
        .output()
        .expect("berth");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ok: "), "{}", stdout(&o));
    // It checks the data dir `berth run` would use: `--data-dir` and
    // `BERTH_DATA_DIR` win over the config's, also for a backup folder
    // that would be inside it.
    let other = root.path().join("other");
    std::fs::create_dir_all(other.join("backups")).expect("backup folder");
    std::fs::write(
        &cfg,
        format!(
            "[handlers.K]\ncommand = [\"true\"]\n[backup]\npath = \"{}\"\nevery = \"1h\"\n",
            other.join("backups").display()
        ),
    )
    .expect("config");
    let check = |env: bool| {
        let mut c = Command::new(common::berth_bin());
        c.arg("--config").arg(&cfg);
        if env {
            c.env("BERTH_DATA_DIR", &other);
        } else {
            c.arg("--data-dir").arg(&other);
        }
        c.arg("check")
            .env_remove("BERTH_CONFIG")
            .output()
            .expect("berth")
    };
    for env in [false, true] {
        let o = check(env);
        // The file, the line and the key, as for any config error.
        common::assert_refused(
            &o,
            2,
            &format!(
                "{}:4: key backup.path: {} is inside the data dir {}",
                cfg.display(),
                other.join("backups").display(),
                other.display()
            ),
        );
    }
    // Without the backup folder in it, `other` is an empty folder, which
    // `berth run` would make its data dir.
    std::fs::remove_dir(other.join("backups")).expect("rmdir");
    std::fs::write(&cfg, "[handlers.K]\ncommand = [\"true\"]\n").expect("config");
    for env in [false, true] {
        let o = check(env);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("data dir {},", other.display())),
            "{}",
            stdout(&o)
        );
    }
}

/// `berth --config CFG ARGS...` (the data dir from the config).
fn berth_cfg(cfg: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(common::berth_bin())
        .arg("--config")
        .arg(cfg)
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .output()
        .expect("berth")
}

/// The commands other than `run` and `check` take only the config's values:
/// a handler's program that is missing (being deployed), a missing `cwd`
/// or no handler at all does not stop `queue list` or an `enqueue`; a value
/// that is wrong still does (exit 2, file, line and key).
#[test]
fn commands_other_than_run_and_check_need_only_the_configs_values() {
    let root = tempdir();
    let cfg = root.path().join("berth.toml");
    let berth_cfg = |args: &[&str]| berth_cfg(&cfg, args);
    let enqueue = ["enqueue", "--queue", "main", "--kind", "K", "--name", "a"];
    for text in [
        "[handlers.K]\ncommand = [\"./hooks/not-yet.sh\"]\n",
        "[handlers.K]\ncommand = [\"true\"]\ncwd = \"missing\"\n",
        "node = \"edge-1\"\n",
    ] {
        std::fs::write(&cfg, text).expect("config");
        for args in [&["check"][..], &["run", "--until-idle"]] {
            assert_eq!(berth_cfg(args).status.code(), Some(2), "{text:?} {args:?}");
        }
        let o = berth_cfg(&enqueue);
        assert!(o.status.success(), "{text:?}: {}", stderr(&o));
        let o = berth_cfg(&["queue", "list"]);
        assert!(o.status.success(), "{text:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("Queue 'main'"), "{}", stdout(&o));
    }
    // The kinds are still checked when the config has handlers.
    std::fs::write(&cfg, "[handlers.K]\ncommand = [\"./hooks/not-yet.sh\"]\n").expect("config");
    let o = berth_cfg(&[
        "enqueue", "--queue", "main", "--kind", "Nope", "--name", "b",
    ]);
    common::assert_refused(&o, 2, "no handler for kind 'Nope'");
    // A wrong value is refused by every command.
    std::fs::write(&cfg, "parallel_queues = \"ten\"\n").expect("config");
    let o = berth_cfg(&["queue", "list"]);
    common::assert_refused(&o, 2, ":1: key parallel_queues: invalid type");
}

/// A file named on the command line is read up to a size: `/dev/zero` as
/// a config or a payload file is refused (exit 2), not read until the
/// memory runs out.
#[test]
fn endless_files_are_refused_at_their_size_limit() {
    let root = tempdir();
    let dir = root.path().join("data");
    let o = Command::new(common::berth_bin())
        .args(["--config", "/dev/zero", "check"])
        .output()
        .expect("berth");
    common::assert_refused(&o, 2, "/dev/zero: cannot read: larger than 16 MiB");
    let o = berth(
        &dir,
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "z",
            "--payload-file",
            "/dev/zero",
        ],
    );
    common::assert_refused(
        &o,
        2,
        "cannot read payload file /dev/zero: larger than 256 MiB",
    );
    assert!(!dir.exists(), "the data dir was created");
}

/// `run --enqueue FILE` checks every entry before the data dir is opened:
/// a kind without a handler, a field too long, a payload over the budget
/// exit 2 and create nothing.
#[test]
fn a_bad_entry_of_run_enqueue_creates_nothing() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        // `true`: an entry let through by mistake ends at once, not hangs.
        "[handlers.K]\ncommand = [\"true\"]\n[budget]\nmax_object = \"64KiB\"\n",
    );
    let dir = root.path().join("data");
    let long = "n".repeat(513);
    // 200 KiB of letters that gzip cannot bring under 64 KiB.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: String = (0..200 << 10)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    for (entry, says) in [
        (
            r#"{"queue":"main","kind":"Nope","name":"x"}"#.to_string(),
            "no handler for kind 'Nope'",
        ),
        (
            format!(r#"{{"queue":"main","kind":"K","name":"{long}"}}"#),
            "field name",
        ),
        (
            format!(r#"{{"queue":"main","kind":"K","name":"x","payload":"{big}"}}"#),
            "field payload",
        ),
    ] {
        let file = root.path().join("start.json");
        std::fs::write(
            &file,
            format!(r#"[{{"queue":"main","kind":"K","name":"ok"}}, {entry}]"#),
        )
        .expect("batch");
        let o = Command::new(common::berth_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(&dir)
            .args(["run", "--until-idle", "--enqueue"])
            .arg(&file)
            .output()
            .expect("berth");
        common::assert_refused(&o, 2, "entry 2 of 2");
        common::assert_refused(&o, 2, says);
        assert!(!dir.exists(), "{entry}: the data dir was created");
    }
}

#[test]
fn an_enqueue_of_a_kind_without_a_handler_is_refused_up_front() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        "[handlers.Backup]\ncommand = [\"./hook.sh\"]\n[handlers.Sync]\ncommand = [\"./hook.sh\"]\n",
    );
    let dir = root.path().join("data");
    let why = "no handler for kind 'Bakup' here (the kinds with a handler: Backup, Sync)";
    // On the command line the flag is named, as for every other flag's error.
    let says = format!("berth: --kind: {why}\n");
    // Without a daemon, with the config: refused, nothing created.
    let o = Command::new(common::berth_bin())
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&dir)
        .args([
            "enqueue", "--queue", "main", "--kind", "Bakup", "--name", "x",
        ])
        .output()
        .expect("berth");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), says);
    assert!(!dir.exists());
    // Through the daemon (which knows its handlers), without --config.
    let _daemon = Daemon::start(&cfg, &dir, &[]);
    let o = berth(
        &dir,
        &[
            "enqueue", "--queue", "main", "--kind", "Bakup", "--name", "x",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), says);
    let batch = root.path().join("b.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"q","kind":"Sync","name":"a"},{"queue":"q","kind":"Bakup","name":"b"}]"#,
    )
    .expect("batch");
    let o = berth(&dir, &["enqueue", "--batch", &batch.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("entry 2 of 2, field kind: {why}")),
        "{}",
        stderr(&o)
    );
    let o = berth(&dir, &["task", "list", "-o", "json"]);
    assert_eq!(stdout(&o).trim(), "[]", "a refused enqueue added a task");
}

/// `BERTH_NOW` (the "now" ages count from) that is not a time is refused by
/// every command, not replaced by the clock without a word.
#[test]
fn a_berth_now_that_is_not_a_time_is_refused() {
    let dir = common::tempdir();
    let data = dir.path().join("data");
    for args in [vec!["queue", "list"], vec!["task", "list"]] {
        let o = Command::new(common::berth_bin())
            .arg("--data-dir")
            .arg(&data)
            .args(&args)
            .env("BERTH_NOW", "bogus")
            .output()
            .unwrap();
        common::assert_refused(&o, 2, "BERTH_NOW: ");
    }
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&data)
        .args(["queue", "list"])
        .env("BERTH_NOW", "2030-01-01T00:00:00Z")
        .output()
        .unwrap();
    // A time passes the check (and the missing data dir is what is said).
    common::assert_refused(&o, 1, "does not exist");
}

/// A bad value taken from `BERTH_TIMEOUT` or `BERTH_DATA_DIR` is blamed on
/// the variable, not on a flag the command line never gave; the flag given
/// wins over the variable, and is blamed itself. Nothing is created.
#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let dir = common::tempdir();
    let data = dir.path().join("data");
    let run = |flags: &[&str], var: &str, value: &str| {
        Command::new(common::berth_bin())
            .args(flags)
            .args(["queue", "list"])
            .env(var, value)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let data_flag = ["--data-dir", data.to_str().unwrap()];
    let o = run(&data_flag, "BERTH_TIMEOUT", "abc");
    common::assert_refused(
        &o,
        2,
        "invalid value \"abc\" in the environment variable BERTH_TIMEOUT (which stands for \
         --timeout): 'abc' is not a duration",
    );
    let o = run(&data_flag, "BERTH_TIMEOUT", "0s");
    common::assert_refused(
        &o,
        2,
        "BERTH_TIMEOUT (which stands for --timeout): the timeout must be more than 0",
    );
    let o = run(&[], "BERTH_DATA_DIR", "");
    common::assert_refused(
        &o,
        2,
        "invalid value \"\" in the environment variable BERTH_DATA_DIR (which stands for \
         --data-dir): it is empty",
    );
    // The flag wins, and a bad one is the flag's fault.
    let o = run(
        &[&data_flag[..], &["--timeout=abc"]].concat(),
        "BERTH_TIMEOUT",
        "5s",
    );
    common::assert_refused(&o, 2, "invalid value 'abc' for '--timeout <TIMEOUT>'");
    let o = run(
        &[&data_flag[..], &["--timeout", "5s"]].concat(),
        "BERTH_TIMEOUT",
        "abc",
    );
    common::assert_refused(&o, 1, "does not exist");
    // A value spelled like the flag (here a file name after `--`) is not the
    // flag: the variable is still to blame, not ignored.
    let o = Command::new(common::berth_bin())
        .args(["import", "--", "--timeout"])
        .env("BERTH_TIMEOUT", "abc")
        .current_dir(dir.path())
        .output()
        .unwrap();
    common::assert_refused(&o, 2, "in the environment variable BERTH_TIMEOUT");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

/// An argument that is not UTF-8 where berth takes text is refused naming
/// its place, its option and its bytes (clap alone said "invalid UTF-8 was
/// detected in one or more arguments").
#[test]
fn an_argument_that_is_not_utf8_is_named() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = common::tempdir();
    let data = dir.path().join("data");
    let o = Command::new(common::berth_bin())
        .args(["task", "list", "--queue"])
        .arg(OsStr::from_bytes(b"q\xff"))
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    common::assert_refused(
        &o,
        2,
        "error: argument 4 (the value of --queue) is not valid UTF-8: \"q\\xFF\"; berth takes \
         text there",
    );
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&data)
        .args(["task", "list"])
        .arg(OsStr::from_bytes(b"--kind=\xfe"))
        .output()
        .unwrap();
    common::assert_refused(&o, 2, "argument 5 (the value of --kind) is not valid UTF-8");
    // A path may be any bytes: the argument blamed is the one refused.
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(dir.path().join(OsStr::from_bytes(b"d\xfd")))
        .args(["task", "list", "--kind"])
        .arg(OsStr::from_bytes(b"k\xfc"))
        .output()
        .unwrap();
    common::assert_refused(&o, 2, "argument 6 (the value of --kind) is not valid UTF-8");
    assert!(!data.exists(), "nothing was created");
}

/// A data dir that a command with `--config` made shows the config's
/// parallel queues (`parallel_queues = 3`: `parallel_queue_0` to `_2`)
/// before a daemon has run on it and recorded its own.
#[test]
fn before_a_daemon_runs_the_configs_parallel_queues_are_shown() {
    let root = tempdir();
    let cfg = root.path().join("berth.toml");
    std::fs::write(
        &cfg,
        "parallel_queues = 3\n[handlers.K]\ncommand = [\"true\"]\n",
    )
    .expect("config");
    let berth_cfg = |args: &[&str]| berth_cfg(&cfg, args);
    let o = berth_cfg(&["enqueue", "--queue", "main", "--kind", "K", "--name", "a"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let queues = |o: &std::process::Output| -> Vec<String> {
        assert!(o.status.success(), "{}", stderr(o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let mut names: Vec<String> = Vec::new();
        for group in ["active", "empty"] {
            for q in v[group].as_array().into_iter().flatten() {
                names.push(q["name"].as_str().expect("a name").to_string());
            }
        }
        names.sort();
        names
    };
    let want = [
        "main",
        "parallel_queue_0",
        "parallel_queue_1",
        "parallel_queue_2",
    ];
    let o = berth_cfg(&["queue", "list", "--show-empty", "-o", "json"]);
    assert_eq!(queues(&o), want, "{}", stdout(&o));
    // Without the config the data dir knows no count: the default.
    let o = common::berth(
        &root.path().join("berth-data"),
        &["queue", "list", "--show-empty", "-o", "json"],
    );
    assert_eq!(queues(&o).len(), 11, "{}", stdout(&o));
}

#[test]
fn a_read_names_an_interrupted_snapshot_in_the_data_dir_and_leaves_it() {
    let tmp = tempdir();
    let dir = tmp.path().join("data");
    let add = |name: &str| {
        let o = berth(
            &dir,
            &["enqueue", "--queue", "main", "--kind", "K", "--name", name],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    add("a");
    let leftover = dir.join("db").join("snap.0000000000000ABC.generating");
    std::fs::write(&leftover, b"junk").expect("a leftover");
    // A read works on a private copy: it says where the file really is,
    // and that it stays.
    let o = berth(&dir, &["queue", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{} was left by a sled snapshot that was interrupted",
            leftover.display()
        )),
        "{e}"
    );
    assert!(!e.contains("berth-read-"), "{e}");
    assert!(leftover.exists());
    // A write removes it, and says so.
    let e = stderr(&add("b"));
    assert!(
        e.contains(&format!("removed {}", leftover.display())),
        "{e}"
    );
    assert!(!leftover.exists());
}

/// A copy of a killed daemon's data dir keeps its `berth.sock`. A socket
/// this command cannot use (a path too long to connect to, here; or one of
/// another user) is no daemon when nothing holds the data dir: the command
/// reads the data dir itself.
#[test]
fn a_socket_left_where_it_cannot_be_used_does_not_stop_a_read() {
    let tmp = tempdir();
    let deep = tmp.path().join("d".repeat(120));
    let dir = deep.join("data");
    let o = berth(
        &dir,
        &[
            "enqueue", "--queue", "main", "--kind", "K", "--name", "kept",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(dir.join("berth.sock"), b"").expect("a stale socket file");
    let before = common::file_hashes(&dir);
    let o = berth(&dir, &["task", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("kept"), "{}", stdout(&o));
    assert_eq!(common::file_hashes(&dir), before);
}

/// A data dir this user may not look into is said to be so, not "not a
/// berth data dir" (run as root, the test reads it as user 65534).
#[test]
fn a_data_dir_that_cannot_be_looked_into_says_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let root = unsafe { libc::geteuid() } == 0;
    let (Some(setpriv), true) = (setpriv, root) else {
        println!("skipped: needs root and setpriv to read as another user");
        return;
    };
    let tmp = tempdir();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let dir = tmp.path().join("data");
    let o = berth(
        &dir,
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let before = common::file_hashes(&dir);
    let as_nobody = |args: &[&str]| {
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(common::berth_bin())
            .arg("--data-dir")
            .arg(&dir)
            .args(args)
            .output()
            .expect("run berth as another user")
    };
    for args in [&["task", "list"][..], &["verify"], &["log"]] {
        common::assert_refused(
            &as_nobody(args),
            1,
            &format!(
                "berth: cannot use data dir {}: looking into it: Permission denied",
                dir.display()
            ),
        );
    }
    // Folders it may look into, files (0600) it may not read: the error
    // names the file.
    for d in [dir.clone(), dir.join("db")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    for f in ["berth.lock", "berth.dir"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    // An unreadable high-water mark is not a damaged one.
    common::assert_refused(
        &as_nobody(&["task", "list"]),
        1,
        "reading its high-water mark (berth.high): Permission denied",
    );
    let high = dir.join("berth.high");
    std::fs::set_permissions(&high, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let o = as_nobody(&["task", "list"]);
    common::assert_refused(
        &o,
        1,
        &format!(
            "copying db/ to read it privately: {}/",
            dir.join("db").display()
        ),
    );
    assert!(stderr(&o).contains("Permission denied"), "{}", stderr(&o));
    assert_eq!(common::file_hashes(&dir), before);
}

/// A daemon that waits for its data dir (a command holds the lock)
/// announces itself in `berth.starting`, which it holds locked, and a
/// command on that dir answers once the daemon serves. A copy of the data
/// dir taken meanwhile has the same file, naming a live process, but
/// nobody holds it there: a command on the copy reads it at once, instead
/// of waiting `--timeout` for a daemon that will never answer there and
/// exiting 3.
#[test]
fn a_starting_daemons_announcement_counts_only_where_it_waits() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        "#!/bin/sh\ncat >/dev/null\n",
        "[handlers.Quick]\ncommand = [\"./hook.sh\"]\n",
    );
    let dir = root.path().join("data");
    let args = [
        "enqueue", "--queue", "main", "--kind", "Quick", "--name", "q",
    ];
    assert!(berth(&dir, &args).status.success());
    // The lock, held as a command holds it.
    let mut lock = std::fs::File::options()
        .read(true)
        .write(true)
        .open(dir.join("berth.lock"))
        .expect("berth.lock");
    lock.lock().expect("flock");
    lock.set_len(0).expect("truncate");
    writeln!(lock, "command {}", std::process::id()).expect("holder line");
    let mut daemon = Daemon::spawn_with(&cfg, &dir, &[], |_| {});
    daemon.wait_log("waiting for a command");
    assert!(dir.join("berth.starting").exists());

    let copy = root.path().join("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(cp.success());
    assert!(copy.join("berth.starting").exists(), "copied with the dir");
    let o = berth(&copy, &["--timeout", "3s", "task", "list", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");

    // On the real dir, the daemon serves once the lock is released.
    drop(lock);
    wait_for("the daemon's socket", || {
        std::os::unix::net::UnixStream::connect(dir.join("berth.sock")).is_ok()
    });
    assert!(!dir.join("berth.starting").exists(), "withdrawn");
    let o = berth(&dir, &["--timeout", "10s", "task", "list", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    daemon.signal(libc::SIGTERM);
    let (status, _) = daemon.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", daemon.log_text());
}

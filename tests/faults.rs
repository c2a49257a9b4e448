//! Faults an edge node meets, made real: a full disk on a small tmpfs (with
//! the daemon and without), a store that fails under the daemon, a damaged
//! database, a restart right after a kill -9 while clients are busy, and the
//! data dir's permissions. Every command must end within a few seconds,
//! nothing acknowledged may be lost, and nothing may panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, write_script};
use common::tmpfs::{Tmpfs, free_ballast};
use common::{stderr, stdout};

/// The longest any command may take here.
const PROMPT: Duration = Duration::from_secs(5);

/// Runs `berth --data-dir DIR ARGS` and checks that it ended promptly and
/// did not panic.
fn run(dir: &Path, args: &[&str]) -> Output {
    let start = Instant::now();
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run berth");
    let took = start.elapsed();
    assert!(
        took < PROMPT,
        "berth {args:?} took {took:?}; stderr:\n{}",
        stderr(&o)
    );
    assert_ne!(
        o.status.code(),
        Some(101),
        "berth {args:?} panicked: {}",
        stderr(&o)
    );
    assert!(
        !stderr(&o).contains("' panicked at"),
        "berth {args:?} panicked: {}",
        stderr(&o)
    );
    o
}

/// A payload file of about 200 KiB that gzip shrinks little, so each task
/// takes real space (and goes to one of sled's blob files).
fn big_payload(root: &Path) -> PathBuf {
    let mut rng = fastrand::Rng::with_seed(7);
    let text: String = (0..200_000).map(|_| rng.alphanumeric()).collect();
    let path = root.join("big.json");
    std::fs::write(&path, format!("{{\"blob\":\"{text}\"}}")).expect("payload");
    path
}

fn enqueue_file(dir: &Path, queue: &str, name: &str, payload: &Path) -> Output {
    run(
        dir,
        &[
            "enqueue",
            "--queue",
            queue,
            "--kind",
            "Big",
            "--name",
            name,
            "--payload-file",
            &payload.to_string_lossy(),
        ],
    )
}

fn id_of(o: &Output) -> u64 {
    stdout(o)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not an id: {:?} ({})", stdout(o), stderr(o)))
}

/// Enqueues big tasks into `main` until one is refused, pushing each
/// acknowledged id onto `acked`; returns the refusal. Fails the test once
/// `acked` holds `most` ids: the disk never filled.
fn enqueue_until_refused(dir: &Path, payload: &Path, acked: &mut Vec<u64>, most: usize) -> Output {
    loop {
        let o = enqueue_file(dir, "main", &format!("t{}", acked.len()), payload);
        if !o.status.success() {
            return o;
        }
        acked.push(id_of(&o));
        assert!(acked.len() < most, "the disk never filled");
    }
}

/// Every id is a task the data dir knows (live or finished).
fn assert_all_present(dir: &Path, ids: &[u64]) {
    for id in ids {
        let o = run(dir, &["task", "show", &id.to_string(), "-o", "json"]);
        assert!(
            o.status.success(),
            "acknowledged task {id} is gone: {}",
            stderr(&o)
        );
    }
}

/// Every file under `dir` (its path and bytes), to show that a refused
/// command changed nothing.
fn dir_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if !p
                .file_name()
                .is_some_and(|n| n == "spare" || n == "spare.tmp")
            {
                let bytes = std::fs::read(&p).expect("read");
                files.push((p, bytes));
            }
        }
    }
    files.sort();
    files
}

/// An enqueue the disk has just refused, tried again, is refused again
/// and changes no file in `dir`.
fn assert_refusal_writes_nothing(dir: &Path, payload: &Path) {
    let before = dir_files(dir);
    let again = enqueue_file(dir, "main", "again", payload);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    let after = dir_files(dir);
    let changed: Vec<_> = after
        .iter()
        .filter(|f| !before.contains(f))
        .map(|(p, _)| p)
        .chain(before.iter().filter(|f| !after.contains(f)).map(|(p, _)| p))
        .collect();
    assert!(
        changed.is_empty(),
        "a refused enqueue changed {changed:?}: {}",
        stderr(&again)
    );
}

fn assert_verify_ok(dir: &Path) {
    let o = run(dir, &["verify"]);
    assert!(o.status.success(), "verify: {}{}", stdout(&o), stderr(&o));
}

fn mount_or_skip(mib: u64) -> Option<Tmpfs> {
    match Tmpfs::mount(mib) {
        Ok(t) => Some(t),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// The write-ahead log's segments in `dir` and the bytes the file system
/// holds for each (its blocks, not its length).
fn wal_segments(dir: &Path) -> Vec<(PathBuf, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(dir.join("db").join("wal"))
        .expect("db/wal")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .map(|p| {
            let held = std::fs::metadata(&p).expect("segment").blocks() * 512;
            (p, held)
        })
        .collect();
    out.sort();
    out
}

/// Opens the store in `dir` and enqueues `n` tasks, one commit each
/// (acknowledged: `sync`); returns the store, still open.
fn store_with_tasks(dir: &Path, n: usize) -> berth::store::Store {
    use berth::store::{Options, Store};
    // A reserve of 1 MiB: this is about the log, not the guard.
    let opts = Options {
        disk_reserve: 1 << 20,
        ..Options::default()
    };
    let store = Store::open(dir, opts, berth::clock::system()).expect("open");
    for i in 0..n {
        let spec = berth::task::TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: format!("t{i}"),
            ..Default::default()
        };
        common::producer::enqueue_acked(&store, spec);
    }
    store
}

#[test]
fn the_write_ahead_log_reserves_no_space_ahead_on_a_nearly_full_disk() {
    let Some(fs) = mount_or_skip(96) else { return };
    let dir = fs.path.join("data");
    // With room, the first segment takes its whole size at once (so that
    // a flush's `fdatasync` has no new length to record).
    let store = store_with_tasks(&dir, 1);
    let segments = wal_segments(&dir);
    assert_eq!(segments.len(), 1, "{segments:?}");
    assert!(
        segments[0].1 >= berth::store::WAL_SEGMENT_BYTES,
        "{segments:?}"
    );
    drop(store);
    // Nearly full: the segment holds only what its frames need, and the
    // store goes on acknowledging tasks.
    let ballast = fs.fill("ballast", berth::store::WAL_TIGHT - (8 << 20));
    let free = fs.free();
    let store = store_with_tasks(&dir, 200);
    let segments = wal_segments(&dir);
    assert_eq!(segments.len(), 1, "{segments:?}");
    assert!(segments[0].1 < 1 << 20, "{segments:?}");
    assert!(
        free - fs.free() < berth::store::WAL_SEGMENT_BYTES,
        "{} bytes taken for 200 tiny tasks",
        free - fs.free()
    );
    drop(store);
    free_ballast(&ballast);
    let store = store_with_tasks(&dir, 0);
    assert_eq!(store.queued_total(), 201);
}

#[test]
fn a_full_disk_without_a_daemon_refuses_new_work_clearly_and_recovers() {
    let Some(fs) = mount_or_skip(160) else { return };
    let root = common::tempdir();
    let payload = big_payload(root.path());
    let dir = fs.path.join("data");
    // Leave about 40 MiB above the default 64 MiB reserve.
    let ballast = fs.fill("ballast", 104 << 20);

    let mut acked = Vec::new();
    let refusal = enqueue_until_refused(&dir, &payload, &mut acked, 200);
    assert!(acked.len() >= 5, "refused too early: {}", stderr(&refusal));
    assert_eq!(refusal.status.code(), Some(1), "{}", stderr(&refusal));
    let msg = stderr(&refusal);
    assert!(
        msg.contains("not enough disk space in")
            && msg.contains(" free, ")
            && msg.contains("needed"),
        "{msg}"
    );
    // The refused command wrote nothing, and reads still work.
    assert_refusal_writes_nothing(&dir, &payload);
    assert_all_present(&dir, &acked);
    assert_verify_ok(&dir);

    // Completely full: commands fail at once with a clear message.
    let rest = fs.fill("ballast2", 0);
    let o = enqueue_file(&dir, "main", "nope", &payload);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("disk is full") || stderr(&o).contains("not enough disk space"),
        "{}",
        stderr(&o)
    );
    assert_refusal_writes_nothing(&dir, &payload);
    let o = run(&dir, &["queue", "list"]);
    assert!(
        o.status.success() || stderr(&o).contains("disk is full"),
        "{}",
        stderr(&o)
    );

    // Space comes back: writes resume, nothing was lost.
    free_ballast(&rest);
    free_ballast(&ballast);
    let o = enqueue_file(&dir, "main", "after", &payload);
    assert!(o.status.success(), "{}", stderr(&o));
    acked.push(id_of(&o));
    assert_all_present(&dir, &acked);
    assert_verify_ok(&dir);
}

fn write_config(root: &Path, extra: &str) -> PathBuf {
    let hook = root.join("hook.sh");
    write_script(
        &hook,
        "#!/bin/sh\ncat >/dev/null\ncase \"$BERTH_TASK_NAME\" in\n  \
         hold*) while [ ! -e release ]; do sleep 0.02; done ;;\nesac\necho '\"ok\"'\n",
    );
    let cfg = root.join("berth.toml");
    std::fs::write(
        &cfg,
        format!(
            "grace = \"10s\"\n{extra}\n[handlers.Big]\ncommand = [\"{}\"]\ntimeout = \"60s\"\ncwd = \"{}\"\n",
            hook.display(),
            root.display()
        ),
    )
    .expect("config");
    cfg
}

fn queue_json(dir: &Path) -> serde_json::Value {
    let o = run(dir, &["queue", "list", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("queue list json")
}

fn total_tasks(dir: &Path) -> u64 {
    queue_json(dir)["summary"]["totalTasks"]
        .as_u64()
        .expect("totalTasks")
}

#[test]
fn a_full_disk_under_a_daemon_pauses_refuses_and_resumes_without_a_restart() {
    let Some(fs) = mount_or_skip(160) else { return };
    let root = common::tempdir();
    let payload = big_payload(root.path());
    let cfg = write_config(root.path(), "[disk]\nreserve = \"32MiB\"");
    let dir = fs.path.join("data");
    let mut daemon = Daemon::start(&cfg, &dir, &[]);
    let task_status = |id: u64| {
        let o = run(&dir, &["task", "show", &id.to_string(), "-o", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let t: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("task json");
        t["status"].as_str().unwrap_or_default().to_string()
    };

    // `hold` tasks run until the test creates `release`. One holds the head
    // of `main`, so the big tasks behind it wait; another runs in `side`.
    let side = id_of(&enqueue_file(&dir, "side", "hold-side", &payload));
    let head = id_of(&enqueue_file(&dir, "main", "hold-main", &payload));
    common::wait_for("both holders to run", || {
        task_status(side) == "running" && task_status(head) == "running"
    });
    let mut acked = vec![side, head];
    let ballast = fs.fill("ballast", 60 << 20);
    let refusal = enqueue_until_refused(&dir, &payload, &mut acked, 300);
    assert_eq!(refusal.status.code(), Some(1), "{}", stderr(&refusal));
    assert!(
        stderr(&refusal).contains("not enough disk space in"),
        "{}",
        stderr(&refusal)
    );
    let waiting = acked.len() - 2;
    assert!(
        waiting >= 3,
        "only {waiting} tasks waited behind the holder"
    );

    // Below the reserve nothing new starts, and `main` says why; the tasks
    // that were running still record how they ended.
    let low = fs.fill("ballast-low", 20 << 20);
    std::fs::write(root.path().join("release"), b"").expect("release");
    common::wait_for("the holders to finish", || {
        task_status(side) == "succeeded" && task_status(head) == "succeeded"
    });
    common::wait_for("main to show that starts are paused", || {
        queue_json(&dir)["active"].as_array().is_some_and(|qs| {
            qs.iter().any(|q| {
                q["name"] == "main"
                    && q["status"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("paused: disk nearly full"))
            })
        })
    });
    assert_eq!(
        total_tasks(&dir),
        waiting as u64,
        "a task started while paused"
    );

    // Space comes back: the same daemon takes new work and runs everything.
    free_ballast(&low);
    free_ballast(&ballast);
    let o = enqueue_file(&dir, "main", "after", &payload);
    assert!(o.status.success(), "{}", stderr(&o));
    acked.push(id_of(&o));
    common::wait_for("every task to run", || total_tasks(&dir) == 0);
    assert_all_present(&dir, &acked);

    daemon.signal(libc::SIGTERM);
    let (status, took) = daemon.wait_exit(PROMPT);
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    assert!(took < PROMPT);
    // A restart opens the dir and finds everything.
    assert_all_present(&dir, &acked);
    assert_verify_ok(&dir);
}

#[test]
fn a_store_that_fails_under_the_daemon_stops_it_with_exit_4_and_loses_nothing() {
    let Some(fs) = mount_or_skip(96) else { return };
    let root = common::tempdir();
    let payload = big_payload(root.path());
    // No guard: sled itself meets ENOSPC.
    let cfg = write_config(root.path(), "[disk]\nreserve = \"0\"");
    let dir = fs.path.join("data");
    let mut daemon = Daemon::start(&cfg, &dir, &[]);
    let ballast = fs.fill("ballast", 20 << 20);
    let mut acked = Vec::new();
    let failed = enqueue_until_refused(&dir, &payload, &mut acked, 300);
    assert!(
        matches!(failed.status.code(), Some(1) | Some(3)),
        "{}",
        stderr(&failed)
    );
    let (status, _) = daemon.wait_exit(PROMPT);
    assert_eq!(
        status.code(),
        Some(4),
        "the daemon should stop with its own code; log:\n{}",
        daemon.log_text()
    );
    assert!(daemon.log_text().contains("the store failed"));
    free_ballast(&ballast);
    // A restart repairs the dir; every acknowledged task is there.
    let mut again = Daemon::start(&cfg, &dir, &[]);
    assert_all_present(&dir, &acked);
    again.signal(libc::SIGTERM);
    let (status, _) = again.wait_exit(Duration::from_secs(40));
    assert_eq!(status.code(), Some(0), "{}", again.log_text());
    assert_verify_ok(&dir);
}

/// A data dir with enough tasks that `db/db` is over 512 KiB, and a payload
/// large enough to live in a blob file.
fn populated(root: &Path) -> PathBuf {
    let dir = root.join("data");
    let payload = big_payload(root);
    for i in 0..4 {
        assert!(
            enqueue_file(&dir, "main", &format!("big-{i}"), &payload)
                .status
                .success()
        );
    }
    let batch: Vec<serde_json::Value> = (0..3000)
        .map(|i| {
            serde_json::json!({"queue": "main", "kind": "K", "name": format!("n-{i}"),
                "payload": {"text": format!("some text to take room {i:08}")}})
        })
        .collect();
    let file = root.join("batch.json");
    std::fs::write(&file, serde_json::to_string(&batch).expect("json")).expect("batch");
    let o = run(&dir, &["enqueue", "--batch", &file.to_string_lossy()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let len = std::fs::metadata(dir.join("db/db")).expect("db/db").len();
    assert!(len > 600 << 10, "db/db is only {len} bytes");
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    let o = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .expect("cp");
    assert!(o.status.success());
}

/// The tasks `populated` enqueues.
const POPULATED: u64 = 3004;

/// The commands on a damaged copy of `populated`: none panics or hangs;
/// each either works on the whole state (every task that was acknowledged
/// is there) or fails with a message that names the data dir. An older
/// state is never shown as if it were the data dir's.
fn check_damaged(dir: &Path, what: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for args in [
        vec!["queue", "list", "-o", "json"],
        vec!["verify"],
        vec!["enqueue", "--queue", "main", "--kind", "K", "--name", "x"],
    ] {
        let o = run(dir, &args);
        if o.status.success() && args[0] == "queue" {
            let listed: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
            assert_eq!(
                listed["summary"]["totalTasks"].as_u64(),
                Some(POPULATED),
                "{what}: queue list read a state without every acknowledged task"
            );
        }
        if !o.status.success() {
            let msg = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{what}: {args:?}: {msg}");
            assert!(
                msg.contains(&dir.display().to_string()),
                "{what}: {args:?}: the error does not name the data dir: {msg}"
            );
            // sled's own text for corruption is for its developers.
            assert!(!msg.contains("backtrace"), "{what}: {args:?}: {msg}");
            errors.push(msg);
        }
    }
    errors
}

#[test]
fn a_damaged_database_gives_a_clear_error_and_never_a_panic() {
    let root = common::tempdir();
    let good = populated(root.path());
    let len = std::fs::metadata(good.join("db/db")).expect("db/db").len();
    // Cut short anywhere: at the start, inside the log, or in its last
    // commit (a batch of 3000 in pieces, which then reads as torn: without
    // the high-water mark that older state opened as if it were whole).
    let cuts = [
        0u64,
        256 << 10,
        512 << 10,
        len / 2,
        len * 3 / 4,
        len * 9 / 10,
        len - 4096,
    ];
    for cut in cuts {
        let dir = root.path().join(format!("cut-{cut}"));
        copy_dir(&good, &dir);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("db/db"))
            .expect("db/db");
        f.set_len(cut).expect("truncate");
        drop(f);
        let errors = check_damaged(&dir, &format!("db/db cut to {cut} bytes"));
        if cut == 0 {
            assert!(
                errors.iter().all(|e| e.contains("its data was lost")),
                "{errors:?}"
            );
            assert_eq!(errors.len(), 3);
        }
    }
    // One flipped byte in the middle of the log, and in a blob file.
    let dir = root.path().join("flip-log");
    copy_dir(&good, &dir);
    flip(&dir.join("db/db"), 300 << 10);
    check_damaged(&dir, "a byte flipped in db/db");
    let dir = root.path().join("flip-blob");
    copy_dir(&good, &dir);
    let blob = std::fs::read_dir(dir.join("db/blobs"))
        .expect("blobs")
        .flatten()
        .map(|e| e.path())
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("a blob file");
    flip(&blob, 1000);
    check_damaged(&dir, "a byte flipped in a blob");
}

/// A data dir whose `db/` was deleted, or whose `db/conf` is garbage: every
/// command names what is wrong in the data dir (not in the private copy a
/// read works on, nor a failed copy).
#[test]
fn a_missing_db_folder_or_a_garbled_conf_is_named_by_every_command() {
    let root = common::tempdir();
    let good = root.path().join("good");
    let o = run(
        &good,
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let gone = root.path().join("gone");
    copy_dir(&good, &gone);
    std::fs::remove_dir_all(gone.join("db")).expect("rm db");
    let garbled = root.path().join("garbled");
    copy_dir(&good, &garbled);
    std::fs::write(garbled.join("db/conf"), [0xffu8; 100]).expect("conf");
    let file = root.path().join("file");
    copy_dir(&good, &file);
    std::fs::remove_dir_all(file.join("db")).expect("rm db");
    std::fs::write(file.join("db"), b"not a folder").expect("db as a file");
    for args in [
        vec!["queue", "list"],
        vec!["verify"],
        vec!["enqueue", "--queue", "main", "--kind", "K", "--name", "b"],
    ] {
        let o = run(&gone, &args);
        let db = gone.join("db");
        common::assert_refused(
            &o,
            1,
            &format!("its database folder {} is missing", db.display()),
        );
        let o = run(&file, &args);
        let db = file.join("db");
        common::assert_refused(
            &o,
            1,
            &format!("its database folder {} is not a folder", db.display()),
        );
        let o = run(&garbled, &args);
        let conf = garbled.join("db/conf");
        common::assert_refused(
            &o,
            1,
            &format!("sled cannot read its settings file {}", conf.display()),
        );
    }
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).expect("read");
    let i = (at as usize).min(bytes.len() - 1);
    bytes[i] ^= 0x5a;
    std::fs::write(path, bytes).expect("write");
}

/// A daemon's run writes many commits after sled's last snapshot; a
/// `db/db` cut short in them reads, for sled, as a log a crash ended early,
/// and opened as the older state it was (tasks finished long ago waiting
/// again, their ids given anew). Every cut is refused or reads the whole
/// state, and the high-water mark is what refuses some of them.
#[test]
fn a_log_cut_short_after_a_daemon_ran_is_never_read_as_an_older_state() {
    let root = common::tempdir();
    let dir = root.path().join("data");
    let cfg = root.path().join("berth.toml");
    std::fs::write(
        &cfg,
        "data_dir = \"data\"\n[handlers.K]\ncommand = [\"true\"]\n",
    )
    .expect("config");
    let batch: Vec<serde_json::Value> = (0..300)
        .map(|i| serde_json::json!({"queue": "main", "kind": "K", "name": format!("t{i}")}))
        .collect();
    let file = root.path().join("batch.json");
    std::fs::write(&file, serde_json::to_string(&batch).expect("json")).expect("batch");
    let o = Command::new(common::berth_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--enqueue")
        .arg(&file)
        .arg("--until-idle")
        .env("RUST_LOG", "warn")
        .output()
        .expect("berth run");
    assert!(o.status.success(), "{}", stderr(&o));
    let finished = |d: &Path| {
        let o = run(d, &["task", "list", "--status", "history", "-o", "json"]);
        (o.status.success()).then(|| {
            serde_json::from_str::<serde_json::Value>(&stdout(&o))
                .expect("json")
                .as_array()
                .map_or(0, Vec::len)
        })
    };
    assert_eq!(finished(&dir), Some(300));
    let len = std::fs::metadata(dir.join("db/db")).expect("db/db").len();
    let mut by_mark = 0;
    for tenth in 1..10 {
        let cut = len * tenth / 10;
        let copy = root.path().join(format!("cut-{tenth}"));
        copy_dir(&dir, &copy);
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.join("db/db"))
            .and_then(|f| f.set_len(cut))
            .expect("truncate");
        match finished(&copy) {
            Some(n) => assert_eq!(n, 300, "db/db cut to {cut} of {len} bytes read as older"),
            None => {
                let o = run(&copy, &["task", "list", "--status", "history"]);
                assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
                by_mark += stderr(&o).contains("high-water mark") as usize;
            }
        }
    }
    assert!(
        by_mark > 0,
        "no cut was one that only the high-water mark refuses"
    );
}

/// sled reads a database whose log was replaced by an older copy (or lost
/// its end) as the older state; the high-water mark (`berth.high`) makes
/// every command refuse it, and removing the mark is the way to open it as
/// it is, on purpose.
#[test]
fn a_database_older_than_its_high_water_mark_is_refused_until_the_mark_is_removed() {
    let root = common::tempdir();
    let dir = root.path().join("data");
    let enqueue = |name: &str| {
        let o = run(
            &dir,
            &["enqueue", "--queue", "main", "--kind", "K", "--name", name],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        id_of(&o)
    };
    for i in 0..3 {
        enqueue(&format!("early-{i}"));
    }
    let old = root.path().join("old-db");
    copy_dir(&dir.join("db"), &old);
    let later: Vec<u64> = (0..3).map(|i| enqueue(&format!("later-{i}"))).collect();
    assert_eq!(later, [4, 5, 6]);
    let mark = std::fs::read_to_string(dir.join("berth.high")).expect("berth.high");
    assert!(mark.contains("next_event 7\nnext_id 7\n"), "{mark}");
    std::fs::remove_dir_all(dir.join("db")).expect("rm db");
    copy_dir(&old, &dir.join("db"));
    // What the refusals may not change: all but sled's snapshot file
    // (which sled's open rewrites from its log: its own housekeeping, the
    // same state). The lock file's holder line is put back.
    let hashes = || {
        let mut h = common::file_hashes(&dir);
        h.retain(|(p, _)| !p.contains("/db/snap."));
        h
    };
    let before = hashes();
    for args in [
        vec!["queue", "list"],
        vec!["verify"],
        vec!["task", "show", "1"],
        vec![
            "enqueue", "--queue", "main", "--kind", "K", "--name", "again",
        ],
    ] {
        let o = run(&dir, &args);
        common::assert_refused(
            &o,
            1,
            "its log ends at event 3 (next task id 4), but the data dir's high-water mark",
        );
        assert!(stderr(&o).contains("berth.high"), "{}", stderr(&o));
        // One piece of advice: reopening repairs nothing here.
        assert!(
            !stderr(&o).contains("reopen the data dir to repair it"),
            "{}",
            stderr(&o)
        );
    }
    // The refusals wrote nothing (a read opens a private copy; the
    // enqueue's open stopped before its first flush).
    assert_eq!(hashes(), before);
    // A mark that does not read back is refused too, saying so.
    std::fs::write(
        dir.join("berth.high"),
        "berth high-water mark 1\nnext_event x\nnext_id 7\ncrc32 00000000\n",
    )
    .expect("w");
    // It is refused before sled opens: no file changes at all.
    let before = common::file_hashes(&dir);
    for args in [
        vec!["queue", "list"],
        vec!["task", "remove", "1"],
        vec![
            "enqueue", "--queue", "main", "--kind", "K", "--name", "again",
        ],
    ] {
        let o = run(&dir, &args);
        common::assert_refused(&o, 1, "its high-water mark");
        assert!(stderr(&o).contains("is not a number"), "{}", stderr(&o));
        assert_eq!(common::file_hashes(&dir), before, "{args:?}");
    }
    // Removed on purpose: the older state opens, and numbering goes on
    // from it (the ids of the lost commits are given again).
    std::fs::remove_file(dir.join("berth.high")).expect("rm mark");
    assert_eq!(total_tasks(&dir), 3);
    assert_eq!(enqueue("after"), 4);
    let mark = std::fs::read_to_string(dir.join("berth.high")).expect("berth.high");
    assert!(mark.contains("next_event 5\nnext_id 5\n"), "{mark}");
    assert_verify_ok(&dir);
}

/// A data dir whose database is gone is refused by every command, and the
/// refusal changes no file: not even the lock's holder line.
#[test]
fn a_lost_database_is_refused_and_the_refusal_changes_no_file() {
    let root = common::tempdir();
    let dir = root.path().join("data");
    let o = run(
        &dir,
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(dir.join("db")).expect("rm db");
    let before = common::file_hashes(&dir);
    assert!(before.iter().any(|(p, _)| p.ends_with("berth.lock")));
    for args in [
        vec!["task", "cancel", "1"],
        vec!["task", "remove", "1"],
        vec![
            "enqueue", "--queue", "main", "--kind", "K", "--name", "b", "--after", "1",
        ],
        vec!["enqueue", "--queue", "main", "--kind", "K", "--name", "b"],
        vec!["queue", "list"],
    ] {
        let o = run(&dir, &args);
        common::assert_refused(&o, 1, "its data was lost");
        assert_eq!(common::file_hashes(&dir), before, "{args:?}");
    }
}

/// A running daemon keeps the mark up with its commits (every 5 s), not
/// only at its stop: after a kill -9 the mark covers what it did, and the
/// data dir opens.
#[test]
fn a_running_daemon_moves_the_high_water_mark_and_a_kill_9_leaves_it_behind_the_disk() {
    let root = common::tempdir();
    let cfg = write_config(root.path(), "");
    let dir = root.path().join("data");
    let mut d = Daemon::start(&cfg, &dir, &[]);
    let read_mark = || std::fs::read_to_string(dir.join("berth.high")).unwrap_or_default();
    let at_start = read_mark();
    assert!(at_start.contains("next_id 1\n"), "{at_start}");
    for i in 0..3 {
        let o = run(
            &dir,
            &[
                "enqueue",
                "--queue",
                "main",
                "--kind",
                "Big",
                "--name",
                &format!("t{i}"),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    common::wait_for("the daemon to write a mark past its three tasks", || {
        read_mark().contains("next_id 4\n")
    });
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(10));
    let o = run(&dir, &["task", "list", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_verify_ok(&dir);
}

#[test]
fn a_daemon_restarted_right_after_a_kill_9_starts_while_clients_are_busy() {
    let root = common::tempdir();
    let cfg = write_config(root.path(), "");
    let dir = root.path().join("data");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|c| {
            let (acked, stop, dir) = (acked.clone(), stop.clone(), dir.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for i in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        return failures;
                    }
                    let o = Command::new(common::berth_bin())
                        .arg("--data-dir")
                        .arg(&dir)
                        .args(["enqueue", "--queue", &format!("q{c}"), "--kind", "Big"])
                        .args(["--name", &format!("c{c}-{i}")])
                        .env("RUST_LOG", "warn")
                        .output()
                        .expect("berth enqueue");
                    match o.status.code() {
                        Some(0) => acked.lock().expect("acked").push(id_of(&o)),
                        _ => failures.push(stderr(&o)),
                    }
                }
                failures
            })
        })
        .collect();
    for round in 0..20 {
        let mut daemon = Daemon::start(&cfg, &dir, &[]);
        let before = acked.lock().expect("acked").len();
        common::wait_for("clients to get answers from this daemon", || {
            acked.lock().expect("acked").len() >= before + 3
        });
        daemon.signal(libc::SIGKILL);
        let (status, _) = daemon.wait_exit(PROMPT);
        assert_eq!(
            status.code(),
            None,
            "round {round}: the daemon ended by itself: {}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.join().expect("client"));
    }
    // A client may lose its answer when the daemon is killed under it; it
    // must never fail because a daemon was starting.
    for f in &failures {
        assert!(
            !f.contains("in use by another berth process"),
            "a client failed because a daemon was starting: {f}"
        );
    }
    let acked = acked.lock().expect("acked").clone();
    assert!(acked.len() >= 60);
    let mut last = Daemon::start(&cfg, &dir, &[]);
    last.signal(libc::SIGTERM);
    last.wait_exit(Duration::from_secs(20));
    assert_all_present(&dir, &acked);
    assert_verify_ok(&dir);
}

#[test]
fn the_data_dir_is_private_whatever_the_umask() {
    let root = common::tempdir();
    let dir = root.path().join("data");
    let payload = big_payload(root.path());
    // The blob file (the big payload) is written by the last command: no
    // later open makes it private, sled must create it so.
    for (name, payload) in [("a", None), ("b", Some(&payload))] {
        let mut cmd = Command::new(common::berth_bin());
        cmd.arg("--data-dir")
            .arg(&dir)
            .args(["enqueue", "--queue", "main", "--kind", "K", "--name", name]);
        if let Some(p) = payload {
            cmd.arg("--payload-file").arg(p);
        }
        use std::os::unix::process::CommandExt;
        // SAFETY: umask(2) is async-signal-safe; it runs in the child only.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let o = cmd.output().expect("berth enqueue");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![dir.clone()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        let mode = std::fs::metadata(&d).expect("dir").mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.display());
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let meta = std::fs::symlink_metadata(e.path()).expect("meta");
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                let mode = meta.mode() & 0o777;
                assert_eq!(mode, 0o600, "{} is {mode:o}", e.path().display());
            }
        }
    }
    assert!(files >= 5, "only {files} files");
    assert!(
        dir.join("db/blobs")
            .read_dir()
            .expect("blobs")
            .next()
            .is_some()
    );
}

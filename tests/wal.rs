//! The write-ahead log (`db/wal`, `src/store/wal.rs`) under real faults.
//!
//! A child process (this test binary re-executed) enqueues with sled's own
//! flush held off (`Options::sled_flush_every` of an hour), prints each id
//! once its commit returned, and is killed with SIGKILL. Its acknowledged
//! commits are then in the write-ahead log and not in sled's files: the
//! reopen must take them from the log.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use berth::store::{Options, Store};
use berth::task::TaskSpec;
use common::producer;

const DIR_VAR: &str = "BERTH_WAL_CHILD_DIR";
/// Commits the child makes before it waits to be killed.
const COMMITS: u64 = 300;

fn options() -> Options {
    Options {
        write_ahead_log: true,
        sled_flush_every: Duration::from_secs(3600),
        ..Options::default()
    }
}

/// The child: does nothing unless re-executed by a test below.
#[test]
fn wal_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let store = Store::open(Path::new(&dir), options(), berth::clock::system()).expect("open");
    producer::end_libtest_line();
    for i in 0..COMMITS {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "Wal".into(),
            name: format!("t{i}"),
            payload: serde_json::json!({ "i": i }),
            ..Default::default()
        };
        println!("{}", producer::enqueue_acked(&store, spec));
    }
    // Held open until killed: nothing flushes sled.
    loop {
        std::thread::park();
    }
}

/// Runs the child on `dir` until it acknowledged every commit, then kills
/// it with SIGKILL; returns the acknowledged ids.
fn run_and_kill(dir: &Path) -> Vec<u64> {
    let mut child = common::child_test("wal_child")
        .env(DIR_VAR, dir)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning the child");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || producer::read_ids(stdout, tx));
    let mut acked = Vec::new();
    while acked.len() < COMMITS as usize {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(id) => acked.push(id),
            Err(e) => {
                let _ = child.kill();
                panic!("the child acknowledged only {} commits: {e}", acked.len());
            }
        }
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    }
    let _ = reader.join();
    acked
}

/// Everything in `db/wal`: the segments (`*.wal`) and the spare.
fn wal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("db").join("wal"))
        .map(|r| r.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v = wal_files(dir);
    v.retain(|p| p.extension().is_some_and(|x| x == "wal"));
    v
}

/// How many commit records sled's files hold (read with sled itself, on a
/// copy, so the data dir is not touched).
fn records_in_sled(dir: &Path) -> usize {
    let copy = tempfile::tempdir().expect("tempdir");
    let status = Command::new("cp")
        .arg("-a")
        .arg(dir.join("db"))
        .arg(copy.path())
        .status()
        .expect("cp");
    assert!(status.success());
    let db = sled::open(copy.path().join("db")).expect("sled opens the copy");
    db.scan_prefix(b"e").count()
}

#[test]
fn acknowledged_commits_that_sled_never_wrote_come_back_from_the_log_after_a_kill_9() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let acked = run_and_kill(&dir);
    assert_eq!(
        segments(&dir).len(),
        1,
        "one segment holds 300 small commits"
    );
    // sled's files lack most of what was acknowledged: only the log has it.
    let in_sled = records_in_sled(&dir);
    assert!(
        in_sled < acked.len(),
        "sled holds {in_sled} records: the test did not keep sled from flushing"
    );

    let store = Store::open(&dir, options(), berth::clock::system()).expect("reopen");
    assert_eq!(
        store.queue_ids("main"),
        acked,
        "every acknowledged task, in order"
    );
    let diffs = berth::store::verify::verify(&store).expect("verify");
    assert_eq!(diffs, Vec::<String>::new(), "the log agrees with the state");
    // Opening put the commits in sled, flushed it and emptied the log.
    assert!(segments(&dir).is_empty(), "{:?}", segments(&dir));
    drop(store);
    // A clean close leaves sled whole on disk and the log's folder empty
    // (no segment, no spare).
    assert!(wal_files(&dir).is_empty(), "{:?}", wal_files(&dir));
    assert!(records_in_sled(&dir) >= acked.len());
}

#[test]
fn a_log_that_goes_on_after_a_gap_or_is_damaged_is_refused_and_left_as_it_is() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    run_and_kill(&dir);
    let seg = segments(&dir).pop().expect("a segment");
    let original = std::fs::read(&seg).expect("read segment");

    // A flipped byte in the first frame's body, with frames after it.
    let mut bytes = original.clone();
    bytes[16 + 24 + 3] ^= 0x20;
    std::fs::write(&seg, &bytes).expect("write");
    // Every file but the lock's holder line: sled is not even opened.
    let files = || {
        let mut f = common::file_hashes(&dir);
        f.retain(|(name, _)| !name.ends_with("berth.lock"));
        f
    };
    let before = files();
    let err = Store::open(&dir, options(), berth::clock::system()).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("write-ahead log is damaged")
            && msg.contains(&seg.display().to_string())
            && msg.contains("at byte 16"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&seg).expect("read"), bytes, "left as it was");
    assert_eq!(files(), before, "a refused open changed the data dir");

    // Whole frames that begin after events sled does not have.
    let mut gap = original[..16].to_vec();
    let (first, next, body) = (1_000_000u64, 1_000_001u64, b"not a record");
    let mut h = crc32fast::Hasher::new();
    h.update(&first.to_le_bytes());
    h.update(&next.to_le_bytes());
    h.update(body);
    gap.extend_from_slice(&(body.len() as u32).to_le_bytes());
    gap.extend_from_slice(&h.finalize().to_le_bytes());
    gap.extend_from_slice(&first.to_le_bytes());
    gap.extend_from_slice(&next.to_le_bytes());
    gap.extend_from_slice(body);
    std::fs::write(&seg, &gap).expect("write");
    let err = Store::open(&dir, options(), berth::clock::system()).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("goes on at event 1000000")
            && msg.contains("acknowledged commits are missing"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&seg).expect("read"), gap, "left as it was");

    // The log as it was: every commit back.
    std::fs::write(&seg, &original).expect("write");
    let store = Store::open(&dir, options(), berth::clock::system()).expect("reopen");
    assert_eq!(store.queued_total(), COMMITS as usize);
}

#[test]
fn an_open_that_fails_on_a_file_says_what_it_was_doing_and_leaves_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    drop(Store::open(&dir, options(), berth::clock::system()).expect("create"));
    // The log's folder replaced by a file: a real ENOTDIR when it is read.
    let wal = dir.join("db").join("wal");
    std::fs::remove_dir_all(&wal).expect("remove db/wal");
    std::fs::write(&wal, b"not a folder").expect("write db/wal");
    let err = Store::open(&dir, options(), berth::clock::system()).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("cannot use data dir {}", dir.display()))
            && msg.contains("reading the write-ahead log (db/wal)"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(&wal).expect("db/wal"),
        b"not a folder",
        "left as it was"
    );
}

/// A read command works on a private copy of `db/`: what it says of a
/// write cut short at the log's end names the data dir's segment.
#[test]
fn a_write_cut_short_is_named_in_the_data_dir_by_a_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    run_and_kill(&dir);
    let seg = segments(&dir).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read segment");
    // Past the whole frames (16-byte header; each frame: length u32, CRC
    // u32, two u64, then the body), a frame whose body is cut short.
    let mut end = 16;
    loop {
        let len = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        end += 24 + len;
    }
    assert!(bytes.len() >= end + 24 + 8, "room for a cut frame");
    bytes[end..end + 4].copy_from_slice(&1_000u32.to_le_bytes());
    bytes[end + 4..end + 32].fill(0x5a);
    std::fs::write(&seg, &bytes).expect("write");
    let o = std::process::Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["queue", "list"])
        .env("RUST_LOG", "info")
        .output()
        .expect("run berth");
    let e = common::stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("the write-ahead log ends with a write cut short")
            && e.contains(&format!("{} at byte {end}", seg.display())),
        "{e}"
    );
    assert!(!e.contains("berth-read-"), "{e}");
}

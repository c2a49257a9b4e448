//! Queue positions kept in the live tasks' records (store format 7): a
//! renumbered queue rewrites its tasks and keeps its order across opens,
//! and a format-6 dir (positions in `q` keys) is folded at open, also after
//! a crash halfway through, also when its last (format-6) record is
//! re-applied by a later open, and is read as it is without writing; a
//! kill -9 in the middle of a fold loses no position.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use berth::clock::FakeClock;
use berth::codec;
use berth::store::event::{CommitRecord, KeyWrite};
use berth::store::{Options, Placement, Store, keys, stored, verify};
use berth::submit;
use berth::task::TaskSpec;
use common::{T0, open, spec, tempdir};

fn add(store: &Store, queue: &str, name: &str, p: Placement) -> u64 {
    submit::enqueue_one(store, spec(queue, name), p).expect("enqueue")
}

fn assert_log_agrees(store: &Store) {
    let diffs = verify::verify(store).expect("replay");
    assert!(diffs.is_empty(), "log and state disagree: {diffs:#?}");
}

/// Every non-empty queue and its ids, head first.
fn queues(store: &Store) -> BTreeMap<String, Vec<u64>> {
    store
        .queues()
        .into_iter()
        .map(|(q, _)| {
            let ids = store.queue_ids(&q);
            (q, ids)
        })
        .collect()
}

#[test]
fn a_renumbered_queue_keeps_its_order_across_opens() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let want = {
        let s = open(dir.path(), &clock);
        let first = add(&s, "main", "first", Placement::Last);
        add(&s, "main", "last", Placement::Last);
        add(&s, "other", "x", Placement::Last);
        // Each one right behind `first` halves the gap: 32 of them leave
        // no integer between, and the queue is renumbered.
        for i in 0..70 {
            add(&s, "main", &format!("n{i}"), Placement::After(first));
        }
        let q = queues(&s);
        assert_eq!(q["main"].len(), 72);
        assert_eq!(q["main"][0], first);
        assert_log_agrees(&s);
        q
    };
    let s = open(dir.path(), &clock);
    assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
    assert_eq!(queues(&s), want);
    assert_log_agrees(&s);
}

/// Rewrites a format-7 data dir as a format-6 build left it: each live
/// task's position in a `q` key and its record alone (for the tasks
/// `unfold` picks; the others as a fold of the new build left them), the
/// last commit record's key writes in format 6's form (with `q` keys if
/// `places`: a format-6 record has them only where the order changed), and
/// `mformat` = `format`. Returns how many `q` keys the dir has.
fn make_format_6(dir: &Path, unfold: impl Fn(u64) -> bool, places: bool, format: u64) -> usize {
    let db = sled::open(dir.join("db")).expect("sled");
    let as_6 = |k: &[u8], v: &[u8]| -> Vec<KeyWrite> {
        let id = keys::parse_id_key(k).expect("a task key");
        let mut out = vec![KeyWrite {
            key: k.to_vec(),
            value: Some(stored::split(v).record.to_vec()),
        }];
        if let Some((q, pos)) = stored::position(v).expect("position") {
            out.push(KeyWrite {
                key: keys::queue_key(&q, pos),
                value: Some(codec::encode(&id)),
            });
        }
        out
    };
    for item in db.scan_prefix([keys::TASK]) {
        let (k, v) = item.unwrap();
        if !unfold(keys::parse_id_key(&k).unwrap()) {
            continue;
        }
        for w in as_6(&k, &v) {
            db.insert(w.key, w.value.unwrap()).unwrap();
        }
    }
    let (last_key, last) = db.scan_prefix([keys::EVENT]).next_back().unwrap().unwrap();
    assert_eq!(last_key.len(), 9, "a whole record");
    let mut rec: CommitRecord = codec::decode(&last).unwrap();
    let mut writes = Vec::new();
    let mut positioned = 0;
    for w in rec.writes {
        match &w.value {
            Some(v) if w.key[0] == keys::TASK => {
                let mut six = as_6(&w.key, v);
                positioned += six.len() - 1;
                if !places {
                    six.truncate(1);
                }
                writes.extend(six);
            }
            _ => writes.push(w),
        }
    }
    assert!(positioned > 0, "the last record places a task");
    rec.writes = writes;
    db.insert(&last_key, codec::encode(&rec)).unwrap();
    db.insert(keys::META_FORMAT, codec::encode(&format))
        .unwrap();
    db.flush().unwrap();
    db.scan_prefix([keys::QUEUE]).count()
}

fn read_only(dir: &Path, clock: &FakeClock) -> Store {
    let opts = Options {
        read_only: true,
        ..Options::default()
    };
    Store::open(dir, opts, Arc::new(clock.clone())).expect("open to read")
}

/// The dir's format and how many `q` keys it has. (Opened with sled
/// directly: only after a store, not right after another such open, whose
/// lock sled may still hold.)
fn inspect(dir: &Path) -> (u64, usize) {
    let db = sled::open(dir.join("db")).expect("sled");
    let format = codec::decode(&db.get(keys::META_FORMAT).unwrap().unwrap()).unwrap();
    (format, db.scan_prefix([keys::QUEUE]).count())
}

#[test]
fn a_format_6_dir_is_folded_at_open_and_stays_so() {
    // All of it, or half (what a crash between two of the fold's batches
    // leaves: some positions folded, the others still in `q` keys).
    for half in [false, true] {
        let dir = tempdir();
        let clock = FakeClock::new(T0);
        let (want, group_child) = {
            let s = open(dir.path(), &clock);
            let mut ids = Vec::new();
            for i in 0..6 {
                ids.push(add(&s, "main", &format!("m{i}"), Placement::Last));
            }
            add(&s, "other", "o", Placement::First);
            // A group: its children wait in no queue.
            let specs: Vec<TaskSpec> = (0..3)
                .map(|i| TaskSpec {
                    weight: Some(1),
                    ..spec("main", &format!("c{i}"))
                })
                .collect();
            let parent = submit::enqueue_batch(&s, specs).unwrap()[0];
            let child = s.task(parent).unwrap().unwrap().children[0];
            let mut w = s.write();
            w.start(ids[0]).unwrap();
            w.commit().unwrap();
            add(&s, "main", "front", Placement::Before(ids[1]));
            (queues(&s), child)
        };
        assert!(make_format_6(dir.path(), |id| !half || id % 2 == 0, true, 6) > 0);
        // Reading leaves the dir as it is, and sees the same queues.
        {
            let s = read_only(dir.path(), &clock);
            assert_eq!(queues(&s), want, "half: {half}");
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
        }
        let (format, q) = inspect(dir.path());
        assert_eq!(format, 6);
        assert!(q > 0);
        {
            let s = open(dir.path(), &clock);
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
            // The running task was put back to wait: still the head.
            assert_eq!(queues(&s), want, "half: {half}");
            assert!(s.task(group_child).unwrap().is_some());
            assert_log_agrees(&s);
        }
        assert_eq!(
            inspect(dir.path()),
            (keys::STORE_FORMAT, 0),
            "every position folded"
        );
        // Opened again: the recovery's commit (a `failed` event: the order
        // does not change) is the last record now. Made a format-6 one (as
        // if no commit had followed the fold), it is re-applied at every
        // open, and writes its task's record alone: the task keeps the
        // position the fold gave it.
        assert_eq!(
            make_format_6(dir.path(), |_| false, false, keys::STORE_FORMAT),
            0
        );
        for _ in 0..2 {
            let s = open(dir.path(), &clock);
            assert!(s.corrupt_records().is_empty(), "{:?}", s.corrupt_records());
            assert_eq!(queues(&s), want, "half: {half}");
            assert_log_agrees(&s);
        }
        assert_eq!(inspect(dir.path()), (keys::STORE_FORMAT, 0));
    }
}

/// A `q` key that names a task that is not live, or gives a task a second
/// position, is reported as corrupt and left as it is; the task keeps the
/// position its own record holds.
#[test]
fn a_queue_key_that_cannot_be_folded_is_reported() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (a, b) = {
        let s = open(dir.path(), &clock);
        (
            add(&s, "main", "a", Placement::Last),
            add(&s, "main", "b", Placement::Last),
        )
    };
    let (stray, second) = (keys::queue_key("main", 99), keys::queue_key("main", -99));
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        db.insert(&stray, codec::encode(&12345u64)).unwrap();
        db.insert(&second, codec::encode(&b)).unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    let reasons: Vec<String> = s
        .corrupt_records()
        .iter()
        .map(|c| format!("{}: {}", c.key, c.reason))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("q/main/99") && r.contains("not live")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("q/main/-99") && r.contains("more than one")),
        "{reasons:?}"
    );
    assert_eq!(s.queue_ids("main"), vec![a, b]);
    drop(s);
    assert_eq!(inspect(dir.path()).1, 2, "left as they are");
}

/// A renumber rewrites every task of the queue; when one of their records
/// is damaged (its position still reads, so it holds its place), the
/// enqueue that needed the renumber is refused, naming the record, and the
/// order is as it was.
#[test]
fn a_renumber_over_a_damaged_record_is_refused_whole() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let (first, bad, last) = {
        let s = open(dir.path(), &clock);
        let ids = (
            add(&s, "main", "first", Placement::Last),
            add(&s, "main", "bad", Placement::Last),
            add(&s, "main", "last", Placement::Last),
        );
        // A later commit, so that bad's is not the record re-applied at open.
        add(&s, "other", "x", Placement::Last);
        ids
    };
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        let key = keys::id_key(keys::TASK, bad);
        let mut v = db.get(key).unwrap().unwrap().to_vec();
        let parts = stored::split(&v);
        let at = v.len() - parts.record.len() / 2;
        v[at] ^= 0x40;
        db.insert(key, v).unwrap();
        db.flush().unwrap();
    }
    let s = open(dir.path(), &clock);
    let key = format!("t/{bad}");
    assert!(s.corrupt_records().iter().any(|c| c.key == key));
    assert_eq!(s.queue_ids("main"), vec![first, bad, last]);
    let mut refused = None;
    for i in 0..40 {
        let before = s.queue_ids("main");
        match submit::enqueue_one(&s, spec("main", &format!("n{i}")), Placement::After(first)) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(s.queue_ids("main"), before, "the order is as it was");
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let e = refused.expect("a renumber was needed within 40 enqueues");
    assert!(e.contains(&key) && e.contains("corrupt"), "{e}");
    // What needs no renumber still goes.
    let n = add(&s, "main", "tail", Placement::Last);
    assert_eq!(s.queue_ids("main").last(), Some(&n));
}

const FOLD_DIR_VAR: &str = "BERTH_FOLD_CHILD_DIR";

/// The child of `a_kill_9_during_a_fold_loses_no_position`: says it is
/// about to open, opens (folding), says so and exits. Does nothing unless
/// re-executed by that test.
#[test]
fn fold_child() {
    let Some(dir) = std::env::var_os(FOLD_DIR_VAR) else {
        return;
    };
    // libtest has printed "test fold_child ... " without a newline.
    println!();
    println!("OPENING");
    let store = Store::open(Path::new(&dir), Options::default(), berth::clock::system())
        .expect("open to fold");
    println!("OPENED");
    drop(store);
    std::process::exit(0);
}

/// Runs the child on `dir` and kills it `delay` after it said it opens.
/// Returns whether it was killed (else it had finished).
fn open_and_kill(dir: &Path, delay: Duration) -> bool {
    let mut child = common::child_test("fold_child")
        .env(FOLD_DIR_VAR, dir)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || common::forward_lines(stdout, tx));
    let stderr = common::read_in_background(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line == "OPENING" => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the child never began to open ({e:?}); stderr:\n{}",
                    stderr.join().unwrap_or_default()
                );
            }
        }
    }
    std::thread::sleep(delay);
    let _ = child.kill();
    let status = child.wait().expect("waiting for the child");
    reader.join().expect("stdout reader");
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(libc::SIGKILL) => true,
        _ => {
            assert!(
                status.success(),
                "the child failed ({status}); stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
            false
        }
    }
}

/// A format-6 dir of 40,001 queued tasks (four batches of 10,000 in three
/// queues, and one more), its open killed with SIGKILL at several moments, some of them
/// while its `q` keys are being folded (four sled batches): every reopen
/// has every task in its place, nothing corrupt, no `q` key left, and the
/// log agrees with the state.
#[test]
fn a_kill_9_during_a_fold_loses_no_position() {
    let template = tempdir();
    let clock = FakeClock::new(T0);
    let want = {
        let s = open(template.path(), &clock);
        for b in 0..4 {
            let q = ["main", "other", "third"][b % 3];
            let specs: Vec<TaskSpec> = (0..10_000).map(|i| spec(q, &format!("b{b}-{i}"))).collect();
            submit::enqueue_batch(&s, specs).expect("a batch");
        }
        // A small last record (`make_format_6` rewrites it whole).
        add(&s, "main", "last", Placement::Last);
        queues(&s)
    };
    let total = make_format_6(template.path(), |_| true, true, 6);
    assert_eq!(total, 40_001);
    let (mut killed, mut mid_fold) = (0, 0);
    for delay_ms in [0, 150, 250, 400, 600, 900] {
        let tmp = tempdir();
        let dir = tmp.path().join("data");
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(template.path())
            .arg(&dir)
            .status()
            .expect("cp");
        assert!(status.success());
        let ctx = format!("killed {delay_ms} ms into its open");
        if open_and_kill(&dir, Duration::from_millis(delay_ms)) {
            killed += 1;
            let (_, left) = inspect(&dir);
            if left > 0 && left < total {
                mid_fold += 1;
            }
            eprintln!("{ctx}: {left} of {total} q keys left");
        }
        let s = open(&dir, &clock);
        assert!(
            s.corrupt_records().is_empty(),
            "{ctx}: {:?}",
            s.corrupt_records()
        );
        assert!(queues(&s) == want, "{ctx}: the queues differ");
        assert_log_agrees(&s);
        drop(s);
        assert_eq!(inspect(&dir), (keys::STORE_FORMAT, 0), "{ctx}");
    }
    eprintln!("{killed} opens killed, {mid_fold} of them in the middle of the fold");
}

//! A kill -9 while a format-6 data dir is folded at open (its `q` keys
//! going into the tasks' values, `store::open::fold_queue_keys`). A test
//! binary of its own: run beside other tests that open sled directly, its
//! children made those opens fail now and then on sled's lock.

mod common;

use std::path::Path;
use std::time::Duration;

use berth::clock::FakeClock;
use berth::store::{Options, Placement, Store, keys};
use berth::submit;
use berth::task::TaskSpec;
use common::format6::{inspect, make_format_6, queues};
use common::{T0, assert_log_agrees, open, spec, tempdir};

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
    let (status, stderr) = common::kill_after_line(
        common::child_test("fold_child").env(FOLD_DIR_VAR, dir),
        "OPENING line",
        |l| l == "OPENING",
        delay,
    );
    use std::os::unix::process::ExitStatusExt;
    if status.signal() == Some(libc::SIGKILL) {
        return true;
    }
    assert!(
        status.success(),
        "the child failed ({status}); stderr:\n{stderr}"
    );
    false
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
        submit::enqueue_one(&s, spec("main", "last"), Placement::Last).expect("enqueue");
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

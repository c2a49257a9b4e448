//! `berth task list` on a mixed history made by a real daemon: a success, a
//! dead letter, a running task and a queued one. Filters, the table and the
//! JSON fields; and the same output through the daemon and without it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::daemon::{Daemon, write_root};
use common::{enqueue_id, stderr, stdout, task_json, tempdir, wait_for};

const HOOK: &str = r#"#!/bin/sh
cat >/dev/null
case "$BERTH_TASK_NAME" in
  ok*) echo '{"done":true}' ;;
  fail*) echo "some noise" >&2; echo "helm upgrade failed: cannot patch \"mcplay\"" >&2; exit 3 ;;
  hold*) while [ ! -e never ]; do sleep 0.05; done ;;
esac
"#;

use common::NOW;

fn list(dir: &Path, args: &[&str]) -> Output {
    Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(["task", "list"])
        .args(args)
        .env("BERTH_NOW", NOW)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run berth")
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

fn ids(json: &str) -> Vec<u64> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(json).expect("json rows");
    rows.iter().filter_map(|r| r["id"].as_u64()).collect()
}

#[test]
fn task_list_finds_every_task_with_filters_the_same_with_and_without_a_daemon() {
    let root = tempdir();
    write_root(
        root.path(),
        HOOK,
        "[retry]\ninitial = \"1s\"\nmax_attempts = 1\n[handlers.Sh]\ncommand = [\"./hook.sh\"]\n",
    );
    let mut daemon = Daemon::start_in(root.path());
    let dir = daemon.dir.clone();
    let enq = |queue: &str, name: &str| {
        enqueue_id(&dir, &["--queue", queue, "--kind", "Sh", "--name", name])
    };
    let good = enq("main", "ok-1");
    let dead = enq("main", "fail-1");
    let running = enq("side", "hold-1");
    let queued = enq("side", "queued-1");
    wait_for("the tasks to settle", || {
        task_json(&dir, good)["status"] == "succeeded"
            && task_json(&dir, dead)["status"] == "failed"
            && task_json(&dir, running)["status"] == "running"
    });

    let cases: [&[&str]; 9] = [
        &[],
        &["-o", "json"],
        &["--status", "dead"],
        &["--status", "live"],
        &["--status", "history", "-o", "json"],
        &["--queue", "side"],
        &[
            "--kind", "Sh", "--name", "*-1", "--status", "queued", "--status", "running",
        ],
        &[
            "--since",
            "2020-01-01T00:00:00Z",
            "--until",
            "2029-12-31T23:59:59Z",
        ],
        &["--since", "1m"],
    ];
    let through: Vec<String> = cases.iter().map(|a| ok(list(&dir, a))).collect();

    // The table: ids, statuses, where each one is, the dead letter's message.
    let table = &through[0];
    let line = |id: u64| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
            .unwrap_or_else(|| panic!("no line for task {id} in\n{table}"))
            .to_string()
    };
    assert!(table.starts_with("ID  QUEUE  KIND  NAME"), "{table}");
    assert!(line(good).contains("succeeded"), "{}", line(good));
    let d = line(dead);
    assert!(
        d.contains(" dead ") && d.contains("helm upgrade failed: cannot patch \"mcplay\""),
        "{d}"
    );
    assert!(line(running).contains("running "), "{}", line(running));
    assert!(line(queued).contains("#2, queued"), "{}", line(queued));

    // JSON: real fields.
    let rows: Vec<serde_json::Value> = serde_json::from_str(&through[1]).expect("json");
    let row = |id: u64| {
        rows.iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no row {id}"))
            .clone()
    };
    assert_eq!(row(dead)["status"], "failed");
    assert_eq!(row(dead)["dead_letter"], true);
    assert_eq!(row(dead)["place"], "history");
    assert_eq!(row(dead)["failures"], 1);
    assert_eq!(row(queued)["place"], "queue");
    assert_eq!(row(queued)["position"], 2);
    assert_eq!(row(running)["status"], "running");
    assert!(row(good)["finished_at"].as_u64().is_some());

    // Filters.
    assert_eq!(
        ids(&ok(list(&dir, &["--status", "dead", "-o", "json"]))),
        [dead]
    );
    assert_eq!(
        ids(&ok(list(&dir, &["--status", "live", "-o", "json"]))),
        [running, queued]
    );
    assert_eq!(ids(&through[4]), [good, dead]);
    assert_eq!(
        ids(&ok(list(&dir, &["--queue", "side", "-o", "json"]))),
        [running, queued]
    );
    assert_eq!(
        ids(&ok(list(
            &dir,
            &[
                "--name", "*-1", "--status", "queued", "--status", "running", "-o", "json"
            ]
        ))),
        [running, queued]
    );
    // Everything happened "now" by the real clock, long before 2030 and after 2020.
    assert_eq!(
        ids(&ok(list(
            &dir,
            &["--until", "2020-01-01T00:00:00Z", "-o", "json"]
        ))),
        Vec::<u64>::new()
    );
    assert!(through[7].lines().count() == 5, "{}", through[7]);
    // `--since 1m` is one minute before BERTH_NOW (2030): nothing.
    assert_eq!(through[8].lines().count(), 1, "{}", through[8]);

    // Bad input is refused with exit 2, before anything is read.
    for (args, says) in [
        (&["--status", "zombie"][..], "'zombie' is not a status"),
        (
            &["--since", "yesterday"][..],
            "--since: 'yesterday' is not a time",
        ),
    ] {
        let o = list(&dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }

    // Without the daemon (killed: the held task stays `running` in the
    // store, as it was), every listing is the same.
    daemon.signal(libc::SIGKILL);
    daemon.wait_exit(std::time::Duration::from_secs(20));
    for (args, before) in cases.iter().zip(&through) {
        common::assert_text_eq(&ok(list(&dir, args)), before);
    }
}

/// A queue, kind or node name that no task can have (`enqueue` refuses it)
/// is bad input for the filters too, naming the flag, not an empty table;
/// a valid name that no task has is an empty table. `berth log --queue`
/// checks its name the same way.
#[test]
fn filters_with_names_no_task_can_have_are_refused() {
    let root = tempdir();
    let dir = root.path().join("data");
    enqueue_id(&dir, &["--queue", "main", "--kind", "Sh", "--name", "ok-1"]);
    for (args, says) in [
        (
            &["--queue", "bad q"][..],
            "--queue: queue 'bad q' has the character ' '",
        ),
        (
            &["--queue", ""],
            "--queue: queue '' must be 1 to 64 characters",
        ),
        (
            &["--target", "bad node"],
            "--target: target node 'bad node' has the character ' '",
        ),
        (
            &["--kind", "a/b"],
            "--kind: kind 'a/b' has the character '/'",
        ),
    ] {
        let o = list(&dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert_eq!(stdout(&o), "", "{args:?}");
    }
    for args in [&["--queue", "nowhere"][..], &["--target", "edge-9"]] {
        assert_eq!(
            ok(list(&dir, args)).lines().count(),
            1,
            "{args:?}: only the header"
        );
    }
    let o = common::berth(&dir, &["log", "--queue", "bad q"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--queue: queue 'bad q' has the character ' '"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "");
}

/// A task cancelled while it waits for its retry finished long after its
/// last attempt ended: `took` is that attempt's (from its log), not the
/// time from its start to the cancel.
#[test]
fn a_task_cancelled_in_its_backoff_shows_how_long_its_last_attempt_took() {
    use berth::clock::FakeClock;
    use berth::ops::{Ctx, TaskFilter, task_list};
    use berth::store::Placement;
    use berth::store::attempts::{AttemptLog, AttemptOutcome};

    let dir = tempdir();
    let clock = FakeClock::new(common::T0);
    let store = common::open(dir.path(), &clock);
    let id =
        berth::submit::enqueue_one(&store, common::spec("main", "flaky"), Placement::Last).unwrap();
    let mut w = store.write();
    w.start(id).unwrap();
    w.commit().unwrap();
    clock.advance_ms(20);
    let mut w = store.write();
    let log = AttemptLog {
        outcome: AttemptOutcome::Failed {
            message: "boom".into(),
        },
        ..AttemptLog::interrupted(1, Some(common::T0), common::T0 + 20)
    };
    w.log_attempt(id, log).unwrap();
    w.fail(id, "boom".into(), Some(30_000)).unwrap();
    w.commit().unwrap();
    clock.advance_ms(5_000);
    let mut w = store.write();
    w.cancel(id, &|_| false).unwrap();
    w.commit().unwrap();
    let rows = task_list(&Ctx::direct(Some(&store), None), &TaskFilter::default()).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "cancelled");
    assert_eq!(rows[0].took_ms, Some(20));
    let table = berth::report::render_task_table(&rows, common::T0 + 5_020, None);
    assert!(table.contains("0s ago, took 20ms"), "{table}");
}

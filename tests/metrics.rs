//! `berth metrics`: the Prometheus text of a known run, parsed back and
//! checked against what the run did; accepted by `promtool check metrics`;
//! written by the daemon to its textfile; the same counters with a daemon
//! and without one.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use berth::backoff::Backoff;
use berth::clock::FakeClock;
use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::ops::{Ctx, metrics};
use berth::store::{Options, Placement, Store};
use berth::task::TaskSpec;
use common::daemon::{Daemon, write_root};
use common::{T0, stderr, stdout, tempdir, wait_for};

/// Parsed samples: `name{labels}` (labels sorted, as written) → value.
type Samples = BTreeMap<String, f64>;

/// Parses the text exposition format: `# HELP`/`# TYPE` lines and one
/// sample per line; every line must be one of these.
fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    let mut typed = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(typed.insert(name.to_string()), "{name} typed twice");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("{line}: {e}")),
        };
        let name = series.split('{').next().unwrap_or(series);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "{line}: no # TYPE before it");
        assert!(
            out.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    out
}

fn get(s: &Samples, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no sample {series} in {s:#?}"))
}

fn spec(kind: &str, name: &str) -> TaskSpec {
    TaskSpec {
        queue: "main".into(),
        kind: kind.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// The known run, on a fake clock whose time only the handlers move:
/// three `Ok` tasks that take 250 ms each (one enqueued twice with a
/// compaction key, merged), a `Flaky` one that fails once after 40 ms and
/// then succeeds after 1.2 s, a `Bad` one that fails twice (a dead letter),
/// and one for another node, which stays.
fn known_run(dir: &Path) -> (Arc<Store>, Engine, berth::engine::RunSummary) {
    let clock = FakeClock::auto_advancing(T0);
    let store =
        Arc::new(Store::open(dir, Options::default(), Arc::new(clock.clone())).expect("open"));
    let add =
        |s: TaskSpec| berth::submit::enqueue_one(&store, s, Placement::Last).expect("enqueue");
    let keyed = |v: i64| TaskSpec {
        compaction_key: Some("ok-1".into()),
        payload: serde_json::json!({ "v": v }),
        ..spec("Ok", "ok-1")
    };
    assert_eq!(add(keyed(1)), add(keyed(2)));
    add(spec("Ok", "ok-2"));
    add(spec("Flaky", "flaky"));
    add(spec("Bad", "bad"));
    add(spec("Ok", "ok-3"));
    add(TaskSpec {
        target: Some("edge-2".into()),
        ..spec("Ok", "elsewhere")
    });
    let mut h = Handlers::new();
    let c = clock.clone();
    h.register("Ok", move |_: &TaskContext| {
        c.advance_ms(250);
        Outcome::success()
    });
    let c = clock.clone();
    let tries = Arc::new(AtomicU32::new(0));
    h.register("Flaky", move |_: &TaskContext| {
        if tries.fetch_add(1, Ordering::SeqCst) == 0 {
            c.advance_ms(40);
            Outcome::fail("not yet")
        } else {
            c.advance_ms(1_200);
            Outcome::success()
        }
    });
    h.register("Bad", |_: &TaskContext| Outcome::fail("never"));
    let cfg = EngineConfig {
        node: Some("edge-1".into()),
        backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(2),
            max_attempts: 2,
        },
        ..Default::default()
    };
    let engine = Engine::new(store.clone(), h, cfg).expect("engine");
    let summary = engine.run_until_idle().expect("run");
    (store, engine, summary)
}

#[test]
fn the_metrics_of_a_known_run_say_what_it_did() {
    let dir = tempdir();
    let (store, engine, summary) = known_run(dir.path());
    let kinds = engine.kinds();
    let text = berth::metrics::render(&metrics(&Ctx::daemon(&engine, &kinds)).expect("metrics"));
    let m = parse(&text);

    // What the engine counted itself agrees.
    assert_eq!(summary.tally.succeeded, 4);
    assert_eq!(summary.tally.failed_attempts, 3);
    assert_eq!(summary.tally.dead_letters, 1);
    let sum = |prefix: &str| -> f64 {
        m.iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!(
        sum("berth_tasks_finished_total{") - sum("berth_tasks_finished_total{kind=\"Bad\""),
        summary.tally.succeeded as f64
    );
    assert_eq!(
        sum("berth_attempts_total{")
            - sum("berth_attempts_total{kind=\"Ok\"")
            - get(
                &m,
                "berth_attempts_total{kind=\"Flaky\",outcome=\"succeeded\"}"
            ),
        summary.tally.failed_attempts as f64
    );

    // Counters, by kind and outcome.
    assert_eq!(get(&m, "berth_tasks_enqueued_total{kind=\"Ok\"}"), 4.0);
    assert_eq!(get(&m, "berth_tasks_merged_total{kind=\"Ok\"}"), 1.0);
    assert_eq!(get(&m, "berth_attempts_started_total{kind=\"Ok\"}"), 3.0);
    assert_eq!(get(&m, "berth_attempts_started_total{kind=\"Flaky\"}"), 2.0);
    assert_eq!(get(&m, "berth_attempts_started_total{kind=\"Bad\"}"), 2.0);
    let outcome = |kind: &str, o: &str| {
        get(
            &m,
            &format!("berth_attempts_total{{kind=\"{kind}\",outcome=\"{o}\"}}"),
        )
    };
    assert_eq!(outcome("Ok", "succeeded"), 3.0);
    assert_eq!(outcome("Ok", "failed"), 0.0);
    assert_eq!(outcome("Flaky", "failed"), 1.0);
    assert_eq!(outcome("Flaky", "succeeded"), 1.0);
    assert_eq!(outcome("Bad", "failed"), 2.0);
    assert_eq!(outcome("Bad", "requeued"), 0.0);
    let finished = |kind: &str, o: &str| {
        get(
            &m,
            &format!("berth_tasks_finished_total{{kind=\"{kind}\",outcome=\"{o}\"}}"),
        )
    };
    assert_eq!(finished("Ok", "succeeded"), 3.0);
    assert_eq!(finished("Flaky", "succeeded"), 1.0);
    assert_eq!(finished("Bad", "dead_letter"), 1.0);
    assert_eq!(finished("Bad", "succeeded"), 0.0);
    assert_eq!(finished("Ok", "cancelled"), 0.0);
    assert_eq!(finished("Ok", "expired"), 0.0);

    // Attempt durations: 3 × 250 ms; 40 ms and 1.2 s.
    let h = |kind: &str, le: &str| {
        get(
            &m,
            &format!("berth_attempt_duration_seconds_bucket{{kind=\"{kind}\",le=\"{le}\"}}"),
        )
    };
    assert_eq!(h("Ok", "0.1"), 0.0);
    assert_eq!(h("Ok", "0.25"), 3.0);
    assert_eq!(h("Ok", "+Inf"), 3.0);
    assert_eq!(
        get(&m, "berth_attempt_duration_seconds_sum{kind=\"Ok\"}"),
        0.75
    );
    assert_eq!(
        get(&m, "berth_attempt_duration_seconds_count{kind=\"Ok\"}"),
        3.0
    );
    assert_eq!(h("Flaky", "0.025"), 0.0);
    assert_eq!(h("Flaky", "0.05"), 1.0);
    assert_eq!(h("Flaky", "1"), 1.0);
    assert_eq!(h("Flaky", "2.5"), 2.0);
    assert_eq!(
        get(&m, "berth_attempt_duration_seconds_sum{kind=\"Flaky\"}"),
        1.24
    );
    // Waits: one per task's first start; ok-1 started first, at once.
    assert_eq!(get(&m, "berth_task_wait_seconds_count{kind=\"Ok\"}"), 3.0);
    assert_eq!(
        get(
            &m,
            "berth_task_wait_seconds_bucket{kind=\"Ok\",le=\"0.005\"}"
        ),
        1.0
    );

    // Gauges: the task for another node is all that is left.
    assert_eq!(get(&m, "berth_queue_length{queue=\"main\"}"), 1.0);
    assert_eq!(
        get(&m, "berth_queue_length{queue=\"parallel_queue_9\"}"),
        0.0
    );
    assert_eq!(
        get(&m, "berth_queue_tasks_for_other_nodes{queue=\"main\"}"),
        1.0
    );
    assert_eq!(
        get(&m, "berth_queue_oldest_wait_seconds{queue=\"main\"}"),
        0.0,
        "nothing waits for this node"
    );
    assert_eq!(get(&m, "berth_tasks_running"), 0.0);
    assert_eq!(get(&m, "berth_node_info{node=\"edge-1\",tags=\"\"}"), 1.0);
    assert!(get(&m, "berth_store_size_bytes") > 0.0);
    assert!(get(&m, "berth_disk_free_bytes") > 0.0);
    assert_eq!(
        get(&m, "berth_store_events_total"),
        (store.next_seq() - 1) as f64
    );
    // What only the engine knows: it ran and has ended.
    assert_eq!(get(&m, "berth_daemon_running"), 0.0);
    assert!(get(&m, "berth_engine_steps_total") >= 6.0);
    assert!(get(&m, "berth_last_step_timestamp_seconds") >= T0 as f64 / 1000.0);
    let flushes = get(&m, "berth_store_flush_duration_seconds_count");
    assert!(flushes > 0.0);
    assert_eq!(
        get(&m, "berth_store_flush_duration_seconds_bucket{le=\"+Inf\"}"),
        flushes
    );

    // Without the engine, from the store alone (also after a reopen), the
    // counters are the same, and the engine's own families are not there.
    drop(engine);
    drop(store);
    let store = common::open(dir.path(), &FakeClock::new(T0));
    let direct = parse(&berth::metrics::render(
        &metrics(&Ctx::direct(Some(&store), None)).expect("metrics"),
    ));
    let counters = |s: &Samples| -> Samples {
        s.iter()
            .filter(|(k, _)| k.contains("_total{") || k.contains("_seconds_"))
            .filter(|(k, _)| !k.starts_with("berth_store_flush"))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    assert_eq!(counters(&direct), counters(&m));
    assert_eq!(get(&direct, "berth_daemon_running"), 0.0);
    assert!(!direct.contains_key("berth_engine_steps_total"));
    assert_eq!(verify_diffs(&store), Vec::<String>::new());
}

fn verify_diffs(store: &Store) -> Vec<String> {
    berth::store::verify::verify(store).expect("replay")
}

/// Runs `promtool check metrics` on `text`; None (after saying why) when
/// promtool is not installed.
fn promtool(text: &str) -> Option<(bool, String)> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "SKIPPED: promtool is not installed here ({e}); Debian's `prometheus` package has it"
            );
            return None;
        }
    };
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("write to promtool");
    }
    let o = child.wait_with_output().expect("promtool");
    let said = format!("{}{}", stdout(&o), stderr(&o));
    Some((o.status.success() && said.trim().is_empty(), said))
}

#[test]
fn promtool_accepts_the_metrics() {
    let dir = tempdir();
    let (_store, engine, _) = known_run(dir.path());
    let kinds = engine.kinds();
    let text = berth::metrics::render(&metrics(&Ctx::daemon(&engine, &kinds)).expect("metrics"));
    let Some((ok, said)) = promtool(&text) else {
        return;
    };
    assert!(ok, "promtool check metrics: {said}\n{text}");
    // promtool does find problems: a counter without _total is one.
    let bad = "# HELP berth_x Bad.\n# TYPE berth_x counter\nberth_x 1\n";
    let (ok, said) = promtool(bad).expect("promtool ran before");
    assert!(!ok, "promtool accepted a counter without _total: {said}");
}

const HOOK: &str = "#!/bin/sh\ncat >/dev/null\necho '\"ok\"'\n";

#[test]
fn the_daemon_writes_its_textfile_and_berth_metrics_reads_the_same_counters() {
    let root = tempdir();
    let prom = root.path().join("berth.prom");
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"data\"\nnode = \"edge-1\"\ntags = [\"gluster\"]\n\
         [metrics]\ntextfile = \"berth.prom\"\ninterval = \"1s\"\n\
         [handlers.Work]\ncommand = [\"./hook.sh\"]\n",
    );
    let dir = root.path().join("data");
    let mut d = Daemon::start(&cfg, &dir, &[]);
    for name in ["a", "b", "c"] {
        common::enqueue_id(&dir, &["--queue", "main", "--kind", "Work", "--name", name]);
    }
    common::enqueue_id(
        &dir,
        &[
            "--queue", "main", "--kind", "Work", "--name", "gpu", "--tag", "gpu",
        ],
    );
    let finished = "berth_tasks_finished_total{kind=\"Work\",outcome=\"succeeded\"} 3\n";
    wait_for("the textfile to count the three tasks", || {
        std::fs::read_to_string(&prom).is_ok_and(|t| t.contains(finished))
    });
    let text = std::fs::read_to_string(&prom).expect("textfile");
    let m = parse(&text);
    assert_eq!(get(&m, "berth_daemon_running"), 1.0);
    assert_eq!(
        get(&m, "berth_queue_tasks_for_other_nodes{queue=\"main\"}"),
        1.0
    );
    assert_eq!(
        get(&m, "berth_node_info{node=\"edge-1\",tags=\"gluster\"}"),
        1.0
    );
    if let Some((ok, said)) = promtool(&text) {
        assert!(ok, "promtool check metrics: {said}\n{text}");
    }
    // `berth metrics` through the daemon: the same counters.
    let o = common::berth(&dir, &["metrics"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let live = parse(&stdout(&o));
    assert_eq!(get(&live, "berth_daemon_running"), 1.0);
    assert!(get(&live, "berth_engine_steps_total") > 0.0);
    assert_eq!(
        get(
            &live,
            "berth_attempts_total{kind=\"Work\",outcome=\"succeeded\"}"
        ),
        3.0
    );
    let o = common::berth(&dir, &["metrics", "-o", "json"]);
    let families: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("json");
    assert!(
        families
            .iter()
            .any(|f| f["name"] == "berth_attempt_duration_seconds" && f["type"] == "histogram")
    );

    // At the stop, a last textfile says the daemon no longer runs.
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    let m = parse(&std::fs::read_to_string(&prom).expect("textfile"));
    assert_eq!(get(&m, "berth_daemon_running"), 0.0);
    assert!(m.contains_key("berth_last_step_timestamp_seconds"));
    // Without a daemon: the same counters, from the store.
    let o = common::berth(&dir, &["metrics"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let direct = parse(&stdout(&o));
    assert_eq!(
        get(&direct, finished.trim_end().rsplit_once(' ').unwrap().0),
        3.0
    );
    assert_eq!(get(&direct, "berth_daemon_running"), 0.0);
    assert!(!direct.contains_key("berth_engine_steps_total"));
    let names: Vec<_> = std::fs::read_dir(root.path())
        .expect("read root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("prom"))
        .collect();
    assert_eq!(names, vec!["berth.prom"], "no temporary file is left");
    // Readable by node_exporter, whatever the daemon's umask.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(root.path().join("berth.prom"))
        .expect("the textfile")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

/// A group parent stays `queued` while its children run, but it does not
/// wait: once its group has started, its queue's oldest wait leaves it out
/// (a long group would otherwise look like a stuck queue).
#[test]
fn a_started_group_is_not_a_waiting_task() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let store = common::open(dir.path(), &clock);
    let specs = ["a", "b"]
        .iter()
        .map(|n| TaskSpec {
            weight: Some(1),
            ..spec("Ok", n)
        })
        .collect();
    let parent = berth::submit::enqueue_batch(&store, specs).unwrap()[0];
    let children = store.task(parent).unwrap().unwrap().children;
    clock.advance_ms(5_000);
    let wait = |store: &Store, q: &str| {
        let m = parse(&berth::metrics::render(
            &metrics(&Ctx::direct(Some(store), None)).expect("metrics"),
        ));
        get(
            &m,
            &format!("berth_queue_oldest_wait_seconds{{queue=\"{q}\"}}"),
        )
    };
    assert_eq!(wait(&store, "main"), 5.0, "a group not started waits");
    let mut w = store.write();
    w.place(children[0], "parallel_queue_0", Placement::Last)
        .unwrap();
    w.commit().unwrap();
    clock.advance_ms(5_000);
    assert_eq!(wait(&store, "main"), 0.0, "the started group does not");
    assert_eq!(wait(&store, "parallel_queue_0"), 10.0, "its child waits");
}

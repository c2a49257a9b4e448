//! The engine on a fake clock: backoff, results, follow-ups, pre/post,
//! panics, missing handlers, dead letters, statuses, and groups.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth::backoff::Backoff;
use berth::clock::{Clock, FakeClock};
use berth::engine::{
    Engine, EngineConfig, FollowUpAt, Handler, Handlers, Outcome, RunResult, TaskContext,
};
use berth::report::render_text;
use berth::store::{Options, Placement, Store};
use berth::task::{Status, TaskSpec};
use common::{T0, assert_log_agrees, spec, tempdir, wait_for};

/// Fields drop in declaration order: the store (which writes its last
/// pending changes when dropped) must go before its directory is deleted.
struct Setup {
    store: Arc<Store>,
    clock: FakeClock,
    _dir: tempfile::TempDir,
}

fn setup(clock: FakeClock) -> Setup {
    let dir = tempdir();
    let store =
        Arc::new(Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).unwrap());
    Setup {
        _dir: dir,
        clock,
        store,
    }
}

fn engine(s: &Setup, h: Handlers, cfg: EngineConfig) -> Engine {
    Engine::new(s.store.clone(), h, cfg).unwrap()
}

/// A task of kind `k` in queue `q`, named `n`.
fn kind(k: &str, q: &str, n: &str) -> TaskSpec {
    TaskSpec {
        kind: k.into(),
        ..spec(q, n)
    }
}

/// Enqueues one task of kind `k` in queue `q` per name, all of one weight:
/// one group. Returns its parent.
fn group(e: &Engine, k: &str, q: &str, names: &[&str]) -> u64 {
    let specs = names
        .iter()
        .map(|n| TaskSpec {
            weight: Some(1),
            ..kind(k, q, n)
        })
        .collect();
    e.enqueue_batch(specs).unwrap()[0]
}

/// A log of (task name, attempt, time) per run.
type Runs = Arc<Mutex<Vec<(String, u32, u64)>>>;

fn recording<F>(clock: &FakeClock, runs: &Runs, f: F) -> impl Handler + use<F>
where
    F: Fn(&TaskContext) -> Outcome + Send + Sync + 'static,
{
    let (clock, runs) = (clock.clone(), runs.clone());
    move |ctx: &TaskContext| {
        runs.lock()
            .unwrap()
            .push((ctx.task.name.clone(), ctx.attempt, clock.now_ms()));
        f(ctx)
    }
}

/// Handlers that block until the gate opens.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn wait(&self) {
        let (m, cv) = &*self.0;
        let mut open = m.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
    }
    fn open(&self) {
        let (m, cv) = &*self.0;
        *m.lock().unwrap() = true;
        cv.notify_all();
    }
    /// A handler that counts its starts in `started`, then waits for the gate.
    fn handler(&self, started: &Arc<AtomicU32>) -> impl Handler + use<> {
        let (gate, started) = (self.clone(), started.clone());
        move |_: &TaskContext| {
            started.fetch_add(1, Ordering::SeqCst);
            gate.wait();
            Outcome::success()
        }
    }
}

/// Opens the gate and stops the engine when dropped, so a failed assertion
/// ends the test instead of leaving the engine thread waiting.
struct Release(Gate, berth::engine::StopHandle);

impl Drop for Release {
    fn drop(&mut self) {
        self.1.stop();
        self.0.open();
    }
}

#[test]
fn failed_heads_retry_with_addon_operators_backoff() {
    let s = setup(FakeClock::auto_advancing(T0));
    let runs: Runs = Default::default();
    let mut h = Handlers::new();
    h.register(
        "ModuleRun",
        recording(&s.clock, &runs, |ctx| {
            if ctx.task.name == "m" && ctx.attempt <= 8 {
                Outcome::fail(format!("attempt {} failed", ctx.attempt))
            } else {
                Outcome::success()
            }
        }),
    );
    let e = engine(&s, h, EngineConfig::default());
    let id = e.enqueue(spec("main", "m"), Placement::Last).unwrap();
    let b = e.enqueue(spec("main", "behind"), Placement::Last).unwrap();
    let sum = e.run_until_idle().unwrap();
    let runs = runs.lock().unwrap();
    let m: Vec<_> = runs.iter().filter(|r| r.0 == "m").collect();
    assert_eq!(m.len(), 9);
    let gaps: Vec<u64> = m.windows(2).map(|w| w[1].2 - w[0].2).collect();
    let windows = [
        (5000, 5000),
        (6000, 6900),
        (7000, 7900),
        (9000, 9900),
        (13000, 13900),
        (21000, 21900),
        (32000, 32000),
        (32000, 32000),
    ];
    for (g, (lo, hi)) in gaps.iter().zip(windows) {
        assert!(
            *g >= lo && *g <= hi && g % 100 == 0,
            "gap {g} not in [{lo}, {hi}]: {gaps:?}"
        );
    }
    // The failing head blocked the task behind it until it succeeded.
    assert_eq!(runs.last().unwrap().0, "behind");
    assert_eq!(sum.tally.succeeded, 2);
    assert_eq!(sum.tally.failed_attempts, 8);
    let t = s.store.task(id).unwrap().unwrap();
    assert_eq!(
        (t.status, t.failures, t.attempts),
        (Status::Succeeded, 8, 9)
    );
    assert_eq!(t.last_failure.as_deref(), Some("attempt 8 failed"));
    assert_eq!(s.store.task(b).unwrap().unwrap().status, Status::Succeeded);
    assert_log_agrees(&s.store);
}

/// A failed head's backoff is that head's: a task put ahead of it
/// (`enqueue --first`) runs at once, and the failed task retries when its
/// own time comes, as the head again.
#[test]
fn a_task_put_ahead_of_a_head_in_backoff_does_not_wait_for_it() {
    let s = setup(FakeClock::new(T0));
    let runs: Runs = Default::default();
    let mut h = Handlers::new();
    h.register(
        "ModuleRun",
        recording(&s.clock, &runs, |ctx| {
            if ctx.task.name == "flaky" && ctx.attempt == 1 {
                Outcome::fail("boom")
            } else {
                Outcome::success()
            }
        }),
    );
    let e = engine(&s, h, EngineConfig::default());
    let flaky = e.enqueue(spec("main", "flaky"), Placement::Last).unwrap();
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(Gate::default(), stop.clone());
        wait_for("the first failure", || {
            s.store.task(flaky).unwrap().unwrap().failures == 1
        });
        let urgent = e.enqueue(spec("main", "urgent"), Placement::First).unwrap();
        wait_for("the task put ahead, within the backoff", || {
            s.store.task(urgent).unwrap().unwrap().status == Status::Succeeded
        });
        assert_eq!(s.clock.now_ms(), T0, "no time passed");
        let f = s.store.task(flaky).unwrap().unwrap();
        assert_eq!(
            (f.attempts, f.status),
            (1, Status::Queued),
            "it waits for its retry"
        );
        s.clock.advance_ms(5_000);
        wait_for("the retry", || {
            s.store.task(flaky).unwrap().unwrap().status == Status::Succeeded
        });
        stop.stop();
        runner.join().unwrap().unwrap();
    });
    let order: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| (r.0.clone(), r.2))
        .collect();
    assert_eq!(
        order,
        [
            ("flaky".to_string(), T0),
            ("urgent".to_string(), T0),
            ("flaky".to_string(), T0 + 5_000)
        ]
    );
}

#[test]
fn repeat_and_keep_run_again_without_counting_failures() {
    let s = setup(FakeClock::auto_advancing(T0));
    let runs: Runs = Default::default();
    let mut h = Handlers::new();
    h.register(
        "ModuleRun",
        recording(&s.clock, &runs, |ctx| {
            match (ctx.task.name.as_str(), ctx.attempt) {
                ("r", 1 | 2) => Outcome::new(RunResult::Repeat),
                ("k", 1) => Outcome::new(RunResult::Keep).with_delay(Duration::from_secs(3)),
                ("k", 2) => Outcome::new(RunResult::Keep),
                _ => Outcome::success().with_output(serde_json::json!({"done": ctx.attempt})),
            }
        }),
    );
    let e = engine(
        &s,
        h,
        EngineConfig {
            keep_delay: Duration::from_secs(7),
            ..Default::default()
        },
    );
    let r = e.enqueue(spec("a", "r"), Placement::Last).unwrap();
    let k = e.enqueue(spec("b", "k"), Placement::Last).unwrap();
    e.run_until_idle().unwrap();
    let runs = runs.lock().unwrap();
    let times = |n: &str| {
        runs.iter()
            .filter(|x| x.0 == n)
            .map(|x| x.2 - T0)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        times("r"),
        vec![0, 1000, 2000],
        "repeat runs again, at most once a second"
    );
    assert_eq!(
        times("k"),
        vec![0, 3000, 10_000],
        "keep waits its delay, else the default"
    );
    for id in [r, k] {
        let t = s.store.task(id).unwrap().unwrap();
        assert_eq!(
            (t.status, t.failures, t.attempts),
            (Status::Succeeded, 0, 3)
        );
        let out = t
            .result
            .unwrap()
            .to_json("result", s.store.budget())
            .unwrap();
        assert_eq!(out["done"], 3);
    }
    assert_log_agrees(&s.store);
}

#[test]
fn follow_ups_go_to_the_head_the_tail_or_right_after() {
    let s = setup(FakeClock::auto_advancing(T0));
    let runs: Runs = Default::default();
    let mut h = Handlers::new();
    h.register(
        "ModuleRun",
        recording(&s.clock, &runs, |ctx| {
            if ctx.task.name == "a" {
                let f = |n: &str| TaskSpec {
                    queue: String::new(),
                    ..spec("", n)
                };
                Outcome::success()
                    .with_follow_up(f("head"), FollowUpAt::Head)
                    .with_follow_up(f("tail"), FollowUpAt::Tail)
                    .with_follow_up(f("after"), FollowUpAt::AfterCurrent)
            } else {
                Outcome::success()
            }
        }),
    );
    let e = engine(&s, h, EngineConfig::default());
    for n in ["a", "b", "c"] {
        e.enqueue(spec("main", n), Placement::Last).unwrap();
    }
    e.run_until_idle().unwrap();
    let order: Vec<_> = runs.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert_eq!(order, vec!["a", "head", "after", "b", "c", "tail"]);
    assert_log_agrees(&s.store);
}

struct Checked {
    pre_ok: bool,
    post_ok: bool,
    ran: Arc<AtomicU32>,
}

impl Handler for Checked {
    fn pre(&self, _: &TaskContext) -> Result<(), String> {
        if self.pre_ok {
            Ok(())
        } else {
            Err("volume not mounted".into())
        }
    }
    fn run(&self, _: &TaskContext) -> Outcome {
        self.ran.fetch_add(1, Ordering::SeqCst);
        Outcome::success()
    }
    fn post(&self, _: &TaskContext, _: &Outcome) -> Result<(), String> {
        if self.post_ok {
            Ok(())
        } else {
            Err("service not healthy".into())
        }
    }
}

#[test]
fn pre_post_panics_and_missing_handlers_fail_the_attempt() {
    let s = setup(FakeClock::auto_advancing(T0));
    let ran_pre = Arc::new(AtomicU32::new(0));
    let ran_post = Arc::new(AtomicU32::new(0));
    let mut h = Handlers::new();
    h.register(
        "Pre",
        Checked {
            pre_ok: false,
            post_ok: true,
            ran: ran_pre.clone(),
        },
    );
    h.register(
        "Post",
        Checked {
            pre_ok: true,
            post_ok: false,
            ran: ran_post.clone(),
        },
    );
    h.register("Panics", |_: &TaskContext| -> Outcome { panic!("boom") });
    let cfg = EngineConfig {
        backoff: Backoff {
            max_attempts: 1,
            ..Backoff::default()
        },
        ..Default::default()
    };
    let e = engine(&s, h, cfg);
    let mk = |q: &str, kind: &str| TaskSpec {
        kind: kind.into(),
        ..spec(q, "t")
    };
    let ids: Vec<u64> = [
        ("q1", "Pre"),
        ("q2", "Post"),
        ("q3", "Panics"),
        ("q4", "Unknown"),
    ]
    .iter()
    .map(|(q, k)| e.enqueue(mk(q, k), Placement::Last).unwrap())
    .collect();
    let sum = e.run_until_idle().unwrap();
    assert_eq!(sum.tally.dead_letters, 4);
    let msg = |id| s.store.task(id).unwrap().unwrap().last_failure.unwrap();
    assert_eq!(msg(ids[0]), "pre-check failed: volume not mounted");
    assert_eq!(
        ran_pre.load(Ordering::SeqCst),
        0,
        "run is skipped after a failed pre"
    );
    assert_eq!(msg(ids[1]), "post-check failed: service not healthy");
    assert_eq!(ran_post.load(Ordering::SeqCst), 1);
    assert_eq!(msg(ids[2]), "handler panicked: boom");
    assert_eq!(msg(ids[3]), "no handler for kind Unknown");
    for id in ids {
        assert_eq!(
            s.store.task(id).unwrap().unwrap().status,
            Status::Failed,
            "dead letters are in the history"
        );
    }
    assert_eq!(s.store.queued_total(), 0, "the queues moved on");
    assert_log_agrees(&s.store);
}

fn status_of(e: &Engine, queue: &str) -> String {
    let out = render_text(&e.queue_views(), false);
    let prefix = format!("Queue '{queue}': ");
    out.lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| {
            l.split("status: '")
                .nth(1)
                .unwrap_or("")
                .trim_end_matches('\'')
                .to_string()
        })
        .unwrap_or_default()
}

/// After a restart a head waiting for its retry shows the delay its
/// failure set, not only what is left of it (the record keeps only the
/// retry's time).
#[test]
fn a_restarted_queue_shows_the_whole_backoff_of_its_head() {
    let s = setup(FakeClock::new(T0));
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| Outcome::fail("boom"));
    let e = engine(&s, h, EngineConfig::default());
    let id = e.enqueue(spec("main", "flaky"), Placement::Last).unwrap();
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(Gate::default(), stop.clone());
        wait_for("the failure", || {
            s.store.task(id).unwrap().unwrap().failures == 1
        });
        stop.stop();
        runner.join().unwrap().unwrap();
    });
    drop(e);
    s.clock.advance_ms(2_000);
    // Another engine on the same store, as after a restart.
    let e = engine(&s, Handlers::new(), EngineConfig::default());
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(Gate::default(), stop.clone());
        wait_for("the status", || {
            status_of(&e, "main") == "sleep after fail for 5s (3s left of 5s delay)"
        });
        stop.stop();
        runner.join().unwrap().unwrap();
    });
}

#[test]
fn statuses_follow_what_each_queue_does() {
    // A clock that moves only by hand, an engine running on its own thread.
    let s = setup(FakeClock::new(T0));
    let gate = Gate::default();
    let started = Arc::new(AtomicU32::new(0));
    let mut h = Handlers::new();
    h.register("Block", gate.handler(&started));
    h.register("Fail", |_: &TaskContext| {
        Outcome::fail("helm upgrade failed")
    });
    h.register("Delay", |_: &TaskContext| {
        Outcome::success().with_delay(Duration::from_secs(5))
    });
    // Two workers for three blocking tasks: one of them waits for a worker.
    let cfg = EngineConfig {
        workers: 2,
        parallel_queues: 2,
        ..Default::default()
    };
    let e = engine(&s, h, cfg);
    let mk = |q: &str, kind: &str, n: &str| TaskSpec {
        kind: kind.into(),
        ..spec(q, n)
    };
    e.enqueue(mk("a_failing", "Fail", "f"), Placement::Last)
        .unwrap();
    e.enqueue(mk("b_delayed", "Delay", "d1"), Placement::Last)
        .unwrap();
    e.enqueue(mk("b_delayed", "Delay", "d2"), Placement::Last)
        .unwrap();
    e.enqueue(mk("c_idle", "Delay", "i"), Placement::Last)
        .unwrap();
    for q in ["x_block", "y_block", "z_block"] {
        e.enqueue(mk(q, "Block", q), Placement::Last).unwrap();
    }
    let stop = e.stop_handle();
    let blockers = |e: &Engine| {
        let mut v: Vec<String> = ["x_block", "y_block", "z_block"]
            .iter()
            .map(|q| status_of(e, q))
            .collect();
        v.sort();
        v
    };
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(gate.clone(), stop.clone());
        wait_for("two blocking tasks", || started.load(Ordering::SeqCst) == 2);
        wait_for("statuses", || {
            status_of(&e, "a_failing").starts_with("sleep after fail")
                && status_of(&e, "b_delayed") == "sleep for 5s"
        });
        assert_eq!(
            blockers(&e),
            vec!["run first task", "run first task", "waiting for task 0s"]
        );
        assert_eq!(
            status_of(&e, "a_failing"),
            "sleep after fail for 5s (5s left of 5s delay)"
        );
        assert_eq!(status_of(&e, "b_delayed"), "sleep for 5s");
        assert_eq!(status_of(&e, "c_idle"), "", "an empty queue has no status");
        s.clock.advance_ms(4_000);
        assert_eq!(
            status_of(&e, "a_failing"),
            "sleep after fail for 5s (1s left of 5s delay)"
        );
        s.clock.advance_ms(16_000);
        assert_eq!(
            blockers(&e),
            vec!["run first task", "run first task", "waiting for task 20s"]
        );
        stop.stop();
        wait_for("stop", || status_of(&e, "x_block") == "stop");
        gate.open();
        runner.join().unwrap().unwrap();
    });
}

#[test]
fn the_seed_startup_batch_gives_the_seed_layout() {
    let s = setup(FakeClock::new(T0));
    let gate = Gate::default();
    let started = Arc::new(AtomicU32::new(0));
    let mut h = Handlers::new();
    h.register("ModuleRun", gate.handler(&started));
    let e = engine(&s, h, EngineConfig::default());
    e.enqueue_batch(common::seed_startup_specs()).unwrap();
    let g = |names: &str| {
        format!("ParallelModuleRun:main:Parallel run for {names}:doStartup:OperatorStartup")
    };
    let m = |name: &str| format!("ModuleRun:main:{name}:doStartup:OperatorStartup");
    let expected_main: Vec<String> = vec![
        g(
            "cloud-data-crd, metallb-crd, operator-prometheus-crd, prometheus-crd, snapshot-controller-crd, user-authn-crd, vertical-pod-autoscaler-crd",
        ),
        m("flow-schema"),
        m("admission-policy-engine"),
        m("cloud-provider-openstack"),
        m("local-path-provisioner"),
        m("cni-flannel"),
        m("kube-proxy"),
        m("registry-packages-proxy"),
        g("control-plane-manager, node-manager, terraform-manager"),
        m("kube-dns"),
        m("snapshot-controller"),
        m("cert-manager"),
        m("user-authz"),
        m("user-authn"),
        m("operator-prometheus"),
        m("prometheus"),
        m("prometheus-metrics-adapter"),
        m("vertical-pod-autoscaler"),
        g(
            "extended-monitoring, monitoring-applications, monitoring-custom, monitoring-deckhouse, monitoring-kubernetes, monitoring-kubernetes-control-plane, monitoring-ping",
        ),
        m("node-local-dns"),
        m("metallb"),
        m("l2-load-balancer"),
        m("ingress-nginx"),
        m("log-shipper"),
        m("pod-reloader"),
        m("chrony"),
        g("dashboard, operator-trivy, upmeter"),
        g("namespace-configurator, secret-copier"),
        m("deckhouse-tools"),
        m("documentation"),
        g("echo, mcplay"),
        "ConvergeModules:main:::Operator-Startup".into(),
        "ModuleHookRun:main:kubernetes:002-deckhouse/hooks/change_host_ip.go:pod:Kubernetes".into(),
    ];
    let views = e.queue_views();
    assert_eq!(views[0].name, "main");
    let lines: Vec<&str> = views[0]
        .tasks
        .iter()
        .map(|t| t.description.as_str())
        .collect();
    assert_eq!(lines, expected_main);
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(gate.clone(), stop.clone());
        wait_for("the seven CRD modules to start", || {
            started.load(Ordering::SeqCst) == 7
        });
        let out = render_text(&e.queue_views(), false);
        assert!(out.starts_with("Queue 'main': length 33, status: 'run first task'\n\n 1. ParallelModuleRun:main:Parallel run for cloud-data-crd"), "{out}");
        for (i, name) in common::SEED_CRDS.iter().enumerate() {
            let block = format!(
                "Queue 'parallel_queue_{i}': length 1, status: 'run first task'\n\n 1. ModuleRun:parallel_queue_{i}:{name}:doStartup:OperatorStartup\n"
            );
            assert!(out.contains(&block), "missing {block:?} in\n{out}");
        }
        assert!(out.ends_with("Summary:\n- 'main' queue: 33 tasks.\n- 10 other queues (7 active, 3 empty): 7 tasks.\n- total 40 tasks to handle.\n"), "{out}");
        stop.stop();
        gate.open();
        runner.join().unwrap().unwrap();
    });
}

#[test]
fn a_failing_child_leaves_its_siblings_running_and_shows_on_the_parent() {
    let s = setup(FakeClock::new(T0));
    let runs: Runs = Default::default();
    let mut h = Handlers::new();
    h.register(
        "ModuleRun",
        recording(&s.clock, &runs, |ctx| {
            if ctx.task.name == "mcplay" && ctx.attempt <= 2 {
                Outcome::fail("helm upgrade failed: cannot patch \"mcplay\" with kind Deployment")
            } else {
                Outcome::success()
            }
        }),
    );
    let e = engine(&s, h, EngineConfig::default());
    let specs: Vec<_> = ["echo", "mcplay", "upmeter"]
        .iter()
        .map(|n| TaskSpec {
            weight: Some(40),
            description: Some("doStartup:OperatorStartup".into()),
            ..spec("main", n)
        })
        .chain([TaskSpec {
            weight: Some(50),
            ..spec("main", "after")
        }])
        .collect();
    let ids = e.enqueue_batch(specs).unwrap();
    let parent = ids[0];
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _release = Release(Gate::default(), stop.clone());
        // Siblings finish while mcplay sleeps after its first failure.
        wait_for("the siblings", || {
            let p = s.store.task(parent).unwrap().unwrap();
            p.failures == 1 && p.name == "Parallel run for mcplay"
        });
        // The statuses are published after the step that wrote the failure.
        wait_for("the statuses", || {
            render_text(&e.queue_views(), false).contains("status: 'sleep after fail")
        });
        let out = render_text(&e.queue_views(), false);
        assert!(out.contains(
            " 1. ParallelModuleRun:main:Parallel run for mcplay:doStartup:OperatorStartup:failures 1:\n    Errors:\n    - mcplay: helm upgrade failed: cannot patch \"mcplay\" with kind Deployment\n\n 2. ModuleRun:main:after\n"
        ), "{out}");
        assert!(out.contains("1. ModuleRun:parallel_queue_1:mcplay:doStartup:OperatorStartup:failures 1:helm upgrade failed"), "{out}");
        assert!(out.contains("status: 'sleep after fail for 5s"), "{out}");
        // Let the retries come due.
        s.clock.advance_ms(5_000);
        wait_for("the second failure", || {
            s.store.task(parent).unwrap().unwrap().failures == 2
        });
        s.clock.advance_ms(7_000);
        wait_for("the group and the task after it", || {
            s.store.queued_total() == 0
        });
        stop.stop();
        runner.join().unwrap().unwrap();
    });
    let p = s.store.task(parent).unwrap().unwrap();
    assert_eq!(p.status, Status::Succeeded);
    assert_eq!(p.failures, 2);
    assert_eq!(
        p.last_failure, None,
        "a child's success removes its error line"
    );
    let order: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| (r.0.clone(), r.1))
        .collect();
    assert_eq!(
        order.last().unwrap().0,
        "after",
        "the queue moved on only after the whole group"
    );
    assert_eq!(order.iter().filter(|r| r.0 == "echo").count(), 1);
    assert_eq!(order.iter().filter(|r| r.0 == "mcplay").count(), 3);
    assert_log_agrees(&s.store);
}

#[test]
fn removing_a_parent_removes_its_children() {
    let s = setup(FakeClock::new(T0));
    let e = engine(&s, Handlers::new(), EngineConfig::default());
    let specs: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| TaskSpec {
            weight: Some(1),
            ..spec("main", n)
        })
        .collect();
    let ids = e.enqueue_batch(specs).unwrap();
    let children = s.store.task(ids[0]).unwrap().unwrap().children;
    assert_eq!(children.len(), 2);
    let mut w = s.store.write();
    let removed = w.remove(ids[0]).unwrap();
    w.commit().unwrap();
    assert_eq!(removed.len(), 3);
    for &c in children.iter() {
        assert!(s.store.task(c).unwrap().is_none());
    }
    assert_log_agrees(&s.store);
}

#[test]
fn a_repeating_head_shows_repeat_head_task_until_a_worker_takes_it() {
    use berth::engine::scheduler::{Completion, Scheduler, StepEnv};
    use berth::engine::status::render;
    let s = setup(FakeClock::new(T0));
    let cfg = EngineConfig::default();
    let handlers = Arc::new(Handlers::new());
    let (tx, _rx) = crossbeam_channel::unbounded();
    let commits = s.store.group_commit();
    let env = StepEnv {
        config: &cfg,
        handlers: &handlers,
        budget: s.store.budget(),
        tx: &tx,
        commits: &commits,
        clock: s.store.clock(),
    };
    let id = berth::submit::enqueue_one(&s.store, spec("q", "r"), Placement::Last).unwrap();
    let mut sched = Scheduler::new();
    let status = |sched: &Scheduler| render(&sched.activities(T0)["q"].current(), T0);
    // Start it (the job is not handed to any worker here).
    let mut w = s.store.write();
    let jobs = sched.dispatch(&mut w, &env).unwrap();
    w.commit().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(status(&sched), "waiting for task 0s");
    // It asks to repeat: the queue says so, then again once restarted.
    let mut w = s.store.write();
    let done = Completion {
        id,
        queue: "q".into(),
        outcome: Outcome::new(RunResult::Repeat),
        began_at: Some(T0),
        duration_ms: 1,
        output: Default::default(),
    };
    sched.complete(&mut w, &env, done).unwrap();
    w.commit().unwrap();
    assert_eq!(status(&sched), "repeat head task");
    // It ran for no time: it waits until a second after its start.
    let mut w = s.store.write();
    assert_eq!(sched.dispatch(&mut w, &env).unwrap().len(), 0);
    w.commit().unwrap();
    assert_eq!(sched.next_wake(T0), Some(T0 + 1000));
    assert_eq!(status(&sched), "repeat head task");
    s.clock.advance_ms(1000);
    let mut w = s.store.write();
    let jobs = sched.dispatch(&mut w, &env).unwrap();
    w.commit().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(status(&sched), "repeat head task");
    let t = s.store.task(id).unwrap().unwrap();
    assert_eq!((t.attempts, t.failures), (2, 0));
}

#[test]
fn a_result_over_the_budget_is_cut_with_a_marker() {
    let s = setup(FakeClock::auto_advancing(T0));
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| {
        let mut rng = fastrand::Rng::with_seed(9);
        let noise: String = (0..4 << 20).map(|_| rng.alphanumeric()).collect();
        Outcome::success().with_output(serde_json::Value::String(noise))
    });
    let e = engine(&s, h, EngineConfig::default());
    let id = e.enqueue(spec("main", "big"), Placement::Last).unwrap();
    e.run_until_idle().unwrap();
    let t = s.store.task(id).unwrap().unwrap();
    assert_eq!(t.status, Status::Succeeded);
    let r = t
        .result
        .unwrap()
        .to_json("result", s.store.budget())
        .unwrap();
    assert_eq!(r["truncated"], true);
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("the object budget is 1.5 MiB"),
        "{r}"
    );
    assert_eq!(r["head"].as_str().unwrap().len(), 64 * 1024);
}

#[test]
fn a_corrupt_child_keeps_its_group_waiting_and_run_until_idle_gives_up() {
    let dir = tempdir();
    let clock = FakeClock::auto_advancing(T0);
    let (parent, bad);
    {
        let store = Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).unwrap();
        let specs: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| TaskSpec {
                weight: Some(1),
                ..spec("main", n)
            })
            .collect();
        parent = berth::submit::enqueue_batch(&store, specs).unwrap()[0];
        bad = store.task(parent).unwrap().unwrap().children[1];
        // A later commit, so the batch's record is not the last one re-applied at open.
        berth::submit::enqueue_one(&store, spec("other", "x"), Placement::Last).unwrap();
    }
    {
        let db = sled::open(dir.path().join("db")).unwrap();
        let key = berth::store::keys::id_key(berth::store::keys::TASK, bad);
        let mut v = db.get(key).unwrap().unwrap().to_vec();
        let mid = v.len() / 2;
        v[mid] ^= 0x10;
        db.insert(key, v).unwrap();
        db.flush().unwrap();
    }
    let store =
        Arc::new(Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).unwrap());
    assert!(
        store
            .corrupt_records()
            .iter()
            .any(|c| c.key == format!("t/{bad}"))
    );
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| Outcome::success());
    let e = Engine::new(store.clone(), h, EngineConfig::default()).unwrap();
    let sum = e.run_until_idle().unwrap();
    assert_eq!(sum.stuck, 1, "the parent is left in its queue");
    let p = store.task(parent).unwrap().unwrap();
    assert_eq!(
        p.status,
        Status::Queued,
        "never finished on a child it cannot read"
    );
    assert_eq!(p.name, format!("Parallel run for <corrupt task {bad}>"));
}

#[test]
fn a_group_in_a_parallel_queue_runs_its_children_in_the_other_ones() {
    // Each child runs in a parallel queue other than the one its parent
    // waits in: a child placed behind its own parent would never start.
    // Two parallel queues, the group in the first: every child runs in the
    // second, and the single behind the group runs after it.
    let s = setup(FakeClock::auto_advancing(T0));
    let runs: Arc<Mutex<Vec<(String, String)>>> = Default::default();
    let mut h = Handlers::new();
    let seen = runs.clone();
    h.register("ModuleRun", move |ctx: &TaskContext| {
        seen.lock()
            .unwrap()
            .push((ctx.task.name.clone(), ctx.task.queue.clone()));
        Outcome::success()
    });
    let cfg = EngineConfig {
        parallel_queues: 2,
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let parent = group(&e, "ModuleRun", "parallel_queue_0", &["x1", "x2", "x3"]);
    e.enqueue(spec("parallel_queue_0", "after"), Placement::Last)
        .unwrap();
    let sum = e.run_until_idle().unwrap();
    assert_eq!(sum.stuck, 0, "nothing is left waiting");
    assert_eq!(
        sum.tally.succeeded, 5,
        "three children, the parent and the single"
    );
    assert_eq!(
        s.store.task(parent).unwrap().unwrap().status,
        Status::Succeeded
    );
    let runs = runs.lock().unwrap().clone();
    let names: Vec<_> = runs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["x1", "x2", "x3", "after"]);
    assert!(
        runs[..3].iter().all(|(_, q)| q == "parallel_queue_1"),
        "{runs:?}"
    );
    assert_log_agrees(&s.store);

    // With one parallel queue, the group in it has nowhere for its children:
    // it waits, the other queues run, and running until idle gives up on it.
    let s = setup(FakeClock::auto_advancing(T0));
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| Outcome::success());
    let cfg = EngineConfig {
        parallel_queues: 1,
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let parent = group(&e, "ModuleRun", "parallel_queue_0", &["y1", "y2"]);
    let single = e.enqueue(spec("main", "single"), Placement::Last).unwrap();
    let sum = e.run_until_idle().unwrap();
    assert_eq!(sum.stuck, 1, "the group parent is left in its queue");
    assert_eq!(
        s.store.task(single).unwrap().unwrap().status,
        Status::Succeeded
    );
    let p = s.store.task(parent).unwrap().unwrap();
    assert_eq!(p.status, Status::Queued);
    for &c in p.children.iter() {
        assert_eq!(s.store.queue_of(c), None, "child {c} was placed nowhere");
    }
}

#[test]
fn every_attempt_is_logged_and_a_library_handler_sees_a_cancel() {
    use berth::store::AttemptOutcome;
    let s = setup(FakeClock::new(T0));
    let mut h = Handlers::new();
    h.register("Ok", |_: &TaskContext| {
        Outcome::success().with_output(serde_json::json!("fine"))
    });
    h.register("Fail", |_: &TaskContext| Outcome::fail("no luck"));
    // Runs until it is asked to stop, then returns a success, which the
    // cancel overrides.
    h.register("Loop", |ctx: &TaskContext| {
        wait_for("a cancel", || ctx.cancel_requested());
        Outcome::success()
    });
    let cfg = EngineConfig {
        backoff: Backoff {
            max_attempts: 1,
            ..Backoff::default()
        },
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let ok = e.enqueue(kind("Ok", "a", "ok"), Placement::Last).unwrap();
    let fail = e
        .enqueue(kind("Fail", "b", "fail"), Placement::Last)
        .unwrap();
    let looping = e
        .enqueue(kind("Loop", "c", "loop"), Placement::Last)
        .unwrap();
    let behind = e
        .enqueue(kind("Ok", "c", "behind"), Placement::Last)
        .unwrap();
    let stop = e.stop_handle();
    std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        wait_for("the loop to run", || e.live_attempt(looping).is_some());
        wait_for("the failure", || {
            s.store.history_task(fail).unwrap().is_some()
        });
        assert_eq!(
            e.cancel(fail).unwrap_err().to_string(),
            format!("task {fail} is finished (failed); cannot cancel it")
        );
        assert_eq!(e.cancel(looping).unwrap(), vec![looping]);
        wait_for("the task behind it", || {
            s.store.history_task(behind).unwrap().is_some()
        });
        stop.stop();
        runner.join().unwrap().unwrap();
    });
    let outcome = |id| {
        let logs = s.store.attempts(id).unwrap();
        assert_eq!(logs.len(), 1, "task {id}");
        assert_eq!(logs[0].attempt, 1);
        assert_eq!((logs[0].exit_code, logs[0].signal), (None, None));
        logs[0].outcome.clone()
    };
    assert_eq!(outcome(ok), AttemptOutcome::Succeeded);
    assert_eq!(
        outcome(fail),
        AttemptOutcome::Failed {
            message: "no luck".into()
        }
    );
    assert_eq!(outcome(looping), AttemptOutcome::Cancelled);
    assert_eq!(outcome(behind), AttemptOutcome::Succeeded);
    let t = s.store.task(looping).unwrap().unwrap();
    assert_eq!(t.status, Status::Cancelled);
    assert_eq!(t.result, None, "a cancelled attempt's result is not kept");
    assert_eq!(s.store.task(fail).unwrap().unwrap().status, Status::Failed);
    assert_log_agrees(&s.store);
}

/// A task whose queue waits for a worker (every worker is busy) is still
/// queued: a cancel ends it at once, `cancelled`, without its handler ever
/// running and without waiting for the busy worker; so does a group whose
/// children wait so. The busy handler is released only after both cancels
/// were answered, so neither answer can have waited for it.
#[test]
fn a_cancel_ends_a_task_waiting_for_a_worker_without_waiting_for_one() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let s = setup(FakeClock::new(T0));
    let release = Arc::new(AtomicBool::new(false));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut h = Handlers::new();
    let r = release.clone();
    h.register("Block", move |_: &TaskContext| {
        wait_for("the test to release the worker", || {
            r.load(Ordering::SeqCst)
        });
        Outcome::success()
    });
    let n = ran.clone();
    h.register("Ok", move |_: &TaskContext| {
        n.fetch_add(1, Ordering::SeqCst);
        Outcome::success()
    });
    let cfg = EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let block = e
        .enqueue(kind("Block", "a", "block"), Placement::Last)
        .unwrap();
    let stop = e.stop_handle();
    // If an assertion fails, the worker is released and the engine stopped,
    // so that the test fails instead of hanging.
    struct Unblock<'a>(&'a AtomicBool, &'a berth::engine::StopHandle);
    impl Drop for Unblock<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            self.1.stop();
        }
    }
    let (single, group, children) = std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        let _unblock = Unblock(&release, &stop);
        wait_for("the only worker to be busy", || {
            e.live_attempt(block)
                .is_some_and(|_| s.store.task(block).unwrap().unwrap().status == Status::Running)
        });
        let single = e
            .enqueue(kind("Ok", "b", "single"), Placement::Last)
            .unwrap();
        let group = group(&e, "Ok", "c", &["x", "y"]);
        let children = s.store.task(group).unwrap().unwrap().children;
        wait_for("the group's children to be placed", || {
            children.iter().all(|id| {
                let t = s.store.task(*id).unwrap().unwrap();
                t.queue.starts_with("parallel_queue_") && t.status == Status::Queued
            })
        });
        assert_eq!(
            s.store.task(single).unwrap().unwrap().status,
            Status::Queued,
            "no worker is free"
        );
        assert_eq!(e.cancel(single).unwrap(), vec![single]);
        let mut want = children.to_vec();
        want.push(group);
        assert_eq!(e.cancel(group).unwrap(), want);
        assert!(!release.load(Ordering::SeqCst));
        release.store(true, Ordering::SeqCst);
        wait_for("the busy task to finish", || {
            s.store.history_task(block).unwrap().is_some()
        });
        stop.stop();
        runner.join().unwrap().unwrap();
        (single, group, children)
    });
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no cancelled handler ran");
    for id in std::iter::once(single).chain(children.iter().copied()) {
        let t = s.store.task(id).unwrap().unwrap();
        assert_eq!(t.status, Status::Cancelled, "task {id}");
        assert_eq!(t.attempts, 0, "task {id} never started");
        assert!(s.store.attempts(id).unwrap().is_empty(), "task {id}");
    }
    assert_eq!(
        s.store.task(group).unwrap().unwrap().status,
        Status::Cancelled
    );
    assert_eq!(
        s.store.task(block).unwrap().unwrap().status,
        Status::Succeeded
    );
    assert_log_agrees(&s.store);
}

/// An attempt starts when a worker is free to take it: with one worker, of
/// two queues ready in the same step only one starts, and the other starts
/// when that attempt has ended (each handler takes 5 s of the fake clock);
/// each attempt's log begins at its task's start.
#[test]
fn a_ready_queue_starts_its_head_only_when_a_worker_is_free() {
    let s = setup(FakeClock::new(T0));
    let mut h = Handlers::new();
    let clock = s.clock.clone();
    h.register("Slow", move |_: &TaskContext| {
        clock.advance_ms(5_000);
        Outcome::success()
    });
    let cfg = EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let ids: Vec<u64> = ["a", "b"]
        .iter()
        .map(|q| {
            e.enqueue(
                TaskSpec {
                    kind: "Slow".into(),
                    ..spec(q, "slow")
                },
                Placement::Last,
            )
            .unwrap()
        })
        .collect();
    let sum = e.run_until_idle().unwrap();
    assert_eq!(sum.tally.succeeded, 2);
    let mut starts: Vec<_> = ids
        .iter()
        .map(|id| {
            let t = s.store.task(*id).unwrap().unwrap();
            let l = s.store.attempts(*id).unwrap();
            assert_eq!(l.len(), 1);
            assert_eq!(Some(l[0].started_at), t.started_at, "task {id}");
            (t.started_at, t.finished_at)
        })
        .collect();
    starts.sort();
    assert_eq!(starts[0], (Some(T0), Some(T0 + 5_000)), "{starts:?}");
    assert_eq!(
        starts[1],
        (Some(T0 + 5_000), Some(T0 + 10_000)),
        "the second started when the first had ended: {starts:?}"
    );
    assert_log_agrees(&s.store);
}

/// Children interrupted at a crash count as failed attempts on their parent,
/// and a parent is brought up to date once per step, not once per child:
/// three children interrupted together give one `group-updated` event with
/// three failures. Then they run again and the group finishes.
#[test]
fn a_parent_is_updated_once_per_step_with_all_its_childrens_failures() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let open =
        || Arc::new(Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).unwrap());
    let (parent, children) = {
        let store = open();
        let e = Engine::new(store.clone(), Handlers::new(), EngineConfig::default()).unwrap();
        let specs: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| TaskSpec {
                weight: Some(1),
                ..spec("main", n)
            })
            .collect();
        let parent = e.enqueue_batch(specs).unwrap()[0];
        let children = store.task(parent).unwrap().unwrap().children;
        // What a crash leaves: the three children running in their queues.
        let mut w = store.write();
        for (i, c) in children.iter().enumerate() {
            w.place(*c, &berth::queues::parallel_queue(i), Placement::Last)
                .unwrap();
            w.start(*c).unwrap();
        }
        w.commit().unwrap();
        (parent, children)
    };
    let store = open();
    assert_eq!(store.recovered().len(), 3, "{:?}", store.recovered());
    let from = store.next_seq();
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| Outcome::success());
    let e = Engine::new(store.clone(), h, EngineConfig::default()).unwrap();
    let summary = e.run_until_idle().unwrap();
    assert_eq!(summary.tally.succeeded, 4);
    let updates: Vec<u32> = store
        .events_from(from)
        .map(|ev| ev.unwrap())
        .filter_map(|ev| match ev.kind {
            berth::store::EventKind::GroupUpdated { id, failures, .. } if id == parent => {
                Some(failures)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        updates.first(),
        Some(&3),
        "one update for the three interrupted children: {updates:?}"
    );
    let p = store.task(parent).unwrap().unwrap();
    assert_eq!((p.status, p.failures), (Status::Succeeded, 3));
    for &c in children.iter() {
        let t = store.task(c).unwrap().unwrap();
        assert_eq!(
            (t.status, t.attempts, t.failures),
            (Status::Succeeded, 2, 1)
        );
    }
    assert_log_agrees(&store);
}

/// A group of `n` no-op children of kind ModuleRun in `main`, enqueued in
/// `store` (one batch): (parent, children).
fn big_group(store: &Arc<Store>, n: usize) -> (u64, Vec<u64>) {
    let e = Engine::new(store.clone(), Handlers::new(), EngineConfig::default()).unwrap();
    let specs: Vec<_> = (0..n)
        .map(|i| TaskSpec {
            weight: Some(1),
            ..spec("main", &format!("c{i}"))
        })
        .collect();
    let parent = e.enqueue_batch(specs).unwrap()[0];
    let children = store.task(parent).unwrap().unwrap().children.to_vec();
    assert_eq!(children.len(), n);
    (parent, children)
}

/// Each child's `placed` and `started` events from `from` on, in log order.
fn placed_and_started(store: &Store, from: u64) -> Vec<(&'static str, u64)> {
    store
        .events_from(from)
        .map(|ev| ev.unwrap())
        .filter_map(|ev| match ev.kind {
            berth::store::EventKind::Placed { id, .. } => Some(("placed", id)),
            berth::store::EventKind::Started { id } => Some(("started", id)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_large_group_is_placed_a_chunk_per_step_and_its_first_children_start_meanwhile() {
    use berth::engine::PLACE_PER_STEP;
    let s = setup(FakeClock::new(T0));
    let n = 2 * PLACE_PER_STEP + PLACE_PER_STEP / 2;
    let (parent, children) = big_group(&s.store, n);
    let from = s.store.next_seq();
    let mut h = Handlers::new();
    h.register("ModuleRun", |_: &TaskContext| Outcome::success());
    let summary = engine(&s, h, EngineConfig::default())
        .run_until_idle()
        .unwrap();
    assert_eq!(summary.tally.succeeded, n as u64 + 1);
    let log = placed_and_started(&s.store, from);
    let placed: Vec<u64> = log
        .iter()
        .filter(|(k, _)| *k == "placed")
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(
        placed, children,
        "every child placed once, in the group's order"
    );
    let last_placed = log.iter().rposition(|(k, _)| *k == "placed").unwrap();
    let first_started = log.iter().position(|(k, _)| *k == "started").unwrap();
    assert!(
        first_started < last_placed,
        "children start before the last chunk is placed (first start at {first_started}, last placement at {last_placed})"
    );
    let p = s.store.task(parent).unwrap().unwrap();
    assert_eq!((p.status, p.failures), (Status::Succeeded, 0));
    for &c in &children {
        let t = s.store.task(c).unwrap().unwrap();
        assert_eq!((t.status, t.attempts), (Status::Succeeded, 1), "child {c}");
    }
    assert_log_agrees(&s.store);
}

#[test]
fn a_group_left_half_placed_is_placed_on_from_where_it_stopped() {
    use berth::engine::PLACE_PER_STEP;
    let s = setup(FakeClock::new(T0));
    let n = 2 * PLACE_PER_STEP + PLACE_PER_STEP / 2;
    let (parent, children) = big_group(&s.store, n);
    // What a crash between two steps of the placement leaves: the first
    // chunk placed, some of it finished.
    let done = PLACE_PER_STEP / 4;
    let mut w = s.store.write();
    for (i, &c) in children[..PLACE_PER_STEP].iter().enumerate() {
        w.place(c, &berth::queues::parallel_queue(i % 10), Placement::Last)
            .unwrap();
        if i < done {
            w.start(c).unwrap();
            w.succeed(c, None).unwrap();
            w.to_history(c, Status::Succeeded).unwrap();
        }
    }
    w.commit().unwrap();
    let from = s.store.next_seq();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut h = Handlers::new();
    let r = runs.clone();
    h.register("ModuleRun", move |ctx: &TaskContext| {
        r.lock().unwrap().push(ctx.task.id);
        Outcome::success()
    });
    let summary = engine(&s, h, EngineConfig::default())
        .run_until_idle()
        .unwrap();
    assert_eq!(summary.tally.succeeded, (n - done) as u64 + 1);
    let placed: Vec<u64> = placed_and_started(&s.store, from)
        .into_iter()
        .filter(|(k, _)| *k == "placed")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        placed,
        children[PLACE_PER_STEP..],
        "only the unplaced children are placed"
    );
    let mut ran = runs.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(
        ran,
        children[done..],
        "every unfinished child ran once, no finished one again"
    );
    assert_eq!(
        s.store.task(parent).unwrap().unwrap().status,
        Status::Succeeded
    );
    assert_log_agrees(&s.store);
}

/// A stop whose grace period runs out asks what still runs to stop at once:
/// a library handler that looks at `cancel_requested` returns, and its
/// attempt is recorded `interrupted` by the stop (here two group children:
/// each back in its queue with one failure more, the parent not finished);
/// one that ignores the request is not waited for past `STOP_WAIT`, and
/// stays `running` for the next open's recovery (`abandoned`).
#[test]
fn a_grace_period_that_runs_out_records_what_returns_and_abandons_the_rest() {
    use berth::engine::stop::{STOP_WAIT, STOPPED_AT_GRACE};
    use berth::store::AttemptOutcome;
    use std::sync::atomic::AtomicBool;
    let s = setup(FakeClock::new(T0));
    let release = Arc::new(AtomicBool::new(false));
    let mut h = Handlers::new();
    h.register("Polite", |ctx: &TaskContext| {
        wait_for("the stop", || ctx.cancel_requested());
        Outcome::success()
    });
    let r = release.clone();
    h.register("Deaf", move |_: &TaskContext| {
        wait_for("the test to release the worker", || {
            r.load(Ordering::SeqCst)
        });
        Outcome::success()
    });
    let cfg = EngineConfig {
        grace: Duration::from_millis(100),
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let group = group(&e, "Polite", "a", &["x", "y"]);
    let children = s.store.task(group).unwrap().unwrap().children;
    let deaf = e
        .enqueue(kind("Deaf", "b", "deaf"), Placement::Last)
        .unwrap();
    let stop = e.stop_handle();
    let (summary, took) = std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        wait_for("every task to run", || {
            std::iter::once(deaf)
                .chain(children.iter().copied())
                .all(|id| e.live_attempt(id).is_some())
        });
        let asked = std::time::Instant::now();
        stop.stop();
        let summary = runner.join().unwrap();
        let took = asked.elapsed();
        release.store(true, Ordering::SeqCst);
        (summary.unwrap(), took)
    });
    assert_eq!(summary.abandoned, 1, "{summary:?}");
    assert_eq!(summary.tally.interrupted, 2, "{summary:?}");
    assert!(
        took >= STOP_WAIT,
        "the stop waited {took:?} for the handler that ignores it"
    );
    for &id in children.iter() {
        let t = s.store.task(id).unwrap().unwrap();
        assert_eq!(t.status, Status::Queued, "task {id}");
        assert_eq!(t.failures, 1, "task {id}");
        assert_eq!(t.last_failure.as_deref(), Some(STOPPED_AT_GRACE));
        let logs = s.store.attempts(id).unwrap();
        assert_eq!(logs.len(), 1, "task {id}");
        assert_eq!(logs[0].outcome, AttemptOutcome::Interrupted, "task {id}");
    }
    assert!(
        s.store.history_task(group).unwrap().is_none(),
        "the parent waits for its children"
    );
    let d = s.store.task(deaf).unwrap().unwrap();
    assert_eq!(
        d.status,
        Status::Running,
        "left to the next open's recovery"
    );
    assert!(s.store.attempts(deaf).unwrap().is_empty());
    assert_log_agrees(&s.store);
}

/// With fewer workers than ready queues, no more attempts start than there
/// are workers (a task is `running` only while a worker runs it), and the
/// ready queues take the free workers in turn.
#[test]
fn no_more_attempts_start_than_there_are_workers_and_ready_queues_take_turns() {
    let s = setup(FakeClock::new(T0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut h = Handlers::new();
    let (o, store) = (order.clone(), s.store.clone());
    h.register("Rec", move |ctx: &TaskContext| {
        let running: Vec<String> = store
            .live_tasks()
            .into_iter()
            .map(Result::unwrap)
            .filter(|t| t.status == Status::Running)
            .map(|t| t.name)
            .collect();
        o.lock().unwrap().push((ctx.task.name.clone(), running));
        Outcome::success()
    });
    let cfg = EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    for q in ["qa", "qb", "qc"] {
        for n in 1..=2 {
            e.enqueue(kind("Rec", q, &format!("{q}{n}")), Placement::Last)
                .unwrap();
        }
    }
    let summary = e.run_until_idle().unwrap();
    assert_eq!(summary.tally.succeeded, 6);
    let order = order.lock().unwrap();
    for (name, running) in order.iter() {
        assert_eq!(
            running,
            &vec![name.clone()],
            "while {name} ran, the store's running tasks"
        );
    }
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["qa1", "qb1", "qc1", "qa2", "qb2", "qc2"]);
    assert_log_agrees(&s.store);
}

/// A stop whose grace period runs out stops and records only the attempts
/// that workers ran: a ready task that waited for a worker was never
/// started, so it keeps its place with no attempt and no failure.
#[test]
fn a_grace_period_that_runs_out_charges_nothing_to_tasks_that_waited_for_a_worker() {
    use berth::store::AttemptOutcome;
    let s = setup(FakeClock::new(T0));
    let mut h = Handlers::new();
    h.register("Polite", |ctx: &TaskContext| {
        wait_for("the stop", || ctx.cancel_requested());
        Outcome::success()
    });
    let cfg = EngineConfig {
        workers: 1,
        grace: Duration::from_millis(100),
        ..EngineConfig::default()
    };
    let e = engine(&s, h, cfg);
    let ids: Vec<u64> = ["qa", "qb", "qc"]
        .iter()
        .map(|q| {
            e.enqueue(kind("Polite", q, &format!("{q}1")), Placement::Last)
                .unwrap()
        })
        .collect();
    let stop = e.stop_handle();
    let summary = std::thread::scope(|sc| {
        let runner = sc.spawn(|| e.run());
        wait_for("a task to run", || {
            ids.iter().any(|id| e.live_attempt(*id).is_some())
        });
        stop.stop();
        runner.join().unwrap().unwrap()
    });
    assert_eq!(summary.tally.interrupted, 1, "{summary:?}");
    assert_eq!(summary.abandoned, 0, "{summary:?}");
    let (mut ran, mut waited) = (0, 0);
    for &id in &ids {
        let t = s.store.task(id).unwrap().unwrap();
        assert_eq!(t.status, Status::Queued, "task {id}");
        let logs = s.store.attempts(id).unwrap();
        if t.attempts == 0 {
            waited += 1;
            assert_eq!(t.failures, 0, "task {id} never ran");
            assert!(logs.is_empty(), "task {id} never ran: {logs:?}");
        } else {
            ran += 1;
            assert_eq!(t.failures, 1, "task {id}");
            assert_eq!(logs.len(), 1, "task {id}");
            assert_eq!(logs[0].outcome, AttemptOutcome::Interrupted);
        }
    }
    assert_eq!((ran, waited), (1, 2));
    assert_log_agrees(&s.store);
}

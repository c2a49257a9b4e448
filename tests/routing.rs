//! Routing (Tendrl's targeted jobs): a task runs on a daemon only if its
//! target is empty or names the node, and its tags are all the node's.
//! Tasks for other nodes stay in their queues, in their order, never block
//! them, are listed with the reason they wait, and `--until-idle` does not
//! wait for them.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use berth::clock::FakeClock;
use berth::engine::{Engine, EngineConfig, Handlers, Outcome, TaskContext};
use berth::ops::{Ctx, TaskFilter, task_list};
use berth::routing::Node;
use berth::store::{Options, Placement, Store, verify};
use berth::task::TaskSpec;
use common::{T0, stderr, stdout, tempdir};

fn node(name: Option<&str>, tags: &[&str]) -> EngineConfig {
    EngineConfig {
        node: name.map(str::to_string),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    }
}

fn routed(name: &str, target: Option<&str>, tags: &[&str]) -> TaskSpec {
    TaskSpec {
        queue: "main".into(),
        kind: "Work".into(),
        name: name.into(),
        target: target.map(str::to_string),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    }
}

/// Handlers whose runs are recorded by task name.
fn recording(runs: &Arc<Mutex<Vec<String>>>) -> Handlers {
    let runs = runs.clone();
    let mut h = Handlers::new();
    h.register("Work", move |ctx: &TaskContext| {
        runs.lock().unwrap().push(ctx.task.name.clone());
        Outcome::success()
    });
    h
}

fn rows_by_name(ctx: &Ctx<'_>, filter: &TaskFilter) -> Vec<(String, Option<String>)> {
    task_list(ctx, filter)
        .expect("task list")
        .into_iter()
        .map(|r| (r.name, r.waiting_for))
        .collect()
}

#[test]
fn tasks_for_other_nodes_wait_in_place_while_this_nodes_queue_moves_on() {
    let dir = tempdir();
    let clock = FakeClock::auto_advancing(T0);
    let store = Arc::new(
        Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).expect("open"),
    );
    // The head of main is for another node; tasks for this node are behind
    // it, between others that are not.
    let specs = [
        routed("for-edge-2", Some("edge-2"), &[]),
        routed("anyone", None, &[]),
        routed("edge-3-or-us", Some("edge-3,edge-1"), &[]),
        routed("needs-gpu", None, &["gpu"]),
        routed("needs-gluster", None, &["gluster"]),
        routed("us-but-gpu", Some("edge-1"), &["gpu", "gluster"]),
        routed("us", Some("edge-1"), &["gluster"]),
    ];
    for s in specs {
        berth::submit::enqueue_one(&store, s, Placement::Last).expect("enqueue");
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = Engine::new(
        store.clone(),
        recording(&runs),
        node(Some("edge-1"), &["gluster", "ssd"]),
    )
    .expect("engine");
    let summary = engine.run_until_idle().expect("run until idle");
    assert_eq!(summary.stuck, 0, "tasks for other nodes are not stuck ones");
    assert_eq!(summary.tally.succeeded, 4);
    assert_eq!(
        *runs.lock().unwrap(),
        vec!["anyone", "edge-3-or-us", "needs-gluster", "us"],
        "this node's tasks ran in queue order, past the others"
    );
    // The others are still in main, in their order.
    let names: Vec<String> = store
        .queue_ids("main")
        .into_iter()
        .map(|id| store.task(id).unwrap().unwrap().name)
        .collect();
    assert_eq!(names, vec!["for-edge-2", "needs-gpu", "us-but-gpu"]);
    assert_eq!(verify::verify(&store).unwrap(), Vec::<String>::new());

    // task list says why they wait; --target and --status elsewhere select them.
    let kinds = engine.kinds();
    let ctx = Ctx::daemon(&engine, &kinds);
    let waiting = TaskFilter {
        statuses: vec!["elsewhere".into()],
        ..Default::default()
    };
    let expected = vec![
        (
            "for-edge-2".to_string(),
            Some("for node edge-2".to_string()),
        ),
        ("needs-gpu".to_string(), Some("needs tag gpu".to_string())),
        ("us-but-gpu".to_string(), Some("needs tag gpu".to_string())),
    ];
    assert_eq!(rows_by_name(&ctx, &waiting), expected);
    let for_edge_2 = TaskFilter {
        targets: vec!["edge-2".into()],
        ..Default::default()
    };
    assert_eq!(rows_by_name(&ctx, &for_edge_2), expected[..1].to_vec());
    let for_edge_3 = TaskFilter {
        targets: vec!["edge-3".into()],
        ..Default::default()
    };
    assert_eq!(
        rows_by_name(&ctx, &for_edge_3),
        vec![("edge-3-or-us".to_string(), None)],
        "a finished task is selected by its target too, and waits for nothing"
    );

    // Without a daemon, a command knows the node the daemon recorded.
    store
        .set_node(&engine.config().routing())
        .expect("record the node");
    let direct = Ctx::direct(Some(&store), None);
    assert_eq!(rows_by_name(&direct, &waiting), expected);
}

#[test]
fn a_group_for_another_node_waits_whole_and_a_nameless_node_runs_no_targeted_task() {
    let dir = tempdir();
    let clock = FakeClock::auto_advancing(T0);
    let store = Arc::new(
        Store::open(dir.path(), Options::default(), Arc::new(clock.clone())).expect("open"),
    );
    let weighted = |name: &str, w: i64, target: Option<&str>| TaskSpec {
        weight: Some(w),
        ..routed(name, target, &[])
    };
    // Two children for edge-2 form a group; a child for anyone does not
    // join it (its routing differs); then a single for anyone.
    let ids = berth::submit::enqueue_batch(
        &store,
        vec![
            weighted("a", 1, Some("edge-2")),
            weighted("b", 1, Some("edge-2")),
            weighted("c", 1, None),
            weighted("d", 2, None),
        ],
    )
    .expect("batch");
    assert_eq!(ids.len(), 3, "the group, c, d: {ids:?}");
    let parent = store.task(ids[0]).unwrap().unwrap();
    assert_eq!(parent.target.as_deref(), Some("edge-2"));
    assert_eq!(parent.children.len(), 2);

    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = Engine::new(store.clone(), recording(&runs), node(None, &[])).expect("engine");
    let summary = engine.run_until_idle().expect("run until idle");
    assert_eq!(summary.stuck, 0);
    assert_eq!(*runs.lock().unwrap(), vec!["c", "d"]);
    // The parent waits at the head, its children outside every queue.
    assert_eq!(store.queue_ids("main"), vec![ids[0]]);
    for child in parent.children.iter() {
        assert_eq!(store.queue_of(*child), None);
    }
    let kinds = engine.kinds();
    let ctx = Ctx::daemon(&engine, &kinds);
    let waiting = rows_by_name(
        &ctx,
        &TaskFilter {
            statuses: vec!["elsewhere".into()],
            ..Default::default()
        },
    );
    assert_eq!(
        waiting.len(),
        3,
        "the parent and its two children: {waiting:?}"
    );
    assert!(
        waiting
            .iter()
            .all(|(_, why)| why.as_deref() == Some("for node edge-2"))
    );
    assert_eq!(verify::verify(&store).unwrap(), Vec::<String>::new());
}

fn write_config(root: &Path, node: &str) -> std::path::PathBuf {
    common::daemon::write_root(
        root,
        "#!/bin/sh\ncat >/dev/null\necho \"\\\"$BERTH_NODE\\\"\"\n",
        &format!(
            "data_dir = \"data\"\nnode = \"{node}\"\ntags = [\"gluster\"]\n[handlers.Work]\ncommand = [\"./hook.sh\"]\n"
        ),
    )
}

#[test]
fn berth_run_until_idle_runs_its_tasks_and_leaves_the_others_listed() {
    let root = tempdir();
    let cfg = write_config(root.path(), "edge-1");
    let dir = root.path().join("data");
    let enq = |args: &[&str]| {
        common::enqueue_id(
            &dir,
            &[&["--queue", "main", "--kind", "Work"], args].concat(),
        )
    };
    let elsewhere = enq(&["--name", "for-edge-2", "--target", "edge-2"]);
    let gpu = enq(&["--name", "gpu", "--tag", "gpu"]);
    let mine = enq(&["--name", "mine", "--target", "edge-2", "--target", "edge-1"]);
    let run = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&dir)
        .args(["run", "--until-idle", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .output()
        .expect("berth run");
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("idle; 2 task(s) for other nodes are left waiting"),
        "{}",
        stderr(&run)
    );
    let t = common::task_json(&dir, mine);
    assert_eq!(t["status"], "succeeded");
    assert_eq!(t["result"], "edge-1");
    assert_eq!(t["target"], "edge-2,edge-1");
    // Without a daemon, task list knows the node the daemon recorded.
    let list = common::berth(&dir, &["task", "list", "--status", "elsewhere"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[1]
            .trim_start()
            .starts_with(&format!("{elsewhere}  main"))
            && lines[1].contains("#1, for node edge-2"),
        "{text}"
    );
    assert!(
        lines[2].trim_start().starts_with(&format!("{gpu}  main"))
            && lines[2].contains("#2, needs tag gpu"),
        "{text}"
    );
    let json = common::berth(&dir, &["task", "list", "--target", "edge-2", "-o", "json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&json.stdout).expect("json");
    let got: Vec<(u64, serde_json::Value)> = rows
        .iter()
        .map(|r| (r["id"].as_u64().unwrap(), r["waiting_for"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (elsewhere, serde_json::json!("for node edge-2")),
            (mine, serde_json::Value::Null)
        ]
    );
    // Several nodes, as enqueue takes them: any of them.
    let json = common::berth(
        &dir,
        &["task", "list", "--target", "edge-1,edge-9", "-o", "json"],
    );
    assert!(json.status.success(), "{}", stderr(&json));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&json.stdout).expect("json");
    let ids: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![mine]);
    // A spec's target may be a list.
    let batch = root.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"main","kind":"Work","name":"two","target":["edge-1","edge-2"]},
            {"queue":"main","kind":"Work","name":"bad","target":["edge-1","no,comma"]}]"#,
    )
    .expect("batch");
    let o = common::berth(&dir, &["enqueue", "--batch", &batch.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("entry 2 of 2, field target: target node 'no,comma' has a comma"),
        "{}",
        stderr(&o)
    );
    let v = common::berth(&dir, &["verify"]);
    assert!(v.status.success(), "{}", stderr(&v));
}

#[test]
fn the_node_is_recorded_for_commands_without_a_daemon() {
    let dir = tempdir();
    let store = Store::open(dir.path(), Options::default(), berth::clock::system()).unwrap();
    assert_eq!(store.node().unwrap(), None);
    let n = Node {
        name: Some("edge-9".into()),
        tags: vec!["a".into()],
    };
    store.set_node(&n).unwrap();
    drop(store);
    let store = Store::open(dir.path(), Options::default(), berth::clock::system()).unwrap();
    assert_eq!(store.node().unwrap(), Some(n));
}

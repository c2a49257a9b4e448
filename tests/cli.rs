//! The `berth` command as a user runs it: outputs, exit codes, errors.

mod common;

use common::{assert_text_eq, berth, stderr, stdout, tempdir};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

#[test]
fn enqueue_prints_the_id_and_queue_list_shows_the_order() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let a = berth(
        &d,
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "ModuleRun",
            "--name",
            "flow-schema",
            "--description",
            "doStartup:OperatorStartup",
        ],
    );
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), "1\n");
    let b = berth(
        &d,
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "two\nlines",
        ],
    );
    assert_eq!(b.status.code(), Some(2), "a name with a newline is refused");
    assert!(
        stderr(&b).contains("--name: must not contain control characters"),
        "{}",
        stderr(&b)
    );
    let c = berth(
        &d,
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "ModuleRun",
            "--name",
            "echo",
            "--first",
            "--tag",
            "gluster",
        ],
    );
    assert_eq!(stdout(&c), "2\n");
    let e = berth(
        &d,
        &[
            "enqueue",
            "--queue",
            "parallel_queue_3",
            "--kind",
            "ModuleRun",
            "--name",
            "x",
        ],
    );
    assert_eq!(stdout(&e), "3\n");
    let list = berth(&d, &["queue", "list"]);
    assert!(list.status.success());
    assert_text_eq(
        &stdout(&list),
        "Queue 'main': length 2, status: ''

 1. ModuleRun:main:echo
 2. ModuleRun:main:flow-schema:doStartup:OperatorStartup

Queue 'parallel_queue_3': length 1, status: ''

 1. ModuleRun:parallel_queue_3:x

Summary:
- 'main' queue: 2 tasks.
- 10 other queues (1 active, 9 empty): 1 task.
- total 3 tasks to handle.
",
    );
    let json = berth(&d, &["queue", "list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["summary"]["totalTasks"], 3);
    assert_eq!(v["active"][1]["name"], "parallel_queue_3");
}

#[test]
fn batch_errors_name_the_entry_and_field_and_write_nothing() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let f = dir.path().join("tasks.json");
    std::fs::write(&f, r#"[{"queue":"main","kind":"K","name":"a"},{"queue":"main","kind":"K","name":"b","wieght":2}]"#).unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("entry 2 of 2, field wieght: unknown field `wieght`"),
        "{err}"
    );
    // A type error names the entry (counted from 1) and the field.
    std::fs::write(
        &f,
        r#"[{"queue":"main","kind":"K","name":"a","weight":"5"}]"#,
    )
    .unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("entry 1 of 1, field weight: invalid type: string \"5\", expected i64"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&f, r#"{"tasks":[{"queue":"main","kind":"K","name":"a"},{"queue":"ma in","kind":"K","name":"b"}]}"#).unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("entry 2 of 2, field queue: queue 'ma in'"),
        "{}",
        stderr(&o)
    );
    // A batch of one entry names it too, for every rule.
    std::fs::write(&f, r#"[{"queue":"ma in","kind":"K","name":"b"}]"#).unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    common::assert_refused(&o, 2, "entry 1 of 1, field queue: queue 'ma in'");
    std::fs::write(&f, r#"[{"queue":"main","kind":"K","name":"b","name":"c"}]"#).unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    common::assert_refused(&o, 2, "entry 1 of 1: duplicate field `name`");
    assert!(!d.exists() || stdout(&berth(&d, &["queue", "list"])).contains("no tasks to handle"));
    std::fs::write(
        &f,
        r#"[{"queue":"main","kind":"K","name":"a"},{"queue":"main","kind":"K","name":"b"}]"#,
    )
    .unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "1\n2\n");
}

#[test]
fn bad_arguments_exit_2_and_change_nothing() {
    let dir = tempdir();
    let d = dir.path().join("data");
    for args in [
        vec!["enqueue", "--queue", "main", "--kind", "K"],
        vec![
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "n",
            "--payload",
            "{not json",
        ],
        vec![
            "enqueue", "--queue", "main", "--kind", "K", "--name", "n", "--first", "--after", "3",
        ],
        vec!["enqueue", "--queue", "x/y", "--kind", "K", "--name", "n"],
        vec!["task", "show", "abc"],
        vec!["enqueue", "--batch", "/nonexistent/file.json"],
    ] {
        let o = berth(&d, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty());
    }
    assert!(!d.exists(), "no data dir was created by bad input");
}

/// A change that what the data dir holds refuses (no such task, a task in
/// the wrong state, an anchor in no queue or in another) exits non-zero
/// with its reason and leaves every file of the data dir as it was (the
/// command tries it on a read-only open first), while the same commands
/// that the data dir takes still do their work.
#[test]
fn refused_changes_leave_every_file_of_the_data_dir_as_it_was() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let a = common::enqueue_id(&d, &["--queue", "main", "--kind", "K", "--name", "a"]);
    let a_s = a.to_string();
    let before = common::file_hashes(&d);
    for (args, code, says) in [
        (vec!["task", "cancel", "999"], 1, "no task 999".to_string()),
        (vec!["task", "remove", "999"], 1, "no task 999".to_string()),
        (
            vec!["task", "retry", a_s.as_str()],
            1,
            format!("task {a} is queued; cannot retry it"),
        ),
        (
            vec![
                "enqueue", "--queue", "main", "--kind", "K", "--name", "b", "--after", "77",
            ],
            2,
            "task 77 is not in any queue".to_string(),
        ),
        (
            vec![
                "enqueue",
                "--queue",
                "other",
                "--kind",
                "K",
                "--name",
                "b",
                "--before",
                a_s.as_str(),
            ],
            2,
            format!("task {a} is in queue 'main', not in 'other'"),
        ),
    ] {
        let o = berth(&d, &args);
        common::assert_refused(&o, code, &says);
        assert_eq!(
            common::file_hashes(&d),
            before,
            "berth {args:?} changed the data dir"
        );
    }
    // A data dir that does not exist holds no anchor, and is not created.
    let none = dir.path().join("none");
    let o = berth(
        &none,
        &[
            "enqueue", "--queue", "main", "--kind", "K", "--name", "b", "--after", "1",
        ],
    );
    common::assert_refused(&o, 2, "task 1 is not in any queue");
    assert!(
        !none.exists(),
        "a refused enqueue created {}",
        none.display()
    );
    // Nor does an empty folder, which is left empty, with its mode.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = berth(
        &empty,
        &[
            "enqueue", "--queue", "main", "--kind", "K", "--name", "b", "--before", "7",
        ],
    );
    common::assert_refused(&o, 2, "task 7 is not in any queue");
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "a refused enqueue wrote into an empty folder"
    );
    assert_eq!(
        std::fs::metadata(&empty).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // What the data dir takes is done.
    let b = common::enqueue_id(
        &d,
        &[
            "--queue", "main", "--kind", "K", "--name", "b", "--before", &a_s,
        ],
    );
    let o = berth(&d, &["queue", "list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let ids: Vec<u64> = v["active"][0]["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, [b, a]);
    let o = berth(&d, &["task", "cancel", &a_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::task_json(&d, a)["status"], "cancelled");
}

/// A first enqueue refused for disk space (a reserve larger than any disk
/// here) creates no data dir: the folders it made are taken away, and an
/// empty folder is left empty, with its mode. A data dir that exists keeps
/// every file as it was.
#[test]
fn an_enqueue_refused_for_space_creates_no_data_dir() {
    let dir = tempdir();
    let cfg = dir.path().join("berth.toml");
    std::fs::write(&cfg, "[disk]\nreserve = \"100000000GiB\"\n").unwrap();
    let enqueue = |d: &Path| {
        Command::new(common::berth_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(d)
            .args(["enqueue", "--queue", "main", "--kind", "K", "--name", "b"])
            .output()
            .expect("berth enqueue")
    };
    let none = dir.path().join("a/b/data");
    common::assert_refused(&enqueue(&none), 1, "not enough disk space in");
    assert!(
        !dir.path().join("a").exists(),
        "a refused enqueue created {}",
        none.display()
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    common::assert_refused(&enqueue(&empty), 1, "not enough disk space in");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert_eq!(
        std::fs::metadata(&empty).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let d = dir.path().join("data");
    let a = common::enqueue_id(&d, &["--queue", "main", "--kind", "K", "--name", "a"]);
    let before = common::file_hashes(&d);
    common::assert_refused(&enqueue(&d), 1, "not enough disk space in");
    assert_eq!(common::file_hashes(&d), before);
    assert_eq!(common::task_json(&d, a)["status"], "queued");
}

#[test]
fn a_task_record_over_the_budget_is_refused_before_anything_is_opened() {
    // Each field fits the budget, the payload too; the record, all of them
    // together, does not. `enqueue`, `enqueue --batch` and `run --enqueue`
    // all refuse it as bad input, naming the entry, and create or change
    // nothing: no data dir, no file of an existing one.
    let dir = tempdir();
    let cfg = dir.path().join("berth.toml");
    std::fs::write(
        &cfg,
        "[budget]\ncompress_over = \"1KiB\"\nmax_object = \"4KiB\"\n\
         max_decompressed = \"8KiB\"\n[handlers.K]\ncommand = [\"true\"]\n",
    )
    .unwrap();
    // 4,000 random letters, which gzip shrinks only to about 2.9 KiB.
    let mut x: u32 = 1;
    let letters = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let noise: String = (0..4000)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            char::from(letters[(x >> 16) as usize % letters.len()])
        })
        .collect();
    let (name, description) = ("n".repeat(512), "d".repeat(1024));
    let batch = dir.path().join("b.json");
    std::fs::write(
        &batch,
        serde_json::json!([
            {"queue": "main", "kind": "K", "name": "fits"},
            {"queue": "main", "kind": "K", "name": name, "description": description, "payload": noise},
        ])
        .to_string(),
    )
    .unwrap();
    let berth_with = |d: &Path, args: &[&str]| {
        Command::new(common::berth_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(d)
            .args(args)
            .output()
            .expect("berth")
    };
    let b = batch.to_str().unwrap();
    let payload = serde_json::Value::String(noise.clone()).to_string();
    let single = [
        "enqueue",
        "--queue",
        "main",
        "--kind",
        "K",
        "--name",
        &name,
        "--description",
        &description,
        "--payload",
        &payload,
    ];
    let says =
        "the object budget is 4 KiB (its name, description, payload and other fields together)";
    let none = dir.path().join("none");
    for args in [
        &["enqueue", "--batch", b][..],
        &["run", "--until-idle", "--enqueue", b],
    ] {
        let o = berth_with(&none, args);
        common::assert_refused(
            &o,
            2,
            &format!("batch file {b}: entry 2 of 2: task record is "),
        );
        common::assert_refused(&o, 2, says);
        assert!(!none.exists(), "{args:?} made {}", none.display());
    }
    let o = berth_with(&none, &single);
    common::assert_refused(&o, 2, "berth: task record is ");
    common::assert_refused(&o, 2, says);
    assert!(!none.exists());
    let d = dir.path().join("data");
    let a = common::enqueue_id(&d, &["--queue", "main", "--kind", "K", "--name", "a"]);
    let before = common::file_hashes(&d);
    for args in [
        &["enqueue", "--batch", b][..],
        &single,
        &["run", "--until-idle", "--enqueue", b],
    ] {
        common::assert_refused(&berth_with(&d, args), 2, says);
        assert_eq!(common::file_hashes(&d), before, "{args:?}");
    }
    assert_eq!(common::task_json(&d, a)["status"], "queued");
}

#[test]
fn an_empty_batch_adds_nothing_and_makes_no_data_dir() {
    let dir = tempdir();
    let batch = dir.path().join("empty.json");
    for text in ["[]", "{\"tasks\": []}"] {
        std::fs::write(&batch, text).unwrap();
        let none = dir.path().join("none");
        let o = berth(&none, &["enqueue", "--batch", batch.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), "");
        assert!(!none.exists(), "an empty batch made {}", none.display());
    }
}

#[test]
fn task_show_and_remove() {
    let dir = tempdir();
    let d = dir.path().join("data");
    berth(
        &d,
        &[
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "a",
            "--payload",
            r#"{"values":[1,2]}"#,
        ],
    );
    let o = berth(&d, &["task", "show", "1", "-o", "json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["payload"]["values"][1], 2);
    assert_eq!(v["status"], "queued");
    let o = berth(&d, &["task", "show", "1"]);
    assert!(stdout(&o).contains("name: a\n"));
    let o = berth(&d, &["task", "remove", "1"]);
    assert_eq!(stdout(&o), "removed 1\n");
    let o = berth(&d, &["task", "show", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).trim(), "berth: no task 1");
    let o = berth(&d, &["verify"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_dir_held_by_a_daemon_gives_exit_3() {
    let dir = tempdir();
    let _daemon = berth::store::Store::open(
        dir.path(),
        berth::store::Options {
            role: berth::store::Role::Daemon,
            ..Default::default()
        },
        berth::clock::system(),
    )
    .unwrap();
    // A daemon that holds the dir without answering is waited for (it may
    // be starting), up to --timeout.
    let start = std::time::Instant::now();
    let o = berth(
        dir.path(),
        &[
            "--timeout",
            "1s",
            "enqueue",
            "--queue",
            "main",
            "--kind",
            "K",
            "--name",
            "n",
        ],
    );
    let took = start.elapsed();
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("is in use by another berth process (a daemon, pid"),
        "{}",
        stderr(&o)
    );
    assert!(
        took >= std::time::Duration::from_millis(900) && took.as_secs() < 5,
        "{took:?}"
    );
}

#[test]
fn concurrent_short_commands_wait_for_each_other() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let procs: Vec<_> = (0..6)
        .map(|i| {
            std::process::Command::new(common::berth_bin())
                .arg("--data-dir")
                .arg(&d)
                .args([
                    "enqueue",
                    "--queue",
                    "main",
                    "--kind",
                    "K",
                    "--name",
                    &format!("m{i}"),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in procs {
        let o = p.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&berth(&d, &["queue", "list", "-o", "json"]).stdout).unwrap();
    assert_eq!(v["summary"]["totalTasks"], 6);
}

#[test]
fn queue_list_watch_redraws_until_interrupted() {
    use std::io::Read;
    let dir = tempdir();
    let d = dir.path().join("data");
    berth(
        &d,
        &["enqueue", "--queue", "main", "--kind", "K", "--name", "a"],
    );
    let mut child = std::process::Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&d)
        .args(["queue", "list", "--watch", "--interval", "50ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(8).filter(|w| w == b"Summary:").count() < 3 {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "watch ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let text = String::from_utf8_lossy(&seen);
    // Into a pipe: plain frames, each after a `# TIME` line, no escape codes.
    assert!(text.starts_with("# 20"), "{text}");
    assert!(text.contains("Z\nQueue 'main': length 1"), "{text}");
    assert!(!text.contains('\x1b'), "{text}");
    let bad = berth(&d, &["queue", "list", "--watch", "--interval", "1ms"]);
    assert_eq!(bad.status.code(), Some(2));
}

/// `queue list` lists the first 1,000 tasks of a queue and says how many
/// more it holds (text and JSON, with the whole length and summary);
/// `--all` lists every one.
#[test]
fn queue_list_lists_the_first_thousand_tasks_unless_asked_for_all() {
    let dir = tempdir();
    let d = dir.path().join("data");
    let f = dir.path().join("batch.json");
    let entries: Vec<_> = (0..1003)
        .map(|i| serde_json::json!({"queue": "main", "kind": "K", "name": format!("t{i}")}))
        .collect();
    std::fs::write(&f, serde_json::to_string(&entries).unwrap()).unwrap();
    let o = berth(&d, &["enqueue", "--batch", f.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = berth(&d, &["queue", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("Queue 'main': length 1003,"), "{text}");
    assert!(
        text.contains("\n1000. K:main:t999\n... and 3 more (queue list --all lists them)\n"),
        "{text}"
    );
    assert!(!text.contains("t1000"), "{text}");
    assert!(text.contains("- total 1003 tasks to handle."), "{text}");
    let o = berth(&d, &["queue", "list", "--all"]);
    let all = stdout(&o);
    assert!(all.contains("\n1003. K:main:t1002\n"), "{all}");
    assert!(!all.contains("more (queue list --all"), "{all}");
    let o = berth(&d, &["queue", "list", "-o", "json"]);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["active"][0]["tasksCount"], 1003);
    assert_eq!(j["active"][0]["tasksListed"], 1000);
    assert_eq!(j["active"][0]["tasks"].as_array().map(Vec::len), Some(1000));
}

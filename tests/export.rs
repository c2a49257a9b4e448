//! `berth export` and `berth import` with the real binary: what an import
//! rebuilds (every task field, payloads as stored, queue order, groups,
//! the history), through daemons and without, and that the result passes
//! `verify` and runs; damaged files refused with nothing changed; an export
//! that never writes to the data dir it reads; the daemon's periodic
//! backups; and the README's worked example.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use berth::store::{Options, Store};
use berth::task::{Status, Task};
use common::daemon::{Daemon, write_root};
use common::{berth, stderr, stdout, tempdir, wait_for};

/// A handler that succeeds, except for a task whose payload says "hold":
/// that one runs while the file `hold` exists beside the config.
const HOOK: &str = "#!/bin/sh\np=$(cat)\ncase \"$p\" in *hold*) while [ -e hold ]; do sleep 0.02; done;; esac\nexit 0\n";

fn config(node: &str, extra: &str) -> String {
    format!(
        "data_dir = \"data\"\nnode = \"{node}\"\ntags = [\"gluster\"]\ngrace = \"5s\"\n{extra}\n\
         [handlers.ModuleRun]\ncommand = [\"./hook.sh\"]\n\
         [handlers.Backup]\ncommand = [\"./hook.sh\"]\n"
    )
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}{}", stdout(o), stderr(o));
}

/// Runs berth with `--config CFG` (its data dir), from `cwd`.
fn berth_cfg(cfg: &Path, args: &[&str]) -> Output {
    Command::new(common::berth_bin())
        .arg("--config")
        .arg(cfg)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run berth")
}

/// A payload whose JSON is over 100 KiB (so stored gzip-compressed) and
/// differs from line to line.
fn big_payload(dir: &Path) -> PathBuf {
    let lines: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                "line {i}: the module values of release {}",
                i * 7919 % 10007
            )
        })
        .collect();
    let p = dir.join("big.json");
    std::fs::write(&p, serde_json::json!({ "lines": lines }).to_string()).expect("write");
    assert!(std::fs::metadata(&p).expect("size").len() > 100 * 1024);
    p
}

/// Fills a data dir: two queues, a target and tags, a 100+ KiB compressed
/// payload, a group of three, a task with a payload that holds its handler
/// (first in `main`), and a cancelled task in the history: 9 tasks, 8 live.
fn fill(dir: &Path, root: &Path) {
    let big = big_payload(root);
    let e = |args: &[&str]| ok(&berth(dir, &[&["enqueue"], args].concat()), "enqueue");
    e(&[
        "--queue",
        "main",
        "--kind",
        "ModuleRun",
        "--name",
        "held",
        "--payload",
        r#"{"hold":1}"#,
    ]);
    e(&[
        "--queue",
        "main",
        "--kind",
        "ModuleRun",
        "--name",
        "big",
        "--payload-file",
        big.to_str().expect("utf-8"),
        "--tag",
        "gluster",
        "--description",
        "doStartup",
    ]);
    e(&[
        "--queue",
        "other",
        "--kind",
        "ModuleRun",
        "--name",
        "solo",
        "--target",
        "edge-2",
        "--payload",
        r#"{"n":[1,2,3]}"#,
    ]);
    let batch = root.join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"main","kind":"ModuleRun","name":"c1","weight":5,"payload":{"c":1}},
            {"queue":"main","kind":"ModuleRun","name":"c2","weight":5},
            {"queue":"main","kind":"ModuleRun","name":"c3","weight":5},
            {"queue":"main","kind":"ModuleRun","name":"after","weight":9}]"#,
    )
    .expect("batch");
    ok(
        &berth(dir, &["enqueue", "--batch", batch.to_str().expect("utf-8")]),
        "batch",
    );
    let id = common::enqueue_id(
        dir,
        &["--queue", "other", "--kind", "ModuleRun", "--name", "gone"],
    );
    ok(&berth(dir, &["task", "cancel", &id.to_string()]), "cancel");
}

/// The tasks (live and finished) and queues of a data dir, read with the
/// library (read-only: the data dir does not change).
struct State {
    tasks: BTreeMap<u64, Task>,
    history: Vec<u64>,
    queues: BTreeMap<String, Vec<u64>>,
}

fn state(dir: &Path) -> State {
    let opts = Options {
        read_only: true,
        ..Options::default()
    };
    let store = Store::open(dir, opts, berth::clock::system()).expect("open to read");
    let mut tasks = BTreeMap::new();
    for t in store.live_tasks() {
        let t = t.expect("readable");
        tasks.insert(t.id, t);
    }
    let mut history = Vec::new();
    for t in store.history() {
        let t = t.expect("readable");
        history.push(t.id);
        tasks.insert(t.id, t);
    }
    let queues = store
        .queues()
        .into_iter()
        .map(|(q, _)| {
            let ids = store.queue_ids(&q);
            (q, ids)
        })
        .collect();
    State {
        tasks,
        history,
        queues,
    }
}

/// The old -> new id map of an `import -o json` answer.
fn id_map(o: &Output) -> BTreeMap<u64, u64> {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("import -o json");
    v["ids"]
        .as_object()
        .expect("ids")
        .iter()
        .map(|(k, v)| (k.parse().expect("an id"), v.as_u64().expect("an id")))
        .collect()
}

/// Checks that `b` holds every task of `a` under its new id (`map`), field
/// by field, in the same queue order and place; `running` tasks of `a`
/// must be back `queued` with one failure more.
fn assert_reproduced(a: &State, b: &State, map: &BTreeMap<u64, u64>) {
    assert_eq!(map.len(), a.tasks.len(), "every task is mapped");
    for (old, t) in &a.tasks {
        let new = map[old];
        let got = b
            .tasks
            .get(&new)
            .unwrap_or_else(|| panic!("task {new} missing"));
        let mut want = t.clone();
        want.id = new;
        want.parent = t.parent.map(|p| map[&p]);
        want.children = t.children.iter().map(|c| map[c]).collect();
        if t.status == Status::Running {
            want.status = Status::Queued;
            want.failures += 1;
            want.last_failure = Some(berth::ops::INTERRUPTED_BY_EXPORT.to_string());
        }
        assert_eq!(got, &want, "task {old} -> {new}");
        assert_eq!(
            a.history.contains(old),
            b.history.contains(&new),
            "task {old}'s place"
        );
    }
    let mapped: BTreeMap<String, Vec<u64>> = a
        .queues
        .iter()
        .map(|(q, ids)| (q.clone(), ids.iter().map(|i| map[i]).collect()))
        .collect();
    assert_eq!(b.queues, mapped, "queue order");
}

fn verify(dir: &Path) {
    let o = berth(dir, &["verify"]);
    ok(&o, "verify");
    assert!(stdout(&o).contains("the log agrees with the state"));
}

#[test]
fn an_import_reproduces_every_task_runs_them_and_the_export_wrote_nothing_to_its_dir() {
    let root = tempdir();
    let cfg = write_root(root.path(), HOOK, &config("edge-2", ""));
    let a = root.path().join("a");
    fill(&a, root.path());
    let before = common::file_hashes(&a);
    let file = root.path().join("all.bex");
    let o = berth(
        &a,
        &["export", "-o", file.to_str().expect("utf-8"), "--history"],
    );
    ok(&o, "export");
    assert!(
        stderr(&o).starts_with("exported 9 tasks (2 queues, 1 groups) to "),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        common::file_hashes(&a),
        before,
        "the export wrote to the data dir it read"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&file).expect("the file").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    let b = root.path().join("b");
    let o = berth(&b, &["import", file.to_str().expect("utf-8")]);
    ok(&o, "import");
    assert_eq!(stdout(&o), "imported 9 tasks: ids 1..9\n");
    // Again, into a third dir, for the id map.
    let c = root.path().join("c");
    let o = berth(&c, &["import", file.to_str().expect("utf-8"), "-o", "json"]);
    ok(&o, "import -o json");
    let map = id_map(&o);
    let sa = state(&a);
    assert_reproduced(&sa, &state(&c), &map);
    // The big payload is still stored compressed, byte for byte.
    let big = sa.tasks.values().find(|t| t.name == "big").expect("big");
    assert!(big.payload.compressed && big.payload.bytes.len() > 1000);
    verify(&c);

    // They run there (with --data-dir, the config's handlers).
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&c)
        .args(["run", "--until-idle", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "warn")
        .current_dir(root.path())
        .output()
        .expect("berth run");
    ok(&o, "run --until-idle");
    let sc = state(&c);
    assert!(sc.queues.is_empty(), "{:?}", sc.queues);
    let done: Vec<&str> = sc
        .tasks
        .values()
        .filter(|t| t.status == Status::Succeeded)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(done.len(), 8, "{done:?}"); // all but the cancelled one
    verify(&c);
}

#[test]
fn standard_output_and_input_and_the_selection_filters() {
    let root = tempdir();
    let a = root.path().join("a");
    fill(&a, root.path());
    // -o - | import -
    let export = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&a)
        .args(["export", "-o", "-", "--queue", "other"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("export");
    let out = export.wait_with_output().expect("export");
    ok(&out, "export -o -");
    assert!(stderr(&out).contains("exported 1 tasks (1 queues, 0 groups) to standard output"));
    let b = root.path().join("b");
    let mut import = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&b)
        .args(["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("import");
    {
        use std::io::Write;
        let mut stdin = import.stdin.take().expect("stdin");
        stdin.write_all(&out.stdout).expect("write");
    }
    let o = import.wait_with_output().expect("import");
    ok(&o, "import -");
    assert_eq!(stdout(&o), "imported 1 tasks: ids 1..1\n");
    let sb = state(&b);
    assert_eq!(sb.tasks[&1].name, "solo");

    // A child selected by a filter takes its whole group: --status waiting
    // selects the three waiting children, and their parent comes along.
    let file = root.path().join("g.bex");
    let o = berth(
        &a,
        &[
            "export",
            "-o",
            file.to_str().expect("utf-8"),
            "--status",
            "waiting",
        ],
    );
    ok(&o, "export --status waiting");
    assert!(
        stderr(&o).contains("exported 4 tasks (1 queues, 1 groups)"),
        "{}",
        stderr(&o)
    );
    // Finished-only words need --history; unknown words are refused.
    for (args, msg) in [
        (
            &["--status", "dead"][..],
            "which an export takes only with --history",
        ),
        (&["--status", "zombie"], "'zombie' is not a status"),
    ] {
        let o = berth(&a, &[&["export", "-o", "x.bex"], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(msg), "{}", stderr(&o));
    }
    let o = berth(
        &a,
        &[
            "export",
            "-o",
            file.to_str().expect("utf-8"),
            "--status",
            "dead",
            "--history",
        ],
    );
    ok(&o, "export --status dead --history");
    assert!(stderr(&o).contains("exported 0 tasks (0 queues, 0 groups)"));
    // Never into the data dir, nor a folder that does not exist.
    let inside = a.join("x.bex");
    let o = berth(&a, &["export", "-o", inside.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is inside the data dir"),
        "{}",
        stderr(&o)
    );
    let o = berth(&a, &["export", "-o", "/nonexistent/folder/x.bex"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("the folder /nonexistent/folder does not exist"));
}

/// `--target NODE` takes the tasks targeted at NODE (a group whole), not
/// those for other nodes, nor tag-gated or untargeted ones; a name no task
/// can have is refused for every filter, naming the flag, and writes nothing.
#[test]
fn an_export_with_target_takes_only_the_tasks_for_that_node() {
    let root = tempdir();
    let a = root.path().join("a");
    // `solo` in `other` is targeted at edge-2; the rest of `fill` is not.
    fill(&a, root.path());
    let e = |args: &[&str]| ok(&berth(&a, &[&["enqueue"], args].concat()), "enqueue");
    e(&[
        "--queue", "other", "--kind", "Backup", "--name", "for-c", "--target", "edge-3",
    ]);
    e(&[
        "--queue",
        "other",
        "--kind",
        "Backup",
        "--name",
        "both",
        "--target",
        "edge-3,edge-2",
    ]);
    e(&[
        "--queue", "main", "--kind", "Backup", "--name", "gpu", "--tag", "gpu",
    ]);
    let batch = root.path().join("targeted.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"main","kind":"Backup","name":"g1","weight":3,"target":"edge-2"},
            {"queue":"main","kind":"Backup","name":"g2","weight":3,"target":"edge-2"}]"#,
    )
    .expect("batch");
    ok(
        &berth(&a, &["enqueue", "--batch", batch.to_str().expect("utf-8")]),
        "batch",
    );
    let file = root.path().join("edge-2.bex");
    let o = berth(
        &a,
        &[
            "export",
            "-o",
            file.to_str().expect("utf-8"),
            "--target",
            "edge-2",
        ],
    );
    ok(&o, "export --target edge-2");
    assert!(
        stderr(&o).contains("exported 5 tasks (2 queues, 1 groups)"),
        "{}",
        stderr(&o)
    );
    let b = root.path().join("b");
    ok(
        &berth(&b, &["import", file.to_str().expect("utf-8")]),
        "import",
    );
    let mut names: Vec<String> = state(&b).tasks.values().map(|t| t.name.clone()).collect();
    names.sort();
    let parent = names
        .iter()
        .find(|n| n.contains("g1") && n.contains("g2"))
        .cloned()
        .expect("the group's parent");
    let mut want = vec![
        "both".to_string(),
        "g1".into(),
        "g2".into(),
        parent,
        "solo".into(),
    ];
    want.sort();
    assert_eq!(names, want);

    // Names no task can have: exit 2, the flag named, no file.
    let bad = root.path().join("bad.bex");
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
            "--target: target node 'bad node'",
        ),
    ] {
        let o = berth(
            &a,
            &[&["export", "-o", bad.to_str().expect("utf-8")], args].concat(),
        );
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(!bad.exists(), "{args:?} wrote the file");
    }
    // A valid name that no task has: an empty export.
    let o = berth(
        &a,
        &[
            "export",
            "-o",
            bad.to_str().expect("utf-8"),
            "--target",
            "edge-9",
        ],
    );
    ok(&o, "export --target edge-9");
    assert!(stderr(&o).contains("exported 0 tasks"), "{}", stderr(&o));
}

/// `-o` never replaces what is not a regular file (a device such as
/// /dev/null, a FIFO, a symbolic link: the export renames its new file over
/// the old one), and a path that is not UTF-8 is refused, not a panic.
#[test]
fn an_export_replaces_only_a_regular_file_and_takes_only_a_utf8_path() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    let root = tempdir();
    let a = root.path().join("a");
    common::enqueue_id(&a, &["--queue", "main", "--kind", "K", "--name", "one"]);
    let fifo = root.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let target = write(root.path(), "target", b"keep");
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for (path, what) in [(&fifo, "a FIFO"), (&link, "a symbolic link")] {
        let o = berth(&a, &["export", "-o", path.to_str().expect("utf-8")]);
        let says = format!("is {what}; an export replaces only a regular file");
        common::assert_refused(&o, 2, &says);
    }
    let kind = |p: &Path| std::fs::symlink_metadata(p).expect("stat").file_type();
    assert!(kind(&fifo).is_fifo(), "the FIFO is left as it was");
    assert!(kind(&link).is_symlink(), "the link is left as it was");
    assert_eq!(std::fs::read(&target).expect("read"), b"keep");
    // No temporary file is left beside them.
    let names: Vec<_> = std::fs::read_dir(root.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 4, "nothing else was written: {names:?}");

    let bad = root.path().join(std::ffi::OsStr::from_bytes(b"x\xff.bex"));
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(&a)
        .args(["export", "-o"])
        .arg(&bad)
        .output()
        .expect("run berth");
    common::assert_refused(&o, 2, "the path is not valid UTF-8");
    assert!(!bad.exists(), "nothing was written");
}

/// Writes `bytes` to `name` under `dir`; returns its path.
fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

#[test]
fn damaged_files_are_refused_naming_the_file_and_nothing_changes() {
    let root = tempdir();
    let a = root.path().join("a");
    fill(&a, root.path());
    let good_path = root.path().join("good.bex");
    ok(
        &berth(
            &a,
            &[
                "export",
                "-o",
                good_path.to_str().expect("utf-8"),
                "--history",
            ],
        ),
        "export",
    );
    let good = std::fs::read(&good_path).expect("read");
    // The target: a data dir with a task of its own.
    let t = root.path().join("t");
    common::enqueue_id(&t, &["--queue", "main", "--kind", "K", "--name", "mine"]);
    let before = common::file_hashes(&t);
    let header = 50 + "".len(); // no node name: the header ends at 50
    let mut cases: Vec<(String, Vec<u8>, &str)> = Vec::new();
    for cut in [0, 5, 12, header, good.len() / 2, good.len() - 1] {
        let why = match cut {
            0 => "not a berth export file (it is empty)",
            5 => "not a berth export file",
            _ => "the file is damaged",
        };
        cases.push((format!("cut{cut}.bex"), good[..cut].to_vec(), why));
    }
    for (region, at) in [
        ("header", 30),
        ("body", header + (good.len() - header) / 2),
        ("trailer", good.len() - 1),
    ] {
        let mut b = good.clone();
        b[at] ^= 0x04;
        cases.push((format!("flip-{region}.bex"), b, "checksum mismatch"));
    }
    let mut v = good.clone();
    v[8] = 2;
    cases.push((
        "v2.bex".into(),
        v,
        "export format version 2; this build reads version 1",
    ));
    let mut m = good.clone();
    m[..8].copy_from_slice(b"BERTHSEG");
    cases.push((
        "magic.bex".into(),
        m,
        "not a berth export file (no BERTHEXP magic",
    ));
    for (name, bytes, why) in &cases {
        let p = write(root.path(), name, bytes);
        let o = berth(&t, &["import", p.to_str().expect("utf-8")]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(name.as_str()) && e.contains(why), "{name}: {e}");
        assert_eq!(common::file_hashes(&t), before, "{name} changed the target");
        // A data dir that does not exist is not created.
        let fresh = root.path().join("fresh");
        let o = berth(&fresh, &["import", p.to_str().expect("utf-8")]);
        assert_eq!(o.status.code(), Some(2), "{name}");
        assert!(!fresh.exists(), "{name} created the data dir");
    }
    // A missing file, and kinds without a handler (a config given).
    let o = berth(&t, &["import", "/nonexistent.bex"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read /nonexistent.bex"));
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"t\"\n[handlers.Other]\ncommand = [\"./hook.sh\"]\n",
    );
    let o = berth_cfg(&cfg, &["import", good_path.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no handler for kind 'ModuleRun' here"),
        "{}",
        stderr(&o)
    );
    // A budget the big payload does not fit.
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"t\"\n[budget]\nmax_object = \"8KiB\"\n[handlers.ModuleRun]\ncommand = [\"./hook.sh\"]\n",
    );
    let o = berth_cfg(&cfg, &["import", good_path.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("(ModuleRun big): task record is")
            && stderr(&o).contains("the object budget is 8 KiB"),
        "{}",
        stderr(&o)
    );
    assert_eq!(common::file_hashes(&t), before);
}

/// An export file's bytes for `x` as `transfer::encode` writes them, but
/// without its check that the records agree: a file with a valid checksum
/// whatever it holds, as a crafted one can be.
fn unchecked(x: &berth::transfer::Export) -> Vec<u8> {
    let records: Vec<Vec<u8>> = x
        .tasks
        .iter()
        .map(berth::codec::encode)
        .chain(x.queues.iter().map(berth::codec::encode))
        .collect();
    let raw = berth::frame::pack(&records);
    let packed = berth::frame::compress(&raw, 3).expect("zstd");
    let node = x.node.as_deref().unwrap_or("");
    let mut out = b"BERTHEXP".to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&u16::from(x.history).to_le_bytes());
    out.extend_from_slice(&x.created_at.to_le_bytes());
    out.extend_from_slice(&(node.len() as u16).to_le_bytes());
    out.extend_from_slice(node.as_bytes());
    out.extend_from_slice(&(x.tasks.len() as u32).to_le_bytes());
    out.extend_from_slice(&(x.queues.len() as u32).to_le_bytes());
    out.extend_from_slice(&(x.groups() as u32).to_le_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
    out.extend_from_slice(&packed);
    berth::frame::seal(&mut out);
    out
}

/// A file whose checksums all hold is still refused, exit 2, naming the
/// task and what is wrong, when its groups are impossible (a task that is
/// its own parent and child, a child with children, a live child of a
/// finished parent, a child whose parent is not in it) or a time is later
/// than any berth records (a `retry_at` of `u64::MAX` would keep its queue
/// asleep for good); nothing changes, and no data dir is made.
#[test]
fn impossible_groups_and_times_are_refused_naming_the_task() {
    use berth::transfer::{Export, Place};
    let root = tempdir();
    let a = root.path().join("a");
    common::enqueue_id(&a, &["--queue", "main", "--kind", "K", "--name", "solo"]);
    let batch = root.path().join("group.json");
    std::fs::write(
        &batch,
        r#"[{"queue": "main", "kind": "K", "name": "x", "weight": 5},
            {"queue": "main", "kind": "K", "name": "y", "weight": 5}]"#,
    )
    .expect("batch");
    ok(
        &berth(&a, &["enqueue", "--batch", batch.to_str().expect("utf-8")]),
        "batch",
    );
    let good_path = root.path().join("good.bex");
    ok(
        &berth(&a, &["export", "-o", good_path.to_str().expect("utf-8")]),
        "export",
    );
    let good = berth::transfer::decode(&std::fs::read(&good_path).expect("read")).expect("decode");
    let find = |x: &Export, name: &str| -> usize {
        x.tasks
            .iter()
            .position(|e| e.task.name == name || e.task.name.starts_with(name))
            .expect(name)
    };
    let solo = good.tasks[find(&good, "solo")].task.id;
    let parent = good
        .tasks
        .iter()
        .find(|e| !e.task.children.is_empty())
        .expect("a group");
    let (pid, kids) = (parent.task.id, parent.task.children.to_vec());
    let by_id = |x: &mut Export, id: u64| -> usize {
        x.tasks.iter().position(|e| e.task.id == id).expect("task")
    };
    type Change = Box<dyn Fn(&mut Export)>;
    let cases: Vec<(&str, String, Change)> = vec![
        (
            "self",
            format!("task {solo} is its own group's parent or child"),
            Box::new(move |x| {
                let i = by_id(x, solo);
                x.tasks[i].task.parent = Some(solo);
                x.tasks[i].task.children = vec![solo].into();
            }),
        ),
        (
            "nested",
            format!(
                "task {} is a child of task {pid} and has children of its own",
                kids[0]
            ),
            Box::new({
                let kids = kids.clone();
                move |x| {
                    // The first child takes the second as its own child.
                    let (c0, c1) = (by_id(x, kids[0]), by_id(x, kids[1]));
                    x.tasks[c0].task.children = vec![kids[1]].into();
                    x.tasks[c1].task.parent = Some(kids[0]);
                    let p = by_id(x, pid);
                    x.tasks[p].task.children = vec![kids[0]].into();
                }
            }),
        ),
        (
            "finished-parent",
            format!("is live but its group's parent, task {pid}, is finished"),
            Box::new(move |x| {
                let p = by_id(x, pid);
                x.tasks[p].place = Place::History;
                x.tasks[p].task.status = Status::Cancelled;
                x.tasks[p].task.finished_at = Some(x.created_at);
                for q in &mut x.queues {
                    q.ids.retain(|id| *id != pid);
                }
                x.queues.retain(|q| !q.ids.is_empty());
                x.history = true;
            }),
        ),
        (
            "no-parent",
            format!("is a child of task {pid}, which is not in the file"),
            Box::new(move |x| {
                let p = by_id(x, pid);
                x.tasks.remove(p);
                for q in &mut x.queues {
                    q.ids.retain(|id| *id != pid);
                }
            }),
        ),
        (
            "retry-at",
            format!(
                "task {solo} (K solo): its retry_at is 18446744073709551615 ms since the epoch"
            ),
            Box::new(move |x| {
                let i = by_id(x, solo);
                x.tasks[i].task.retry_at = Some(u64::MAX);
            }),
        ),
        (
            "queued-at",
            format!("task {solo} (K solo): its queued_at is"),
            Box::new(move |x| {
                let i = by_id(x, solo);
                // A day more than 100 years after the file was made.
                x.tasks[i].task.queued_at = x.created_at + (100 * 365 + 26) * 86_400_000;
            }),
        ),
    ];
    // The target: a data dir with a task of its own.
    let t = root.path().join("t");
    common::enqueue_id(&t, &["--queue", "main", "--kind", "K", "--name", "mine"]);
    let before = common::file_hashes(&t);
    for (name, why, change) in &cases {
        let mut x = good.clone();
        change(&mut x);
        let p = write(root.path(), &format!("{name}.bex"), &unchecked(&x));
        for dir in [&t, &root.path().join("fresh")] {
            let o = berth(dir, &["import", p.to_str().expect("utf-8")]);
            assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(
                e.contains(&format!("{name}.bex: ")) && e.contains(why.as_str()),
                "{name}: {e}"
            );
        }
        assert_eq!(common::file_hashes(&t), before, "{name} changed the target");
        assert!(
            !root.path().join("fresh").exists(),
            "{name} made a data dir"
        );
    }
    // The file unchanged imports (the crafting itself is sound).
    let p = write(root.path(), "same.bex", &unchecked(&good));
    ok(
        &berth(&t, &["import", p.to_str().expect("utf-8")]),
        "import",
    );
}

/// `import` checks an export file's first bytes before it reads the rest:
/// a stream that is no export is refused at once, not read to the largest
/// export's size (1.1 GiB of `/dev/zero`) or to its end. A file cut short
/// inside its header is said to be too short for it, not to hold less
/// than its node name claims.
#[test]
fn an_import_checks_the_start_of_a_stream_before_reading_on() {
    use std::io::Write;
    let root = tempdir();
    let dir = root.path().join("data");
    let mut child = Command::new(common::berth_bin())
        .args(["--data-dir", dir.to_str().expect("utf-8"), "import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Zeros, and the pipe kept open: only an import that looks at the
    // first bytes alone can answer.
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&[0u8; 4096]).expect("write");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let answer = rx.recv_timeout(Duration::from_secs(20));
    drop(stdin);
    let o = match answer {
        Ok(o) => o.expect("output"),
        Err(_) => {
            // SAFETY: the child this test started, still running.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the import read on after the first bytes of a stream that is no export");
        }
    };
    let status = o.status;
    assert_eq!(status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("standard input: not a berth export file (no BERTHEXP magic at its start)"),
        "{e}"
    );
    assert!(!dir.exists());
    // A file cut inside its header, after a node name.
    let a = root.path().join("a");
    common::enqueue_id(&a, &["--queue", "main", "--kind", "K", "--name", "solo"]);
    let full = root.path().join("full.bex");
    ok(
        &berth(&a, &["export", "-o", full.to_str().expect("utf-8")]),
        "export",
    );
    let mut x = berth::transfer::decode(&std::fs::read(&full).expect("read")).expect("decode");
    x.node = Some("edge-1".into());
    let bytes = unchecked(&x);
    let cut = write(root.path(), "cut.bex", &bytes[..54]);
    let o = berth(&dir, &["import", cut.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "cut.bex: the file is damaged: 54 bytes is too short for its header and checksum \
             (60 bytes, with its 6-byte node name)"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn through_daemons_a_running_task_comes_back_queued_and_everything_runs() {
    let ra = tempdir();
    let cfg_a = write_root(ra.path(), HOOK, &config("edge-1", ""));
    std::fs::write(ra.path().join("hold"), b"").expect("hold");
    let a = ra.path().join("data");
    fill(&a, ra.path());
    let mut da = Daemon::start_in(ra.path());
    wait_for("the held task to run", || {
        let o = berth_cfg(
            &cfg_a,
            &["task", "list", "--status", "running", "-o", "json"],
        );
        stdout(&o).contains("\"held\"")
    });
    let file = ra.path().join("pending.bex");
    let o = berth_cfg(&cfg_a, &["export", "-o", file.to_str().expect("utf-8")]);
    ok(&o, "export through the daemon");
    assert!(
        stderr(&o).contains("exported 8 tasks (2 queues, 1 groups)"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(ra.path().join("hold")).expect("release");
    da.signal(libc::SIGTERM);
    da.wait_exit(Duration::from_secs(20));

    let rb = tempdir();
    let cfg_b = write_root(rb.path(), HOOK, &config("edge-2", ""));
    let b = rb.path().join("data");
    // B's daemon starts on an empty data dir; the import goes through it.
    ok(
        &berth(
            &b,
            &[
                "enqueue",
                "--queue",
                "x",
                "--kind",
                "ModuleRun",
                "--name",
                "first",
            ],
        ),
        "enqueue",
    );
    let db = Daemon::start_in(rb.path());
    let o = berth_cfg(
        &cfg_b,
        &["import", file.to_str().expect("utf-8"), "-o", "json"],
    );
    ok(&o, "import through the daemon");
    let map = id_map(&o);
    assert_eq!(map.values().min(), Some(&2));
    wait_for("every imported task to finish", || {
        let o = berth_cfg(&cfg_b, &["task", "list", "--status", "live", "-o", "json"]);
        stdout(&o).trim() == "[]"
    });
    // Stopped, not killed: the daemon shows a step's outcome before its
    // flush, so a kill could lose the last one (to be run again).
    let mut db = db;
    db.signal(libc::SIGTERM);
    let (status, _) = db.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let sb = state(&b);
    let held = sb.tasks.values().find(|t| t.name == "held").expect("held");
    assert_eq!(held.status, Status::Succeeded);
    assert_eq!(held.failures, 1, "{held:?}");
    assert_eq!(
        held.last_failure.as_deref(),
        Some(berth::ops::INTERRUPTED_BY_EXPORT)
    );
    assert_eq!(held.attempts, 2);
    let succeeded = sb
        .tasks
        .values()
        .filter(|t| t.status == Status::Succeeded)
        .count();
    assert_eq!(succeeded, 9, "the 8 imported tasks and B's own");
    verify(&b);
}

/// The names of the tasks `task list` shows with `status` (a daemon's,
/// through its config).
fn names_with_status(cfg: &Path, status: &str) -> Vec<String> {
    let o = berth_cfg(cfg, &["task", "list", "--status", status, "-o", "json"]);
    ok(&o, "task list");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("json");
    rows.iter()
        .map(|r| r["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A group exported while it ran (one child finished, two running in
/// parallel queues) comes back as a group not yet dispatched: its parent
/// behind the task already in its queue, its live children in no queue.
/// None of them starts before that task has finished, and the finished
/// child keeps its outcome and does not run again.
#[test]
fn a_running_group_comes_back_undispatched_behind_the_queue() {
    let ra = tempdir();
    let cfg_a = write_root(ra.path(), HOOK, &config("edge-1", ""));
    std::fs::write(ra.path().join("hold"), b"").expect("hold");
    let a = ra.path().join("data");
    let batch = ra.path().join("group.json");
    std::fs::write(
        &batch,
        r#"[{"queue":"gq","kind":"ModuleRun","name":"c1","weight":5,"payload":{"hold":1}},
            {"queue":"gq","kind":"ModuleRun","name":"c2","weight":5,"payload":{"hold":2}},
            {"queue":"gq","kind":"ModuleRun","name":"c3","weight":5}]"#,
    )
    .expect("batch");
    ok(
        &berth(&a, &["enqueue", "--batch", batch.to_str().expect("utf-8")]),
        "batch",
    );
    let mut da = Daemon::start_in(ra.path());
    wait_for("c1 and c2 to run and c3 to finish on A", || {
        let mut running = names_with_status(&cfg_a, "running");
        running.sort();
        running == ["c1", "c2"] && names_with_status(&cfg_a, "succeeded") == ["c3"]
    });
    let file = ra.path().join("rungroup.bex");
    let o = berth_cfg(
        &cfg_a,
        &[
            "export",
            "-o",
            file.to_str().expect("utf-8"),
            "--queue",
            "gq",
        ],
    );
    ok(&o, "export --queue gq");
    assert!(
        stderr(&o).contains("exported 4 tasks (3 queues, 1 groups)"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(ra.path().join("hold")).expect("release");
    da.signal(libc::SIGTERM);
    da.wait_exit(Duration::from_secs(20));

    let rb = tempdir();
    let cfg_b = write_root(rb.path(), HOOK, &config("edge-2", ""));
    let b = rb.path().join("data");
    let blocker = common::enqueue_id(
        &b,
        &[
            "--queue",
            "gq",
            "--kind",
            "ModuleRun",
            "--name",
            "blocker",
            "--payload",
            r#"{"hold":3}"#,
        ],
    );
    let o = berth(&b, &["import", file.to_str().expect("utf-8"), "-o", "json"]);
    ok(&o, "import");
    let map = id_map(&o);
    let sa = state(&a);
    let new_of = |is: &dyn Fn(&Task) -> bool| {
        let t = sa.tasks.values().find(|t| is(t)).expect("on A");
        map[&t.id]
    };
    let parent = new_of(&|t| !t.children.is_empty());
    let [c1, c2, c3] = ["c1", "c2", "c3"].map(|n| new_of(&|t| t.name == n));

    // After the import: the parent behind the blocker, no child in a queue.
    let sb = state(&b);
    let want: BTreeMap<String, Vec<u64>> = [("gq".to_string(), vec![blocker, parent])].into();
    assert_eq!(sb.queues, want, "the children are in no queue");
    for c in [c1, c2] {
        let t = &sb.tasks[&c];
        assert_eq!(t.status, Status::Queued, "{t:?}");
        assert_eq!(t.queue, "gq", "a waiting child has its parent's queue");
        assert_eq!(t.parent, Some(parent));
        assert_eq!((t.attempts, t.failures), (1, 1), "{t:?}");
        assert_eq!(
            t.last_failure.as_deref(),
            Some(berth::ops::INTERRUPTED_BY_EXPORT)
        );
        assert!(!sb.history.contains(&c));
    }
    let done = &sb.tasks[&c3];
    assert!(sb.history.contains(&c3));
    assert_eq!((done.status, done.attempts), (Status::Succeeded, 1));
    assert_eq!(sb.tasks[&parent].children.to_vec(), [c1, c2, c3]);
    verify(&b);

    // Running it: nothing of the group starts while the blocker runs.
    std::fs::write(rb.path().join("hold"), b"").expect("hold");
    let mut db = Daemon::start_in(rb.path());
    wait_for("the blocker to run on B", || {
        names_with_status(&cfg_b, "running").contains(&"blocker".to_string())
    });
    // The step that started the blocker would have started the children
    // too, had they been placed: they run until `hold` goes, as it does.
    assert_eq!(names_with_status(&cfg_b, "running"), ["blocker"]);
    let mut waiting = names_with_status(&cfg_b, "waiting");
    waiting.sort();
    assert_eq!(waiting, ["c1", "c2"], "the children wait in no queue");
    std::fs::remove_file(rb.path().join("hold")).expect("release");
    wait_for("every task to finish on B", || {
        names_with_status(&cfg_b, "live").is_empty()
    });
    // A stop, not a kill: what the list showed is on the disk once the
    // daemon has exited (a step is published before it is durable).
    db.signal(libc::SIGTERM);
    db.wait_exit(Duration::from_secs(20));
    drop(db);
    let sb = state(&b);
    let blocked_until = sb.tasks[&blocker]
        .finished_at
        .expect("the blocker finished");
    for c in [c1, c2] {
        let t = &sb.tasks[&c];
        assert_eq!((t.status, t.attempts), (Status::Succeeded, 2), "{t:?}");
        let started = t.started_at.expect("started");
        assert!(
            started >= blocked_until,
            "child {c} started at {started}, before the blocker finished at {blocked_until}"
        );
    }
    let done = &sb.tasks[&c3];
    assert_eq!(
        (done.status, done.attempts),
        (Status::Succeeded, 1),
        "not run again"
    );
    assert_eq!(sb.tasks[&parent].status, Status::Succeeded);
    assert!(sb.queues.is_empty(), "{:?}", sb.queues);
    verify(&b);
}

#[test]
fn a_daemon_writes_backups_and_keeps_the_newest() {
    let root = tempdir();
    std::fs::create_dir(root.path().join("backups")).expect("mkdir");
    write_root(
        root.path(),
        HOOK,
        &config(
            "edge-1",
            "[backup]\nevery = \"1s\"\npath = \"backups\"\nkeep = 2\n",
        ),
    );
    std::fs::write(root.path().join("hold"), b"").expect("hold");
    let dir = root.path().join("data");
    common::enqueue_id(
        &dir,
        &[
            "--queue",
            "main",
            "--kind",
            "ModuleRun",
            "--name",
            "held",
            "--payload",
            r#"{"hold":1}"#,
        ],
    );
    common::enqueue_id(
        &dir,
        &["--queue", "main", "--kind", "ModuleRun", "--name", "next"],
    );
    let mut d = Daemon::start_in(root.path());
    let written = |d: &Daemon| -> Vec<String> {
        d.log_text()
            .lines()
            .filter_map(|l| l.split("] backup ").nth(1))
            .filter_map(|rest| rest.find(".bex:").map(|i| rest[..i + 4].to_string()))
            .collect()
    };
    wait_for("four backups", || written(&d).len() >= 4);
    std::fs::remove_file(root.path().join("hold")).expect("release");
    d.signal(libc::SIGTERM);
    d.wait_exit(Duration::from_secs(20));
    let all = written(&d);
    let mut left: Vec<PathBuf> = std::fs::read_dir(root.path().join("backups"))
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    left.sort();
    let newest: Vec<PathBuf> = all[all.len() - 2..].iter().map(PathBuf::from).collect();
    assert_eq!(
        left, newest,
        "the folder keeps the newest two; the log: {all:?}"
    );
    assert!(!Path::new(&all[0]).exists(), "the oldest was pruned");
    // A backup is an export of everything: it imports.
    let b = root.path().join("restored");
    let o = berth(&b, &["import", left[1].to_str().expect("utf-8")]);
    ok(&o, "import a backup");
    assert_eq!(stdout(&o), "imported 2 tasks: ids 1..2\n");
    verify(&b);
}

/// README.md, "Moving pending work to another node": the commands as
/// written there, on two "nodes" (two folders, each with its config).
#[test]
fn the_readme_worked_example_works() {
    let node_a = tempdir();
    let node_b = tempdir();
    let cfg_a = write_root(node_a.path(), HOOK, &config("edge-1", ""));
    let cfg_b = write_root(node_b.path(), HOOK, &config("edge-2", ""));
    std::fs::write(node_a.path().join("hold"), b"").expect("hold");
    let on_a = |args: &[&str]| berth_cfg(&cfg_a, args);
    let on_b = |args: &[&str]| berth_cfg(&cfg_b, args);
    for name in ["kube-dns", "cert-manager", "ingress-nginx"] {
        let payload = if name == "kube-dns" {
            r#"{"hold":1}"#
        } else {
            "{}"
        };
        ok(
            &on_a(&[
                "enqueue",
                "--queue",
                "main",
                "--kind",
                "ModuleRun",
                "--name",
                name,
                "--payload",
                payload,
            ]),
            "enqueue",
        );
    }
    let mut da = Daemon::start_in(node_a.path());
    wait_for("kube-dns to run on A", || {
        stdout(&on_a(&[
            "task", "list", "--status", "running", "-o", "json",
        ]))
        .contains("kube-dns")
    });
    // 1. Export through A's running daemon.
    let file = node_a.path().join("pending.bex");
    let o = on_a(&["export", "-o", file.to_str().expect("utf-8")]);
    ok(&o, "export");
    assert!(
        stderr(&o).contains("exported 3 tasks (1 queues, 0 groups)"),
        "{}",
        stderr(&o)
    );
    // 2. Stop A.
    std::fs::remove_file(node_a.path().join("hold")).expect("release");
    da.signal(libc::SIGTERM);
    da.wait_exit(Duration::from_secs(20));
    // 3. Copy the file.
    let copied = node_b.path().join("pending.bex");
    std::fs::copy(&file, &copied).expect("copy");
    // 4. Import on B and run.
    let o = on_b(&["import", copied.to_str().expect("utf-8")]);
    ok(&o, "import");
    assert_eq!(stdout(&o), "imported 3 tasks: ids 1..3\n");
    let o = Command::new(common::berth_bin())
        .args(["--config"])
        .arg(&cfg_b)
        .args(["run", "--until-idle"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run");
    ok(&o, "run --until-idle on B");
    let o = on_b(&["task", "list", "-o", "json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("json");
    let names: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or(""),
                r["status"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("kube-dns", "succeeded"),
            ("cert-manager", "succeeded"),
            ("ingress-nginx", "succeeded")
        ]
    );
}

#[test]
fn a_failed_backup_is_logged_and_tried_again_and_the_daemon_goes_on() {
    let root = tempdir();
    let backups = root.path().join("backups");
    std::fs::create_dir(&backups).expect("mkdir");
    write_root(
        root.path(),
        HOOK,
        &config("edge-1", "[backup]\nevery = \"1s\"\npath = \"backups\"\n"),
    );
    let mut d = Daemon::start_in(root.path());
    let count = |d: &Daemon, what: &str| d.log_text().lines().filter(|l| l.contains(what)).count();
    wait_for("a backup", || count(&d, "] backup ") >= 1);
    // The folder goes away: the next backups fail, and are logged.
    let away = root.path().join("away");
    std::fs::rename(&backups, &away).expect("move the folder away");
    wait_for("a failed backup", || {
        count(&d, "failed (tried again in 1s)") >= 1
    });
    assert!(
        d.child.try_wait().expect("try_wait").is_none(),
        "the daemon stopped"
    );
    // It comes back: so do the backups.
    std::fs::create_dir(&backups).expect("mkdir");
    wait_for("a backup in the new folder", || {
        std::fs::read_dir(&backups).expect("ls").count() >= 1
    });
    let o = berth(
        &root.path().join("data"),
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "ModuleRun",
            "--name",
            "n",
        ],
    );
    ok(&o, "the daemon still serves");
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}

/// A request names the export file to import by an absolute path, as it
/// names the file to export to: a relative one would be read from wherever
/// the daemon runs. It is refused as bad input, and nothing changes.
#[test]
fn an_import_request_with_a_relative_path_is_refused() {
    use berth::ops::{Class, Ctx, Request, execute};
    let dir = tempdir();
    let store = Store::open(dir.path(), Options::default(), berth::clock::system()).unwrap();
    let e = execute(
        &Ctx::direct(Some(&store), None),
        Request::Import {
            path: PathBuf::from("a.bex"),
            label: None,
        },
    )
    .unwrap_err();
    assert_eq!(e.class, Class::Input, "{e:?}");
    assert_eq!(e.message, "a.bex: the export file's path must be absolute");
    assert!(store.live_tasks().is_empty(), "nothing was imported");
}

#[test]
fn an_export_request_for_a_path_that_names_no_file_is_bad_input() {
    use berth::ops::{Class, Ctx, Request, execute};
    let dir = tempdir();
    let store = Store::open(
        &dir.path().join("data"),
        Options::default(),
        berth::clock::system(),
    )
    .unwrap();
    let folder = dir.path().display().to_string();
    for (path, says) in [
        (String::new(), "the export file's path is empty".to_string()),
        (
            format!("{folder}/sub/"),
            format!("{folder}/sub/: names a folder (it ends with '/'), not a file"),
        ),
        (
            format!("{folder}/a\0b.bex"),
            format!("{folder}/a\0b.bex: the export file's path contains a NUL byte"),
        ),
    ] {
        let e = execute(
            &Ctx::direct(Some(&store), None),
            Request::Export {
                path: PathBuf::from(&path),
                queues: vec![],
                statuses: vec![],
                history: false,
                targets: vec![],
            },
        )
        .unwrap_err();
        assert_eq!(
            (e.class, e.message.as_str()),
            (Class::Input, says.as_str()),
            "{path:?}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["data"], "nothing was written");
}

#[test]
fn an_import_request_for_a_fifo_or_a_device_is_refused_at_once() {
    // A FIFO no one writes to would block the open (and, in a daemon, the
    // connection's thread and its stop) for good; a device is no export.
    use berth::ops::{Class, Ctx, Request, execute};
    let dir = tempdir();
    let fifo = dir.path().join("pending.bex");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let data = dir.path().join("data");
    std::thread::spawn(move || {
        let store = Store::open(&data, Options::default(), berth::clock::system()).unwrap();
        for path in [fifo, PathBuf::from("/dev/zero")] {
            let r = execute(
                &Ctx::direct(Some(&store), None),
                Request::Import { path, label: None },
            );
            let _ = tx.send(r.map_err(|e| (e.class, e.message)));
        }
    });
    for what in ["a FIFO", "a character device"] {
        let answer = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the import to answer, not to wait for a writer");
        let (class, message) = answer.expect_err("refused");
        assert_eq!(class, Class::Input, "{message}");
        assert!(
            message.ends_with(&format!("it is {what}, not a regular file")),
            "{message}"
        );
    }
}

#[test]
fn a_daemon_imports_what_it_could_not_open_by_its_path_through_a_copy() {
    // A pipe (`import <(...)`) and a path that is not UTF-8 (which a
    // request cannot carry) are read by the command and sent as a private
    // copy: the same import as without a daemon.
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    let ra = tempdir();
    let a = ra.path().join("a");
    common::enqueue_id(
        &a,
        &["--queue", "main", "--kind", "ModuleRun", "--name", "one"],
    );
    let file = ra.path().join("one.bex");
    ok(
        &berth(&a, &["export", "-o", file.to_str().expect("utf-8")]),
        "export",
    );
    let bytes = std::fs::read(&file).expect("export file");
    let odd = ra.path().join(std::ffi::OsStr::from_bytes(b"one\xff.bex"));
    std::fs::write(&odd, &bytes).expect("copy");
    let fifo = ra.path().join("pipe.bex");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());

    let rb = tempdir();
    let cfg = write_root(rb.path(), HOOK, &config("edge-1", ""));
    let mut d = Daemon::start_in(rb.path());
    let import = |path: &Path| {
        Command::new(common::berth_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("import")
            .arg(path)
            .output()
            .expect("berth import")
    };
    let o = import(&odd);
    ok(&o, "import of a path that is not UTF-8");
    assert_eq!(stdout(&o), "imported 1 tasks: ids 1..1\n");
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(fifo)
                .expect("open the FIFO");
            f.write_all(&bytes).expect("write the FIFO");
        })
    };
    let o = import(&fifo);
    ok(&o, "import of a FIFO");
    assert_eq!(stdout(&o), "imported 1 tasks: ids 2..2\n");
    writer.join().expect("writer");
    d.signal(libc::SIGTERM);
    let (status, _) = d.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}

/// A finished task whose payload and result each fit `max_object` but do
/// not fit it together (a handler that echoes its payload) is what the
/// engine stores: a backup of it (`export --history`) imports again, into
/// a fresh data dir, with its result. An object over the budget on its own
/// is still refused.
#[test]
fn a_backup_of_a_task_that_echoed_a_large_payload_imports_again() {
    let root = tempdir();
    let cfg = |name: &str| -> PathBuf {
        let p = root.path().join(format!("{name}.toml"));
        std::fs::write(
            &p,
            format!(
                "data_dir = \"{name}\"\n[budget]\nmax_object = \"64KiB\"\ncompress_over = \
                 \"32KiB\"\n[handlers.Echo]\ncommand = [\"cat\"]\n"
            ),
        )
        .expect("config");
        p
    };
    let (a, b) = (cfg("a"), cfg("b"));
    // 100 KiB of hex digits from a xorshift: about 55 KiB gzip-compressed,
    // under 64 KiB alone and over it twice.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let digits: String = (0..100 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap_or('0')
        })
        .collect();
    let payload = root.path().join("payload.json");
    std::fs::write(&payload, serde_json::json!(digits).to_string()).expect("payload");
    let payload_arg = payload.to_str().expect("utf-8");
    ok(
        &berth_cfg(
            &a,
            &[
                "enqueue",
                "--queue",
                "main",
                "--kind",
                "Echo",
                "--name",
                "big",
                "--payload-file",
                payload_arg,
            ],
        ),
        "enqueue",
    );
    ok(&berth_cfg(&a, &["run", "--until-idle"]), "run");
    let shown = |cfg: &Path| -> serde_json::Value {
        let o = berth_cfg(cfg, &["task", "show", "1", "-o", "json"]);
        ok(&o, "task show");
        serde_json::from_str(&stdout(&o)).expect("json")
    };
    let done = shown(&a);
    assert_eq!(done["status"], "succeeded");
    assert_eq!(
        done["result"],
        serde_json::json!(digits),
        "the result is the payload"
    );
    let file = root.path().join("backup.bex");
    let file_arg = file.to_str().expect("utf-8");
    ok(
        &berth_cfg(&a, &["export", "-o", file_arg, "--history"]),
        "export",
    );
    ok(&berth_cfg(&b, &["import", file_arg]), "import");
    let back = shown(&b);
    assert_eq!(back["status"], "succeeded");
    assert_eq!(back["result"], done["result"]);
    assert_eq!(back["payload"], done["payload"]);
    let o = berth_cfg(&b, &["verify"]);
    ok(&o, "verify");
    // With a smaller budget, what is over it is refused, naming the task.
    let small = root.path().join("small.toml");
    std::fs::write(
        &small,
        "data_dir = \"c\"\n[budget]\nmax_object = \"40KiB\"\ncompress_over = \"32KiB\"\n\
         [handlers.Echo]\ncommand = [\"cat\"]\n",
    )
    .expect("config");
    let o = berth_cfg(&small, &["import", file_arg]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("after compression; the object budget is 40 KiB"),
        "{}",
        stderr(&o)
    );
    assert!(!root.path().join("c").exists(), "no data dir made");
}

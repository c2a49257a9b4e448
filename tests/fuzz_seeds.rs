//! Replays every seed and regression input of every cargo fuzz target
//! (`fuzz/seeds/NAME/*`) through the very functions the fuzzer runs
//! (`fuzz/src/targets/`, included here by path), on the stable toolchain,
//! so that `cargo test --release` checks them all on every run without
//! libFuzzer. See fuzz/README.md for the targets and how to run them.
//!
//! `cargo test --release --test fuzz_seeds -- --ignored write_seeds`
//! rewrites the generated seeds (`gen-*` files) of the binary targets.

#[allow(dead_code)]
#[path = "../fuzz/src/targets/mod.rs"]
mod targets;

use std::path::{Path, PathBuf};
use std::time::Instant;

fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds")
}

fn seeds(name: &str) -> Vec<PathBuf> {
    let dir = seeds_dir().join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every input of `name`'s seed folder; fails naming each input that
/// failed (the panic messages are printed above).
fn replay(name: &str) {
    let target = targets::target(name).expect("a target of that name");
    let files = seeds(name);
    assert!(!files.is_empty(), "fuzz/seeds/{name} is empty");
    let started = Instant::now();
    let mut failed = Vec::new();
    for path in &files {
        let data = std::fs::read(path).expect("a readable seed");
        if std::panic::catch_unwind(|| target(&data)).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{name}: {} of {} inputs failed: {failed:#?}",
        failed.len(),
        files.len()
    );
    eprintln!(
        "{name}: {} inputs replayed in {:.2?}",
        files.len(),
        started.elapsed()
    );
}

#[test]
fn batch() {
    replay("batch");
}

#[test]
fn log_files() {
    replay("log_files");
}

#[test]
fn codec() {
    replay("codec");
}

#[test]
fn commit_record() {
    replay("commit_record");
}

#[test]
fn config() {
    replay("config");
}

#[test]
fn control() {
    replay("control");
}

#[test]
fn gzip() {
    replay("gzip");
}

#[test]
fn store_files() {
    replay("store_files");
}

#[test]
fn store_ops() {
    replay("store_ops");
}

#[test]
fn transfer() {
    replay("transfer");
}

#[test]
fn units() {
    replay("units");
}

#[test]
fn every_target_has_seeds_a_test_and_a_fuzz_target() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let this = std::fs::read_to_string(file!()).unwrap_or_default();
    for (name, _) in targets::TARGETS {
        assert!(
            fuzz.join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file(),
            "fuzz/fuzz_targets/{name}.rs"
        );
        assert!(!seeds(name).is_empty(), "fuzz/seeds/{name}");
        assert!(
            this.is_empty() || this.contains(&format!("replay(\"{name}\")")),
            "a test replays {name}"
        );
    }
    for entry in std::fs::read_dir(seeds_dir()).expect("fuzz/seeds") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            targets::target(&name).is_some(),
            "fuzz/seeds/{name} has no target"
        );
    }
    assert!(
        targets::alloc::counting(),
        "the counting allocator is in use"
    );
}

/// Writes the generated seeds of the binary targets (codec, commit_record,
/// gzip) from real values: records of a real store, gzip of real JSON.
#[test]
#[ignore = "writes fuzz/seeds; run by hand"]
fn write_seeds() {
    use berth::budget::{Blob, Budget, gzip};
    use berth::clock::FakeClock;
    use berth::codec::encode;
    use berth::store::event::{CommitRecord, KeyWrite};
    use berth::store::{Options, Placement, Store};
    use berth::submit;
    use berth::task::TaskSpec;

    let write = |target: &str, name: &str, bytes: &[u8]| {
        let path = seeds_dir().join(target).join(format!("gen-{name}"));
        std::fs::write(&path, bytes).expect("write a seed");
    };
    // A store with a few tasks, a group, a failure and a finished task.
    let dir = tempfile::tempdir().expect("a temp dir");
    let clock = FakeClock::new(1_800_000_000_000);
    let store = Store::open(
        dir.path(),
        Options {
            disk_reserve: 0,
            ..Options::default()
        },
        std::sync::Arc::new(clock.clone()),
    )
    .expect("open");
    let spec = |name: &str, weight: Option<i64>, payload: serde_json::Value| TaskSpec {
        queue: "main".into(),
        kind: "ModuleRun".into(),
        name: name.into(),
        description: Some("doStartup:OperatorStartup".into()),
        weight,
        payload,
        tags: vec!["edge".into()],
        target: Some("edge-1".into()),
        compaction_key: None,
        ttl: None,
    };
    let a = submit::enqueue_one(
        &store,
        spec("a", None, serde_json::json!({"replicas": 2})),
        Placement::Last,
    )
    .expect("enqueue");
    submit::enqueue_one(
        &store,
        spec("b", None, serde_json::Value::Null),
        Placement::After(a),
    )
    .expect("enqueue");
    let big: Vec<String> = (0..4000).map(|i| format!("module-{i}")).collect();
    submit::enqueue_one(
        &store,
        spec("big", None, serde_json::json!(big)),
        Placement::First,
    )
    .expect("enqueue");
    submit::enqueue_batch(
        &store,
        vec![
            spec("x", Some(1), serde_json::Value::Null),
            spec("y", Some(1), serde_json::Value::Null),
        ],
    )
    .expect("batch");
    let mut w = store.write();
    w.start(a).expect("start");
    w.fail(a, "helm upgrade failed".into(), Some(5000))
        .expect("fail");
    w.start(a).expect("start");
    w.succeed(
        a,
        Some(
            Blob::from_json(
                "result",
                &serde_json::json!({"ok": true}),
                &Budget::default(),
            )
            .expect("blob"),
        ),
    )
    .expect("succeed");
    w.to_history(a, berth::task::Status::Succeeded)
        .expect("history");
    w.commit().expect("commit");
    let events: Vec<_> = store
        .events_from(1)
        .map(|e| e.expect("a good record"))
        .collect();
    let tasks: Vec<_> = store
        .live_tasks()
        .into_iter()
        .chain(store.history())
        .map(|t| t.expect("a good task"))
        .collect();
    // codec: selector (type in the low bits; bit 7 clear: the target adds
    // the checksum; bit 3: a live task's value) and the record without its
    // checksum.
    let unframed = |bytes: Vec<u8>| bytes[..bytes.len() - 4].to_vec();
    let with = |sel: u8, bytes: Vec<u8>| [vec![sel], bytes].concat();
    for t in &tasks {
        write(
            "codec",
            &format!("task-{}", t.id),
            &with(0, unframed(encode(t))),
        );
    }
    let record = CommitRecord {
        next_id: 9,
        events: events.clone(),
        writes: vec![KeyWrite::put(
            b"t\0\0\0\0\0\0\0\x01".to_vec(),
            encode(&tasks[0]),
        )],
    };
    write(
        "codec",
        "commit-record",
        &with(1, unframed(encode(&record))),
    );
    for (i, e) in events.iter().enumerate().take(12) {
        write(
            "codec",
            &format!("event-{i}"),
            &with(2, unframed(encode(e))),
        );
    }
    write("codec", "u64", &with(3, unframed(encode(&2u64))));
    write(
        "codec",
        "blob",
        &with(4, unframed(encode(&tasks[0].payload))),
    );
    write(
        "codec",
        "keywrite",
        &with(5, unframed(encode(&record.writes[0]))),
    );
    write(
        "codec",
        "placement",
        &with(6, unframed(encode(&Placement::After(7)))),
    );
    write(
        "codec",
        "string",
        &with(7, unframed(encode(&"parallel_queue_0".to_string()))),
    );
    write("codec", "raw-task", &with(0x80, encode(&tasks[0])));
    // Bit 3: a live task's value, as the store keeps it (with its summary).
    // (`gen-live-0` and `gen-live-1`, kept as they were written before store
    // format 8, are the same without a summary, with version-1 records.)
    use berth::store::stored;
    for (i, pos) in [Some(-(1i64 << 32)), None].into_iter().enumerate() {
        write(
            "codec",
            &format!("live-summary-{i}"),
            &with(0x08, stored::live_bytes(&tasks[0], pos)),
        );
    }
    // A record as a commit writes it (version 3): each new task's key
    // write names its event.
    let mut v3 = record.clone();
    v3.writes.clear();
    for (i, e) in events.iter().enumerate() {
        if let berth::store::EventKind::Enqueued { task, .. } = &e.kind {
            let position = Some(i as i64);
            v3.writes.push(KeyWrite {
                key: berth::store::keys::id_key(berth::store::keys::TASK, task.id).to_vec(),
                value: Some(stored::live_bytes(task, position)),
                from_event: Some(berth::store::event::FromEvent {
                    event: i as u32,
                    position,
                }),
            });
        }
    }
    assert!(v3.writes.len() >= 5, "the store's tasks were enqueued");
    let v3 = berth::codec::encode_as(&v3, berth::codec::COMMIT_VERSION).expect("encodes");
    write("codec", "commit-record-v3", &with(1, unframed(v3.clone())));
    // commit_record: mode 1 (raw) and the record without its checksum.
    write("commit_record", "log", &with(1, unframed(encode(&record))));
    write("commit_record", "log-v3", &with(1, unframed(v3)));
    let mut half = record.clone();
    half.events.truncate(3);
    write(
        "commit_record",
        "log-start",
        &with(1, unframed(encode(&half))),
    );
    // gzip: the cap (little-endian u16, in 16-byte steps) and the bytes.
    let cap = |n: u16| n.to_le_bytes().to_vec();
    let json = serde_json::to_vec(&serde_json::json!(big)).expect("json");
    write("gzip", "json", &[cap(4096), gzip(&json)].concat());
    write("gzip", "json-over-cap", &[cap(64), gzip(&json)].concat());
    write(
        "gzip",
        "small",
        &[cap(8), gzip(b"{\"replicas\":2}")].concat(),
    );
    write(
        "gzip",
        "zeros",
        &[cap(1024), gzip(&[0u8; 100_000])].concat(),
    );
    write("gzip", "empty", &[cap(1), gzip(b"")].concat());
    let mut cut = gzip(&json);
    cut.truncate(cut.len() / 2);
    write("gzip", "truncated", &[cap(4096), cut].concat());
    write(
        "gzip",
        "raw-json",
        &[cap(100), b"[1,2,{\"a\":null}]".to_vec()].concat(),
    );
}

/// `cargo test --release --test fuzz_seeds -- --ignored write_log_file_seeds`
/// writes the `log_files` seeds: a segment and a checkpoint of a store that
/// ran a few tasks and a group, cut by retention.
#[test]
#[ignore = "writes fuzz/seeds/log_files; run by hand"]
fn write_log_file_seeds() {
    use berth::clock::FakeClock;
    use berth::retention::{self, Retention};
    use berth::store::{Options, Placement, Store};
    use berth::task::TaskSpec;

    let dir = tempfile::tempdir().expect("a temp dir");
    let clock = FakeClock::new(1_800_000_000_000);
    let store = Store::open(
        dir.path(),
        Options {
            disk_reserve: 0,
            ..Options::default()
        },
        std::sync::Arc::new(clock.clone()),
    )
    .expect("open");
    let spec = |name: &str, weight: Option<i64>| TaskSpec {
        queue: "main".into(),
        kind: "ModuleRun".into(),
        name: name.into(),
        weight,
        payload: serde_json::json!({"name": name}),
        ..Default::default()
    };
    let r = Retention {
        log_size: 512,
        ..Retention::default()
    };
    for round in 0..3 {
        let id =
            berth::submit::enqueue_one(&store, spec(&format!("a{round}"), None), Placement::Last)
                .expect("enqueue");
        berth::submit::enqueue_batch(
            &store,
            vec![
                spec(&format!("g{round}"), Some(1)),
                spec(&format!("h{round}"), Some(1)),
            ],
        )
        .expect("a group");
        let mut w = store.write();
        w.start(id).expect("start");
        w.commit().expect("commit");
        let mut w = store.write();
        w.succeed(id, None).expect("succeed");
        w.to_history(id, berth::task::Status::Succeeded)
            .expect("history");
        w.commit().expect("commit");
        clock.advance_ms(1000);
        retention::pass(&store, &r).expect("a retention pass");
    }
    let out = seeds_dir().join("log_files");
    let seg = berth::archive::list(&dir.path().join(berth::archive::DIR)).expect("segments");
    let seg = seg.first().expect("a segment");
    let bytes = std::fs::read(&seg.path).expect("read the segment");
    std::fs::write(out.join("gen-segment"), [vec![0u8], bytes].concat()).expect("write");
    let (_, ck) = berth::checkpoint::list(dir.path())
        .expect("checkpoints")
        .pop()
        .expect("a checkpoint");
    let bytes = std::fs::read(&ck).expect("read the checkpoint");
    std::fs::write(out.join("gen-checkpoint"), [vec![1u8], bytes].concat()).expect("write");
}

//! Batch files (`berth::submit::parse_batch`), then staging them in a store
//! (`submit::stage_batch`, in a transaction that is dropped, so nothing is
//! written and one store serves every input).
//!
//! The store's budget is small (objects of at most 2 KiB, compressed from
//! 256 bytes), so that inputs of a few KiB reach every budget check.
//!
//! Asserts:
//! - parsing never panics, and a refused file is refused as a whole
//!   document or names its entry (`entry N: ...`, N an entry of the file);
//! - a batch that parses either stages or is refused with an error that
//!   names an entry and a field, and the entry named is at fault: its spec
//!   does not validate, its payload does not fit, or its record is over
//!   the budget;
//! - a batch whose every entry is fine on its own stages, with one id per
//!   single task and group, in queue order: new ids rising, and a run that
//!   reports an earlier run's id only where it could merge into it (same
//!   queue, size, kinds and compaction keys).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use berth::budget::Budget;
use berth::clock::FakeClock;
use berth::codec;
use berth::groups;
use berth::store::{Durability, Options, Role, Store};
use berth::submit::{self, EnqueueError};
use berth::task::TaskSpec;

const FIELDS: [&str; 9] = [
    "queue",
    "kind",
    "name",
    "description",
    "weight",
    "payload",
    "tags",
    "target",
    "compaction_key",
];

fn budget() -> Budget {
    Budget {
        compress_over: 256,
        max_object: 2048,
        max_decompressed: 64 << 10,
    }
}

fn store() -> &'static Store {
    static STORE: OnceLock<Store> = OnceLock::new();
    STORE.get_or_init(|| {
        // The store lives as long as the process; so does its folder.
        let dir = super::process_dir("berth-fuzz-batch-");
        let opts = Options {
            durability: Durability::Batched {
                interval: Duration::from_secs(3600),
            },
            budget: budget(),
            role: Role::Command,
            wait_for_lock: Duration::ZERO,
            create: true,
            cache_bytes: 1 << 20,
            power_safe: false,
            write_ahead_log: false,
            sled_flush_every: Duration::from_secs(3600),
            read_only: false,
            disk_reserve: 0,
        };
        Store::open(
            Path::new(&dir),
            opts,
            Arc::new(FakeClock::new(1_800_000_000_000)),
        )
        .expect("open the batch store")
    })
}

/// Why the entry would be refused on its own, if it would: the field.
fn fault(spec: &TaskSpec) -> Option<&'static str> {
    let b = budget();
    match spec.clone().into_task(0, &b) {
        Err(e) => Some(e.field()),
        Ok(mut t) => {
            t.id = u64::MAX;
            (codec::encode(&t).len() > b.max_object).then_some("payload")
        }
    }
}

pub fn batch(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let specs = match submit::parse_batch(text) {
        Ok(specs) => specs,
        Err(message) => {
            let entries = match serde_json::from_str::<serde_json::Value>(text) {
                Ok(serde_json::Value::Array(a)) => Some(a.len()),
                Ok(serde_json::Value::Object(o)) => {
                    o.get("tasks").and_then(|t| t.as_array()).map(Vec::len)
                }
                _ => None,
            };
            if let Some(rest) = message.strip_prefix("entry ") {
                // `entry N of M[:|,] ...`, counted from 1.
                let mut words = rest.split([' ', ':', ',']);
                let n: usize = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("an entry error without its number: {message}"));
                let of: Option<usize> = (words.next() == Some("of"))
                    .then(|| words.next().and_then(|m| m.parse().ok()))
                    .flatten();
                let entries = entries.unwrap_or_else(|| panic!("{message}: but no entries"));
                assert_eq!(of, Some(entries), "{message}: it has {entries} entries");
                assert!(
                    (1..=entries).contains(&n),
                    "{message}: only {entries} entries"
                );
            } else {
                let document = [
                    "not valid JSON: ",
                    "unknown field `",
                    "field `tasks` must be an array",
                    "missing field `tasks`",
                    "duplicate field `",
                    "expected a JSON array of task specs",
                ];
                assert!(
                    document.iter().any(|d| message.starts_with(d)),
                    "a refusal that names no entry: {message}"
                );
            }
            return;
        }
    };
    let faults: Vec<Option<&'static str>> = specs.iter().map(fault).collect();
    let store = store();
    let mut w = store.write();
    let staged = submit::stage_batch(&mut w, store, specs.clone());
    drop(w);
    match staged {
        Ok(ids) => {
            if let Some(i) = faults.iter().position(Option::is_some) {
                panic!(
                    "entry {i} is at fault ({:?}) but the batch staged",
                    faults[i]
                );
            }
            let runs = groups::plan_indices(&specs);
            assert_eq!(ids.len(), runs.len(), "one id per single task and group");
            // A run whose entries all have compaction keys may merge into
            // an earlier run of the batch (README, "Compaction": within one
            // batch, a later entry merges into an earlier one) and report
            // its id again; every other run adds a task, with a new id
            // above every id before it.
            let mut newest = 0;
            for (k, (run, &id)) in runs.iter().zip(&ids).enumerate() {
                if id > newest {
                    newest = id;
                    continue;
                }
                let earlier = ids[..k].iter().position(|&e| e == id);
                let Some(e) = earlier else {
                    panic!("run {k} has id {id}, new but not above {newest}: {ids:?}");
                };
                let keyed = |r: &[usize]| r.iter().all(|&i| specs[i].compaction_key.is_some());
                assert!(
                    keyed(run) && keyed(&runs[e]),
                    "run {k} reports run {e}'s id {id} without compaction keys: {ids:?}"
                );
                let (a, b) = (&specs[runs[e][0]], &specs[run[0]]);
                assert!(
                    a.queue == b.queue && run.len() == runs[e].len(),
                    "run {k} merged into run {e} of another queue or size: {ids:?}"
                );
                for (&i, &j) in runs[e].iter().zip(run) {
                    assert!(
                        specs[i].kind == specs[j].kind
                            && specs[i].compaction_key == specs[j].compaction_key,
                        "entry {j} merged into entry {i} of another kind or key"
                    );
                }
            }
        }
        Err(EnqueueError::Invalid {
            entry: Some(entry),
            field,
            reason,
        }) => {
            let i = entry.index;
            assert!(
                i < specs.len() && entry.of == specs.len(),
                "{entry} of {}",
                specs.len()
            );
            assert!(
                FIELDS.contains(&field),
                "field {field} is no field of an entry"
            );
            assert!(
                faults[i].is_some(),
                "entry {i}, field {field}: {reason}: but entry {i} is fine on its own ({:?})",
                specs[i]
            );
        }
        Err(e) => panic!("a batch refused without naming its entry and field: {e}"),
    }
}

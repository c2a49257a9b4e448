//! Store format 6 made by hand from a format-7 data dir, for the tests of
//! the fold that upgrades it (`store::open::fold_queue_keys`), and what a
//! data dir's queues and keys are.

use std::collections::BTreeMap;
use std::path::Path;

use berth::codec;
use berth::store::event::{CommitRecord, KeyWrite};
use berth::store::{Store, keys, stored};

/// Every non-empty queue and its ids, head first.
pub fn queues(store: &Store) -> BTreeMap<String, Vec<u64>> {
    store
        .queues()
        .into_iter()
        .map(|(q, _)| {
            let ids = store.queue_ids(&q);
            (q, ids)
        })
        .collect()
}

/// Rewrites a format-7 data dir as a format-6 build left it: each live
/// task's position in a `q` key and its record alone (for the tasks
/// `unfold` picks; the others as a fold of the new build left them), the
/// last commit record's key writes in format 6's form (with `q` keys if
/// `places`: a format-6 record has them only where the order changed), and
/// `mformat` = `format`. Returns how many `q` keys the dir has.
pub fn make_format_6(dir: &Path, unfold: impl Fn(u64) -> bool, places: bool, format: u64) -> usize {
    let db = sled::open(dir.join("db")).expect("sled");
    let as_6 = |k: &[u8], v: &[u8]| -> Vec<KeyWrite> {
        let id = keys::parse_id_key(k).expect("a task key");
        let mut out = vec![KeyWrite::put(k.to_vec(), stored::split(v).record.to_vec())];
        if let Some((q, pos)) = stored::position(v).expect("position") {
            out.push(KeyWrite::put(keys::queue_key(&q, pos), codec::encode(&id)));
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

/// The dir's format and how many `q` keys it has. (Opened with sled
/// directly: only after a store, not right after another such open, whose
/// lock sled may still hold.)
pub fn inspect(dir: &Path) -> (u64, usize) {
    let db = sled::open(dir.join("db")).expect("sled");
    let format = codec::decode(&db.get(keys::META_FORMAT).unwrap().unwrap()).unwrap();
    (format, db.scan_prefix([keys::QUEUE]).count())
}

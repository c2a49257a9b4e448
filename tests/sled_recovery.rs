//! sled's recovery of its log when the segment that holds the newest
//! header's stable point is gone from the file (vendor/sled/BERTH.md,
//! change 8).
//!
//! A segment header records `max_stable_lsn`: how far the log was synced
//! when the header was written. Recovery checks the segments from the one
//! that holds that point on; sled 0.34 took a missing one there for a torn
//! write and recovered nothing at all, not even what lay before it. A power
//! cut on LazyFS left exactly that (`tests/power_cut.rs`, 1 daemon run in
//! about 2,700): the segments holding the stable point had been freed and
//! cut off the end of the file, and berth found an empty database. Here the
//! newest header is rewritten to claim a stable point in a segment the file
//! does not hold, and every task written before must still open.

mod common;

use std::path::Path;

use berth::clock::FakeClock;
use berth::store::Placement;
use berth::submit;
use common::{T0, assert_log_agrees, open, spec, tempdir};

/// sled's segment size as berth opens it (sled's default).
const SEGMENT: u64 = 512 * 1024;
const SEGMENT_HEADER: usize = 20;
/// sled stores both numbers in a header XOR-ed with this.
const LSN_XOR: i64 = 0x7FFF_FFFF_FFFF_FFFF;

/// The header of the segment with the highest lsn in sled's log file:
/// (offset, lsn).
fn newest_segment(log: &[u8]) -> (usize, i64) {
    log.chunks(SEGMENT as usize)
        .enumerate()
        .filter_map(|(i, seg)| {
            let h = seg.get(..SEGMENT_HEADER)?;
            let crc = u32::from_le_bytes(h[0..4].try_into().ok()?) ^ 0xFFFF_FFFF;
            let lsn = i64::from_le_bytes(h[4..12].try_into().ok()?) ^ LSN_XOR;
            (crc32fast::hash(&h[4..20]) == crc).then_some((i * SEGMENT as usize, lsn))
        })
        .max_by_key(|(_, lsn)| *lsn)
        .expect("sled's log has a valid segment header")
}

/// Rewrites the header at `at` to say the log was stable up to `stable`.
fn claim_stable(log: &mut [u8], at: usize, stable: i64) {
    log[at + 12..at + 20].copy_from_slice(&(stable ^ LSN_XOR).to_le_bytes());
    let crc = crc32fast::hash(&log[at + 4..at + 20]) ^ 0xFFFF_FFFF;
    log[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

fn snapshots(db: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(db)
        .expect("listing db/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snap."))
        })
        .collect()
}

#[test]
fn a_log_whose_stable_point_lies_in_a_segment_no_longer_in_the_file_opens_with_what_it_holds() {
    let dir = tempdir();
    let clock = FakeClock::new(T0);
    let ids: Vec<u64> = {
        let s = open(dir.path(), &clock);
        (0..20)
            .map(|i| {
                submit::enqueue_one(&s, spec("main", &format!("t{i}")), Placement::Last)
                    .expect("enqueue")
            })
            .collect()
    };
    let db = dir.path().join("db");
    // Recovery then reads the whole log, as it did in the cut that found
    // the bug (no snapshot had been written there); a snapshot is only a
    // shortcut through the log.
    for snap in snapshots(&db) {
        std::fs::remove_file(snap).expect("removing a sled snapshot");
    }
    let path = db.join("db");
    let mut log = std::fs::read(&path).expect("reading sled's log");
    let (at, lsn) = newest_segment(&log);
    let segments_in_file = (log.len() as u64).div_ceil(SEGMENT) as i64;
    // A point in the segment after the last one the file holds.
    let stable =
        (lsn / SEGMENT as i64).max(segments_in_file) * SEGMENT as i64 + SEGMENT as i64 + 100;
    claim_stable(&mut log, at, stable);
    std::fs::write(&path, &log).expect("writing sled's log");

    let s = open(dir.path(), &clock);
    assert_eq!(
        s.queue_len("main"),
        ids.len(),
        "every task written before is there"
    );
    for id in ids {
        assert!(s.task(id).expect("reading a task").is_some(), "task {id}");
    }
    assert_log_agrees(&s);
}

//! The record codec (`berth::codec`): every value berth reads from disk.
//!
//! The first byte picks the record type and whether the rest is taken as a
//! whole record (checksum and all) or as version byte and body, framed here
//! with a correct CRC-32 so that the fuzzer reaches the body decoder. With
//! bit 3 set, the rest is a live task's value (`berth::store::stored`: a
//! position, a summary and a record, each framed), taken as it is.
//!
//! Asserts:
//! - decoding never panics;
//! - a record that decodes re-encodes to exactly the same bytes at its own
//!   version (`codec::encode_as`; a version-1 record as version 1): the
//!   encoding is canonical, no two records mean the same value;
//! - decoding allocates no more than the allocation limit the codec picks
//!   for the record's size, plus the boxes bincode does not count (a
//!   task inside an event), bounded by the input's size;
//! - a live task's value whose parts both decode is exactly their join.

use std::fmt::Debug;

use berth::budget::Blob;
use berth::codec;
use berth::store::event::{CommitRecord, Event, KeyWrite};
use berth::store::order::Placement;
use berth::store::stored;
use berth::task::Task;

use super::alloc;

/// The allocation limit `codec::decode` uses for a body of `len` bytes.
fn decode_limit(body_len: usize) -> usize {
    match body_len {
        0..=2_048 => 64 << 10,
        2_049..=65_536 => 2 << 20,
        65_537..=1_048_576 => 32 << 20,
        _ => 4 * codec::MAX_RECORD_BYTES,
    }
}

/// `bytes` followed by their CRC-32, as `codec::encode` frames a record.
pub fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    v
}

fn check<T: codec::Record + Debug>(record: &[u8]) {
    let (decoded, peak) = alloc::measure(|| codec::decode::<T>(record));
    let body = record.len().saturating_sub(5);
    // Each event can hold a boxed task that bincode's limit does not
    // count: at most one per 3 bytes of body, of `size_of::<Task>()`.
    let boxes = (body / 3 + 1) * std::mem::size_of::<Task>();
    let bound = decode_limit(body) + boxes + 4 * record.len() + (16 << 10);
    if alloc::counting() {
        assert!(
            peak <= bound,
            "decoding a {}-byte record as {} took {peak} bytes (bound {bound})",
            record.len(),
            std::any::type_name::<T>()
        );
    }
    if let Ok(value) = decoded {
        let version = codec::version_of(record).expect("a record that decodes has a version");
        let again =
            codec::encode_as(&value, version).expect("a decoded value has its version's form");
        assert!(
            again == record,
            "a record that decodes must re-encode to the same bytes: {record:?} decoded as {value:?}, which encodes as {again:?}"
        );
    }
}

/// A live task's value: each part as a record of its own, and the whole.
fn check_live(v: &[u8]) {
    let parts = stored::split(v);
    if let Some(p) = parts.position {
        check::<Option<stored::Position>>(p);
    }
    if let Some(s) = parts.summary {
        check::<stored::Summary>(s);
    }
    check::<Task>(parts.record);
    // A summary is only taken with a whole record frame.
    if stored::summary(v).is_some() {
        assert!(codec::check_frame(parts.record).is_ok());
    }
    let (position, task) = stored::decode_live(v);
    if let Ok(t) = &task {
        let _ = stored::check_summary(v, t);
    }
    if let (Ok(_), Ok(_), Some(p)) = (position, task, parts.position) {
        assert_eq!(
            stored::with_position(p, v),
            v,
            "a live value that decodes is its parts joined"
        );
    }
}

pub fn codec(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector & 0x08 != 0 {
        return check_live(rest);
    }
    let record = if selector & 0x80 == 0 {
        frame(rest)
    } else {
        rest.to_vec()
    };
    match selector & 0x07 {
        0 => check::<Task>(&record),
        1 => check::<CommitRecord>(&record),
        2 => check::<Event>(&record),
        3 => check::<u64>(&record),
        4 => check::<Blob>(&record),
        5 => check::<KeyWrite>(&record),
        6 => check::<Placement>(&record),
        _ => check::<String>(&record),
    }
}

//! The key layout of berth's one sled tree. Every key starts with a byte that
//! names its record type. Integers are big-endian so sled's byte order is
//! numeric order. (A commit is atomic because it is one `e` record that
//! carries its key writes; see `write` and `overlay`.)
//!
//! | key                                   | value (codec record)  |
//! |---------------------------------------|-----------------------|
//! | `m` name                              | meta: format, applied, parallel queues |
//! | `t` id:u64                            | live task             |
//! | `h` id:u64                            | finished task         |
//! | `e` seq:u64                           | commit record         |
//! | `q` queue-name 0x00 position:i64(*)   | task id:u64           |
//! | `c` kind                              | that kind's counters  |
//!
//! (*) positions are stored with the sign bit flipped so that negative
//! positions sort before positive ones.

pub const META: u8 = b'm';
pub const TASK: u8 = b't';
pub const HISTORY: u8 = b'h';
pub const EVENT: u8 = b'e';
pub const QUEUE: u8 = b'q';
/// Counters per task kind (see `counters`).
pub const COUNTER: u8 = b'c';

pub const META_FORMAT: &[u8] = b"mformat";
/// The key (first event number) of a commit record up to which every record's
/// key writes are in the tree; open re-applies the records after it.
pub const META_APPLIED: &[u8] = b"mapplied";
/// The event where counting began (see `counters`).
pub const META_COUNTED: &[u8] = b"mcounted";

/// The number of parallel queues the last daemon ran (so that a data dir
/// read without a daemon lists the same queues).
pub const META_PARALLEL: &[u8] = b"mparallel";

/// The node (name and tags) of the last daemon that ran on the data dir,
/// so that a data dir read without a daemon says which tasks are not for it.
pub const META_NODE: &[u8] = b"mnode";

/// The on-disk layout version (the key layout above; the record framing has its own byte).
pub const STORE_FORMAT: u64 = 2;
/// The format before deferred apply (no `mapplied`; only the last record may
/// be partly applied). Opening upgrades it.
pub const STORE_FORMAT_V1: u64 = 1;

pub fn id_key(prefix: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Reads the u64 after a one-byte prefix.
pub fn parse_id_key(key: &[u8]) -> Option<u64> {
    if key.len() != 9 {
        return None;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[1..]);
    Some(u64::from_be_bytes(b))
}

/// The key of a kind's counters.
pub fn counter_key(kind: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(kind.len() + 1);
    k.push(COUNTER);
    k.extend_from_slice(kind.as_bytes());
    k
}

fn pos_bytes(pos: i64) -> [u8; 8] {
    ((pos as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn queue_key(queue: &str, pos: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(queue.len() + 10);
    k.push(QUEUE);
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(&pos_bytes(pos));
    k
}

/// Splits a queue key into queue name and position.
pub fn parse_queue_key(key: &[u8]) -> Option<(String, i64)> {
    if key.len() < 11 || key[0] != QUEUE || key[key.len() - 9] != 0 {
        return None;
    }
    let name = std::str::from_utf8(&key[1..key.len() - 9]).ok()?;
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[key.len() - 8..]);
    let pos = (u64::from_be_bytes(b) ^ (1 << 63)) as i64;
    Some((name.to_string(), pos))
}

pub fn key_display(key: &[u8]) -> String {
    match key.first() {
        Some(&p @ (TASK | HISTORY | EVENT)) if key.len() == 9 => {
            format!("{}/{}", p as char, parse_id_key(key).unwrap_or(0))
        }
        Some(&QUEUE) => match parse_queue_key(key) {
            Some((q, pos)) => format!("q/{q}/{pos}"),
            None => format!("{key:?}"),
        },
        _ => String::from_utf8_lossy(key).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_keys_sort_by_position_and_round_trip() {
        let ps = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys: Vec<_> = ps.iter().map(|p| queue_key("main", *p)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for (k, p) in keys.iter().zip(ps) {
            assert_eq!(parse_queue_key(k), Some(("main".to_string(), p)));
        }
        assert_eq!(parse_queue_key(b"qmain"), None);
    }

    #[test]
    fn id_keys_sort_numerically() {
        assert!(id_key(TASK, 2) < id_key(TASK, 256));
        assert_eq!(parse_id_key(&id_key(EVENT, 99)), Some(99));
        assert_eq!(key_display(&id_key(TASK, 42)), "t/42");
    }
}

//! The commit records' keys: a record is stored whole under `e` ‖ its
//! first event number, or, when it is larger than [`CHUNK`], in pieces of
//! at most `CHUNK` bytes under `e` ‖ first event number ‖ piece number
//! (u32, from 0), all written in one atomic sled batch.
//!
//! Why: sled 0.34 writes a page (a leaf of up to 17 keys) of more than a
//! quarter of its 512 KiB segment as a file of its own under `db/blobs`,
//! and does not always delete the file when the page is written again
//! (sled issue 786): a log of large records (an enqueue batch of 1,000
//! tasks of 4 KiB is 8 MiB) grew `db/blobs` with every task run, by
//! hundreds of megabytes per 100,000 tasks, whatever retention cut. With
//! pieces of 6 KiB a leaf of the log stays under 128 KiB and is written in
//! sled's log, whose segments sled reuses.
//!
//! A piece key sorts after its record's whole key and before the next
//! record's (`e` ‖ n < `e` ‖ n ‖ i < `e` ‖ n+1), so a range of records is a
//! range of keys, and [`Records`] puts each record back together. The
//! pieces are cut from the framed record (`codec::frame`), whose length
//! and CRC-32 check the joined bytes: a piece missing or out of place is a
//! corrupt record, named by its key.

use std::ops::Bound;

use sled::IVec;

use crate::store::error::CorruptRecord;
use crate::store::event::CommitRecord;
use crate::store::keys::{self, EVENT};

/// The largest piece of a commit record under one key (and the largest
/// record stored whole).
pub const CHUNK: usize = 6 * 1024;

/// The length of a piece's key: `e` ‖ seq ‖ piece number.
const PIECE_KEY_LEN: usize = 13;

/// The key of piece `i` of the record whose first event is `seq`.
pub fn piece_key(seq: u64, i: u32) -> [u8; PIECE_KEY_LEN] {
    let mut k = [0u8; PIECE_KEY_LEN];
    k[..9].copy_from_slice(&keys::id_key(EVENT, seq));
    k[9..].copy_from_slice(&i.to_be_bytes());
    k
}

/// The first event number of a record key (whole or piece).
pub fn key_seq(key: &[u8]) -> Option<u64> {
    match key.len() {
        9 | PIECE_KEY_LEN => keys::parse_id_key(&key[..9]),
        _ => None,
    }
}

/// The sled writes that store `record` (whole, or in pieces).
pub fn writes(seq: u64, record: &[u8]) -> Stored {
    if record.len() <= CHUNK {
        return Stored::Whole(keys::id_key(EVENT, seq), sled::IVec::from(record));
    }
    let mut batch = sled::Batch::default();
    for (key, piece) in pieces(seq, record) {
        batch.insert(key, piece);
    }
    Stored::Pieces(batch)
}

/// The keys and values that store `record`: its whole key, or its pieces.
pub fn pieces(seq: u64, record: &[u8]) -> Vec<(Vec<u8>, &[u8])> {
    if record.len() <= CHUNK {
        return vec![(keys::id_key(EVENT, seq).to_vec(), record)];
    }
    record
        .chunks(CHUNK)
        .enumerate()
        // A record is at most `codec::MAX_RECORD_BYTES`: far fewer pieces
        // than u32 numbers.
        .map(|(i, piece)| {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            (piece_key(seq, i).to_vec(), piece)
        })
        .collect()
}

/// Record keys not yet in the tree (the overlay's, see `overlay`), in key order.
pub type Pending = std::collections::BTreeMap<Vec<u8>, IVec>;

/// The log as a reader sees it: the records in the tree and those written
/// after them that are still pending (with a write-ahead log, a commit's
/// record reaches the tree in the applier's next round), up to the last
/// record committed when the view was taken. The pending records are
/// taken before the tree is read: a record the applier writes meanwhile is
/// read from one or the other.
pub struct View<'t> {
    pub tree: &'t sled::Tree,
    pub pending: Pending,
    /// The key (first event number) of the last record committed.
    pub last: u64,
}

impl<'t> View<'t> {
    /// The records whose first event is in `from..=to` (and not after the
    /// view's last record: one committed since may be half in the tree).
    pub fn read(&self, from: u64, to: u64) -> Records<Merged> {
        let to = to.min(self.last);
        let range = match from <= to {
            true => range(from, to),
            // Nothing (a map's range must not begin after its end).
            false => {
                let at = keys::id_key(EVENT, from).to_vec();
                (Bound::Included(at.clone()), Bound::Excluded(at))
            }
        };
        let pending: Pending = self
            .pending
            .range::<Vec<u8>, _>((range.0.as_ref(), range.1.as_ref()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Records::new(Merged {
            tree: self.tree.range(range).peekable(),
            pending: pending.into_iter().peekable(),
        })
    }

    /// The first event number of the log's last record.
    pub fn last_seq(&self) -> sled::Result<Option<u64>> {
        let pending = self.pending.keys().next_back().and_then(|k| key_seq(k));
        Ok(last_seq(self.tree)?.max(pending))
    }

    /// The key of the log's first record (`Err` names a key that is no
    /// record's).
    pub fn first_key(&self) -> sled::Result<Option<Vec<u8>>> {
        let tree = self.tree.scan_prefix([EVENT]).next().transpose()?;
        let tree = tree.map(|(k, _)| k.to_vec());
        let pending = self.pending.keys().next().cloned();
        Ok(match (tree, pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// The first event number of the last record that begins at or before
    /// `seq` (the one that holds event `seq`, if any does).
    pub fn holding(&self, seq: u64) -> Option<u64> {
        let range = range(0, seq);
        let tree = self
            .tree
            .range(range.clone())
            .next_back()
            .and_then(|r| r.ok())
            .and_then(|(k, _)| key_seq(&k));
        let pending = self
            .pending
            .range::<Vec<u8>, _>((range.0.as_ref(), range.1.as_ref()))
            .next_back()
            .and_then(|(k, _)| key_seq(k));
        tree.max(pending)
    }
}

/// A range of the tree's record keys merged with the pending ones (a key
/// in both is read once, as pending).
pub struct Merged {
    tree: std::iter::Peekable<sled::Iter>,
    pending: std::iter::Peekable<std::collections::btree_map::IntoIter<Vec<u8>, IVec>>,
}

impl Iterator for Merged {
    type Item = sled::Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::cmp::Ordering::*;
        let from_pending = match (self.tree.peek(), self.pending.peek()) {
            (_, None) => false,
            (None, Some(_)) => true,
            // An error is read at its place in the tree's order: now.
            (Some(Err(_)), Some(_)) => false,
            (Some(Ok((tk, _))), Some((pk, _))) => match tk[..].cmp(pk.as_slice()) {
                Less => false,
                Greater => true,
                Equal => {
                    self.tree.next();
                    true
                }
            },
        };
        if from_pending {
            let (k, v) = self.pending.next()?;
            return Some(Ok((IVec::from(k), v)));
        }
        self.tree.next()
    }
}

/// How a record goes into the tree.
pub enum Stored {
    Whole([u8; 9], sled::IVec),
    Pieces(sled::Batch),
}

impl Stored {
    pub fn apply(self, tree: &sled::Tree) -> sled::Result<()> {
        match self {
            Stored::Whole(k, v) => tree.insert(k, v).map(|_| ()),
            Stored::Pieces(batch) => tree.apply_batch(batch),
        }
    }
}

/// The keys of the records whose first event is in `from..=to`.
pub fn range(from: u64, to: u64) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let end = match to.checked_add(1) {
        Some(next) => keys::id_key(EVENT, next).to_vec(),
        // Every key of the `e` range, pieces of the last number included.
        None => vec![EVENT + 1],
    };
    (
        Bound::Included(keys::id_key(EVENT, from).to_vec()),
        Bound::Excluded(end),
    )
}

/// The first event number of the log's last record.
pub fn last_seq(tree: &sled::Tree) -> sled::Result<Option<u64>> {
    Ok(tree
        .scan_prefix([EVENT])
        .next_back()
        .transpose()?
        .and_then(|(k, _)| key_seq(&k)))
}

/// One record read back: its first event number, its keys and its bytes.
pub struct Logged {
    pub seq: u64,
    pub keys: Vec<IVec>,
    pub bytes: Bytes,
}

impl Logged {
    /// The key that names the record (in errors).
    pub fn key(&self) -> Vec<u8> {
        keys::id_key(EVENT, self.seq).to_vec()
    }

    /// Whether it was read from pieces (even a lone first piece: a record
    /// in pieces has two at least).
    pub fn in_pieces(&self) -> bool {
        self.keys.len() > 1 || self.keys.first().is_some_and(|k| k.len() == PIECE_KEY_LEN)
    }

    /// The commit record, decoded (a corrupt one names its key).
    pub fn record(&self) -> Result<CommitRecord, CorruptRecord> {
        crate::codec::decode(&self.bytes).map_err(|e| CorruptRecord::new(&self.key(), e))
    }
}

/// A record's bytes: as sled holds them, or its pieces joined.
pub enum Bytes {
    Whole(IVec),
    Joined(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Whole(v) => v,
            Bytes::Joined(v) => v,
        }
    }
}

/// Why a record could not be read (the rest of the range is still read).
#[derive(Debug)]
pub enum Unread {
    /// sled failed.
    Db(sled::Error),
    /// A key in the `e` range that is no record's.
    BadKey(CorruptRecord),
    /// The pieces of the record of `seq` (under `keys`) are not whole: one
    /// is missing or out of place.
    Torn {
        seq: u64,
        keys: Vec<IVec>,
        record: CorruptRecord,
    },
}

impl Unread {
    pub fn corrupt(self) -> CorruptRecord {
        match self {
            Unread::Db(e) => CorruptRecord::new(&[EVENT], e),
            Unread::BadKey(c) | Unread::Torn { record: c, .. } => c,
        }
    }
}

/// The records of a range of `e` keys, oldest first, each joined from its
/// pieces.
pub struct Records<I: Iterator<Item = sled::Result<(IVec, IVec)>>> {
    inner: std::iter::Peekable<I>,
}

impl<I: Iterator<Item = sled::Result<(IVec, IVec)>>> Records<I> {
    pub fn new(items: I) -> Self {
        Records {
            inner: items.peekable(),
        }
    }
}

/// The records of `tree` whose first event is in `from..=to`.
pub fn read(tree: &sled::Tree, from: u64, to: u64) -> Records<sled::Iter> {
    Records::new(tree.range(range(from, to)))
}

impl<I: Iterator<Item = sled::Result<(IVec, IVec)>>> Iterator for Records<I> {
    type Item = Result<Logged, Unread>;

    fn next(&mut self) -> Option<Self::Item> {
        let (k, v) = match self.inner.next()? {
            Ok(kv) => kv,
            Err(e) => return Some(Err(Unread::Db(e))),
        };
        let Some(seq) = key_seq(&k) else {
            return Some(Err(Unread::BadKey(CorruptRecord::new(
                &k,
                "not a commit record key",
            ))));
        };
        if k.len() == 9 {
            return Some(Ok(Logged {
                seq,
                keys: vec![k],
                bytes: Bytes::Whole(v),
            }));
        }
        // Pieces: every key of this number, numbered from 0 without a gap.
        let mut keys = vec![k];
        let mut joined = v.to_vec();
        let mut bad = None;
        while let Some(Ok((next, _))) = self.inner.peek() {
            if next.len() != PIECE_KEY_LEN || key_seq(next) != Some(seq) {
                break;
            }
            let Some(Ok((next, piece))) = self.inner.next() else {
                break;
            };
            joined.extend_from_slice(&piece);
            keys.push(next);
        }
        for (want, key) in keys.iter().enumerate() {
            let got = u32::from_be_bytes([key[9], key[10], key[11], key[12]]);
            if usize::try_from(got).ok() != Some(want) {
                bad = Some(format!("piece {got} where piece {want} belongs"));
                break;
            }
        }
        if let Some(why) = bad {
            let record = CorruptRecord::new(&keys::id_key(EVENT, seq), why);
            return Some(Err(Unread::Torn { seq, keys, record }));
        }
        Some(Ok(Logged {
            seq,
            keys,
            bytes: Bytes::Joined(joined),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, sled::Tree) {
        let dir = tempfile::tempdir().expect("tmp");
        let db = sled::Config::new()
            .path(dir.path().join("db"))
            .open()
            .expect("sled");
        let t = db.open_tree("t").expect("tree");
        (dir, t)
    }

    fn record(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn records_come_back_whole_whatever_their_size_and_ranges_hold_their_pieces() {
        let (_d, t) = tree();
        let sizes = [10, CHUNK, CHUNK + 1, 3 * CHUNK, 100_000, 1];
        for (i, len) in sizes.iter().enumerate() {
            let seq = 10 * (i as u64 + 1);
            writes(seq, &record(*len, i as u8))
                .apply(&t)
                .expect("write");
        }
        // A key of another range right after the log must not be read.
        t.insert([EVENT + 1], &b"x"[..]).expect("insert");
        let all: Vec<Logged> = read(&t, 0, u64::MAX)
            .collect::<Result<_, _>>()
            .expect("read");
        assert_eq!(all.len(), sizes.len());
        for (i, (l, len)) in all.iter().zip(sizes).enumerate() {
            assert_eq!(l.seq, 10 * (i as u64 + 1));
            assert_eq!(&l.bytes[..], &record(len, i as u8)[..]);
            assert_eq!(l.keys.len(), len.div_ceil(CHUNK).max(1));
        }
        // `to` is inclusive and takes the pieces of its record.
        let some: Vec<u64> = read(&t, 20, 40).map(|r| r.expect("read").seq).collect();
        assert_eq!(some, vec![20, 30, 40]);
        assert_eq!(last_seq(&t).expect("last"), Some(60));
    }

    /// The pending map of `View` for the records `(seq, bytes)`.
    fn pending(recs: &[(u64, Vec<u8>)]) -> Pending {
        recs.iter()
            .flat_map(|(seq, r)| pieces(*seq, r))
            .map(|(k, v)| (k, IVec::from(v)))
            .collect()
    }

    #[test]
    fn a_view_reads_the_trees_records_and_the_pending_ones_as_one_log() {
        let (_d, t) = tree();
        let (r1, r2, r3, r4) = (
            record(10, 1),
            record(2 * CHUNK + 5, 2),
            record(3 * CHUNK, 3),
            record(7, 4),
        );
        writes(1, &r1).apply(&t).expect("write");
        // Record 2 is in the tree and still pending (its round has not
        // ended); 3 and 4 only pending; 4 was committed after the view's
        // last record (5 would be the next).
        writes(2, &r2).apply(&t).expect("write");
        let view = View {
            tree: &t,
            pending: pending(&[(2, r2.clone()), (3, r3.clone()), (4, r4)]),
            last: 3,
        };
        let all: Vec<Logged> = view
            .read(0, u64::MAX)
            .collect::<Result<_, _>>()
            .expect("read");
        let got: Vec<(u64, &[u8])> = all.iter().map(|l| (l.seq, &l.bytes[..])).collect();
        assert_eq!(
            got,
            vec![(1, &r1[..]), (2, &r2[..]), (3, &r3[..])],
            "each record once, whole, in order, none after the view's last"
        );
        let some: Vec<u64> = view.read(2, 2).map(|r| r.expect("read").seq).collect();
        assert_eq!(some, vec![2]);
        assert_eq!(view.read(3, 2).count(), 0, "an empty range");
        assert_eq!(view.holding(1), Some(1));
        assert_eq!(view.holding(2), Some(2));
        assert_eq!(view.holding(3), Some(3), "a pending record holds it");
        assert_eq!(view.last_seq().expect("last"), Some(4));
        assert_eq!(
            view.first_key().expect("first").as_deref(),
            Some(&keys::id_key(EVENT, 1)[..])
        );
        // With nothing in the tree, the pending records alone.
        let (_d2, empty) = tree();
        let view = View {
            tree: &empty,
            pending: pending(&[(5, record(1, 5))]),
            last: 5,
        };
        assert_eq!(view.holding(4), None);
        assert_eq!(
            view.first_key().expect("first").as_deref(),
            Some(&keys::id_key(EVENT, 5)[..])
        );
        assert_eq!(
            view.read(0, 9)
                .map(|r| r.expect("read").seq)
                .collect::<Vec<_>>(),
            [5]
        );
    }

    #[test]
    fn a_missing_piece_is_a_corrupt_record_and_the_next_record_still_reads() {
        let (_d, t) = tree();
        writes(1, &record(3 * CHUNK, 1)).apply(&t).expect("write");
        writes(2, &record(10, 2)).apply(&t).expect("write");
        t.remove(piece_key(1, 1)).expect("remove");
        let got: Vec<_> = read(&t, 0, u64::MAX).collect();
        assert_eq!(got.len(), 2);
        match &got[0] {
            Err(Unread::Torn {
                seq: 1,
                keys,
                record,
            }) => {
                assert_eq!(keys.len(), 2, "the pieces there are");
                assert!(
                    record.reason.contains("piece 2 where piece 1"),
                    "{}",
                    record.reason
                )
            }
            _ => panic!("a missing piece was not reported"),
        }
        assert!(matches!(&got[1], Ok(l) if l.seq == 2));
    }
}

//! The record codec: every value berth writes to disk is framed here, and
//! nowhere else knows the byte format.
//!
//! A record is `[format version: u8][bincode 2 body][CRC32 of version+body: u32 LE]`.
//! Decoding checks length, checksum and version before the body is looked at,
//! and decodes the body with an allocation limit scaled to the input, so no
//! input (truncated, bit-flipped, crafted) can panic or exhaust memory. A
//! body that decodes must be the canonical encoding of its value, so every
//! record that decodes re-encodes to the same bytes.
//! bincode is pinned to 2.x (3.0 is an empty release); moving to another body
//! encoding means a new version byte, and old records stay readable.
//!
//! Versions: 1 (every record written before tasks had a TTL), 2 (since:
//! a `Task` ends with its `ttl_ms`) and 3 (a commit record's key write may
//! name the event of its record that enqueued the task it stores, instead
//! of carrying the task's bytes a second time: see `store::commit_record`).
//! Every other type has the same body in all three. This build writes
//! version 2, except commit records, which it writes at version 3 (so an
//! export or a checkpoint stays readable by a build that reads version 2),
//! and reads all three: a record is decoded with its version as bincode's
//! decode context ([`Layout`]), which the hand-written codecs (`Task`'s
//! here, a commit record's and a key write's) look at; the types that hold
//! a task (`EventKind`, `Event`) pass it down (their derive names the
//! context). A record re-encodes to its own bytes at its own version: a
//! version-1 record is checked against the version-1 encoding of the value
//! it decodes to (see [`encode_as`]).

use std::cell::Cell;

use bincode::config;
use bincode::de::{BorrowDecoder, Decoder};
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{BorrowDecode, Decode, Encode};

use crate::task::Task;

/// The version byte of records written by this build (but commit records:
/// [`COMMIT_VERSION`]).
pub const FORMAT_VERSION: u8 = 2;

/// The version byte of the commit records this build writes, the newest
/// it reads.
pub const COMMIT_VERSION: u8 = 3;

/// The oldest version byte this build reads.
pub const OLDEST_VERSION: u8 = 1;

/// The first version whose `Task` has its TTL.
const TASK_TTL_SINCE: u8 = 2;

/// What a record's body is decoded with: the record's version byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub version: u8,
}

/// A type berth frames as a record: it encodes, and decodes at any
/// version this build reads.
pub trait Record: Decode<Layout> + Encode {}
impl<T: Decode<Layout> + Encode> Record for T {}

thread_local! {
    /// The version bodies are encoded at on this thread: [`FORMAT_VERSION`]
    /// except inside [`encode_as`] (bincode's encoder carries no context).
    static ENCODING: Cell<u8> = const { Cell::new(FORMAT_VERSION) };
}

/// The version the value being encoded on this thread is encoded at (for a
/// hand-written `Encode` whose body differs between versions).
pub fn encoding_version() -> u8 {
    ENCODING.get()
}

/// Sets the encoding version of this thread until dropped.
struct EncodingAt(u8);

impl EncodingAt {
    fn set(version: u8) -> EncodingAt {
        EncodingAt(ENCODING.replace(version))
    }
}

impl Drop for EncodingAt {
    fn drop(&mut self) {
        ENCODING.set(self.0);
    }
}

/// `Task`'s body: its fields in declaration order (ARCHITECTURE.md lists
/// them), and from version 2 on its `ttl_ms` last. A task with a TTL has no
/// version-1 form.
impl Encode for Task {
    fn encode<E: Encoder>(&self, e: &mut E) -> Result<(), EncodeError> {
        self.id.encode(e)?;
        self.kind.encode(e)?;
        self.queue.encode(e)?;
        self.name.encode(e)?;
        self.description.encode(e)?;
        self.weight.encode(e)?;
        self.payload.encode(e)?;
        self.tags.encode(e)?;
        self.target.encode(e)?;
        self.compaction_key.encode(e)?;
        self.failures.encode(e)?;
        self.attempts.encode(e)?;
        self.last_failure.encode(e)?;
        self.status.encode(e)?;
        self.queued_at.encode(e)?;
        self.started_at.encode(e)?;
        self.finished_at.encode(e)?;
        self.retry_at.encode(e)?;
        self.parent.encode(e)?;
        self.children.encode(e)?;
        self.result.encode(e)?;
        if ENCODING.get() >= TASK_TTL_SINCE {
            self.ttl_ms.encode(e)?;
        } else if self.ttl_ms.is_some() {
            return Err(EncodeError::Other(
                "a task with a TTL has no version-1 encoding",
            ));
        }
        Ok(())
    }
}

impl Decode<Layout> for Task {
    fn decode<D: Decoder<Context = Layout>>(d: &mut D) -> Result<Self, DecodeError> {
        let version = d.context().version;
        Ok(Task {
            id: Decode::decode(d)?,
            kind: Decode::decode(d)?,
            queue: Decode::decode(d)?,
            name: Decode::decode(d)?,
            description: Decode::decode(d)?,
            weight: Decode::decode(d)?,
            payload: Decode::decode(d)?,
            tags: Decode::decode(d)?,
            target: Decode::decode(d)?,
            compaction_key: Decode::decode(d)?,
            failures: Decode::decode(d)?,
            attempts: Decode::decode(d)?,
            last_failure: Decode::decode(d)?,
            status: Decode::decode(d)?,
            queued_at: Decode::decode(d)?,
            started_at: Decode::decode(d)?,
            finished_at: Decode::decode(d)?,
            retry_at: Decode::decode(d)?,
            parent: Decode::decode(d)?,
            children: Decode::decode(d)?,
            result: Decode::decode(d)?,
            ttl_ms: if version >= TASK_TTL_SINCE {
                Decode::decode(d)?
            } else {
                None
            },
        })
    }
}

impl<'de> BorrowDecode<'de, Layout> for Task {
    fn borrow_decode<D: BorrowDecoder<'de, Context = Layout>>(
        d: &mut D,
    ) -> Result<Self, DecodeError> {
        Decode::decode(d)
    }
}

/// No record on disk may be larger than this (the object budget's ceiling
/// plus room for the other fields of a task or event).
pub const MAX_RECORD_BYTES: usize = crate::budget::MAX_OBJECT_CEILING * 2 + (1 << 20);

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record is truncated ({len} bytes; at least 5 are needed)")]
    Truncated { len: usize },
    #[error("record is {len} bytes; records are at most {max} bytes")]
    Oversized { len: usize, max: usize },
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error(
        "unknown format version {0} (this build reads versions {OLDEST_VERSION} to {COMMIT_VERSION})"
    )]
    Version(u8),
    #[error("record body does not decode: {0}")]
    Body(String),
    #[error("record body has {0} trailing bytes")]
    Trailing(usize),
    #[error(
        "record body is not in canonical form (it decodes, but not from the bytes berth writes)"
    )]
    NonCanonical,
}

fn base() -> config::Configuration {
    config::standard()
}

/// Frames a value as a record (of [`FORMAT_VERSION`]).
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    encode_sized(value, 256)
}

/// [`encode`] into a buffer of `capacity` bytes to begin with: a large
/// record whose size is about known (a batch's commit record) is then
/// written without growing its buffer step by step, each step fresh pages.
pub fn encode_sized<T: Encode>(value: &T, capacity: usize) -> Vec<u8> {
    match encode_into(value, FORMAT_VERSION, capacity) {
        Ok(out) => out,
        Err(e) => {
            // Encoding at the current version into a Vec only fails for
            // types that refuse to encode; ours never do.
            log::error!("codec: encoding failed: {e}");
            Vec::new()
        }
    }
}

/// Frames a value as a record of another `version` this build reads, as a
/// build of that version wrote it (a value that has no such form, a task
/// with a TTL at version 1, is refused). Used to check that a record
/// re-encodes to its own bytes, and to write commit records at
/// [`COMMIT_VERSION`].
pub fn encode_as<T: Encode>(value: &T, version: u8) -> Result<Vec<u8>, CodecError> {
    encode_into(value, version, 256)
}

/// [`encode_as`] into a buffer of `capacity` bytes to begin with (see
/// [`encode_sized`]).
pub fn encode_sized_as<T: Encode>(
    value: &T,
    version: u8,
    capacity: usize,
) -> Result<Vec<u8>, CodecError> {
    encode_into(value, version, capacity)
}

fn encode_into<T: Encode>(value: &T, version: u8, capacity: usize) -> Result<Vec<u8>, CodecError> {
    if !(OLDEST_VERSION..=COMMIT_VERSION).contains(&version) {
        return Err(CodecError::Version(version));
    }
    let mut out = Vec::with_capacity(capacity.clamp(256, MAX_RECORD_BYTES));
    frame_into(value, version, &mut out)?;
    Ok(out)
}

/// Appends `value` framed as a record (version byte, body, CRC-32 of both)
/// to `out`, after what it holds.
fn frame_into<T: Encode>(value: &T, version: u8, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let start = out.len();
    out.push(version);
    let _at = EncodingAt::set(version);
    bincode::encode_into_std_write(value, out, base())
        .map_err(|e| CodecError::Body(e.to_string()))?;
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The length of [`encode`]`(value)`, counted without writing the bytes
/// (a size budget's check, before the value is encoded for good).
pub fn encoded_len<T: Encode>(value: &T) -> usize {
    let _at = EncodingAt::set(FORMAT_VERSION);
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::encode_into_writer(value, &mut size, base()) {
        // The version byte, the body and its CRC-32.
        Ok(()) => 1 + size.bytes_written + 4,
        Err(e) => {
            // As in `encode_sized`: our types never refuse to encode.
            log::error!("codec: encoding failed: {e}");
            0
        }
    }
}

/// [`encode`] appended to `out`: the bytes after its old length are the
/// same as `encode(value)` (so several records can share one buffer).
/// Returns how many bytes it appended (none if encoding failed, as
/// [`encode`] returns none).
pub fn encode_append<T: Encode>(value: &T, out: &mut Vec<u8>) -> usize {
    let start = out.len();
    match frame_into(value, FORMAT_VERSION, out) {
        Ok(()) => out.len() - start,
        Err(e) => {
            log::error!("codec: encoding failed: {e}");
            out.truncate(start);
            0
        }
    }
}

/// The version byte of a record, if it has one this build reads (the
/// frame is not checked).
pub fn version_of(bytes: &[u8]) -> Option<u8> {
    bytes
        .first()
        .copied()
        .filter(|v| (OLDEST_VERSION..=COMMIT_VERSION).contains(v))
}

/// Checks a record's frame (length, checksum and version) without decoding
/// its body.
pub fn check_frame(bytes: &[u8]) -> Result<(), CodecError> {
    unframe(bytes).map(|_| ())
}

/// Checks the frame and returns the body's layout and the body.
fn unframe(bytes: &[u8]) -> Result<(Layout, &[u8]), CodecError> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(CodecError::Oversized {
            len: bytes.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    if bytes.len() < 5 {
        return Err(CodecError::Truncated { len: bytes.len() });
    }
    let (framed, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(framed);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    let version = framed[0];
    if !(OLDEST_VERSION..=COMMIT_VERSION).contains(&version) {
        return Err(CodecError::Version(version));
    }
    Ok((Layout { version }, &framed[1..]))
}

/// A bincode writer that compares what it is given with a record's body
/// instead of keeping it.
struct SameAs<'a>(&'a [u8]);

impl bincode::enc::write::Writer for SameAs<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        match self.0.strip_prefix(bytes) {
            Some(rest) => {
                self.0 = rest;
                Ok(())
            }
            None => Err(bincode::error::EncodeError::Other("differs")),
        }
    }
}

fn decode_limited<T: Record, const LIMIT: usize>(
    layout: Layout,
    body: &[u8],
) -> Result<T, CodecError> {
    let cfg = base().with_limit::<LIMIT>();
    let (value, used) = bincode::decode_from_slice_with_context(body, cfg, layout)
        .map_err(|e| CodecError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    // bincode also reads integers written in more bytes than they need (a
    // varint 5 as `251, 5, 0`). Only the canonical form is a record: every
    // value has exactly one, so a record re-encodes to its own bytes (at
    // its own version: a version-1 record to the version-1 encoding).
    let mut same = SameAs(body);
    let _at = EncodingAt::set(layout.version);
    if bincode::encode_into_writer(&value, &mut same, base()).is_err() || !same.0.is_empty() {
        return Err(CodecError::NonCanonical);
    }
    Ok(value)
}

/// Decodes a record. Allocation while decoding is capped at about 32 times
/// the input's size (strings and byte vectors can claim no more than the
/// bytes that carry them; the factor covers small integers in vectors).
/// Only the canonical encoding of a value decodes (what [`encode`] writes,
/// or for a version-1 record what [`encode_as`] writes at version 1).
pub fn decode<T: Record>(bytes: &[u8]) -> Result<T, CodecError> {
    let (layout, body) = unframe(bytes)?;
    match body.len() {
        0..=2_048 => decode_limited::<T, { 64 << 10 }>(layout, body),
        2_049..=65_536 => decode_limited::<T, { 2 << 20 }>(layout, body),
        65_537..=1_048_576 => decode_limited::<T, { 32 << 20 }>(layout, body),
        _ => decode_limited::<T, { 4 * MAX_RECORD_BYTES }>(layout, body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use crate::task::TaskSpec;

    fn sample() -> crate::task::Task {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "ModuleRun".into(),
            name: "echo".into(),
            tags: vec!["gluster".into()],
            payload: serde_json::json!({"values": [1, 2, 3]}),
            ..Default::default()
        };
        let mut t = spec.into_task(42, &Budget::default()).unwrap();
        t.id = 7;
        t.children = vec![8, 9].into();
        t
    }

    /// The counted length is the encoded one, for a task (small and with a
    /// large payload, which the budget checks count) and for other values.
    #[test]
    fn the_counted_length_is_the_encoded_length() {
        let mut big = sample();
        big.payload = crate::budget::Blob {
            compressed: false,
            bytes: vec![b'x'; 300 << 10],
        };
        for t in [sample(), big] {
            assert_eq!(encoded_len(&t), encode(&t).len());
        }
        assert_eq!(encoded_len(&7u64), encode(&7u64).len());
        assert_eq!(
            encoded_len(&"name".to_string()),
            encode(&"name".to_string()).len()
        );
    }

    #[test]
    fn a_record_appended_to_a_buffer_is_the_record_encoded_alone() {
        let t = sample();
        let mut out = b"before".to_vec();
        let n = encode_append(&t, &mut out);
        assert_eq!(&out[..6], b"before");
        assert_eq!(n, out.len() - 6);
        assert_eq!(&out[6..], &encode(&t)[..]);
        assert_eq!(decode::<crate::task::Task>(&out[6..]), Ok(t));
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let bytes = encode(&t);
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<crate::task::Task>(&bytes).unwrap(), t);
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            let r = decode::<crate::task::Task>(&bytes[..len]);
            assert!(r.is_err(), "truncated to {len} bytes decoded");
        }
    }

    #[test]
    fn every_single_bit_flip_is_refused() {
        let bytes = encode(&sample());
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                decode::<crate::task::Task>(&b).is_err(),
                "flip of bit {i} decoded"
            );
        }
    }

    #[test]
    fn oversized_and_unknown_version_records_are_refused() {
        let huge = vec![0u8; MAX_RECORD_BYTES + 1];
        assert!(matches!(
            decode::<crate::task::Task>(&huge),
            Err(CodecError::Oversized { .. })
        ));
        let mut b = encode(&sample());
        b[0] = 9;
        let n = b.len();
        let crc = crc32fast::hash(&b[..n - 4]).to_le_bytes();
        b[n - 4..].copy_from_slice(&crc);
        assert_eq!(decode::<crate::task::Task>(&b), Err(CodecError::Version(9)));
    }

    #[test]
    fn a_crafted_huge_length_claim_is_refused_without_allocating() {
        // Valid frame and checksum around a body that claims a 2^60-byte string.
        let mut rec = vec![FORMAT_VERSION];
        rec.push(253); // bincode varint tag for u64
        rec.extend_from_slice(&(1u64 << 60).to_le_bytes());
        rec.extend_from_slice(b"abc");
        let crc = crc32fast::hash(&rec);
        rec.extend_from_slice(&crc.to_le_bytes());
        let e = decode::<String>(&rec).unwrap_err();
        assert!(matches!(e, CodecError::Body(_)), "{e}");
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut rec = vec![FORMAT_VERSION];
        bincode::encode_into_std_write(5u32, &mut rec, base()).unwrap();
        rec.push(0);
        let crc = crc32fast::hash(&rec);
        rec.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode::<u32>(&rec), Err(CodecError::Trailing(1)));
    }
}

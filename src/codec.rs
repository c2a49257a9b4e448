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

use bincode::config;
use bincode::{Decode, Encode};

/// The version byte of records written by this build.
pub const FORMAT_VERSION: u8 = 1;

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
    #[error("unknown format version {0} (this build reads version {FORMAT_VERSION})")]
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

/// Frames a value as a record.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.push(FORMAT_VERSION);
    // Encoding into a Vec only fails for types that refuse to encode; ours never do.
    if let Err(e) = bincode::encode_into_std_write(value, &mut out, base()) {
        log::error!("codec: encoding failed: {e}");
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks the frame and returns the body.
fn unframe(bytes: &[u8]) -> Result<&[u8], CodecError> {
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
    if framed[0] != FORMAT_VERSION {
        return Err(CodecError::Version(framed[0]));
    }
    Ok(&framed[1..])
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

fn decode_limited<T: Decode<()> + Encode, const LIMIT: usize>(
    body: &[u8],
) -> Result<T, CodecError> {
    let cfg = base().with_limit::<LIMIT>();
    let (value, used) =
        bincode::decode_from_slice(body, cfg).map_err(|e| CodecError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    // bincode also reads integers written in more bytes than they need (a
    // varint 5 as `251, 5, 0`). Only the canonical form is a record: every
    // value has exactly one, so a record re-encodes to its own bytes.
    let mut same = SameAs(body);
    if bincode::encode_into_writer(&value, &mut same, base()).is_err() || !same.0.is_empty() {
        return Err(CodecError::NonCanonical);
    }
    Ok(value)
}

/// Decodes a record. Allocation while decoding is capped at about 32 times
/// the input's size (strings and byte vectors can claim no more than the
/// bytes that carry them; the factor covers small integers in vectors).
/// Only the canonical encoding of a value decodes (what [`encode`] writes).
pub fn decode<T: Decode<()> + Encode>(bytes: &[u8]) -> Result<T, CodecError> {
    let body = unframe(bytes)?;
    match body.len() {
        0..=2_048 => decode_limited::<T, { 64 << 10 }>(body),
        2_049..=65_536 => decode_limited::<T, { 2 << 20 }>(body),
        65_537..=1_048_576 => decode_limited::<T, { 32 << 20 }>(body),
        _ => decode_limited::<T, { 4 * MAX_RECORD_BYTES }>(body),
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
        t.children = vec![8, 9];
        t
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

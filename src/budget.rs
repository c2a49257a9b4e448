//! The object size budget (frameworkcontroller's LargeFrameworkCompression):
//! a payload or result whose JSON is at least `compress_over` bytes is kept
//! gzip-compressed; a payload, a result, or a record without its result
//! larger than `max_object` is refused ([`check_record`]); reading a
//! compressed blob never inflates past `max_decompressed`, and nothing whose
//! JSON is larger than that is stored. A handler's result that does not fit
//! becomes a `truncated` marker ([`Budget::result_blob`]).
//!
//! Invariants enforced here: no stored blob, however crafted, can make a
//! reader allocate more than `max_decompressed` bytes; every blob this module
//! makes can be read back within the same budget.

use std::io::{Read, Write};

use serde_json::json;

use bincode::{Decode, Encode};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;

use crate::units::{format_size, format_size_against};

/// The three limits of the object size budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// JSON of this many bytes or more is stored gzip-compressed.
    pub compress_over: usize,
    /// The largest payload or result (after compression), and the largest
    /// record of a task as it is enqueued (all its fields together). A
    /// result is measured on its own ([`Budget::result_blob`]), so a
    /// finished task's record, payload and result together, can be larger.
    pub max_object: usize,
    /// The most bytes a compressed blob may inflate to.
    pub max_decompressed: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            compress_over: 100 * 1024,
            max_object: 1536 * 1024,
            max_decompressed: 64 << 20,
        }
    }
}

/// How much of a result that does not fit is kept, as text, in its
/// `truncated` marker.
pub const RESULT_HEAD: usize = 64 * 1024;

/// The hard ceiling on `max_object`: records are decoded with allocation
/// limits derived from it.
pub const MAX_OBJECT_CEILING: usize = 64 << 20;

impl Budget {
    /// Checks that the limits make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_object == 0 || self.max_object > MAX_OBJECT_CEILING {
            return Err(format!(
                "max_object must be between 1 B and {}",
                format_size(MAX_OBJECT_CEILING as u64)
            ));
        }
        if self.max_decompressed < self.max_object {
            return Err("max_decompressed must be at least max_object".into());
        }
        Ok(())
    }

    /// The stored form of a handler's result `value`: its blob when the
    /// budget holds it, else a marker `{"truncated": true, "reason": ...,
    /// "head": ...}` that keeps the first [`RESULT_HEAD`] bytes of its text
    /// (a string's content, else its JSON). `cut` is why the handler already
    /// had to cut it (its output was over a read limit); `value` is then the
    /// part it kept, and the result is always a marker.
    ///
    /// A result never fits when its JSON is over `max_decompressed` (it
    /// could not be read back) or still over `max_object` after
    /// compression. Whatever this returns can be read back with this budget.
    /// None only when not even an empty marker fits in `max_object`.
    pub fn result_blob(&self, value: &serde_json::Value, cut: Option<&str>) -> Option<Blob> {
        let reason = match cut {
            Some(r) => r.to_string(),
            None => match Blob::from_json("result", value, self) {
                Ok(b) => return Some(b),
                Err(e) => e.to_string(),
            },
        };
        let mut head = text_head(value, RESULT_HEAD);
        loop {
            let marker = json!({"truncated": true, "reason": reason, "head": head});
            if let Ok(b) = Blob::from_json("result", &marker, self) {
                return Some(b);
            }
            if head.is_empty() {
                return None;
            }
            // A tiny budget: keep less.
            head.truncate(floor_char_boundary(&head, head.len() / 2));
        }
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The first `max` bytes (at most) of a value's text: a string's content,
/// else its JSON, cut at a char boundary. Only `max` bytes are serialized.
fn text_head(value: &serde_json::Value, max: usize) -> String {
    if let serde_json::Value::String(s) = value {
        return s[..floor_char_boundary(s, max)].to_string();
    }
    let mut w = JsonSink::new(max);
    let _ = serde_json::to_writer(&mut w, value);
    let keep = match std::str::from_utf8(&w.kept) {
        Ok(_) => w.kept.len(),
        Err(e) => e.valid_up_to(),
    };
    String::from_utf8_lossy(&w.kept[..keep]).into_owned()
}

/// Keeps the first `cap` bytes written to it and counts the rest.
struct JsonSink {
    kept: Vec<u8>,
    cap: usize,
    total: usize,
}

impl JsonSink {
    fn new(cap: usize) -> Self {
        JsonSink {
            kept: Vec::new(),
            cap,
            total: 0,
        }
    }
}

impl Write for JsonSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&buf[..room.min(buf.len())]);
        self.total = self.total.saturating_add(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A JSON document as stored: raw, or gzip-compressed when large. (An
/// attempt log's output tails are blobs of raw bytes: [`Blob::from_raw`].)
#[derive(Clone, PartialEq, Eq, Encode, Decode, Default)]
pub struct Blob {
    pub compressed: bool,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Blob({} bytes{})",
            self.bytes.len(),
            if self.compressed { ", gzip" } else { "" }
        )
    }
}

/// Errors of the size budget.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error("task {what} is {}", over(*size, *compressed, "object budget", *budget))]
    TooLarge {
        what: &'static str,
        size: usize,
        compressed: bool,
        budget: usize,
    },
    #[error("compressed {what} inflates past the {} decompression limit", format_size(*limit as u64))]
    Bomb { what: &'static str, limit: usize },
    #[error("task {what} is {}", over(*size, false, "decompression limit", *limit))]
    OverReadLimit {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("compressed {what} is not valid gzip: {reason}")]
    BadGzip { what: &'static str, reason: String },
    #[error("{what} is not valid JSON: {reason}")]
    BadJson { what: &'static str, reason: String },
}

/// Checks a task's record of `record_len` encoded bytes against
/// `max_object` as the engine keeps it: the record without its result (as
/// it was enqueued: its fields and payload together) and the result on its
/// own (as [`Budget::result_blob`] made it). A finished task's record,
/// which holds both, may be up to about twice `max_object`: whatever the
/// engine stored passes here, so an export of it imports again.
pub fn check_record(
    budget: &Budget,
    record_len: usize,
    payload_compressed: bool,
    result: Option<&Blob>,
) -> Result<(), BudgetError> {
    let result_len = result.map_or(0, |r| r.bytes.len());
    if let Some(r) = result
        && result_len > budget.max_object
    {
        return Err(BudgetError::TooLarge {
            what: "result",
            size: result_len,
            compressed: r.compressed,
            budget: budget.max_object,
        });
    }
    let size = record_len.saturating_sub(result_len);
    if size > budget.max_object {
        return Err(BudgetError::TooLarge {
            what: "record",
            size,
            compressed: payload_compressed,
            budget: budget.max_object,
        });
    }
    Ok(())
}

/// "SIZE[ after compression]; the LIMIT_NAME is LIMIT", the two sizes in
/// units that tell them apart.
fn over(size: usize, compressed: bool, limit_name: &str, limit: usize) -> String {
    let (size, limit) = format_size_against(size as u64, limit as u64);
    let after = if compressed { " after compression" } else { "" };
    format!("{size}{after}; the {limit_name} is {limit}")
}

impl Blob {
    /// Serializes `value` and compresses it when it reaches `compress_over`.
    /// Refuses it when its JSON is over `max_decompressed` (it could not be
    /// read back; never more than that is held while serializing) or when
    /// even compressed it is over `max_object`.
    pub fn from_json(
        what: &'static str,
        value: &serde_json::Value,
        budget: &Budget,
    ) -> Result<Blob, BudgetError> {
        let mut sink = JsonSink::new(budget.max_decompressed);
        serde_json::to_writer(&mut sink, value).map_err(|e| BudgetError::BadJson {
            what,
            reason: e.to_string(),
        })?;
        if sink.total > budget.max_decompressed {
            return Err(BudgetError::OverReadLimit {
                what,
                size: sink.total,
                limit: budget.max_decompressed,
            });
        }
        Self::from_json_bytes(what, sink.kept, budget)
    }

    /// Like [`Blob::from_json`] for bytes already known to be JSON.
    pub fn from_json_bytes(
        what: &'static str,
        raw: Vec<u8>,
        budget: &Budget,
    ) -> Result<Blob, BudgetError> {
        if raw.len() > budget.max_decompressed {
            return Err(BudgetError::OverReadLimit {
                what,
                size: raw.len(),
                limit: budget.max_decompressed,
            });
        }
        let blob = if raw.len() >= budget.compress_over {
            // The fast level first; the best level only when that is not enough.
            let mut bytes = gzip_level(&raw, Compression::fast());
            if bytes.len() > budget.max_object {
                bytes = gzip_level(&raw, Compression::best());
            }
            Blob {
                compressed: true,
                bytes,
            }
        } else {
            Blob {
                compressed: false,
                bytes: raw,
            }
        };
        if blob.bytes.len() > budget.max_object {
            return Err(BudgetError::TooLarge {
                what,
                size: blob.bytes.len(),
                compressed: blob.compressed,
                budget: budget.max_object,
            });
        }
        Ok(blob)
    }

    /// Raw bytes that are not JSON (a handler's output tail), stored under
    /// the same rules as JSON: gzip at `compress_over`, refused over
    /// `max_object` or `max_decompressed`. Read back with [`Blob::raw_bytes`].
    pub fn from_raw(
        what: &'static str,
        raw: Vec<u8>,
        budget: &Budget,
    ) -> Result<Blob, BudgetError> {
        Self::from_json_bytes(what, raw, budget)
    }

    /// The bytes of a blob made by [`Blob::from_raw`], inflated if needed,
    /// never more than `max_decompressed`.
    pub fn raw_bytes(&self, what: &'static str, budget: &Budget) -> Result<Vec<u8>, BudgetError> {
        self.json_bytes(what, budget)
    }

    /// The JSON bytes, inflated if needed, never more than `max_decompressed`.
    pub fn json_bytes(&self, what: &'static str, budget: &Budget) -> Result<Vec<u8>, BudgetError> {
        if self.compressed {
            gunzip_capped(what, &self.bytes, budget.max_decompressed)
        } else {
            Ok(self.bytes.clone())
        }
    }

    /// The JSON value.
    pub fn to_json(
        &self,
        what: &'static str,
        budget: &Budget,
    ) -> Result<serde_json::Value, BudgetError> {
        let bytes = self.json_bytes(what, budget)?;
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| BudgetError::BadJson {
            what,
            reason: e.to_string(),
        })
    }
}

/// gzip-compresses bytes (default level).
pub fn gzip(raw: &[u8]) -> Vec<u8> {
    gzip_level(raw, Compression::default())
}

fn gzip_level(raw: &[u8], level: Compression) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::with_capacity(raw.len() / 4 + 64), level);
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(raw);
    enc.finish().unwrap_or_default()
}

/// Inflates gzip bytes, refusing to produce more than `limit` bytes. The
/// output grows by doubling but never past `limit`, and never to more than
/// half of it except to `limit` itself, so that a move from one buffer to
/// the next holds at most `1.5 * limit`: the peak memory is below that plus
/// a 64 KiB buffer (and the decoder's state).
pub fn gunzip_capped(
    what: &'static str,
    compressed: &[u8],
    limit: usize,
) -> Result<Vec<u8>, BudgetError> {
    let mut out: Vec<u8> = Vec::with_capacity(compressed.len().saturating_mul(4).min(limit / 2));
    let mut reader = GzDecoder::new(compressed);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(BudgetError::BadGzip {
                    what,
                    reason: e.to_string(),
                });
            }
        };
        let needed = out.len() + n;
        if needed > limit {
            return Err(BudgetError::Bomb { what, limit });
        }
        if needed > out.capacity() {
            let mut want = (out.capacity() * 2).max(needed);
            if want > limit / 2 {
                want = limit;
            }
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn big_json(len: usize) -> serde_json::Value {
        // Repetitive but not trivial: compresses well, like real status JSON.
        let items: Vec<_> = (0..len / 40)
            .map(|i| json!({"module": format!("m{i}"), "ok": i % 3 == 0}))
            .collect();
        json!(items)
    }

    #[test]
    fn small_payloads_stay_raw_and_round_trip() {
        let b = Budget::default();
        let v = json!({"a": 1});
        let blob = Blob::from_json("payload", &v, &b).unwrap();
        assert!(!blob.compressed);
        assert_eq!(blob.to_json("payload", &b).unwrap(), v);
    }

    #[test]
    fn payloads_at_the_threshold_are_compressed_and_round_trip() {
        let b = Budget::default();
        let v = big_json(300 * 1024);
        let raw_len = serde_json::to_vec(&v).unwrap().len();
        assert!(raw_len >= b.compress_over);
        let blob = Blob::from_json("payload", &v, &b).unwrap();
        assert!(blob.compressed);
        assert!(blob.bytes.len() < raw_len / 3);
        assert_eq!(blob.to_json("payload", &b).unwrap(), v);
    }

    #[test]
    fn over_budget_objects_are_refused_naming_both_sizes() {
        let b = Budget {
            compress_over: usize::MAX,
            ..Budget::default()
        };
        let v = json!("x".repeat(2 * 1024 * 1024));
        let err = Blob::from_json("payload", &v, &b).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task payload is 2 MiB; the object budget is 1.5 MiB"
        );
        // Incompressible data over the budget even after compression.
        let mut rng = fastrand::Rng::with_seed(7);
        let noise: String = (0..4 * 1024 * 1024).map(|_| rng.alphanumeric()).collect();
        let err = Blob::from_json("payload", &json!(noise), &Budget::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("task payload is 3"), "{msg}");
        assert!(
            msg.ends_with("MiB after compression; the object budget is 1.5 MiB"),
            "{msg}"
        );
    }

    #[test]
    fn inflating_past_the_limit_is_refused() {
        let zeros = vec![0u8; 2 << 20];
        let gz = gzip(&zeros);
        let err = gunzip_capped("payload", &gz, 1 << 20).unwrap_err();
        assert!(matches!(err, BudgetError::Bomb { .. }), "{err}");
        assert_eq!(
            gunzip_capped("payload", &gz, 2 << 20).unwrap().len(),
            2 << 20
        );
    }

    #[test]
    fn garbage_is_reported_as_bad_gzip() {
        let err = gunzip_capped("result", b"not gzip at all", 1024).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("compressed result is not valid gzip")
        );
    }

    /// A small budget, so the tests stay small: 1 KiB, 64 KiB, 1 MiB.
    fn small() -> Budget {
        Budget {
            compress_over: 1024,
            max_object: 64 * 1024,
            max_decompressed: 1 << 20,
        }
    }

    /// Reads a stored result back within `b`, as every reader does.
    fn read_back(blob: &Blob, b: &Budget) -> serde_json::Value {
        assert!(blob.bytes.len() <= b.max_object, "{blob:?} over max_object");
        blob.to_json("result", b)
            .unwrap_or_else(|e| panic!("a stored result cannot be read back: {e}"))
    }

    #[test]
    fn a_result_that_fits_is_stored_as_is() {
        let b = small();
        for v in [json!({"ok": true}), big_json(200 * 1024), json!("x")] {
            let blob = b.result_blob(&v, None).unwrap();
            assert_eq!(blob, Blob::from_json("result", &v, &b).unwrap());
            assert_eq!(read_back(&blob, &b), v);
        }
    }

    #[test]
    fn json_over_the_read_limit_becomes_a_marker_even_when_it_compresses_well() {
        let b = small();
        // 1.5 MiB of one letter gzips to a few KiB, far under max_object:
        // stored as is, it could never be inflated again.
        let v = json!("a".repeat(3 << 19));
        let err = Blob::from_json("result", &v, &b).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task result is 1.5 MiB; the decompression limit is 1 MiB"
        );
        let r = read_back(&b.result_blob(&v, None).unwrap(), &b);
        assert_eq!(r["truncated"], true);
        assert_eq!(r["reason"], err.to_string());
        assert_eq!(r["head"], "a".repeat(RESULT_HEAD));
        // Text under the limit whose JSON escapes push it over: 200 KiB of
        // control characters are 1.2 MiB of "\u0001".
        let v = json!("\u{1}".repeat(200 * 1024));
        let r = read_back(&b.result_blob(&v, None).unwrap(), &b);
        assert_eq!(r["truncated"], true, "{}", r["reason"]);
        assert_eq!(r["head"].as_str().map(str::len), Some(RESULT_HEAD));
    }

    #[test]
    fn a_result_over_max_object_after_compression_becomes_a_marker() {
        let b = small();
        let mut rng = fastrand::Rng::with_seed(3);
        let noise: String = (0..300 * 1024).map(|_| rng.alphanumeric()).collect();
        let r = read_back(&b.result_blob(&json!(noise), None).unwrap(), &b);
        assert_eq!(r["truncated"], true);
        let reason = r["reason"].as_str().unwrap();
        assert!(
            reason.ends_with("after compression; the object budget is 64 KiB"),
            "{reason}"
        );
        assert_eq!(r["head"], noise[..RESULT_HEAD]);
    }

    #[test]
    fn a_result_the_handler_cut_is_always_a_marker() {
        let b = Budget::default();
        let v = json!("the first part");
        let r = read_back(
            &b.result_blob(&v, Some("stdout is over the 64 MiB read limit"))
                .unwrap(),
            &b,
        );
        assert_eq!(
            r,
            json!({"truncated": true, "reason": "stdout is over the 64 MiB read limit", "head": "the first part"})
        );
    }

    #[test]
    fn a_marker_head_is_json_text_cut_at_a_char_boundary() {
        let b = small();
        // JSON of a non-string, with two-byte characters: 1.1 MiB.
        let v = json!(vec!["é"; 300 * 1024]);
        let r = read_back(&b.result_blob(&v, None).unwrap(), &b);
        let head = r["head"].as_str().unwrap();
        assert!(head.len() <= RESULT_HEAD && head.len() > RESULT_HEAD - 4);
        assert!(
            head.starts_with("[\"é\",\"é\""),
            "{}",
            head.chars().take(20).collect::<String>()
        );
    }

    #[test]
    fn a_tiny_budget_keeps_a_shorter_head_or_nothing() {
        let mut b = Budget {
            compress_over: usize::MAX,
            max_object: 300,
            max_decompressed: 300,
        };
        let v = json!("z".repeat(1000));
        let r = read_back(&b.result_blob(&v, None).unwrap(), &b);
        assert_eq!(r["truncated"], true);
        let head = r["head"].as_str().unwrap();
        assert!(!head.is_empty() && head.len() < 300, "{head}");
        b.max_object = 10;
        b.max_decompressed = 10;
        assert_eq!(b.result_blob(&v, None), None, "not even a marker fits");
    }

    #[test]
    fn a_payload_over_the_read_limit_is_refused() {
        let b = small();
        let err = Blob::from_json("payload", &json!("a".repeat(2 << 20)), &b).unwrap_err();
        assert!(matches!(err, BudgetError::OverReadLimit { .. }), "{err}");
        let err = Blob::from_json_bytes("payload", vec![b'1'; (1 << 20) + 1], &b).unwrap_err();
        assert!(matches!(err, BudgetError::OverReadLimit { .. }), "{err}");
    }

    #[test]
    fn budget_validation_rejects_nonsense() {
        let mut b = Budget::default();
        assert!(b.validate().is_ok());
        b.max_object = 0;
        assert!(b.validate().is_err());
        b.max_object = 10;
        b.max_decompressed = 5;
        assert!(b.validate().is_err());
    }
}

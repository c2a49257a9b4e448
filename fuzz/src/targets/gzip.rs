//! Compressed blobs under the inflate cap (`berth::budget::gunzip_capped`,
//! `Blob`).
//!
//! The first two bytes pick the cap (1 byte to 1 MiB); the rest is the
//! compressed blob. flate2's plain decoder, run to just past the cap, is
//! the reference.
//!
//! Asserts:
//! - inflating never panics;
//! - what inflates within the cap comes back whole and exactly as the
//!   reference reads it; what inflates past the cap is refused as a bomb
//!   (or as bad gzip if it breaks right after the cap); what is broken
//!   before the cap is refused as bad gzip;
//! - memory: the bytes inflating holds at its peak (counted by the
//!   allocator) stay within 1.5 times the cap plus what flate2's decoder
//!   and a 64 KiB read buffer take on the same input (as the budget
//!   documents), and the refusal's message;
//! - `Blob::to_json` reads the same bytes, and a blob made from JSON
//!   (`Blob::from_json_bytes`) reads back as the same bytes.

use std::io::Read;

use berth::budget::{Blob, Budget, BudgetError, gunzip_capped};
use flate2::read::GzDecoder;

use super::alloc;

/// What flate2 reads from `gz`, at most `limit + 1` bytes, and whether it
/// stopped on an error.
fn reference(gz: &[u8], limit: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let r = GzDecoder::new(gz)
        .take(limit as u64 + 1)
        .read_to_end(&mut out);
    (out, r.is_err())
}

/// The memory flate2's decoder takes on `gz` with a 64 KiB buffer,
/// throwing the output away.
fn decoder_overhead(gz: &[u8], limit: usize) -> usize {
    alloc::measure(|| {
        let mut d = GzDecoder::new(gz);
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0usize;
        while let Ok(n) = d.read(&mut buf) {
            total += n;
            if n == 0 || total > limit {
                break;
            }
        }
    })
    .1
}

pub fn gzip(data: &[u8]) {
    let [a, b, gz @ ..] = data else {
        return;
    };
    let limit = 1 + usize::from(u16::from_le_bytes([*a, *b])) * 16;
    let (want, broken) = reference(gz, limit);
    let (got, peak) = alloc::measure(|| gunzip_capped("payload", gz, limit));
    match &got {
        Ok(bytes) => {
            assert!(
                !broken && want.len() <= limit,
                "accepted: {} bytes, but the reference read {} (broken: {broken})",
                bytes.len(),
                want.len()
            );
            assert!(*bytes == want, "inflated bytes differ from the reference");
        }
        Err(BudgetError::Bomb { limit: l, .. }) => {
            assert_eq!(*l, limit);
            assert!(
                want.len() > limit,
                "refused as a bomb, but it inflates to {} bytes (cap {limit})",
                want.len()
            );
        }
        Err(BudgetError::BadGzip { .. }) => {
            // Past the cap too, a stream that breaks within the next read
            // (64 KiB of output) may be refused as broken first.
            let (_, broken_soon) = reference(gz, limit + (64 << 10));
            assert!(
                (broken && want.len() <= limit) || (want.len() > limit && broken_soon),
                "refused as bad gzip, but the reference read {} bytes (broken: {broken}, cap {limit})",
                want.len()
            );
        }
        Err(e) => panic!("inflating failed with {e:?}"),
    }
    if alloc::counting() {
        // The refusal's own message (a String in the error) is held too.
        let bound = decoder_overhead(gz, limit) + limit + limit / 2 + 1024;
        assert!(
            peak <= bound,
            "inflating {} bytes under a {limit}-byte cap held {peak} bytes at its peak (bound {bound})",
            gz.len()
        );
    }
    let budget = Budget {
        compress_over: 64,
        max_object: limit.max(64),
        max_decompressed: limit.max(64),
    };
    if let Ok(bytes) = &got
        && limit >= 64
    {
        let blob = Blob {
            compressed: true,
            bytes: gz.to_vec(),
        };
        assert_eq!(blob.json_bytes("payload", &budget).as_ref(), Ok(bytes));
        let parsed: Option<serde_json::Value> = if bytes.is_empty() {
            Some(serde_json::Value::Null)
        } else {
            serde_json::from_slice(bytes).ok()
        };
        match blob.to_json("payload", &budget) {
            Ok(v) => assert_eq!(Some(v), parsed),
            Err(e) => assert!(parsed.is_none(), "valid JSON refused: {e}"),
        }
    }
    // The write side: JSON in, a blob that reads back as the same bytes.
    if serde_json::from_slice::<serde_json::Value>(gz).is_ok() {
        match Blob::from_json_bytes("payload", gz.to_vec(), &budget) {
            Ok(blob) => {
                assert!(blob.bytes.len() <= budget.max_object);
                assert_eq!(blob.compressed, gz.len() >= budget.compress_over);
                let back = blob
                    .json_bytes("payload", &budget)
                    .expect("a blob made within the budget reads back");
                assert!(back == gz, "a blob does not read back as its JSON");
            }
            Err(BudgetError::TooLarge { .. } | BudgetError::OverReadLimit { .. }) => {}
            Err(e) => panic!("from_json_bytes: {e}"),
        }
    }
}

//! Export files (`berth::transfer`): what `berth import` reads.
//!
//! The input is taken as a whole file, or (first byte odd) as a file whose
//! trailing CRC-32 the target recomputes, so that the fuzzer gets past the
//! checksum to the header's lengths, the zstd frame and the records.
//!
//! Asserts:
//! - decoding never panics;
//! - a file that decodes holds records that agree (`Export::check`), and
//!   encodes again to a file that decodes to the same export;
//! - decoding allocates no more than about three times what the header
//!   says the records take, plus what the records' own decoding may
//!   (bounded by the codec), plus a constant: a length claim that the
//!   file does not back costs nothing.

use berth::transfer;

use super::alloc;

pub fn transfer(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mut file = rest.to_vec();
    if first & 1 == 1 && file.len() >= 4 {
        let n = file.len() - 4;
        let crc = crc32fast::hash(&file[..n]).to_le_bytes();
        file[n..].copy_from_slice(&crc);
    }
    let (decoded, peak) = alloc::measure(|| transfer::decode(&file));
    // The header's claim of the records' length (at 34 + n), if it has one.
    let claimed = (file.len() >= 22)
        .then(|| u16::from_le_bytes([file[20], file[21]]) as usize)
        .and_then(|n| file.get(34 + n..42 + n))
        .map_or(0, |b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a).min(transfer::MAX_RAW_BYTES) as usize
        });
    let bound = 3 * claimed + 64 * file.len() + (32 << 20);
    if alloc::counting() {
        assert!(
            peak <= bound,
            "decoding a {}-byte export took {peak} bytes (bound {bound})",
            file.len()
        );
    }
    if let Ok(export) = decoded {
        export.check().expect("a decoded export agrees");
        let again = transfer::encode(&export).expect("a decoded export encodes");
        let back = transfer::decode(&again).expect("an encoded export decodes");
        assert_eq!(back, export, "an export round-trips");
    }
}

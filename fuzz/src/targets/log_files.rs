//! The log's files: archive segments (`berth::archive`) and checkpoints
//! (`berth::checkpoint`), as a damaged disk or a copied data dir gives them.
//!
//! The first byte picks the reader (even: a segment, odd: a checkpoint);
//! the rest is the file.
//!
//! Asserts:
//! - reading never panics;
//! - memory: the reading thread holds at most twice what the records
//!   really inflate to (a reference decoder counts it, up to the header's
//!   claim), twice the file and 8 MiB (zstd's window and tables): a claimed
//!   length costs nothing until the data is there;
//! - a file that reads writes back (`write_segment`, `checkpoint::write`)
//!   to a file that reads to the same records or state.

use std::io::Read;
use std::path::Path;

use berth::{archive, checkpoint};

use super::alloc;

/// The bytes the records of `file` really inflate to, at most the
/// header's claim plus one (0 when there is no header to go by).
fn inflated(file: &[u8]) -> u64 {
    if file.len() < 52 {
        return 0;
    }
    let claim = u64::from_le_bytes(file[32..40].try_into().unwrap_or([0; 8]));
    let Ok(d) = zstd::stream::read::Decoder::new(&file[48..file.len() - 4]) else {
        return 0;
    };
    let mut n = 0u64;
    let mut buf = [0u8; 16 << 10];
    let mut d = d.take(claim.saturating_add(1));
    while let Ok(k) = d.read(&mut buf) {
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    n
}

fn bound(file: &[u8]) -> usize {
    2 * inflated(file) as usize + 2 * file.len() + (8 << 20)
}

pub fn log_files(data: &[u8]) {
    let [kind, file @ ..] = data else {
        return;
    };
    let name = Path::new("fuzz-input");
    if kind % 2 == 0 {
        let (read, peak) = alloc::measure(|| archive::segment_from_bytes(name, file));
        assert!(peak <= bound(file), "a segment read took {peak} bytes");
        let Ok((info, records)) = read else { return };
        let dir = super::temp_dir("berth-fuzz-seg-");
        let framed: Vec<Vec<u8>> = records.iter().map(berth::codec::encode).collect();
        let path = archive::write_segment(dir.path(), info.first_seq, info.last_seq, &framed)
            .expect("write the segment back");
        let (again, back) = archive::read_segment(&path).expect("read it again");
        assert_eq!(back, records);
        assert_eq!(
            (again.first_seq, again.last_seq, again.records),
            (info.first_seq, info.last_seq, info.records)
        );
    } else {
        let (read, peak) = alloc::measure(|| checkpoint::from_bytes(name, file));
        // A checkpoint's state is decoded into maps: count them too.
        assert!(
            peak <= 2 * bound(file),
            "a checkpoint read took {peak} bytes"
        );
        let Ok(snap) = read else { return };
        let dir = super::temp_dir("berth-fuzz-ckpt-");
        let path = checkpoint::write(dir.path(), &snap).expect("write the checkpoint back");
        assert_eq!(checkpoint::read(&path).expect("read it again"), snap);
    }
}

//! Archive segments: commit records that retention took out of the store's
//! log, kept in zstd-compressed, checksummed files under `DIR/archive/`, so
//! that the whole history can still be replayed offline.
//!
//! One segment file, `seg-<first event, 20 digits>.bsg`, holds a run of
//! consecutive commit records (all numbers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BERTHSEG` |
//! | 8 | 2 | format version, 1 (a checkpoint's: 1 or 2, see `checkpoint.rs`) |
//! | 10 | 2 | flags, 0 |
//! | 12 | 8 | the first event number in the segment |
//! | 20 | 8 | the last event number in the segment |
//! | 28 | 4 | record count |
//! | 32 | 8 | length of the records once decompressed |
//! | 40 | 8 | compressed length `N` |
//! | 48 | `N` | one zstd frame: for each record, its length (4 bytes) and the record as the codec frames it (version byte, bincode body, CRC-32) |
//! | 48+`N` | 4 | CRC-32 of bytes `0 .. 48+N` |
//!
//! A segment is written to a temporary name, fsync-ed, renamed into place
//! and its folder fsync-ed, so a crash leaves a whole segment or none.
//! Reading checks the magic, the version, the lengths and the checksum
//! before it decompresses, decompresses no more than the header says (at
//! most [`MAX_SEGMENT_BYTES`]), and every record has its own checksum.
//! Segments decode in parallel ([`read_all`], with rayon).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::codec;
use crate::frame;
use crate::store::event::CommitRecord;

/// The folder of a data dir's archive.
pub const DIR: &str = "archive";
const MAGIC: &[u8; 8] = b"BERTHSEG";
const VERSION: u16 = 1;
const HEADER: usize = 48;
/// The most a segment's records may take decompressed.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// The zstd level segments are written with.
const LEVEL: i32 = 3;

/// Why a segment cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// Not a file of this kind at all: too short, or without its magic.
    #[error("{path}: not a {what} ({why})")]
    Invalid {
        path: PathBuf,
        /// "berth archive segment" or "berth checkpoint" (`what_of`).
        what: &'static str,
        why: String,
    },
    /// A file of this kind in a format version this build does not read.
    #[error(
        "{path}: a {what} of format version {version}; this build reads {}",
        versions(*.newest)
    )]
    Version {
        path: PathBuf,
        what: &'static str,
        version: u16,
        /// The newest version this build reads (it reads 1 to this).
        newest: u16,
    },
    /// A file of this kind (its magic and version are right) whose bytes
    /// do not check out: cut short, a checksum mismatch, a header that
    /// contradicts itself or its data.
    #[error("{path}: a damaged {what} ({why})")]
    Damaged {
        path: PathBuf,
        what: &'static str,
        why: String,
    },
    #[error("{path}: record {index} is corrupt: {why}")]
    Record {
        path: PathBuf,
        index: usize,
        why: String,
    },
}

/// What a segment's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub path: PathBuf,
    pub first_seq: u64,
    pub last_seq: u64,
    pub records: u32,
    /// The file's size on disk.
    pub bytes: u64,
    /// Its format version.
    pub version: u16,
}

/// The segment file name for a run that starts at `first_seq`.
pub fn segment_name(first_seq: u64) -> String {
    format!("seg-{first_seq:020}.bsg")
}

/// Writes one segment of `records` (each a commit record as the codec
/// framed it, in event order) into `dir`, durably. Returns its path.
pub fn write_segment(
    dir: &Path,
    first_seq: u64,
    last_seq: u64,
    records: &[Vec<u8>],
) -> io::Result<PathBuf> {
    write_file(
        dir,
        &segment_name(first_seq),
        MAGIC,
        first_seq,
        last_seq,
        records,
    )
}

/// Writes a file of this layout (with its own `magic`; `checkpoint.rs`
/// uses it too) as `dir/name`, durably: a temporary name, fsync, rename,
/// fsync of the folder. The folder is made if missing, mode 0700 as every
/// folder of a data dir.
pub(crate) fn write_file(
    dir: &Path,
    name: &str,
    magic: &[u8; 8],
    first_seq: u64,
    last_seq: u64,
    records: &[Vec<u8>],
) -> io::Result<PathBuf> {
    crate::store::private_dir(dir)?;
    let raw = frame::pack(records);
    let packed = frame::compress(&raw, LEVEL)?;
    let mut out = Vec::with_capacity(HEADER + packed.len() + 4);
    out.extend_from_slice(magic);
    out.extend_from_slice(&newest_of(magic).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&last_seq.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
    out.extend_from_slice(&packed);
    frame::seal(&mut out);
    let path = dir.join(name);
    frame::write_atomic(&path, &out, 0o600)?;
    Ok(path)
}

use frame::{u32_at, u64_at};

/// What a file with `magic` is, in messages: a segment (this module's
/// magic), or a checkpoint (the one other file of this layout).
fn what_of(magic: &[u8; 8]) -> &'static str {
    if magic == MAGIC {
        "berth archive segment"
    } else {
        "berth checkpoint"
    }
}

/// The format version this build writes files with `magic` at, the newest
/// it reads (it reads every version from 1 on).
fn newest_of(magic: &[u8; 8]) -> u16 {
    if magic == MAGIC {
        VERSION
    } else {
        crate::checkpoint::VERSION
    }
}

/// The versions this build reads, up to `newest`, in messages.
fn versions(newest: u16) -> String {
    match newest {
        1 => "version 1".into(),
        n => format!("versions 1 to {n}"),
    }
}

/// Checks a segment's header (only) and says what it holds.
fn parse_header(
    path: &Path,
    magic: &[u8; 8],
    bytes: &[u8],
) -> Result<(SegmentInfo, u64, u64), ArchiveError> {
    let what = what_of(magic);
    let not_one = |why: String| ArchiveError::Invalid {
        path: path.to_path_buf(),
        what,
        why,
    };
    let too_short = || format!("{} bytes is too short", bytes.len());
    if bytes.len() < magic.len() {
        return Err(not_one(too_short()));
    }
    if &bytes[..8] != magic {
        return Err(not_one(format!(
            "no {} magic",
            String::from_utf8_lossy(magic)
        )));
    }
    if bytes.len() < HEADER + 4 {
        return Err(ArchiveError::Damaged {
            path: path.to_path_buf(),
            what,
            why: too_short(),
        });
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    let newest = newest_of(magic);
    if !(1..=newest).contains(&version) {
        return Err(ArchiveError::Version {
            path: path.to_path_buf(),
            what,
            version,
            newest,
        });
    }
    let invalid = |why: String| ArchiveError::Damaged {
        path: path.to_path_buf(),
        what,
        why,
    };
    let (raw_len, packed_len) = (u64_at(bytes, 32), u64_at(bytes, 40));
    if packed_len != (bytes.len() - HEADER - 4) as u64 {
        return Err(invalid(format!(
            "it says {packed_len} compressed bytes but holds {}",
            bytes.len() - HEADER - 4
        )));
    }
    if raw_len > MAX_SEGMENT_BYTES {
        return Err(invalid(format!(
            "it claims {raw_len} bytes of records; at most {MAX_SEGMENT_BYTES} are read"
        )));
    }
    frame::check_seal(bytes).map_err(invalid)?;
    let info = SegmentInfo {
        path: path.to_path_buf(),
        first_seq: u64_at(bytes, 12),
        last_seq: u64_at(bytes, 20),
        records: u32_at(bytes, 28),
        bytes: bytes.len() as u64,
        version,
    };
    if info.first_seq > info.last_seq {
        return Err(invalid(format!(
            "its events run from {} to {}",
            info.first_seq, info.last_seq
        )));
    }
    Ok((info, raw_len, packed_len))
}

/// Reads and checks one segment: its commit records, in order.
pub fn read_segment(path: &Path) -> Result<(SegmentInfo, Vec<CommitRecord>), ArchiveError> {
    let (info, raw) = read_file(path, MAGIC)?;
    let records = decode_records(path, &raw, info.records)?;
    Ok((info, records))
}

/// Reads a file of this layout with `magic`, checked whole before it
/// inflates: its header and its records' bytes (split them with
/// [`split_records`]).
pub(crate) fn read_file(
    path: &Path,
    magic: &[u8; 8],
) -> Result<(SegmentInfo, Vec<u8>), ArchiveError> {
    let bytes = fs::read(path).map_err(|source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_file(path, magic, &bytes)
}

/// [`read_file`] of bytes already read (`path` names them in errors). The
/// records inflate into a buffer that grows with what really comes out,
/// never past the header's length (itself at most [`MAX_SEGMENT_BYTES`]):
/// a claimed length costs nothing until the data is there.
pub(crate) fn decode_file(
    path: &Path,
    magic: &[u8; 8],
    bytes: &[u8],
) -> Result<(SegmentInfo, Vec<u8>), ArchiveError> {
    let (info, raw_len, _) = parse_header(path, magic, bytes)?;
    let raw = frame::inflate(&bytes[HEADER..bytes.len() - 4], raw_len, MAX_SEGMENT_BYTES).map_err(
        |why| ArchiveError::Damaged {
            path: path.to_path_buf(),
            what: what_of(magic),
            why,
        },
    )?;
    Ok((info, raw))
}

/// Reads a segment from bytes already read (`path` names them in errors).
pub fn segment_from_bytes(
    path: &Path,
    bytes: &[u8],
) -> Result<(SegmentInfo, Vec<CommitRecord>), ArchiveError> {
    let (info, raw) = decode_file(path, MAGIC, bytes)?;
    let records = decode_records(path, &raw, info.records)?;
    Ok((info, records))
}

fn decode_records(path: &Path, raw: &[u8], count: u32) -> Result<Vec<CommitRecord>, ArchiveError> {
    split_records(path, MAGIC, raw, count)?
        .par_iter()
        .enumerate()
        .map(|(index, r)| {
            codec::decode::<CommitRecord>(r).map_err(|e| ArchiveError::Record {
                path: path.to_path_buf(),
                index,
                why: e.to_string(),
            })
        })
        .collect()
}

/// Cuts the decompressed records apart by their length prefixes.
pub(crate) fn split_records<'a>(
    path: &Path,
    magic: &[u8; 8],
    raw: &'a [u8],
    count: u32,
) -> Result<Vec<&'a [u8]>, ArchiveError> {
    let out = frame::split(raw).map_err(|e| ArchiveError::Record {
        path: path.to_path_buf(),
        index: e.index,
        why: e.why.to_string(),
    })?;
    if out.len() != count as usize {
        return Err(ArchiveError::Damaged {
            path: path.to_path_buf(),
            what: what_of(magic),
            why: format!("it holds {} records, its header says {count}", out.len()),
        });
    }
    Ok(out)
}

/// The event a segment file's name says it begins with (`seg-<first
/// event>.bsg`); None for a name that is not a segment's.
pub fn named_first_seq(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_prefix("seg-")?.strip_suffix(".bsg")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether a file name is a segment's as `list` looks for them
/// (`seg-*.bsg`, whatever is between).
pub fn named_like_a_segment(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("seg-") && n.ends_with(".bsg"))
}

/// The segments in `dir` (a data dir's `archive/`), by the first event
/// their names say. Only the header is read, not checked against the
/// file's checksum (that takes the whole file), so it is trusted only as
/// far as it agrees with itself and with the file's name: a file named
/// like a segment whose header cannot be read, whose magic or version is
/// not a segment's, whose first event is not the one its name says, or
/// whose events run backwards, is left out (`replay::segments_in` reads
/// such a file whole and reports what is wrong with it). Its other fields
/// (its last event, the record count) are claims until the file is read.
pub fn list(dir: &Path) -> io::Result<Vec<SegmentInfo>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let path = e?.path();
        if !named_like_a_segment(&path) {
            continue;
        }
        let Some(named) = named_first_seq(&path) else {
            continue;
        };
        let mut head = [0u8; HEADER];
        let read = File::open(&path).and_then(|mut f| {
            use std::io::Read;
            f.read_exact(&mut head)
        });
        if read.is_err() || &head[..8] != MAGIC {
            continue;
        }
        let info = SegmentInfo {
            first_seq: u64_at(&head, 12),
            last_seq: u64_at(&head, 20),
            records: u32_at(&head, 28),
            bytes: fs::metadata(&path)?.len(),
            version: u16::from_le_bytes([head[8], head[9]]),
            path,
        };
        let plausible = info.first_seq == named
            && info.first_seq <= info.last_seq
            && (1..=VERSION).contains(&info.version);
        if plausible {
            out.push(info);
        }
    }
    out.sort_by_key(|s| s.first_seq);
    Ok(out)
}

/// Reads every segment in `segments`, in parallel (rayon), and returns all
/// their records in event order.
pub fn read_all(segments: &[SegmentInfo]) -> Result<Vec<CommitRecord>, ArchiveError> {
    let parts = segments
        .par_iter()
        .map(|s| read_segment(&s.path).map(|(_, r)| r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(parts.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::event::{Event, EventKind};

    fn record(seq: u64) -> Vec<u8> {
        codec::encode(&CommitRecord {
            next_id: seq + 1,
            events: vec![Event {
                seq,
                at: 1_000 + seq,
                kind: EventKind::Started { id: seq },
            }],
            writes: Vec::new(),
        })
    }

    #[test]
    fn the_folder_a_file_goes_to_is_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("archive");
        let mode = || fs::metadata(&folder).unwrap().permissions().mode() & 0o7777;
        write_segment(&folder, 5, 5, &[record(5)]).unwrap();
        assert_eq!(mode(), 0o700);
        // One an older build made with the umask is made private too.
        fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).unwrap();
        write_segment(&folder, 6, 6, &[record(6)]).unwrap();
        assert_eq!(mode(), 0o700);
    }

    #[test]
    fn a_segment_reads_back_and_any_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let recs: Vec<Vec<u8>> = (5..=9).map(record).collect();
        let path = write_segment(dir.path(), 5, 9, &recs).unwrap();
        assert_eq!(path.file_name().unwrap(), "seg-00000000000000000005.bsg");
        let (info, back) = read_segment(&path).unwrap();
        assert_eq!((info.first_seq, info.last_seq, info.records), (5, 9, 5));
        let seqs: Vec<u64> = back.iter().map(|r| r.events[0].seq).collect();
        assert_eq!(seqs, [5, 6, 7, 8, 9]);
        assert_eq!(list(dir.path()).unwrap(), vec![info]);

        let good = fs::read(&path).unwrap();
        // Every truncation, and a flip of every byte, is refused.
        for cut in [0, 10, HEADER, good.len() - 5, good.len() - 1] {
            fs::write(&path, &good[..cut]).unwrap();
            assert!(read_segment(&path).is_err(), "cut at {cut}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            fs::write(&path, &bad).unwrap();
            assert!(
                read_segment(&path).is_err(),
                "a flip at byte {i} was accepted"
            );
        }
    }

    #[test]
    fn segments_read_in_parallel_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for start in [1u64, 11, 21] {
            let recs: Vec<Vec<u8>> = (start..start + 10).map(record).collect();
            write_segment(dir.path(), start, start + 9, &recs).unwrap();
        }
        fs::write(dir.path().join("notes.txt"), b"not a segment").unwrap();
        let segs = list(dir.path()).unwrap();
        assert_eq!(segs.len(), 3);
        let all = read_all(&segs).unwrap();
        let seqs: Vec<u64> = all.iter().map(|r| r.events[0].seq).collect();
        assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
    }
}

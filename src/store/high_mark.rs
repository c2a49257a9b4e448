//! The high-water mark (`DIR/berth.high`): how far the database reached on
//! disk, kept outside sled, so that a database that went back is refused
//! instead of being read as an older state.
//!
//! sled reads its log up to the first frame that is not whole and right:
//! for sled a damaged or truncated `db/db` looks like the end of a log that
//! a crash cut short, and it opens an older state without a word. The
//! store would then number new events and tasks again from there: commits
//! that were acknowledged are gone and their ids reused. The mark says the
//! next event number and the next task id of a state known to be durable;
//! opening ([`check`], in `open.rs` after the log is re-applied) refuses a
//! database that ends before it.
//!
//! **Never ahead of the disk.** The mark is written ([`write`], atomically:
//! a temporary file, fsync, rename, fsync of the folder) only with the
//! values of a state already durable: at an open that writes (after its
//! flush), at a close (after the last flush), and by
//! `Store::save_high_mark` (after waiting for every commit it covers),
//! which a daemon calls every few seconds. A power cut between two writes
//! leaves an older mark, which an older check still passes. A store whose
//! flushes are not power-safe (`Options::power_safe` off) writes none: its
//! disk may lose what a flush returned. Damage that loses only commits
//! after the last mark goes unseen; the mark narrows that window, it does
//! not close it.
//!
//! **Layout.** Four text lines: `berth high-water mark 1`, `next_event N`,
//! `next_id N`, and `crc32 X` (8 hex digits: CRC-32 of the lines before
//! it). A mark that does not read back whole and right is itself damage
//! and refuses the dir, saying how to open it without the check.

use std::path::Path;

/// The file's name in the data dir.
pub const FILE: &str = "berth.high";
const HEADER: &str = "berth high-water mark 1";

/// A durable state's next event number and next task id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub next_event: u64,
    pub next_id: u64,
}

fn body(m: &Mark) -> String {
    format!(
        "{HEADER}\nnext_event {}\nnext_id {}\n",
        m.next_event, m.next_id
    )
}

/// The file's bytes for `m`.
pub fn encode(m: &Mark) -> String {
    let body = body(m);
    let crc = crc32fast::hash(body.as_bytes());
    format!("{body}crc32 {crc:08x}\n")
}

/// `text` read back as a mark, or what is wrong with it.
pub fn decode(text: &[u8]) -> Result<Mark, String> {
    let text = std::str::from_utf8(text).map_err(|_| "it is not text".to_string())?;
    let lines: Vec<&str> = text.lines().collect();
    let [header, event, id, crc] = lines[..] else {
        return Err(format!("it has {} lines, not 4", lines.len()));
    };
    if header != HEADER {
        return Err(format!("its first line is not `{HEADER}`"));
    }
    fn value<'a>(line: &'a str, name: &str) -> Result<&'a str, String> {
        line.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .ok_or_else(|| format!("a line where `{name} ...` was expected"))
    }
    let number = |line: &str, name: &str| {
        let v = value(line, name)?;
        v.parse::<u64>()
            .map_err(|_| format!("its {name} `{v}` is not a number"))
    };
    let m = Mark {
        next_event: number(event, "next_event")?,
        next_id: number(id, "next_id")?,
    };
    let crc = value(crc, "crc32")?;
    let want = format!("{:08x}", crc32fast::hash(body(&m).as_bytes()));
    // Byte for byte as written: no other spelling of the same numbers.
    if crc != want || encode(&m) != text {
        return Err(format!(
            "its checksum does not match (crc32 {crc}, computed {want})"
        ));
    }
    Ok(m)
}

/// Why [`read`] found no mark it could use.
#[derive(Debug)]
pub enum MarkError {
    /// This user may not read the file: nothing is known of the mark.
    NotAllowed(std::io::Error),
    /// What is wrong with the file.
    Damaged(String),
}

/// The mark in the data dir `dir`, if it has one.
pub fn read(dir: &Path) -> Result<Option<Mark>, MarkError> {
    let path = dir.join(FILE);
    match std::fs::File::open(&path).and_then(|f| crate::frame::read_file_capped(f, 4096)) {
        Ok(bytes) => decode(&bytes).map(Some).map_err(MarkError::Damaged),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(MarkError::NotAllowed(e)),
        Err(e) => Err(MarkError::Damaged(format!("cannot read it: {e}"))),
    }
}

/// Writes `m` as the data dir's mark, atomically and durably.
pub fn write(dir: &Path, m: &Mark) -> std::io::Result<()> {
    crate::frame::write_atomic(&dir.join(FILE), encode(m).as_bytes(), 0o600)
}

/// Whether a database whose state goes on at `found` may be opened with
/// the mark `mark`: never behind it. The error is the `Damaged` detail.
pub fn check(dir: &Path, found: Mark, mark: Mark) -> Result<(), String> {
    if found.next_event >= mark.next_event && found.next_id >= mark.next_id {
        return Ok(());
    }
    let path = dir.join(FILE);
    Err(format!(
        "its log ends at event {} (next task id {}), but the data dir's high-water mark ({}) \
         says event {} and task id {} were on disk: sled's log lost acknowledged commits (its \
         files were damaged, cut short, or replaced by an older copy), and reading on would \
         reuse their numbers. To open it as it is, with those commits lost, remove {}",
        found.next_event.saturating_sub(1),
        found.next_id,
        path.display(),
        mark.next_event.saturating_sub(1),
        mark.next_id.saturating_sub(1),
        path.display(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Mark = Mark {
        next_event: 1234,
        next_id: 56,
    };

    #[test]
    fn a_mark_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), &M).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(M));
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.starts_with("berth high-water mark 1\nnext_event 1234\nnext_id 56\ncrc32 "));
    }

    #[test]
    fn a_changed_or_cut_mark_is_refused() {
        let good = encode(&M);
        let changed = good.replace("1234", "1235");
        assert!(decode(changed.as_bytes()).unwrap_err().contains("checksum"));
        for cut in 0..good.len() {
            assert!(decode(&good.as_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode(b"\xff\xfe").unwrap_err().contains("not text"));
        let extra = format!("{good}more\n");
        assert!(decode(extra.as_bytes()).unwrap_err().contains("5 lines"));
        let spaced = good.replace("next_id 56", "next_id  56");
        assert!(decode(spaced.as_bytes()).is_err());
    }

    #[test]
    fn a_database_behind_its_mark_is_refused_and_one_at_or_past_it_opens() {
        let dir = Path::new("/d");
        assert!(check(dir, M, M).is_ok());
        let ahead = Mark {
            next_event: 2000,
            next_id: 60,
        };
        assert!(check(dir, ahead, M).is_ok());
        let behind = Mark {
            next_event: 1000,
            ..M
        };
        let e = check(dir, behind, M).unwrap_err();
        assert!(
            e.contains("ends at event 999 (next task id 56)")
                && e.contains("says event 1233 and task id 55 were on disk"),
            "{e}"
        );
        assert!(e.contains("remove /d/berth.high"), "{e}");
        let fewer_ids = Mark { next_id: 50, ..M };
        assert!(check(dir, fewer_ids, M).is_err());
    }
}

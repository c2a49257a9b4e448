//! The shape berth's self-describing files share (archive segments, see
//! `archive`; export files, see `transfer`): a header of their own, one
//! zstd frame holding a run of records, and a CRC-32 of everything before
//! it. Inside the frame each record is its length (4 bytes, little-endian)
//! and the record as the codec frames it (version byte, bincode body,
//! CRC-32), so every record is checked again on its own.
//!
//! The helpers here build and check that shape; each kind of file has its
//! own header and its own error type. Reading goes: check the header and
//! the trailing checksum ([`check_seal`]) before anything is inflated,
//! inflate no more than the header says ([`inflate`]), cut the records
//! apart ([`split`]), then decode each with the codec.

/// Appends each record's length (4 bytes) and the record.
pub fn pack(records: &[Vec<u8>]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(records.iter().map(|r| r.len() + 4).sum());
    for r in records {
        raw.extend_from_slice(&(r.len() as u32).to_le_bytes());
        raw.extend_from_slice(r);
    }
    raw
}

/// Compresses packed records into one zstd frame at `level`.
pub fn compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(raw, level)
}

/// Appends the CRC-32 of everything in `out` (the trailer).
pub fn seal(out: &mut Vec<u8>) {
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Checks the trailing CRC-32 of `bytes` (at least 4 long); the error says
/// both values.
pub fn check_seal(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 4 {
        return Err(format!("{} bytes is too short", bytes.len()));
    }
    let stored = u32_at(bytes, bytes.len() - 4);
    let computed = crc32fast::hash(&bytes[..bytes.len() - 4]);
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        ));
    }
    Ok(())
}

/// Inflates one zstd frame to exactly `raw_len` bytes, refusing more (and
/// refusing a `raw_len` over `cap` before allocating anything). The output
/// grows as it is inflated, so a length claim that the frame does not back
/// costs no memory.
pub fn inflate(packed: &[u8], raw_len: u64, cap: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if raw_len > cap {
        return Err(format!(
            "it claims {raw_len} bytes of records; at most {cap} are read"
        ));
    }
    let mut decoder = zstd::stream::read::Decoder::with_buffer(packed)
        .map_err(|e| format!("its records do not decompress: {e}"))?
        .single_frame();
    let start = raw_len.min(packed.len() as u64 * 4 + (64 << 10)) as usize;
    let mut raw = Vec::with_capacity(start);
    decoder
        .by_ref()
        .take(raw_len + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("its records do not decompress: {e}"))?;
    if raw.len() as u64 != raw_len {
        return Err(format!(
            "{} bytes decompressed, {raw_len} expected",
            raw.len()
        ));
    }
    Ok(raw)
}

/// Why packed records cannot be cut apart: the index of the record at
/// fault, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitError {
    pub index: usize,
    pub why: &'static str,
}

/// Cuts packed records apart by their length prefixes.
pub fn split(mut raw: &[u8]) -> Result<Vec<&[u8]>, SplitError> {
    let mut out = Vec::new();
    while !raw.is_empty() {
        let bad = |why| SplitError {
            index: out.len(),
            why,
        };
        if raw.len() < 4 {
            return Err(bad("a record's length is cut short"));
        }
        let len = u32_at(raw, 0) as usize;
        if raw.len() - 4 < len {
            return Err(bad("a record is cut short"));
        }
        out.push(&raw[4..4 + len]);
        raw = &raw[4 + len..];
    }
    Ok(out)
}

/// The little-endian u16 at `at` (the caller checked the length).
pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at `at` (the caller checked the length).
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The little-endian u64 at `at` (the caller checked the length).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads `r` to its end, refusing (`InvalidData`, before reading further)
/// more than `max` bytes: a file named on a command line may be
/// `/dev/zero`, or far larger than anything berth would take from it.
/// Past the first [`READ_CHUNK`] it reads in chunks of that size, so that
/// refusing a stream holds at most `max` and one chunk (a growing `Vec`
/// would hold twice as much while it doubles) and an accepted one is put
/// together once, at its exact size.
pub fn read_capped(mut r: impl std::io::Read, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let too_big = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {}", crate::units::format_size(max)),
        )
    };
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    loop {
        let mut chunk = Vec::new();
        let n = (&mut r)
            .take((READ_CHUNK as u64).min(max.saturating_add(1) - total))
            .read_to_end(&mut chunk)?;
        total += n as u64;
        if total > max {
            return Err(too_big());
        }
        if n == 0 {
            break;
        }
        chunks.push(chunk);
    }
    if chunks.len() == 1 {
        return Ok(chunks.pop().unwrap_or_default());
    }
    let mut bytes = Vec::with_capacity(total as usize);
    for c in chunks {
        bytes.extend_from_slice(&c);
    }
    Ok(bytes)
}

/// [`read_capped`] of a file: a regular file's size is known, so one
/// larger than `max` is refused without reading it, and a smaller one is
/// read into one buffer of its size.
pub fn read_file_capped(f: std::fs::File, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return read_capped(f, max);
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {}", crate::units::format_size(max)),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    // It may have grown since: still never past the cap.
    f.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {}", crate::units::format_size(max)),
        ));
    }
    Ok(bytes)
}

/// The chunk [`read_capped`] reads a large stream in.
pub const READ_CHUNK: usize = 16 << 20;

/// What `path` is when it exists and is not a regular file ("a symbolic
/// link", "a character device", ...): a rename over it would replace it.
pub fn not_a_regular_file(path: &std::path::Path) -> Option<&'static str> {
    file_kind(std::fs::symlink_metadata(path).ok()?.file_type())
}

/// What a file of type `t` is, when it is not a regular file: "a FIFO",
/// "a folder", ...
pub fn file_kind(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(if t.is_file() {
        return None;
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a folder"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

/// Writes `bytes` to `path` so that no reader (and no crash) ever sees a
/// part of it: a temporary file `.NAME.tmp` in the same folder with `mode`,
/// fsync, rename over `path`, fsync of the folder. On an error the
/// temporary file is removed. A `path` that exists and is not a regular
/// file (a device such as `/dev/null`, a FIFO, a symbolic link) is refused
/// (`InvalidInput`): the rename would replace it with a file.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(what) = not_a_regular_file(path) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is {what}, not a regular file to replace",
                path.display()
            ),
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    // The temporary file is made anew: a leftover of that name (from a
    // crash, or planted: a symbolic link, a FIFO) is removed, never
    // followed or opened.
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&tmp)
    };
    let write = || -> std::io::Result<()> {
        let mut f = match create() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                create()?
            }
            r => r?,
        };
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_never_follows_or_opens_a_leftover_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A symbolic link planted at the temporary name: followed, the
        // write would land in its target, and the file become a link.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".out.bex.tmp")).unwrap();
        let out = dir.path().join("out.bex");
        write_atomic(&out, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        // A FIFO there: opened, the write would wait for a reader for good.
        let fifo = dir.path().join(".pipe.bex.tmp");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let pipe = dir.path().join("pipe.bex");
        let p = pipe.clone();
        std::thread::spawn(move || tx.send(write_atomic(&p, b"new", 0o600).is_ok()));
        let done = rx.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(done, Ok(true), "the write finished");
        assert_eq!(std::fs::read(&pipe).unwrap(), b"new");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_capped_read_takes_up_to_its_cap_and_refuses_more() {
        assert_eq!(read_capped(&b"abcd"[..], 4).unwrap(), b"abcd");
        let e = read_capped(&b"abcde"[..], 4).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("larger than 4"), "{e}");
        // An endless source is cut at the cap, not read to its end.
        let zero = std::fs::File::open("/dev/zero").unwrap();
        assert!(read_capped(zero, 1 << 20).is_err());
        let zero = std::fs::File::open("/dev/zero").unwrap();
        assert!(read_file_capped(zero, 1 << 20).is_err());
    }

    #[test]
    fn a_capped_read_of_several_chunks_is_whole_and_exact_at_the_cap() {
        let data: Vec<u8> = (0..2 * READ_CHUNK + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        let n = data.len() as u64;
        assert_eq!(read_capped(&data[..], n).unwrap(), data);
        assert_eq!(read_capped(&data[..], u64::MAX).unwrap(), data);
        assert!(read_capped(&data[..], n - 1).is_err());
        // A cap at a chunk's edge: exactly one chunk, and one byte more.
        let c = READ_CHUNK as u64;
        assert_eq!(
            read_capped(&data[..READ_CHUNK], c).unwrap(),
            &data[..READ_CHUNK]
        );
        assert!(read_capped(&data[..READ_CHUNK + 1], c).is_err());
        // A regular file: the same, its size known before it is read.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &data).unwrap();
        let open = || std::fs::File::open(&path).unwrap();
        assert_eq!(read_file_capped(open(), n).unwrap(), data);
        let e = read_file_capped(open(), n - 1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("larger than"), "{e}");
    }

    #[test]
    fn an_atomic_write_replaces_a_regular_file_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"old").unwrap();
        write_atomic(&file, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = write_atomic(&link, b"over", 0o600).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let e = write_atomic(std::path::Path::new("/dev/null"), b"over", 0o600).unwrap_err();
        assert!(e.to_string().contains("is a character device"), "{e}");
    }

    #[test]
    fn packed_records_split_back_and_cut_ones_are_refused() {
        let recs = vec![b"one".to_vec(), Vec::new(), b"three".to_vec()];
        let raw = pack(&recs);
        let back: Vec<Vec<u8>> = split(&raw).unwrap().iter().map(|r| r.to_vec()).collect();
        assert_eq!(back, recs);
        for cut in 1..raw.len() {
            if let Ok(parts) = split(&raw[..cut]) {
                // Only a cut at a record boundary splits: into fewer records.
                assert!(parts.len() < recs.len(), "cut at {cut}");
            }
        }
        assert_eq!(
            split(&raw[..raw.len() - 1]).unwrap_err(),
            SplitError {
                index: 2,
                why: "a record is cut short"
            }
        );
    }

    #[test]
    fn the_seal_catches_any_flip_and_inflating_is_capped() {
        let mut b = b"header and body".to_vec();
        seal(&mut b);
        assert!(check_seal(&b).is_ok());
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(check_seal(&bad).is_err(), "flip at {i}");
        }
        let packed = compress(&[7u8; 1000], 3).unwrap();
        assert_eq!(inflate(&packed, 1000, 1 << 20).unwrap(), vec![7u8; 1000]);
        assert!(inflate(&packed, 999, 1 << 20).is_err());
        assert!(inflate(&packed, 1001, 1 << 20).is_err());
        assert!(
            inflate(&packed, 1 << 40, 1 << 20)
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn an_atomic_write_leaves_only_the_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_atomic(&path, b"a", 0o600).unwrap();
        write_atomic(&path, b"bb", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"bb");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.bin")]);
        // A folder that does not exist: an error, nothing left behind.
        assert!(write_atomic(&dir.path().join("no/such/file"), b"x", 0o600).is_err());
    }
}

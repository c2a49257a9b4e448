//! berth's write-ahead log (`db/wal/`): what makes a commit durable.
//!
//! A commit's record goes, under the write lock, into this log's pending
//! buffer as one frame, and into the overlay with the commit's key writes
//! (readers find it there, `records::View`, until the applier's next round
//! writes it to sled under `e`, before those key writes). A flush (the
//! group commit's leader) writes the pending frames with one `pwrite` at
//! the end of the current segment and one `fdatasync`: that is when
//! commits are acknowledged. sled itself is flushed (and its files synced,
//! see `files`) in the background, at most every [`CHECKPOINT_EVERY`] or
//! [`CHECKPOINT_BYTES`] of frames (`Store::checkpoint_sled`); the segments
//! whose frames that flush covered (frames of records the applier had
//! written to sled when it began) are then deleted. sled's flush (a hand-off to its IO thread, a
//! `sync_file_range`, then berth's `fdatasync` and a look for new files)
//! took two to three times one `fdatasync`.
//!
//! **Files.** `wal/SEQ.wal`, SEQ the first event number of its first frame
//! (20 digits), mode 0600. A segment is never reused: a new one is begun
//! (header, synced with its folder) when the current one passes
//! [`SEGMENT_BYTES`]. Its space is reserved beforehand, and reads as
//! zeros, which end a segment's frames:
//!
//! - **The spare.** Once a segment is begun, a background thread
//!   (`berth-wal-spare`) writes the next one's [`SEGMENT_BYTES`] of zeros
//!   into `wal/spare.tmp`, syncs it and renames it `wal/spare`; the next
//!   segment is that file, renamed. A flush's `fdatasync` then writes over
//!   blocks the file system already holds as written: measured here, 155-165
//!   µs a flush against 255-265 with `fallocate`, whose blocks are reserved
//!   but unwritten, so that each `fdatasync` also journals their
//!   conversion. The zeros are written a page at a time, so that the page
//!   cache holds the spare in page-sized folios and a flush writes back
//!   only the pages its frames changed. Neither file ends in `.wal`, so
//!   reading never sees them.
//! - **Without a spare** (the first segment after an open, or the spare not
//!   ready yet): `fallocate` where the file system can.
//! - **On a nearly full disk** (less than [`TIGHT`] free) neither is made:
//!   a segment then grows with its frames, so that the log never fills
//!   the last of the disk with zeros while tasks still need it to record
//!   how they end (see `health`: below the reserve, only such writes go on).
//!
//! **Layout.** Header: `BERTHWAL` and a version (u32 LE, 1) and 4 zero
//! bytes (a header with anything else there is damage). Frame: body length (u32 LE), CRC-32 of what follows the CRC
//! (u32 LE), the record's first event number and the one after its last
//! (u64 LE each), then the body: the commit record's bytes as `codec` framed
//! them.
//!
//! **Reading** ([`read`]) goes through the segments in order and stops at
//! the first frame that is not whole and right: a length of zero (the end),
//! a bad length or CRC, or a frame that does not follow the one before (its
//! first event is not the one after the previous frame's last). At the end
//! of the last segment that is the frame a crash or a power cut cut short:
//! its commit was never acknowledged. Anywhere else it is damage
//! (`Replay::damage`), and opening refuses the dir, saying where.
//!
//! Opening (`open.rs` `replay_wal`) inserts the frames sled lost into sled,
//! flushes sled, and deletes every segment ([`Wal::clear`]).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::codec::MAX_RECORD_BYTES;

/// The folder in `db/`.
pub const DIR: &str = "wal";
const MAGIC: &[u8; 8] = b"BERTHWAL";
const VERSION: u32 = 1;
const HEADER: usize = 16;
const FRAME_HEADER: usize = 24;
/// The size of each write of the spare's zeros: a page (see `write_spare`).
const SPARE_WRITE: usize = 4096;
/// A new segment is begun once the current one holds this much.
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// sled is flushed in the background once this many frame bytes were
/// written since its last flush...
pub const CHECKPOINT_BYTES: u64 = 32 << 20;
/// ...or this long after the first of them (by default: `Options::sled_flush_every`).
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Pending frames are written (by the sled flusher) once they are this many bytes.
pub const PENDING_MAX: u64 = 16 << 20;
/// Free space on the log's file system below which nothing is reserved
/// ahead: no spare, no `fallocate` (see the module doc).
pub const TIGHT: u64 = 2 * SEGMENT_BYTES;

/// Whether the file system holding `dir` has less than [`TIGHT`] free (an
/// unknown size, or a failed look, is not tight: the reservations are best
/// effort anyway).
fn space_is_tight(dir: &Path) -> bool {
    matches!(super::health::free_bytes(dir), Ok(Some(free)) if free < TIGHT)
}

/// The next segment, zeroed and synced (see the module doc), and the file
/// it is written in first.
const SPARE: &str = "spare";
const SPARE_TMP: &str = "spare.tmp";

/// One commit record as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub first_seq: u64,
    pub next_seq: u64,
    pub body: Vec<u8>,
}

/// The log of an open store.
#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    /// `fdatasync` at each flush (off only to measure what it costs).
    sync: bool,
    /// See [`CHECKPOINT_EVERY`].
    checkpoint_every: Duration,
    pending: Mutex<Pending>,
    writer: Mutex<Writer>,
    /// The thread writing the spare, if one was started.
    spare: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    /// The first event number of the first frame in `buf`.
    first_seq: Option<u64>,
    /// The first event number of the last frame appended.
    last_seq: u64,
}

#[derive(Debug, Default)]
struct Writer {
    current: Option<Segment>,
    /// Segments written to the end, oldest first.
    closed: Vec<Segment>,
    /// Frame bytes written since sled's last flush, and when the first was.
    since_checkpoint: u64,
    dirty_since: Option<Instant>,
}

#[derive(Debug)]
struct Segment {
    path: PathBuf,
    file: File,
    /// Where the next frame goes.
    end: u64,
    /// The first event number of its last frame.
    last_seq: u64,
}

impl Wal {
    /// The log of the store in `db` (its folder is created if missing).
    pub fn open(db: &Path, sync: bool, checkpoint_every: Duration) -> io::Result<Wal> {
        let dir = db.join(DIR);
        if !dir.exists() {
            super::files::private_dir(&dir)?;
            super::files::fsync_dir(db)?;
        }
        Ok(Wal {
            dir,
            sync,
            checkpoint_every,
            pending: Mutex::default(),
            writer: Mutex::default(),
            spare: Mutex::default(),
        })
    }

    /// Adds a commit record's frame to the pending buffer. Call it under the
    /// store's write lock, in event order, after sled has the record.
    pub fn append(&self, first_seq: u64, next_seq: u64, body: &[u8]) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.first_seq.get_or_insert(first_seq);
        p.last_seq = first_seq;
        encode_frame(&mut p.buf, first_seq, next_seq, body);
    }

    /// A sled flush begins: returns the first event number of the last
    /// frame appended (a flush that begins now covers every frame up to
    /// it), and counts the log's growth toward the next one from now.
    pub fn begin_checkpoint(&self) -> u64 {
        let upto = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_seq;
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.since_checkpoint = 0;
        w.dirty_since = None;
        upto
    }

    /// Writes every pending frame and makes it durable.
    pub fn flush(&self) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let (buf, first_seq, last_seq) = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let Some(first) = p.first_seq.take() else {
                return Ok(());
            };
            (std::mem::take(&mut p.buf), first, p.last_seq)
        };
        let full = w.current.as_ref().is_none_or(|s| s.end >= SEGMENT_BYTES);
        if full {
            let next = Segment::create(&self.dir, first_seq, buf.len() as u64)?;
            if let Some(old) = w.current.replace(next) {
                w.closed.push(old);
            }
            self.start_spare();
        }
        let Some(seg) = w.current.as_mut() else {
            return Err(io::Error::other("no write-ahead segment"));
        };
        seg.file.write_all_at(&buf, seg.end)?;
        if self.sync {
            seg.file.sync_data()?;
        }
        seg.end += buf.len() as u64;
        seg.last_seq = last_seq;
        w.since_checkpoint += buf.len() as u64;
        w.dirty_since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Whether so many frames are pending that they should be written now,
    /// whatever the durability mode waits for (`batched` with a long
    /// interval would otherwise hold them all in memory).
    pub fn pending_full(&self) -> bool {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.buf.len() as u64 >= PENDING_MAX
    }

    /// Whether sled should be flushed now (see [`CHECKPOINT_BYTES`]).
    pub fn checkpoint_due(&self) -> bool {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.since_checkpoint >= CHECKPOINT_BYTES
            || w.dirty_since
                .is_some_and(|t| t.elapsed() >= self.checkpoint_every)
    }

    /// sled has flushed every record up to `upto` (what
    /// [`Wal::begin_checkpoint`] said before the flush began): deletes the
    /// closed segments that hold nothing after it.
    pub fn release(&self, upto: u64) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let (done, keep): (Vec<Segment>, Vec<Segment>) =
            w.closed.drain(..).partition(|s| s.last_seq <= upto);
        w.closed = keep;
        drop(w);
        for s in done {
            fs::remove_file(&s.path)?;
        }
        Ok(())
    }

    /// Deletes every segment (sled holds everything: at open, after the
    /// replay and a flush of sled; at a clean close), and the spare.
    pub fn clear(&self) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.closed.clear();
        w.current = None;
        w.since_checkpoint = 0;
        w.dirty_since = None;
        for path in segment_paths(&self.dir)? {
            fs::remove_file(path)?;
        }
        self.join_spare();
        for name in [SPARE, SPARE_TMP] {
            match fs::remove_file(self.dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        super::files::fsync_dir(&self.dir)
    }

    /// Starts writing the next segment's spare in the background, unless it
    /// is being written.
    fn start_spare(&self) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let dir = self.dir.clone();
        let started = std::thread::Builder::new()
            .name("berth-wal-spare".into())
            .spawn(move || {
                if let Err(e) = write_spare(&dir) {
                    // The next segment is then reserved with `fallocate`.
                    log::debug!("{}: no spare segment ({e})", dir.join(SPARE).display());
                    let _ = fs::remove_file(dir.join(SPARE_TMP));
                }
            });
        match started {
            Ok(t) => *spare = Some(t),
            Err(e) => log::debug!("no spare segment: starting its thread: {e}"),
        }
    }

    /// Waits for the spare's thread, if one runs (a clean close does, in
    /// [`Wal::clear`]; a store that failed never waits on its disk again,
    /// and a spare it left half written is `spare.tmp`, which nothing reads
    /// and the next `clear` removes).
    fn join_spare(&self) {
        let t = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// Whether `name`, in this log's folder, is the spare or its first file
/// (zeros, never read: a copy of the folder leaves them out).
pub(crate) fn is_spare(name: &std::ffi::OsStr) -> bool {
    name == SPARE || name == SPARE_TMP
}

/// Writes the spare (see the module doc) unless there is one, or the disk
/// is nearly full: zeros in `spare.tmp`, synced, then renamed `spare`.
fn write_spare(dir: &Path) -> io::Result<()> {
    if dir.join(SPARE).exists() || space_is_tight(dir) {
        return Ok(());
    }
    let tmp = dir.join(SPARE_TMP);
    let file = super::files::open_private(&tmp)?;
    file.set_len(0)?;
    // One page a write: Linux (6.x, ext4 and others) caches a buffered
    // write in folios as large as the write, and marks a folio dirty whole,
    // so a flush's few hundred bytes in a spare written 1 MiB at a time
    // made its `fdatasync` write back the whole folio. Measured with 8
    // producers: 33 KB reached the disk per task (about 900 MB/s) against
    // 3.6 KB with page-sized writes, and a flush took 160-180 µs against
    // 140-155.
    let zeros = vec![0u8; SPARE_WRITE];
    let mut at = 0;
    while at < SEGMENT_BYTES {
        file.write_all_at(&zeros, at)?;
        at += zeros.len() as u64;
    }
    file.sync_all()?;
    fs::rename(&tmp, dir.join(SPARE))
}

impl Segment {
    /// A new, empty segment named for `first_seq`, with room for at least
    /// `need` bytes of frames reserved, durable with its folder.
    fn create(dir: &Path, first_seq: u64, need: u64) -> io::Result<Segment> {
        let path = dir.join(format!("{first_seq:020}.wal"));
        let room = (HEADER as u64 + need).max(SEGMENT_BYTES);
        // The spare when it holds the frames: its zeros are synced, so only
        // the header and the folder are left to sync.
        let spare =
            room == SEGMENT_BYTES && !path.exists() && fs::rename(dir.join(SPARE), &path).is_ok();
        let file = match spare {
            true => super::files::open_private(&path)?,
            false => super::files::create_private(&path)?,
        };
        file.write_all_at(&segment_header(), 0)?;
        if spare {
            file.sync_data()?;
        } else {
            // Best effort: a file system without `fallocate`, or one that
            // is nearly full, still takes the frames as they come.
            if space_is_tight(dir) {
                log::debug!(
                    "{}: no space reserved (the disk is nearly full)",
                    path.display()
                );
            } else if let Err(e) = reserve(&file, room) {
                log::debug!("{}: no space reserved ({e})", path.display());
            }
            file.sync_all()?;
        }
        super::files::fsync_dir(dir)?;
        Ok(Segment {
            path,
            file,
            end: HEADER as u64,
            last_seq: first_seq,
        })
    }
}

#[cfg(target_os = "linux")]
fn reserve(file: &File, len: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // The file takes its whole length now, so that a flush's `fdatasync`
    // has no new length to record.
    match unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(not(target_os = "linux"))]
fn reserve(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}

/// A segment's header: the magic, the version, 4 zero bytes.
pub(super) fn segment_header() -> Vec<u8> {
    let mut header = vec![0u8; HEADER];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header
}

pub(super) fn encode_frame(out: &mut Vec<u8>, first_seq: u64, next_seq: u64, body: &[u8]) {
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut h = crc32fast::Hasher::new();
    h.update(&first_seq.to_le_bytes());
    h.update(&next_seq.to_le_bytes());
    h.update(body);
    out.reserve(FRAME_HEADER + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&next_seq.to_le_bytes());
    out.extend_from_slice(body);
}

/// The segment files in `dir`, in order (a missing folder has none).
fn segment_paths(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut paths = Vec::new();
    for e in entries {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "wal") {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// What [`read`] found.
#[derive(Debug, Default)]
pub struct Replay {
    /// The whole frames, in order, each following the one before.
    pub frames: Vec<Frame>,
    /// Where reading stopped before the end of the last segment, and why: a
    /// frame that is not whole or does not follow, with frames or segments
    /// after it that are therefore not used.
    pub damage: Option<String>,
    /// The frame cut short at the end of the last segment (a commit that was
    /// never acknowledged), if any.
    pub torn: Option<String>,
}

/// Reads the log in `db/wal` (see the module doc).
pub fn read(db: &Path) -> io::Result<Replay> {
    let mut out = Replay::default();
    let paths = segment_paths(&db.join(DIR))?;
    let last = paths.len().saturating_sub(1);
    for (i, path) in paths.iter().enumerate() {
        let bytes = fs::read(path)?;
        let stop = read_segment(&bytes, &mut out.frames);
        let Some((offset, why, follows)) = stop else {
            continue;
        };
        let place = format!("{} at byte {offset}: {why}", path.display());
        // In the last segment, with nothing but zeros (reserved space) or the
        // end of the file after it: the last write, cut short. A stop in the
        // header (a segment created but whose header never reached the disk
        // whole) is one only when no byte that could be a frame follows it.
        let cut_short = match offset < HEADER {
            true => bytes
                .get(HEADER..)
                .is_none_or(|r| r.iter().all(|b| *b == 0)),
            false => rest_empty_after_frame(&bytes, offset),
        };
        if i == last && !follows && cut_short {
            out.torn = Some(place);
        } else {
            out.damage = Some(place);
        }
        break;
    }
    Ok(out)
}

/// Whether everything after the frame that starts at `offset` (as far as
/// its length says, or to the end) is zero: a torn last write.
fn rest_empty_after_frame(bytes: &[u8], offset: usize) -> bool {
    let len = bytes
        .get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .map_or(0, |l| l as usize);
    let end = offset.saturating_add(FRAME_HEADER).saturating_add(len);
    bytes.get(end..).is_none_or(|r| r.iter().all(|b| *b == 0))
}

/// Appends a segment's whole frames to `frames`; returns where and why it
/// stopped early (`None`: at its end), and whether because a whole frame
/// did not follow the one before (never a torn write: files are not reused).
pub(super) fn read_segment(bytes: &[u8], frames: &mut Vec<Frame>) -> Option<(usize, String, bool)> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Some((0, "not a berth write-ahead segment".into(), false));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Some((
            8,
            format!("version {version}; this build reads {VERSION}"),
            false,
        ));
    }
    if bytes[12..HEADER] != [0; 4] {
        return Some((
            12,
            "a header whose last 4 bytes are not zeros".into(),
            false,
        ));
    }
    let mut at = HEADER;
    loop {
        let Some(head) = bytes.get(at..at + FRAME_HEADER) else {
            return match bytes.len() == at {
                true => None,
                false => Some((at, "a frame header cut short".into(), false)),
            };
        };
        let u32_at =
            |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (len, crc) = (u32_at(0) as usize, u32_at(4));
        let (first_seq, next_seq) = (u64_at(8), u64_at(16));
        if len == 0 && crc == 0 && first_seq == 0 {
            // Reserved space: the end of this segment's frames.
            return bytes[at..]
                .iter()
                .any(|b| *b != 0)
                .then(|| (at, "bytes after the end of the frames".into(), false));
        }
        if len > MAX_RECORD_BYTES {
            return Some((
                at,
                format!("a frame of {len} bytes (at most {MAX_RECORD_BYTES})"),
                false,
            ));
        }
        let Some(body) = bytes.get(at + FRAME_HEADER..at + FRAME_HEADER + len) else {
            return Some((at, "a frame cut short".into(), false));
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&head[8..]);
        h.update(body);
        if h.finalize() != crc {
            return Some((at, "a frame whose CRC-32 does not match".into(), false));
        }
        if next_seq <= first_seq {
            return Some((
                at,
                format!("a frame of events {first_seq} to {next_seq}"),
                true,
            ));
        }
        if let Some(prev) = frames.last()
            && prev.next_seq != first_seq
        {
            return Some((
                at,
                format!(
                    "a frame of event {first_seq} on after one that ends before event {}",
                    prev.next_seq
                ),
                true,
            ));
        }
        frames.push(Frame {
            first_seq,
            next_seq,
            body: body.to_vec(),
        });
        at += FRAME_HEADER + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: u8, len: usize) -> Vec<u8> {
        vec![n; len]
    }

    fn wal(dir: &Path) -> Wal {
        Wal::open(dir, true, CHECKPOINT_EVERY).unwrap()
    }

    /// Bytes this thread has sent to storage (`write_bytes` of
    /// `/proc/thread-self/io`: counted when a write dirties a page cache
    /// folio, all of it). None where the kernel does not count.
    fn thread_write_bytes() -> Option<u64> {
        let io = fs::read_to_string("/proc/thread-self/io").ok()?;
        let line = io.lines().find(|l| l.starts_with("write_bytes:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    #[test]
    fn a_flush_into_the_spare_sends_only_the_pages_it_changed_to_storage() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        write_spare(dir).unwrap();
        let file = super::super::files::open_private(&dir.join(SPARE)).unwrap();
        let Some(before) = thread_write_bytes() else {
            eprintln!("skipped: this kernel does not count write_bytes");
            return;
        };
        // What a flush does: a few frames in the middle of a page, synced.
        for i in 0..8u64 {
            file.write_all_at(&[7u8; 300], 1_000_000 + i * 300).unwrap();
            file.sync_data().unwrap();
        }
        let sent = thread_write_bytes().unwrap() - before;
        // 2,400 bytes over at most two pages, each page dirtied again after
        // each sync: 16 pages at most. With the zeros written 1 MiB at a
        // time, this kernel (6.18, ext4) sent 8 MiB.
        assert!(
            sent <= 16 * SPARE_WRITE as u64,
            "8 flushes of 300 bytes sent {sent} bytes to storage"
        );
    }

    #[test]
    fn frames_written_in_flushes_read_back_in_order() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        w.append(1, 3, &body(1, 10));
        w.append(3, 4, &body(2, 0));
        w.flush().unwrap();
        w.append(4, 9, &body(3, 5000));
        w.flush().unwrap();
        w.flush().unwrap(); // nothing pending: nothing written
        let r = read(t.path()).unwrap();
        assert_eq!(r.damage, None);
        assert_eq!(r.torn, None);
        let seqs: Vec<_> = r.frames.iter().map(|f| (f.first_seq, f.next_seq)).collect();
        assert_eq!(seqs, [(1, 3), (3, 4), (4, 9)]);
        assert_eq!(r.frames[2].body, body(3, 5000));
        assert_eq!(segment_paths(&t.path().join(DIR)).unwrap().len(), 1);
    }

    #[test]
    fn a_full_segment_is_followed_by_a_new_one_and_released_once_covered() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        let big = body(7, (SEGMENT_BYTES / 2) as usize);
        for s in 0..5u64 {
            w.append(10 + s, 11 + s, &big);
            w.flush().unwrap();
        }
        let names = segment_paths(&t.path().join(DIR)).unwrap();
        // 16 MiB each: frames 10, 11 in the first; 12, 13 in the second; 14.
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[1].ends_with("00000000000000000012.wal"), "{names:?}");
        let r = read(t.path()).unwrap();
        assert_eq!(r.frames.len(), 5);
        assert_eq!(r.damage, None);
        // 40 MiB since the start: sled's flush is due; once it begins, the
        // count starts again.
        assert!(w.checkpoint_due());
        assert_eq!(w.begin_checkpoint(), 14);
        assert!(!w.checkpoint_due());
        w.release(12).unwrap(); // the second holds 13: kept
        assert_eq!(segment_paths(&t.path().join(DIR)).unwrap().len(), 2);
        w.release(14).unwrap(); // the current one is never deleted here
        let left = segment_paths(&t.path().join(DIR)).unwrap();
        assert_eq!(left.len(), 1);
        assert!(left[0].ends_with("00000000000000000014.wal"));
        w.clear().unwrap();
        assert!(read(t.path()).unwrap().frames.is_empty());
        // A flush after the clear begins a new segment.
        w.append(15, 16, &body(1, 3));
        w.flush().unwrap();
        assert_eq!(read(t.path()).unwrap().frames.len(), 1);
    }

    #[test]
    fn the_next_segment_is_the_spare_written_beforehand() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join(DIR);
        let w = wal(t.path());
        let big = body(7, (SEGMENT_BYTES / 2) as usize);
        // The first segment: no spare yet, so `fallocate`; then the spare.
        w.append(10, 11, &big);
        w.flush().unwrap();
        w.join_spare();
        let spare = fs::metadata(dir.join(SPARE)).unwrap();
        assert_eq!(spare.len(), SEGMENT_BYTES);
        assert!(fs::read(dir.join(SPARE)).unwrap().iter().all(|b| *b == 0));
        assert!(!dir.join(SPARE_TMP).exists());
        // Frame 11 fills the first segment; frame 12 begins the spare.
        w.append(11, 12, &big);
        w.flush().unwrap();
        w.append(12, 13, &body(8, 100));
        w.flush().unwrap();
        let second = dir.join("00000000000000000012.wal");
        assert_eq!(fs::metadata(&second).unwrap().ino(), spare.ino());
        assert_eq!(fs::metadata(&second).unwrap().len(), SEGMENT_BYTES);
        // Read back whole, whatever spare is being written beside them.
        let r = read(t.path()).unwrap();
        assert_eq!((r.damage, r.torn), (None, None));
        let seqs: Vec<_> = r.frames.iter().map(|f| f.first_seq).collect();
        assert_eq!(seqs, [10, 11, 12]);
        assert_eq!(r.frames[2].body, body(8, 100));
        // A clean close leaves the folder empty: no segment, no spare.
        w.clear().unwrap();
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    }

    fn only_segment(dir: &Path) -> PathBuf {
        let p = segment_paths(&dir.join(DIR)).unwrap();
        assert_eq!(p.len(), 1);
        p[0].clone()
    }

    #[test]
    fn a_cut_last_frame_is_torn_not_damage_and_frames_before_it_stay() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        w.append(1, 2, &body(1, 100));
        w.append(2, 3, &body(2, 100));
        w.flush().unwrap();
        let path = only_segment(t.path());
        let end = (HEADER + 2 * (FRAME_HEADER + 100)) as u64;
        // A real truncation, in the middle of the second frame.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(end - 30)
            .unwrap();
        let r = read(t.path()).unwrap();
        assert_eq!(r.frames.len(), 1);
        assert_eq!(r.damage, None);
        assert!(
            r.torn.as_deref().unwrap().contains("cut short"),
            "{:?}",
            r.torn
        );
    }

    /// A header that does not read, in the last segment, is a segment cut
    /// short only when no byte that could be a frame follows it: with
    /// frames after it (whatever its bytes say a frame's length is), it is
    /// damage, and opening refuses the dir instead of dropping them.
    #[test]
    fn a_bad_header_with_frames_after_it_is_damage_not_a_cut() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        w.append(1, 2, &body(1, 40));
        w.flush().unwrap();
        let path = only_segment(t.path());
        let good = fs::read(&path).unwrap();
        for (at, to) in [(12, 0xff), (12, 0x01), (9, 0x02), (0, b'X')] {
            let mut bad = good.clone();
            bad[at] = to;
            fs::write(&path, &bad).unwrap();
            let r = read(t.path()).unwrap();
            assert!(r.frames.is_empty(), "{at}");
            assert_eq!(r.torn, None, "{at}");
            assert!(r.damage.is_some(), "{at}");
        }
        // Nothing after a header that never reached the disk whole (a file
        // of zeros, or cut inside its header): nothing was acknowledged in it.
        for bytes in [vec![0u8; 4096], good[..10].to_vec(), Vec::new()] {
            fs::write(&path, &bytes).unwrap();
            let r = read(t.path()).unwrap();
            assert_eq!(r.damage, None, "{}", bytes.len());
            assert!(r.torn.is_some(), "{}", bytes.len());
        }
    }

    #[test]
    fn a_flipped_byte_stops_reading_and_is_damage_when_frames_follow() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        for s in 1..=3 {
            w.append(s, s + 1, &body(s as u8, 50));
        }
        w.flush().unwrap();
        let path = only_segment(t.path());
        let mut bytes = fs::read(&path).unwrap();
        // In the first frame's body.
        bytes[HEADER + FRAME_HEADER + 10] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let r = read(t.path()).unwrap();
        assert!(r.frames.is_empty());
        let why = r.damage.expect("damage reported");
        assert!(
            why.contains("CRC-32") && why.contains(&format!("byte {HEADER}")),
            "{why}"
        );
        // The same flip in the last frame, with nothing after it, is a torn write.
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEADER + FRAME_HEADER + 10] ^= 0x40;
        let last = HEADER + 3 * (FRAME_HEADER + 50) - 5;
        bytes[last] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let r = read(t.path()).unwrap();
        assert_eq!(r.frames.len(), 2);
        assert_eq!(r.damage, None);
        assert!(r.torn.is_some());
    }

    #[test]
    fn a_frame_that_does_not_follow_ends_the_log_and_a_bad_segment_is_damage() {
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        w.append(1, 5, &body(1, 8));
        w.append(7, 8, &body(2, 8)); // events 5 and 6 missing
        w.flush().unwrap();
        let r = read(t.path()).unwrap();
        assert_eq!(r.frames.len(), 1);
        assert_eq!(r.torn, None);
        assert!(r.damage.unwrap().contains("ends before event 5"));
        // A segment that is not one, with a segment after it: damage, and
        // nothing after it is used.
        let t = tempfile::tempdir().unwrap();
        let w = wal(t.path());
        w.append(1, 5, &body(1, 8));
        w.flush().unwrap();
        let d = t.path().join(DIR);
        fs::write(d.join("00000000000000000005.wal"), b"BERTHWAL").unwrap();
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        fs::write(d.join("00000000000000000009.wal"), &header).unwrap();
        let r = read(t.path()).unwrap();
        assert_eq!(r.frames.len(), 1);
        let why = r.damage.unwrap();
        assert!(
            why.contains("00000000000000000005.wal") && why.contains("not a berth"),
            "{why}"
        );
        // The same bad segment last: a segment whose creation was cut short.
        fs::remove_file(d.join("00000000000000000009.wal")).unwrap();
        let r = read(t.path()).unwrap();
        assert_eq!((r.frames.len(), r.damage), (1, None));
        assert!(r.torn.is_some());
    }
}

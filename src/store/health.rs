//! Whether the store can write: a failure that stops it for good, and the
//! disk space that is left.
//!
//! **Failed.** When sled or an fsync returns an error (a disk that filled
//! past the guard below, an I/O error), sled 0.34 cannot be trusted to make
//! progress again: a write it abandoned half way leaves a hole in its log,
//! and every later flush, including the one sled runs when its last handle
//! is dropped, waits for ever. So the first error marks the store
//! [`Failed`]: berth never calls sled's write or flush path again, every
//! commit is refused at once, and one handle to the tree is leaked so that
//! sled's drop never runs. Reopening the data dir repairs it (sled recovers
//! a prefix of its log, berth re-applies the records after its mark).
//!
//! **Space.** berth refuses new work (an enqueue, a retry) unless the data
//! dir's filesystem has the reserve plus what the commit may need free, and
//! the engine starts no task while less than the reserve is free. So sled
//! should never see ENOSPC: what is left is kept for running tasks to
//! record how they ended, and for stopping. Writes resume by themselves
//! once space is freed: every check that could refuse asks the filesystem
//! again (an open store answers from its last look only while that look
//! is [`SPACE_FRESH`] old and found [`SPACE_MARGIN`] more than needed).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::units::format_size;

/// The reserve kept free by default. sled writes a value of over about
/// 128 KiB, and a leaf page holding such values, to a blob file of its own
/// each time the page changes, so a commit of one large task can take a few
/// MiB of disk until sled collects the old copies.
pub const DEFAULT_RESERVE: u64 = 64 << 20;

/// What a commit may need on disk, from its record's size: the record, the
/// task keys the applier writes, and sled rewriting the pages that hold
/// them (measured: about 1.2 MiB of disk per 150 KiB task while a record
/// carried a new task twice; since record version 3 it carries it once, so
/// a 150 KiB task's record is about 150 KiB and this asks 1.7 MiB), plus
/// one sled log segment.
pub fn need_for_record(bytes: usize) -> u64 {
    8 * bytes as u64 + (512 << 10)
}

/// The store has stopped writing for good.
#[derive(Debug, Default)]
pub(crate) struct Failed {
    flag: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Failed {
    /// Marks the store failed (the first reason is kept) and leaks one
    /// handle to the tree so that sled's drop, which flushes, never runs.
    pub fn fail(&self, tree: &sled::Db, reason: impl std::fmt::Display) {
        if self.stop(tree, &reason) {
            log::error!("the store stopped writing: {reason}; reopen the data dir to repair it");
        }
    }

    /// [`Failed::fail`] for an open that is refused, without the log line:
    /// the open's error says why and what to do (reopening repairs
    /// nothing there).
    pub fn refuse(&self, tree: &sled::Db, reason: impl std::fmt::Display) {
        self.stop(tree, &reason);
    }

    /// Marks the store failed; true if this was the first reason.
    fn stop(&self, tree: &sled::Db, reason: &dyn std::fmt::Display) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_some() {
            return false;
        }
        *r = Some(reason.to_string());
        std::mem::forget(tree.clone());
        self.flag.store(true, Ordering::SeqCst);
        true
    }

    pub fn is_failed(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Why the store failed, if it did.
    pub fn reason(&self) -> Option<String> {
        if !self.is_failed() {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Bytes free for an unprivileged writer on the filesystem holding `dir`;
/// `None` for a filesystem that does not report its size (some FUSE
/// filesystems report 0 blocks in all).
pub fn free_bytes(dir: &Path) -> std::io::Result<Option<u64>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs(3) fills `st` when it returns 0; `c` is a valid C string.
    let r = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so `st` is initialized.
    Ok(available(unsafe { st.assume_init() }))
}

/// The bytes a `statvfs` says an unprivileged writer has (see [`free_bytes`]).
fn available(st: libc::statvfs) -> Option<u64> {
    (st.f_blocks != 0).then(|| st.f_bavail.saturating_mul(st.f_frsize))
}

/// An open store's data dir, asked for its free space through a handle
/// held open (`fstatvfs`). The store asks at every commit of new work and
/// the engine at every step; `statvfs` by path walked the path each time,
/// which was most of the call (`e2e_noop_sync`: 0.63 % of all CPU in the
/// walk against 0.11 % in the file system's own count; eight producers
/// committing: 3.8 %, under the store's write lock).
///
/// A look that found far more than needed answers the checks of the next
/// [`SPACE_FRESH`] without another: at every commit, `fstatvfs` was 4 % of
/// a producer's time, under the store's write lock, and eight producers
/// committing one task each ran 3-7 % slower than without the check.
#[derive(Debug)]
pub struct Space {
    dir: PathBuf,
    /// `None` if the dir could not be opened: then asked by path.
    handle: Option<File>,
    /// The last look that found free space: when, and how much.
    last: Mutex<Option<(Instant, u64)>>,
}

/// How long a look at the free space answers for (see [`Space`]).
pub const SPACE_FRESH: Duration = Duration::from_millis(2);

/// How much more than a check needs (its reserve and its need) the last
/// look must have found for it to answer the check: filling 256 MiB within
/// [`SPACE_FRESH`] takes over 100 GB/s. A nearly full disk is asked at
/// every check.
pub const SPACE_MARGIN: u64 = 256 << 20;

impl Space {
    pub fn new(dir: &Path) -> Space {
        Space {
            dir: dir.to_path_buf(),
            handle: File::open(dir).ok(),
            last: Mutex::new(None),
        }
    }

    /// Bytes free for an unprivileged writer (see [`free_bytes`]).
    pub fn free_bytes(&self) -> std::io::Result<Option<u64>> {
        let Some(handle) = &self.handle else {
            return free_bytes(&self.dir);
        };
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: fstatvfs(3) fills `st` when it returns 0; the descriptor
        // is open for as long as `handle` lives.
        let r = unsafe { libc::fstatvfs(handle.as_raw_fd(), st.as_mut_ptr()) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fstatvfs returned 0, so `st` is initialized.
        Ok(available(unsafe { st.assume_init() }))
    }

    /// [`check_space`] through the held handle.
    pub fn check(&self, reserve: u64, need: u64) -> Result<(), SpaceError> {
        if reserve == 0 {
            return Ok(());
        }
        self.check_at(reserve, need, Instant::now())
    }

    /// [`Space::check`] at `now`: from the last look while it is fresh and
    /// far above what is needed, else from a new one.
    fn check_at(&self, reserve: u64, need: u64, now: Instant) -> Result<(), SpaceError> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let enough = reserve.saturating_add(need).saturating_add(SPACE_MARGIN);
        if let Some((at, free)) = *last
            && now.saturating_duration_since(at) < SPACE_FRESH
            && free >= enough
        {
            return Ok(());
        }
        let free = self.free_bytes();
        *last = match &free {
            Ok(Some(bytes)) => Some((now, *bytes)),
            _ => None,
        };
        judge(&self.dir, free, reserve, need)
    }
}

/// Not enough free disk space for what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not enough disk space in {dir}: {} free, {} needed ({} for this change and a reserve of {} \
     kept so that running tasks can record how they end); free some space and try again",
    format_size(*free),
    format_size(need + reserve),
    format_size(*need),
    format_size(*reserve)
)]
pub struct SpaceError {
    pub dir: String,
    pub free: u64,
    pub need: u64,
    pub reserve: u64,
}

/// Whether a commit of new work on `dir` could be refused for space: less
/// than the reserve plus what the largest record needs is free. When not,
/// no refusal is possible and a command need not rehearse one.
pub fn space_may_refuse(dir: &Path, reserve: u64) -> bool {
    check_space(
        dir,
        reserve,
        need_for_record(crate::codec::MAX_RECORD_BYTES),
    )
    .is_err()
}

/// Checks that `need` bytes plus the reserve are free on `dir`'s filesystem.
/// A filesystem that cannot be asked, or does not know, passes (the write
/// itself will tell).
pub fn check_space(dir: &Path, reserve: u64, need: u64) -> Result<(), SpaceError> {
    if reserve == 0 {
        return Ok(());
    }
    judge(dir, free_bytes(dir), reserve, need)
}

/// The verdict of [`check_space`] on what the file system said.
fn judge(
    dir: &Path,
    free: std::io::Result<Option<u64>>,
    reserve: u64,
    need: u64,
) -> Result<(), SpaceError> {
    match free {
        Ok(Some(free)) if free < reserve.saturating_add(need) => Err(SpaceError {
            dir: dir.display().to_string(),
            free,
            need,
            reserve,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_look_far_above_the_need_answers_and_any_other_asks_again() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(dir.path());
        let free = space
            .free_bytes()
            .unwrap()
            .expect("a file system that counts");
        // More than this disk has: a look refuses.
        let reserve = free.saturating_mul(4).max(1 << 40);
        let t0 = Instant::now();
        assert!(space.check_at(reserve, 0, t0).is_err());
        // A look that found far more (pretended) answers while fresh...
        let plenty = reserve * 2 + SPACE_MARGIN;
        *space.last.lock().unwrap() = Some((t0, plenty));
        assert_eq!(space.check_at(reserve, 0, t0 + SPACE_FRESH / 2), Ok(()));
        // ...not once it is SPACE_FRESH old: the disk is asked, and refuses.
        let refused = space.check_at(reserve, 0, t0 + SPACE_FRESH).unwrap_err();
        assert_eq!(refused.reserve, reserve);
        assert!(
            refused.free <= free * 2,
            "the disk's own count: {refused:?}"
        );
        // Nor when it was fresh but within SPACE_MARGIN of the need.
        *space.last.lock().unwrap() = Some((t0, reserve + SPACE_MARGIN - 1));
        assert!(space.check_at(reserve, 0, t0).is_err());
        // A refusal leaves a look that answers nothing.
        let (_, seen) = space.last.lock().unwrap().expect("the last look");
        assert!(seen < reserve);
        assert!(space.check_at(reserve, 0, t0).is_err());
    }

    #[test]
    fn space_is_checked_against_the_reserve_and_the_need() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free.is_some_and(|f| f > 0));
        assert!(check_space(dir.path(), 1, 0).is_ok());
        assert!(
            check_space(dir.path(), 0, u64::MAX).is_ok(),
            "0 turns it off"
        );
        // Through a held handle: the same answer.
        let space = Space::new(dir.path());
        assert!(space.handle.is_some());
        let held = space.free_bytes().unwrap().expect("a size");
        let by_path = free_bytes(dir.path()).unwrap().expect("a size");
        assert!(
            held.abs_diff(by_path) < 64 << 20,
            "{held} against {by_path}"
        );
        assert!(space.check(1, 0).is_ok());
        assert!(space.check(0, u64::MAX).is_ok(), "0 turns it off");
        assert_eq!(
            space.check(u64::MAX / 2, 1 << 20).unwrap_err().need,
            1 << 20
        );
        let e = check_space(dir.path(), u64::MAX / 2, 1 << 20).unwrap_err();
        assert_eq!(e.need, 1 << 20);
        let msg = e.to_string();
        assert!(msg.contains("not enough disk space in"), "{msg}");
        assert!(msg.contains("1 MiB for this change"), "{msg}");
    }

    #[test]
    fn a_failure_keeps_its_first_reason() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::Config::new()
            .path(dir.path().join("db"))
            .temporary(true)
            .open()
            .unwrap();
        let f = Failed::default();
        assert_eq!(f.reason(), None);
        f.fail(&tree, "disk full");
        f.fail(&tree, "later");
        assert!(f.is_failed());
        assert_eq!(f.reason().as_deref(), Some("disk full"));
    }
}

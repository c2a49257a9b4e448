//! Whether a name changed in a folder since the last look: a file created,
//! removed or renamed (Linux inotify). A flush lists sled's folders `db/`
//! and `db/blobs/`, to sync the files that appeared there, only when one
//! did (`files::DbFiles::sync`); the two listings took about 30 µs of every
//! flush, and a flush after which no name changed needs neither.
//!
//! Every failure counts as a change, and a watch that cannot be set up
//! is not used: the caller then lists every time, as before.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A name appeared or went (and the folder itself went).
const MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

#[derive(Debug)]
pub(crate) struct DirWatch {
    fd: OwnedFd,
}

impl DirWatch {
    /// A new watch on no folder yet; None if the system has none to give
    /// (for example, past `fs.inotify.max_user_instances`).
    pub fn new() -> Option<DirWatch> {
        // SAFETY: a plain system call; a valid descriptor is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Some(DirWatch {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `dir` too (again: a folder made anew under the same name is
    /// a new watch). False if it cannot.
    pub fn add(&self, dir: &Path) -> bool {
        let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), MASK) >= 0 }
    }

    /// Whether a name changed in a watched folder since the last call (or
    /// the events were lost, or cannot be read). Takes every pending event.
    pub fn changed(&self) -> bool {
        // Room for many events (each is 16 bytes and a name of at most 256).
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: `buf` is writable for its whole length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                any = true;
                continue;
            }
            if n == 0 {
                return true;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN) => return any,
                Some(libc::EINTR) => continue,
                _ => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_created_removed_or_renamed_is_a_change_and_a_write_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let Some(w) = DirWatch::new() else {
            eprintln!("skipped: no inotify instance to be had");
            return;
        };
        assert!(w.add(dir.path()));
        assert!(!w.changed(), "nothing happened yet");
        let f = dir.path().join("a");
        std::fs::write(&f, b"1").unwrap();
        assert!(w.changed(), "created");
        assert!(!w.changed(), "each event is taken once");
        std::fs::write(&f, b"22").unwrap();
        assert!(!w.changed(), "a write changes no name");
        std::fs::rename(&f, dir.path().join("b")).unwrap();
        assert!(w.changed(), "renamed");
        std::fs::remove_file(dir.path().join("b")).unwrap();
        assert!(w.changed(), "removed");
        assert!(!w.add(&dir.path().join("missing")));
    }
}

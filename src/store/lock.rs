//! The data dir lock: one berth process at a time owns a data dir.
//!
//! `DIR/berth.lock` is locked with `flock` (std's `File::try_lock`) for the
//! life of the store and holds one line saying who holds it (`daemon PID` or
//! `command PID`), so a short command that finds another short command in
//! the way can wait for it, and one that finds a daemon can talk to it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Who holds (or wants) the data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A long-running `berth run`.
    Daemon,
    /// A short CLI command or a library user.
    Command,
}

impl Role {
    fn word(self) -> &'static str {
        match self {
            Role::Daemon => "daemon",
            Role::Command => "command",
        }
    }
}

/// What the lock file says about the process that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub role: Option<Role>,
    pub pid: Option<u32>,
}

#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

pub enum LockError {
    Held(Holder),
    Io(std::io::Error),
}

impl DirLock {
    /// Takes the lock on `dir` (which must exist), or says who holds it.
    pub fn try_acquire(dir: &Path, role: Role) -> Result<DirLock, LockError> {
        let path = dir.join("berth.lock");
        let mut file = super::files::open_private(&path).map_err(LockError::Io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Held(read_holder(&mut file)));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(LockError::Io(e)),
        }
        let line = format!("{} {}\n", role.word(), std::process::id());
        file.set_len(0).map_err(LockError::Io)?;
        file.seek(SeekFrom::Start(0)).map_err(LockError::Io)?;
        file.write_all(line.as_bytes()).map_err(LockError::Io)?;
        Ok(DirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_holder(file: &mut File) -> Holder {
    let mut text = String::new();
    let _ = file.take(128).read_to_string(&mut text);
    let mut words = text.split_whitespace();
    let role = match words.next() {
        Some("daemon") => Some(Role::Daemon),
        Some("command") => Some(Role::Command),
        _ => None,
    };
    let pid = words.next().and_then(|p| p.parse().ok());
    Holder { role, pid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_sees_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::try_acquire(dir.path(), Role::Daemon).ok().unwrap();
        match DirLock::try_acquire(dir.path(), Role::Command) {
            Err(LockError::Held(h)) => {
                assert_eq!(h.role, Some(Role::Daemon));
                assert_eq!(h.pid, Some(std::process::id()));
            }
            _ => panic!("second lock succeeded"),
        }
        drop(first);
        assert!(DirLock::try_acquire(dir.path(), Role::Command).is_ok());
    }
}

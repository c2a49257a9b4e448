//! The data dir lock: one berth process at a time owns a data dir.
//!
//! `DIR/berth.lock` is locked with `flock` (std's `File::try_lock`) for the
//! life of the store and holds one line saying who holds it (`daemon PID` or
//! `command PID`), so a short command that finds another short command in
//! the way can wait for it, and one that finds a daemon can talk to it.
//!
//! A daemon that waits for the lock announces itself in `DIR/berth.starting`
//! ([`Announcement`]): its pid, in a file it holds an `flock` on while it
//! waits. Only a locked announcement counts, so one left by a daemon that
//! died, or copied with the data dir to another machine, is ignored
//! whatever process has its pid there.

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

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = match self.role {
            Some(Role::Daemon) => "a daemon",
            Some(Role::Command) => "a command",
            None => "another berth process",
        };
        match self.pid {
            Some(pid) => write!(f, "{who}, pid {pid}"),
            None => f.write_str(who),
        }
    }
}

/// The file in which a daemon that waits for the lock announces itself.
const STARTING: &str = "berth.starting";

#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    /// The holder line this lock replaced, put back when the lock goes
    /// before the open it was taken for succeeded ([`DirLock::opened`]):
    /// a refused open leaves `berth.lock` as it was.
    previous: Option<Vec<u8>>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            let _ = self.file.set_len(0);
            let _ = self.file.seek(SeekFrom::Start(0));
            let _ = self.file.write_all(&previous);
        }
    }
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
        let mut previous = Vec::new();
        (&mut file)
            .take(128)
            .read_to_end(&mut previous)
            .map_err(LockError::Io)?;
        let line = format!("{} {}\n", role.word(), std::process::id());
        file.set_len(0).map_err(LockError::Io)?;
        file.seek(SeekFrom::Start(0)).map_err(LockError::Io)?;
        file.write_all(line.as_bytes()).map_err(LockError::Io)?;
        Ok(DirLock {
            file,
            path,
            previous: Some(previous),
        })
    }

    /// The open this lock was taken for succeeded: its holder line stays.
    pub fn opened(mut self) -> Self {
        self.previous = None;
        self
    }

    /// Takes the lock on `dir` to read it, without writing anything: the
    /// lock file is opened read-only (a data dir on a read-only filesystem
    /// can be read) and keeps the holder line it had. `Ok(None)` when the
    /// data dir has no lock file (a copy): there is nothing to lock.
    pub fn try_acquire_reader(dir: &Path) -> Result<Option<DirLock>, LockError> {
        let path = dir.join("berth.lock");
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LockError::Io(e)),
        };
        match file.try_lock() {
            Ok(()) => Ok(Some(DirLock {
                file,
                path,
                previous: None,
            })),
            Err(std::fs::TryLockError::WouldBlock) => Err(LockError::Held(read_holder(&mut file))),
            Err(std::fs::TryLockError::Error(e)) => Err(LockError::Io(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A daemon waits for the lock: new commands should step aside and wait
    /// for its socket instead of taking the lock again. The announcement
    /// lasts as long as the value returned; None when another waiting
    /// daemon holds the announcement already.
    pub fn announce_start(dir: &Path) -> std::io::Result<Option<Announcement>> {
        use std::os::unix::fs::MetadataExt;
        let path = dir.join(STARTING);
        for _ in 0..ANNOUNCE_TRIES {
            let mut file = super::files::open_private(&path)?;
            match file.try_lock() {
                Ok(()) => {}
                // A command looking at it (for a moment), or another
                // daemon that announced itself (for as long as it waits).
                Err(std::fs::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
            // The file locked must still be the one under the name (an
            // announcement withdrawn meanwhile removed it).
            let (held, named) = (file.metadata()?, std::fs::metadata(&path));
            if !named.is_ok_and(|n| (n.dev(), n.ino()) == (held.dev(), held.ino())) {
                continue;
            }
            file.set_len(0)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            return Ok(Some(Announcement { _file: file, path }));
        }
        Ok(None)
    }

    /// Whether a daemon waits for the lock, and its pid if it wrote it
    /// yet. An announcement nobody holds is ignored (see the module doc).
    /// Where the file system has no `flock`, a file whose pid is alive
    /// counts, as before the lock was taken on it.
    pub fn daemon_starting(dir: &Path) -> Option<Option<u32>> {
        let mut file = File::open(dir.join(STARTING)).ok()?;
        let held = match file.try_lock_shared() {
            Ok(()) => return None,
            Err(std::fs::TryLockError::WouldBlock) => true,
            Err(std::fs::TryLockError::Error(_)) => false,
        };
        let mut text = String::new();
        let _ = (&mut file).take(32).read_to_string(&mut text);
        let pid: Option<u32> = text.trim().parse().ok();
        match held {
            true => Some(pid),
            false => pid.filter(|p| alive(*p)).map(Some),
        }
    }
}

/// How many times [`DirLock::announce_start`] tries to lock its file (a
/// command that looks at it holds it for microseconds; another waiting
/// daemon, for as long as it waits).
const ANNOUNCE_TRIES: usize = 50;

/// A daemon's announcement that it waits for the data dir's lock
/// (`berth.starting`, locked): withdrawn (the file removed, then the lock
/// released) when dropped, once the daemon has the lock or gave up.
#[derive(Debug)]
pub struct Announcement {
    /// Held for its lock.
    _file: File,
    path: PathBuf,
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
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
    let pid: Option<u32> = words.next().and_then(|p| p.parse().ok());
    // The line of a process that is gone was left by one that died holding
    // the lock (its lock went with it): whoever holds the lock now has not
    // written its own line yet, so it is unknown (and maybe a short
    // command, which a starting daemon waits for).
    if pid.is_some_and(|p| !alive(p)) {
        return Holder {
            role: None,
            pid: None,
        };
    }
    Holder { role, pid }
}

/// Whether process `pid` exists (signal 0 checks without sending).
pub(crate) fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder line left by a process that died is not trusted: the lock's
    /// holder has not written its own line yet (a starting daemon must wait
    /// for it, not take it for the dead daemon).
    #[test]
    fn a_holder_line_of_a_dead_process_names_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::try_acquire(dir.path(), Role::Command)
            .ok()
            .unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.path().join("berth.lock"), format!("daemon {dead}\n")).unwrap();
        match DirLock::try_acquire(dir.path(), Role::Daemon) {
            Err(LockError::Held(h)) => assert_eq!(
                h,
                Holder {
                    role: None,
                    pid: None
                }
            ),
            _ => panic!("the lock is held"),
        }
        std::fs::write(
            dir.path().join("berth.lock"),
            format!("daemon {}\n", std::process::id()),
        )
        .unwrap();
        match DirLock::try_acquire(dir.path(), Role::Daemon) {
            Err(LockError::Held(h)) => assert_eq!(h.role, Some(Role::Daemon)),
            _ => panic!("the lock is held"),
        }
        drop(held);
    }

    /// Only an announcement a daemon holds counts: one whose pid is alive
    /// but that nobody holds (left by a daemon that died, or copied from
    /// another machine where that pid was a daemon) is ignored; a second
    /// daemon does not take over the first one's; a withdrawn one is gone.
    #[test]
    fn only_a_held_announcement_says_a_daemon_is_starting() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DirLock::daemon_starting(dir.path()), None, "no file");
        // This process is alive, but holds no lock on the file.
        std::fs::write(
            dir.path().join(STARTING),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(DirLock::daemon_starting(dir.path()), None, "a copy");
        let a = DirLock::announce_start(dir.path())
            .unwrap()
            .expect("announced");
        assert_eq!(
            DirLock::daemon_starting(dir.path()),
            Some(Some(std::process::id()))
        );
        assert!(
            DirLock::announce_start(dir.path()).unwrap().is_none(),
            "a second daemon leaves the first one's announcement"
        );
        assert_eq!(
            DirLock::daemon_starting(dir.path()),
            Some(Some(std::process::id()))
        );
        drop(a);
        assert!(!dir.path().join(STARTING).exists(), "withdrawn");
        assert_eq!(DirLock::daemon_starting(dir.path()), None);
    }

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

//! The result files of command handlers (`$BERTH_RESULT`): a fresh private
//! file per attempt in the temp dir, removed when the attempt is over. A
//! process killed in the middle of an attempt (kill -9, a power cut)
//! cannot remove its file, so each name carries the pid of the process
//! that made it, and a starting daemon removes the files of processes
//! that no longer run ([`sweep`]).

use std::path::Path;

use crate::store::lock::alive;

/// Every result file's name begins with this, then `PID-`.
pub const PREFIX: &str = "berth-result-";

/// A fresh, empty result file (mode 0600) in the temp dir (`TMPDIR`),
/// removed when the returned path is dropped.
pub fn create() -> std::io::Result<tempfile::TempPath> {
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempfile()
        .map(|f| f.into_temp_path())
}

/// The pid in a result file's name (`berth-result-PID-...`), if it has one.
fn maker(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

/// Removes the result files in `dir` that this user's processes left and
/// that no process is using any more: files whose maker is not running.
/// A file of a live process, of another user, or with a name that holds
/// no pid (berth before this naming) is left alone. Returns how many went.
pub fn sweep(dir: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // SAFETY: geteuid(2) has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(maker) else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.uid() == uid);
        if ours && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid of a process that has ended (and been reaped).
    fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        pid
    }

    #[test]
    fn a_file_made_here_is_named_for_this_process_and_goes_when_dropped() {
        let path = create().expect("result file");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        assert_eq!(maker(&name), Some(std::process::id()), "{name}");
        let kept = path.to_path_buf();
        assert!(kept.exists());
        drop(path);
        assert!(!kept.exists());
    }

    #[test]
    fn the_sweep_removes_only_the_files_of_processes_that_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = ended_pid();
        let left = dir.path().join(format!("{PREFIX}{gone}-abc123"));
        let mine = dir
            .path()
            .join(format!("{PREFIX}{}-def456", std::process::id()));
        let old_style = dir.path().join(format!("{PREFIX}Xy12Zq"));
        let other = dir.path().join("unrelated-file");
        for p in [&left, &mine, &old_style, &other] {
            std::fs::write(p, b"").expect("write");
        }
        // A folder with a result file's name is not a result file.
        let folder = dir.path().join(format!("{PREFIX}{gone}-folder"));
        std::fs::create_dir(&folder).expect("mkdir");
        assert_eq!(sweep(dir.path()), 1);
        assert!(!left.exists(), "the ended process's file is removed");
        for p in [&mine, &old_style, &other, &folder] {
            assert!(p.exists(), "{} is left alone", p.display());
        }
        assert_eq!(sweep(dir.path()), 0, "nothing more to remove");
    }

    #[test]
    fn names_without_a_pid_are_not_taken_for_result_files_of_a_process() {
        assert_eq!(maker("berth-result-123-abc"), Some(123));
        assert_eq!(maker("berth-result-abc"), None);
        assert_eq!(maker("berth-result--abc"), None);
        assert_eq!(maker("berth-result-12x-abc"), None);
        assert_eq!(maker("other-123-abc"), None);
    }
}

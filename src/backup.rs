//! Periodic backups (`[backup]`): their file names and the pruning of old
//! ones. A backup is an export file (`transfer`) of every live task and
//! the history, written by the daemon's service thread (`cli/daemon.rs`)
//! through `ops::export`, so it is written atomically like any export.

use std::path::{Path, PathBuf};

const PREFIX: &str = "berth-backup-";
const SUFFIX: &str = ".bex";

/// The file name of a backup made at `now_ms`:
/// `berth-backup-2026-11-30T14:31:13.745Z.bex`. Names sort as their times
/// do (RFC 3339 in UTC, always with milliseconds).
pub fn file_name(now_ms: u64) -> String {
    format!("{PREFIX}{}{SUFFIX}", crate::units::format_time(now_ms))
}

/// Whether `name` is a backup's file name (or the temporary name of one
/// being written, `.NAME.tmp`, which a crash can leave).
fn is_backup(name: &str) -> bool {
    let name = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".tmp"))
        .unwrap_or(name);
    name.starts_with(PREFIX) && name.ends_with(SUFFIX)
}

/// Deletes the backups in `dir` but the newest `keep` (by name, which is by
/// time), and temporary files that interrupted ones left; other files are
/// left alone. Returns the paths deleted.
pub fn prune(dir: &Path, keep: usize) -> std::io::Result<Vec<PathBuf>> {
    let mut backups = Vec::new();
    let mut leftovers = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_backup(&name) || !e.file_type()?.is_file() {
            continue;
        }
        if name.starts_with('.') {
            leftovers.push(e.path());
        } else {
            backups.push(e.path());
        }
    }
    backups.sort();
    let old = backups.len().saturating_sub(keep);
    let mut deleted = Vec::new();
    for p in backups.into_iter().take(old).chain(leftovers) {
        std::fs::remove_file(&p)?;
        deleted.push(p);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time() {
        let a = file_name(1_800_000_000_000);
        assert_eq!(a, "berth-backup-2027-01-15T08:00:00.000Z.bex");
        let b = file_name(1_800_000_000_001);
        let c = file_name(1_800_000_060_000);
        assert!(a < b && b < c);
        assert!(is_backup(&a) && is_backup(&format!(".{a}.tmp")));
        assert!(!is_backup("notes.txt") && !is_backup("berth-backup-x.txt"));
    }

    #[test]
    fn pruning_keeps_the_newest_and_leaves_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..5)
            .map(|i| file_name(1_800_000_000_000 + i * 1000))
            .collect();
        for n in &names {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        std::fs::write(dir.path().join(format!(".{}.tmp", names[0])), b"half").unwrap();
        let deleted = prune(dir.path(), 2).unwrap();
        assert_eq!(deleted.len(), 4);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![names[3].clone(), names[4].clone(), "notes.txt".into()]
        );
        assert!(prune(dir.path(), 2).unwrap().is_empty());
    }
}

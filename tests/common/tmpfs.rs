//! A small tmpfs, for real disk-full faults. Mounting needs root (CI runs as
//! root); elsewhere the tests that need it skip with a printed reason.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    pub path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB, or says why it cannot.
    pub fn mount(mib: u64) -> Result<Tmpfs, String> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("mounting a tmpfs needs root".into());
        }
        let tmp = tempfile::Builder::new()
            .prefix("berth-tmpfs-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let path = tmp.path().to_path_buf();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "tmpfs",
            ])
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { path, _tmp: tmp })
    }

    /// Bytes free on it.
    pub fn free(&self) -> u64 {
        berth::store::free_bytes(&self.path)
            .expect("statvfs")
            .expect("a tmpfs reports its size")
    }

    /// Fills it with a ballast file until only `leave` bytes are free (or
    /// none, with `leave` 0). Returns the ballast's path.
    pub fn fill(&self, name: &str, leave: u64) -> PathBuf {
        let path = self.path.join(name);
        let want = self.free().saturating_sub(leave);
        let f = std::fs::File::create(&path).expect("ballast");
        // Write real pages (tmpfs counts them), in 1 MiB steps, then bytes.
        let mut left = want;
        let chunk = vec![0xabu8; 1 << 20];
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if w.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
        let _ = w.flush();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Removes a ballast file.
pub fn free_ballast(path: &Path) {
    std::fs::remove_file(path).expect("removing the ballast");
}

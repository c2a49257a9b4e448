//! LazyFS, a FUSE filesystem that keeps every write in its own cache until
//! the file is fsync-ed, and drops what was never synced on the command
//! `lazyfs::clear-cache`: a power cut on demand (the tool Jepsen uses for
//! etcd and PostgreSQL). `.ci/run` builds it; a machine without it, without
//! FUSE or without root skips the tests that need it, with a printed reason.
//!
//! The binary is `$BERTH_LAZYFS`, else `~/.cache/lazyfs/lazyfs/build/lazyfs`
//! (where `build.sh` puts it).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LazyFs {
    /// Where programs write: the FUSE mount.
    pub mnt: PathBuf,
    /// The backing folder: after [`LazyFs::power_cut_and_unmount`], exactly
    /// what survived.
    pub root: PathBuf,
    faults: PathBuf,
    /// LazyFS's answers ("finished::clear-cache"); it keeps its end open.
    done: std::fs::File,
    child: Option<Child>,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_LAZYFS") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".cache/lazyfs/lazyfs/build/lazyfs");
    p.exists().then_some(p)
}

fn mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = mnt.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&want))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo(3) with a valid C string.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo {}", path.display());
}

impl LazyFs {
    /// Mounts a fresh LazyFS, or says why it cannot (the caller skips).
    pub fn mount() -> Result<LazyFs, String> {
        let bin = binary().ok_or(
            "LazyFS is not built (run ../shared/tools/lazyfs/build.sh, or set BERTH_LAZYFS)",
        )?;
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("mounting LazyFS needs root".into());
        }
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse is missing".into());
        }
        // No '-' in the name: LazyFS takes a config path that contains "-o"
        // (in any case) for an option, ignores it and aborts on a missing
        // `config/default.toml`, which a random suffix after '-' made
        // happen in about 1 mount in 30.
        let tmp = tempfile::Builder::new()
            .prefix("berth_lazyfs_")
            .tempdir()
            .expect("tempdir");
        let base = tmp.path().to_path_buf();
        if base.to_string_lossy().to_lowercase().contains("-o") {
            return Err(format!(
                "LazyFS would take its config path for an option ({} has \"-o\" in it: set TMPDIR)",
                base.display()
            ));
        }
        let (mnt, root) = (base.join("mnt"), base.join("root"));
        std::fs::create_dir(&mnt).expect("mnt");
        std::fs::create_dir(&root).expect("root");
        let (faults, done) = (base.join("faults.fifo"), base.join("done.fifo"));
        mkfifo(&faults);
        mkfifo(&done);
        let config = base.join("lazyfs.toml");
        std::fs::write(
            &config,
            format!(
                "[faults]\nfifo_path=\"{}\"\nfifo_path_completed=\"{}\"\n\
                 [cache]\napply_eviction=false\n[cache.simple]\ncustom_size=\"1gb\"\n\
                 blocks_per_page=1\n[filesystem]\nlog_all_operations=false\nlogfile=\"\"\n",
                faults.display(),
                done.display()
            ),
        )
        .expect("config");
        // Opened for reading first and without blocking: LazyFS opens its
        // end for writing at start and waits until a reader exists.
        let done = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&done)
                .expect("opening the answer fifo")
        };
        let log = base.join("lazyfs.log");
        let child = Command::new(&bin)
            .arg(&mnt)
            .arg("--config-path")
            .arg(&config)
            .args(["-o", "allow_other", "-o", "modules=subdir", "-o"])
            .arg(format!("subdir={}", root.display()))
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("log"),
            ))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut fs = LazyFs {
            mnt,
            root,
            faults,
            done,
            child: Some(child),
            log,
            _tmp: tmp,
        };
        let start = Instant::now();
        while !mounted(&fs.mnt) {
            if let Some(c) = fs.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                let log = std::fs::read_to_string(&fs.log).unwrap_or_default();
                return Err(format!("LazyFS exited at start ({status}): {log}"));
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err("LazyFS did not mount within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Listed in /proc/mounts is not yet serving: under load a first
        // mkdir in it failed with ENOENT. Wait until one goes through.
        let probe = fs.mnt.join("berth-mount-probe");
        while let Err(e) = std::fs::create_dir(&probe).and_then(|()| std::fs::remove_dir(&probe)) {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "LazyFS mounted but does not serve within 20 s: {e}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(fs)
    }

    /// The power cut: every byte not fsync-ed is dropped. Stop the writers
    /// first (SIGSTOP) so that nothing is written after the cut, then call
    /// [`LazyFs::unmount`] without letting them run again.
    ///
    /// LazyFS itself can die (once in about 2,500 runs here it aborted on
    /// "Resource deadlock avoided"). That drops every byte not synced, as
    /// the cut would: the cut has happened, and this says so on stderr.
    pub fn power_cut(&mut self) {
        if self.died() {
            return;
        }
        // Without blocking: a fifo with no reader (LazyFS gone) would wait
        // for ever; it fails with ENXIO instead.
        let sent = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.faults)
                .and_then(|mut f| f.write_all(b"lazyfs::clear-cache\n"))
        };
        if let Err(e) = sent {
            assert!(self.died(), "sending the power cut: {e}");
            return;
        }
        let start = Instant::now();
        let mut answer = Vec::new();
        while !String::from_utf8_lossy(&answer).contains("finished::clear-cache") {
            if self.died() {
                return;
            }
            let mut buf = [0u8; 256];
            match self.done.read(&mut buf) {
                Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("reading LazyFS's answer: {e}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "LazyFS did not confirm the cut: {:?}",
                String::from_utf8_lossy(&answer)
            );
        }
    }

    /// Whether LazyFS has ended on its own (said on stderr, with its log's
    /// last lines): what it had not synced is gone, as after a power cut.
    fn died(&mut self) -> bool {
        let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        else {
            return false;
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        eprintln!(
            "LazyFS ended before the cut ({status}; its log ends: {:?}): every byte it had \
             not synced is gone, as the cut would have done",
            tail.iter().rev().collect::<Vec<_>>()
        );
        true
    }

    /// Kills LazyFS at once (it writes nothing more to the backing folder)
    /// and removes the mount.
    pub fn unmount(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        if mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        self.unmount();
    }
}

//! A real `berth run` for tests: started, signalled, waited for, and killed
//! when the test ends.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    /// Its data dir.
    pub dir: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `berth run --config CONFIG` (with `extra` arguments) on the data
    /// dir `dir`, logging to `DIR/../daemon-N.log`; waits until its socket
    /// answers.
    pub fn start(config: &Path, dir: &Path, extra: &[&str]) -> Daemon {
        let d = Daemon::spawn(config, dir, extra);
        let sock = dir.join("berth.sock");
        let start = Instant::now();
        let mut d = d;
        while UnixStream::connect(&sock).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!(
                    "the daemon exited at start ({status}):\n{}",
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the daemon's socket did not answer within 20 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        d
    }

    /// Starts it without waiting for anything.
    pub fn spawn(config: &Path, dir: &Path, extra: &[&str]) -> Daemon {
        let parent = dir.parent().unwrap_or(dir);
        let log = (0..)
            .map(|n| parent.join(format!("daemon-{n}.log")))
            .find(|p| !p.exists())
            .expect("a log name");
        let child = Command::new(super::berth_bin())
            .arg("--data-dir")
            .arg(dir)
            .args(["run", "--config"])
            .arg(config)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"))
            .spawn()
            .expect("spawning berth run");
        Daemon {
            child,
            dir: dir.to_path_buf(),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits for it to exit, at most `limit`; panics (with its log) if it
    /// does not. Returns its status and how long the wait took.
    pub fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status, start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the daemon did not exit within {limit:?}; its log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- the daemon's log ---\n{}", self.log_text());
        }
    }
}

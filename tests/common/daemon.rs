//! A real `berth run` for tests: started, signalled, waited for, and killed
//! when the test ends.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a daemon may take to start, or to log a line a test waits for.
const PATIENCE: Duration = Duration::from_secs(20);

pub struct Daemon {
    pub child: Child,
    /// Its data dir.
    pub dir: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `berth run --config CONFIG` (with `extra` arguments) on the data
    /// dir `dir`, logging to `CONFIG/../daemon-N.log` (beside the config, not
    /// the data dir, which a test may put on a filesystem it fills); waits
    /// until its socket answers.
    pub fn start(config: &Path, dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_with(config, dir, extra, |_| {})
    }

    /// Starts ROOT/berth.toml on the data dir ROOT/data (see [`write_root`]).
    pub fn start_in(root: &Path) -> Daemon {
        Daemon::start(&root.join("berth.toml"), &root.join("data"), &[])
    }

    /// [`Daemon::start`], with `setup` adjusting the command first (limits,
    /// environment).
    pub fn start_with(
        config: &Path,
        dir: &Path,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        Daemon::try_start_with(config, dir, extra, setup).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Daemon::start_with`], but a daemon that exits before its socket
    /// answers is an error (with its log), not a panic.
    pub fn try_start_with(
        config: &Path,
        dir: &Path,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Result<Daemon, String> {
        let mut d = Daemon::spawn_with(config, dir, extra, setup);
        let start = Instant::now();
        while UnixStream::connect(d.socket()).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                return Err(format!(
                    "the daemon exited at start ({status}):\n{}",
                    d.log_text()
                ));
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the daemon's socket did not answer within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(d)
    }

    /// Starts it, with `setup` adjusting the command first, without waiting
    /// for anything.
    pub fn spawn_with(
        config: &Path,
        dir: &Path,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        let parent = config.parent().unwrap_or(dir);
        let log = (0..)
            .map(|n| parent.join(format!("daemon-{n}.log")))
            .find(|p| !p.exists())
            .expect("a log name");
        let mut cmd = Command::new(super::berth_bin());
        cmd.arg("--data-dir")
            .arg(dir)
            .args(["run", "--config"])
            .arg(config)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"));
        setup(&mut cmd);
        let child = cmd.spawn().expect("spawning berth run");
        Daemon {
            child,
            dir: dir.to_path_buf(),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("berth.sock")
    }

    /// Sends it `sig`, which must reach it.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.pid());
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

    /// Waits until its log has a line that contains `text`.
    pub fn wait_log(&self, text: &str) {
        let start = Instant::now();
        while !self.log_text().lines().any(|l| l.contains(text)) {
            assert!(
                start.elapsed() < PATIENCE,
                "no log line with {text:?} within {PATIENCE:?}"
            );
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

/// Lays out a daemon's folder ROOT: the handler ROOT/hook.sh and the config
/// ROOT/berth.toml (whose `data_dir = "data"` is ROOT/data). Returns the
/// config's path.
pub fn write_root(root: &Path, hook: &str, config: &str) -> PathBuf {
    write_script(&root.join("hook.sh"), hook);
    let cfg = root.join("berth.toml");
    std::fs::write(&cfg, config).expect("write the config");
    cfg
}

/// Writes an executable script (a handler) to `path`.
pub fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write the script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

//! Attempts running now: what `berth task log --follow` reads while a task
//! runs, and how `berth task cancel` reaches its handler.
//!
//! The scheduler registers a [`LiveAttempt`] when it starts a task
//! (`dispatch.rs`) and drops it when the attempt comes back
//! (`complete.rs`). The handler sees it in its `TaskContext`: a command
//! handler's poll loop (`command.rs`) appends what the process prints to
//! its stdout and stderr tails and records how each process ended, and
//! watches its cancel signal. The attempt's log is made from it when the
//! attempt returns ([`LiveAttempt::captured`]).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::store::attempts::TAIL_KEEP;

/// The last bytes of one output stream, and how many it carried in all.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tail {
    /// Bytes the stream carried in all: the offset just past `kept`.
    pub total: u64,
    /// Its last bytes, at most [`TAIL_KEEP`] once trimmed (up to twice
    /// that between trims).
    kept: Vec<u8>,
}

impl Tail {
    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.kept.extend_from_slice(chunk);
        if self.kept.len() > 2 * TAIL_KEEP {
            let extra = self.kept.len() - TAIL_KEEP;
            self.kept.drain(..extra);
        }
    }

    /// The last [`TAIL_KEEP`] bytes (fewer if fewer came).
    pub fn end(&self) -> &[u8] {
        &self.kept[self.kept.len().saturating_sub(TAIL_KEEP)..]
    }

    /// The bytes from offset `from` on, as far as they are still kept:
    /// (the offset of the first byte returned, the bytes).
    pub fn since(&self, from: u64) -> (u64, &[u8]) {
        let end = self.end();
        let first = self.total - end.len() as u64;
        let start = from.clamp(first, self.total);
        (start, &end[(start - first) as usize..])
    }
}

/// What an attempt's processes printed and how the last one ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    pub stdout: Tail,
    pub stderr: Tail,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// A process ran past its timeout.
    pub timed_out: bool,
}

impl Captured {
    /// The bytes this will add to a commit record (twice: the event and
    /// the key write each carry them).
    pub fn log_bytes(&self) -> usize {
        2 * (self.stdout.end().len() + self.stderr.end().len())
    }
}

/// A wake-up a poll loop can wait on: a flag, and an eventfd (made on
/// first use, so an attempt nobody polls costs no descriptor) that becomes
/// readable once [`CancelSignal::raise`] was called, and stays so. Without
/// eventfds, the flag alone, which the poll loop then checks on a short
/// tick.
#[derive(Debug, Default)]
struct CancelSignal {
    raised: AtomicBool,
    /// Raised with it by [`LiveAttempt::stop_now`]: no grace after SIGTERM.
    now: AtomicBool,
    /// Made by the first `fd()`; `raise` and `fd` hold this lock, so a
    /// raise is never missed by a descriptor made meanwhile.
    fd: Mutex<Option<OwnedFd>>,
}

/// Makes an eventfd readable.
fn signal_fd(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
    unsafe {
        libc::write(
            fd.as_raw_fd(),
            (&one as *const u64).cast(),
            std::mem::size_of::<u64>(),
        );
    }
}

impl CancelSignal {
    fn lock(&self) -> MutexGuard<'_, Option<OwnedFd>> {
        self.fd.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn raise(&self) {
        let fd = self.lock();
        if self.raised.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(fd) = fd.as_ref() {
            signal_fd(fd);
        }
    }

    /// The eventfd (None if the kernel gives none).
    fn fd(&self) -> Option<RawFd> {
        let mut fd = self.lock();
        if fd.is_none() {
            // SAFETY: eventfd(2) returns a new descriptor or -1.
            let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if raw < 0 {
                return None;
            }
            // SAFETY: the descriptor was just returned to us and nobody else owns it.
            let made = unsafe { OwnedFd::from_raw_fd(raw) };
            if self.raised.load(Ordering::SeqCst) {
                signal_fd(&made);
            }
            *fd = Some(made);
        }
        fd.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// One attempt that runs now.
#[derive(Debug)]
pub struct LiveAttempt {
    pub id: u64,
    pub attempt: u32,
    /// When it started, ms since the epoch: its `started` event, then,
    /// once a worker has taken it, when its handler began (as its attempt
    /// log will say).
    started_at: AtomicU64,
    /// A worker has taken it ([`Self::began`]).
    begun: AtomicBool,
    captured: Mutex<Captured>,
    cancel: CancelSignal,
}

impl LiveAttempt {
    pub fn new(id: u64, attempt: u32, started_at: u64) -> Self {
        LiveAttempt {
            id,
            attempt,
            started_at: AtomicU64::new(started_at),
            begun: AtomicBool::new(false),
            captured: Mutex::new(Captured::default()),
            cancel: CancelSignal::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Captured> {
        self.captured.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When it started (see the field), ms since the epoch.
    pub fn started_at(&self) -> u64 {
        self.started_at.load(Ordering::SeqCst)
    }

    /// A worker took it and its handler begins at `at`.
    pub fn began(&self, at: u64) {
        self.started_at.fetch_max(at, Ordering::SeqCst);
        self.begun.store(true, Ordering::SeqCst);
    }

    /// Whether a worker has taken it: its handler runs (or has run).
    pub fn has_begun(&self) -> bool {
        self.begun.load(Ordering::SeqCst)
    }

    /// Appends bytes the attempt printed on stdout.
    pub fn stdout(&self, chunk: &[u8]) {
        self.lock().stdout.push(chunk);
    }

    /// Appends bytes the attempt printed on stderr.
    pub fn stderr(&self, chunk: &[u8]) {
        self.lock().stderr.push(chunk);
    }

    /// Records how a process of the attempt ended.
    pub fn ended(&self, exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) {
        let mut c = self.lock();
        c.exit_code = exit_code;
        c.signal = signal;
        c.timed_out |= timed_out;
    }

    /// What was captured so far.
    pub fn captured(&self) -> Captured {
        self.lock().clone()
    }

    /// Asks the attempt to stop (`berth task cancel`).
    pub fn cancel(&self) {
        self.cancel.raise();
    }

    /// Asks the attempt to stop at once (a daemon's stop whose grace period
    /// ran out): a command handler's process group gets SIGKILL, without
    /// the grace a cancel gives it; a library handler sees
    /// [`Self::cancel_requested`], as for a cancel.
    pub fn stop_now(&self) {
        self.cancel.now.store(true, Ordering::SeqCst);
        self.cancel.raise();
    }

    /// Whether [`Self::stop_now`] was called.
    pub fn stop_now_requested(&self) -> bool {
        self.cancel.now.load(Ordering::SeqCst)
    }

    /// Whether the attempt was asked to stop. A library handler may look
    /// at it (through `TaskContext::cancel_requested`) and return early.
    pub fn cancel_requested(&self) -> bool {
        self.cancel.raised.load(Ordering::SeqCst)
    }

    /// A descriptor that becomes readable when the attempt is asked to
    /// stop, for a poll loop (None: check [`Self::cancel_requested`]).
    pub fn cancel_fd(&self) -> Option<RawFd> {
        self.cancel.fd()
    }

    /// The output from the offsets `stdout_from` and `stderr_from` on (as
    /// far as it is still kept), as the `task_output` operation sends it.
    pub fn output_json(&self, stdout_from: u64, stderr_from: u64) -> Value {
        let c = self.lock();
        let part = |t: &Tail, from: u64| {
            let (start, bytes) = t.since(from);
            json!({"from": start, "to": t.total, "base64": BASE64.encode(bytes)})
        };
        json!({
            "attempt": self.attempt,
            "started_at": self.started_at(),
            "stdout": part(&c.stdout, stdout_from),
            "stderr": part(&c.stderr, stderr_from),
        })
    }
}

/// The attempts running now, by task id.
#[derive(Debug, Default)]
pub struct LiveAttempts {
    map: Mutex<BTreeMap<u64, Arc<LiveAttempt>>>,
}

impl LiveAttempts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<LiveAttempt>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers an attempt that starts now.
    pub fn start(&self, id: u64, attempt: u32, started_at: u64) -> Arc<LiveAttempt> {
        let a = Arc::new(LiveAttempt::new(id, attempt, started_at));
        self.lock().insert(id, a.clone());
        a
    }

    /// The attempt of task `id` that runs now.
    pub fn get(&self, id: u64) -> Option<Arc<LiveAttempt>> {
        self.lock().get(&id).cloned()
    }

    /// The attempt of task `id` has come back.
    pub fn end(&self, id: u64) {
        self.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_the_end_and_knows_its_offsets() {
        let mut t = Tail::default();
        t.push(b"hello ");
        t.push(b"world");
        assert_eq!(t.since(0), (0, &b"hello world"[..]));
        assert_eq!(t.since(6), (6, &b"world"[..]));
        assert_eq!(t.since(99), (11, &b""[..]));
        let big = vec![b'x'; 3 * TAIL_KEEP];
        t.push(&big);
        assert_eq!(t.total, 11 + 3 * TAIL_KEEP as u64);
        assert_eq!(t.end().len(), TAIL_KEEP);
        let (start, bytes) = t.since(0);
        assert_eq!(start, t.total - TAIL_KEEP as u64);
        assert_eq!(bytes.len(), TAIL_KEEP);
    }

    #[test]
    fn a_cancel_before_the_descriptor_is_made_still_wakes_a_poll() {
        let a = LiveAttempt::new(1, 1, 0);
        a.cancel();
        let mut p = libc::pollfd {
            fd: a.cancel_fd().expect("eventfd"),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, without waiting.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
    }

    #[test]
    fn a_cancel_wakes_a_poll() {
        let a = LiveAttempt::new(1, 1, 0);
        assert!(!a.cancel_requested());
        let fd = a.cancel_fd().expect("eventfd");
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, without waiting.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
        a.cancel();
        a.cancel();
        assert!(a.cancel_requested());
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
    }

    #[test]
    fn the_registry_holds_attempts_while_they_run() {
        let r = LiveAttempts::default();
        let a = r.start(5, 2, 100);
        a.stdout(b"step 1\n");
        let j = r.get(5).unwrap().output_json(0, 0);
        assert_eq!(j["attempt"], 2);
        assert_eq!(j["stdout"]["to"], 7);
        assert_eq!(j["stdout"]["base64"], BASE64.encode(b"step 1\n"));
        r.end(5);
        assert!(r.get(5).is_none());
    }
}

//! The daemon's side of the control socket: [`Server`] accepts connections
//! (at most [`Limits::max_connections`] at once, one thread each), reads
//! request lines within the memory limits, answers each through
//! `ops::execute`, and stops every connection at a stop.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{
    CODE_BUSY, CODE_INPUT, MAX_REQUEST, Response, parse_request, socket_path, write_within,
};
use crate::engine::Engine;
use crate::ops::{self, Access, Ctx, OpError};

/// The control socket's limits. [`Limits::default`] is what `berth run`
/// uses; README.md ("The control socket") states each of them.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once, one thread each. When all are taken, a
    /// new connection takes the place of the one idle the longest; when none
    /// is idle, it gets a busy error and is closed.
    pub max_connections: usize,
    /// The longest request line (without its newline).
    pub max_request: usize,
    /// Bytes of unfinished request lines held over all connections; a
    /// request that would go past it gets a busy error.
    pub request_budget: usize,
    /// A connection is closed when no whole request arrives within this
    /// long of its start or of its previous answer.
    pub idle_timeout: Duration,
    /// A connection is closed when an answer cannot be written within this
    /// long (its client does not read).
    pub write_timeout: Duration,
    /// At a stop, how long connections may finish the request they have
    /// before their sockets are shut.
    pub stop_linger: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_request: MAX_REQUEST as usize,
            request_budget: 2 * MAX_REQUEST as usize,
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            stop_linger: Duration::from_secs(1),
        }
    }
}

/// How often the accept loop and the connection threads look at the stop
/// flag and their deadlines.
const TICK: Duration = Duration::from_millis(200);
/// Accept errors (out of file descriptors, say) back off from the first
/// delay, doubling up to the last, instead of spinning.
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a new connection waits for an evicted idle one to leave.
const EVICT_WAIT: Duration = Duration::from_secs(1);
/// The read buffer of a connection.
const READ_CHUNK: usize = 16 << 10;

/// One open connection, as the server sees it.
struct Slot {
    /// The connection's socket, to shut it from another thread; -1 until
    /// its thread has started. The thread closes it only after it has
    /// removed the slot (under the lock), so a shut never hits another file.
    fd: RawFd,
    /// Since when it waits for a request with nothing buffered (None while
    /// it reads, handles or answers one, and before it starts).
    idle_since: Option<Instant>,
    /// It was shut to make room; its thread is leaving.
    evicted: bool,
}

#[derive(Default)]
struct Slots {
    next_id: u64,
    open: BTreeMap<u64, Slot>,
}

struct Shared {
    limits: Limits,
    stop: AtomicBool,
    slots: Mutex<Slots>,
    /// Signalled when a slot is freed and at a stop.
    changed: Condvar,
    /// Bytes of unfinished request lines, over all connections.
    buffered: AtomicUsize,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn busy_message(&self) -> String {
        format!(
            "the daemon is serving {} connections; try again",
            self.limits.max_connections
        )
    }

    /// Takes a slot for a new connection, making room by closing the
    /// connection idle the longest when all are taken. Err: none is free.
    fn admit(&self) -> Result<u64, String> {
        let deadline = Instant::now() + EVICT_WAIT;
        let mut slots = self.slots();
        loop {
            if slots.open.len() < self.limits.max_connections {
                let id = slots.next_id;
                slots.next_id += 1;
                slots.open.insert(
                    id,
                    Slot {
                        fd: -1,
                        idle_since: None,
                        evicted: false,
                    },
                );
                return Ok(id);
            }
            let leaving = slots.open.values().any(|s| s.evicted);
            if !leaving && !evict_longest_idle(&mut slots) {
                return Err(self.busy_message());
            }
            let now = Instant::now();
            if now >= deadline || self.stopping() {
                return Err(self.busy_message());
            }
            slots = self
                .changed
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The connection's thread has started: its socket can be shut from
    /// now on, and it waits for its first request.
    fn register(&self, id: u64, fd: RawFd) {
        let mut slots = self.slots();
        if let Some(s) = slots.open.get_mut(&id) {
            s.fd = fd;
            s.idle_since = Some(Instant::now());
            if self.stopping() {
                shutdown(fd, libc::SHUT_RD);
            }
        }
    }

    fn set_idle(&self, id: u64, idle: bool) {
        if let Some(s) = self.slots().open.get_mut(&id) {
            s.idle_since = idle.then(Instant::now);
        }
    }

    fn leave(&self, id: u64) {
        self.slots().open.remove(&id);
        self.changed.notify_all();
    }

    /// Waits `d`, or less if the server stops meanwhile.
    fn pause(&self, d: Duration) {
        let slots = self.slots();
        if !self.stopping() {
            let _ = self.changed.wait_timeout(slots, d);
        }
    }
}

/// Shuts the read side of the connection idle the longest: its thread
/// answers what it has already received and leaves, and its client's next
/// write fails. False if no connection is idle.
fn evict_longest_idle(slots: &mut Slots) -> bool {
    // A connection with bytes waiting is not idle: its thread is about to
    // read a request (or the client's close).
    let victim = slots
        .open
        .values_mut()
        .filter(|s| !s.evicted && s.fd >= 0 && !readable(s.fd))
        .filter_map(|s| s.idle_since.map(|t| (t, s)))
        .min_by_key(|(t, _)| *t);
    match victim {
        Some((since, s)) => {
            log::debug!(
                "control socket: closing a connection idle for {:?} to make room",
                since.elapsed()
            );
            s.evicted = true;
            shutdown(s.fd, libc::SHUT_RD);
            true
        }
        None => false,
    }
}

/// Whether a connection's socket has something to read now (see
/// [`Slot::fd`]; called under the slots lock).
fn readable(fd: RawFd) -> bool {
    poll_in(fd, Duration::ZERO)
}

/// Shuts one or both directions of a connection's socket (see [`Slot::fd`]).
fn shutdown(fd: RawFd, how: libc::c_int) {
    if fd >= 0 {
        // SAFETY: the caller holds the slots lock and `fd` is a slot's: its
        // thread closes it only after removing the slot under that lock.
        unsafe { libc::shutdown(fd, how) };
    }
}

/// A running socket server.
pub struct Server {
    path: PathBuf,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds `DIR/berth.sock` (replacing a stale one: the caller holds the
    /// data dir lock) with mode 0600, with the default [`Limits`].
    pub fn bind(data_dir: &Path) -> std::io::Result<(Server, UnixListener)> {
        Self::bind_with(data_dir, Limits::default())
    }

    /// [`Server::bind`] with other limits.
    pub fn bind_with(data_dir: &Path, limits: Limits) -> std::io::Result<(Server, UnixListener)> {
        let path = socket_path(data_dir);
        let _ = std::fs::remove_file(&path);
        // Created with its final mode (umask 177: 0600), so that nobody else
        // can connect before the chmod, and a client that connects at once
        // (the kernel queues connections from the bind on) never sees
        // another mode. The chmod stays for systems whose sockets ignore
        // the umask.
        // SAFETY: umask(2) only swaps the process's file mode mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(&path);
        unsafe { libc::umask(old) };
        let listener = bound?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        // Accept polls, so that a stop is seen even when nobody connects.
        listener.set_nonblocking(true)?;
        Ok((
            Server {
                path,
                shared: Arc::new(Shared {
                    limits,
                    stop: AtomicBool::new(false),
                    slots: Mutex::new(Slots::default()),
                    changed: Condvar::new(),
                    buffered: AtomicUsize::new(0),
                }),
            },
            listener,
        ))
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.slots().open.len()
    }

    /// Bytes of unfinished request lines held now, over all connections.
    pub fn buffered(&self) -> usize {
        self.shared.buffered.load(Ordering::SeqCst)
    }

    /// Serves connections until [`Server::stop`]; run it on its own (scoped)
    /// thread. Each connection gets a (scoped) thread of its own, at most
    /// `max_connections` at once.
    pub fn serve<'s>(
        &self,
        scope: &'s std::thread::Scope<'s, '_>,
        listener: UnixListener,
        engine: &'s Engine,
    ) {
        let mut backoff: Option<Duration> = None;
        let mut refusals = Refusals::default();
        while !self.shared.stopping() {
            let stream = match listener.accept() {
                Ok((s, _)) => {
                    backoff = None;
                    s
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait_readable(&listener, TICK);
                    continue;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    self.accept_failed(&e, &mut backoff);
                    continue;
                }
            };
            if let Err(message) = self.start_connection(scope, stream, engine) {
                refusals.note(&message);
            }
        }
    }

    /// Out of file descriptors (EMFILE, ENFILE) or memory: backs off
    /// instead of spinning, and when it is file descriptors, gives one back
    /// by closing an idle connection.
    fn accept_failed(&self, e: &std::io::Error, backoff: &mut Option<Duration>) {
        let delay = backoff.map_or(ACCEPT_BACKOFF_FIRST, |d| (d * 2).min(ACCEPT_BACKOFF_MAX));
        if backoff.is_none() {
            log::warn!(
                "control socket: accepting a connection failed: {e}; \
                 retrying after {delay:?}, backing off up to {ACCEPT_BACKOFF_MAX:?}"
            );
        }
        *backoff = Some(delay);
        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            evict_longest_idle(&mut self.shared.slots());
        }
        self.shared.pause(delay);
    }

    /// Gives an accepted connection a slot and a thread, or refuses it with
    /// one busy line; the error is why it was refused.
    fn start_connection<'s>(
        &self,
        scope: &'s std::thread::Scope<'s, '_>,
        stream: UnixStream,
        engine: &'s Engine,
    ) -> Result<(), String> {
        let _ = stream.set_nonblocking(false);
        let id = match self.shared.admit() {
            Ok(id) => id,
            Err(message) => {
                refuse(stream, &message);
                return Err(message);
            }
        };
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name("berth-conn".into())
            .spawn_scoped(scope, move || {
                // A connection runs in short bursts (a request, a commit,
                // the wait for its flush, the answer): see `threads`.
                crate::threads::short_slice("a connection");
                {
                    // Dropped before the stream: the slot goes before its fd closes.
                    let _leave = Leave(&shared, id);
                    shared.register(id, stream.as_raw_fd());
                    serve_connection(&shared, id, &stream, engine);
                }
                drop(stream);
            })
            .map(|_| ())
            .map_err(|e| {
                // The connection went with the closure, unanswered.
                self.shared.leave(id);
                format!("the daemon cannot start a thread for a connection: {e}")
            })
    }

    /// Stops accepting, lets open connections answer what they have
    /// received (up to `stop_linger`), then shuts the rest; their threads
    /// end at once.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        let _ = std::fs::remove_file(&self.path);
        let deadline = Instant::now() + self.shared.limits.stop_linger;
        let mut slots = self.shared.slots();
        for s in slots.open.values() {
            shutdown(s.fd, libc::SHUT_RD);
        }
        while !slots.open.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            slots = self
                .shared
                .changed
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        for s in slots.open.values() {
            shutdown(s.fd, libc::SHUT_RDWR);
        }
    }
}

/// Refused connections, logged at most every 10 s.
#[derive(Default)]
struct Refusals {
    count: u64,
    logged: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, message: &str) {
        self.count += 1;
        if self
            .logged
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            log::warn!(
                "control socket: refused {} connection(s): {message}",
                self.count
            );
            self.logged = Some(Instant::now());
            self.count = 0;
        }
    }
}

/// Frees a connection's slot when its thread ends, however it ends.
struct Leave<'a>(&'a Shared, u64);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// Answers a connection the server does not take with one busy error line,
/// without waiting for the client, and closes it.
fn refuse(stream: UnixStream, message: &str) {
    let _ = stream.set_nonblocking(true);
    let mut out = serde_json::to_vec(&Response::err(CODE_BUSY, message)).unwrap_or_default();
    out.push(b'\n');
    let _ = (&stream).write(&out);
}

/// Waits until the listener has a connection to accept, at most `timeout`.
fn wait_readable(listener: &UnixListener, timeout: Duration) {
    poll_in(listener.as_raw_fd(), timeout);
}

/// Waits until `fd` has something to read (or its peer closed), at most
/// `timeout`; whether it has.
fn poll_in(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: poll(2) on one valid pollfd that lives across the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// The bytes of a connection's unfinished request line, counted against
/// the server's `request_budget` while they are held. They are kept as the
/// pieces read (each allocated to its size), not in one growing buffer:
/// a buffer that doubles holds up to twice what it counts, and an
/// allocator that moves it when it grows holds both copies for a moment.
struct Partial<'a> {
    shared: &'a Shared,
    pieces: Vec<Vec<u8>>,
    /// The bytes in `pieces`.
    len: usize,
    /// How many of them are counted in the budget.
    counted: usize,
}

impl Partial<'_> {
    fn new(shared: &Shared) -> Partial<'_> {
        Partial {
            shared,
            pieces: Vec::new(),
            len: 0,
            counted: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole line, ending with `tail`; the pieces are freed as they
    /// are copied, so the line is held about once.
    fn take_with(&mut self, tail: &[u8]) -> Vec<u8> {
        let mut whole = Vec::with_capacity(self.len + tail.len());
        for piece in self.pieces.drain(..) {
            whole.extend_from_slice(&piece);
        }
        whole.extend_from_slice(tail);
        whole
    }

    /// Adds `more`, if the budget has room for it.
    fn try_extend(&mut self, more: &[u8]) -> bool {
        let budget = self.shared.limits.request_budget;
        let taken = self
            .shared
            .buffered
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(more.len()).filter(|n| *n <= budget)
            });
        if taken.is_err() {
            return false;
        }
        self.pieces.push(more.to_vec());
        self.len += more.len();
        self.counted += more.len();
        true
    }

    /// Drops the line and gives its bytes back to the budget.
    fn clear(&mut self) {
        self.shared
            .buffered
            .fetch_sub(self.counted, Ordering::SeqCst);
        self.counted = 0;
        self.len = 0;
        self.pieces = Vec::new();
    }
}

impl Drop for Partial<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The answer to a line over `max_request`.
fn too_long(limits: &Limits) -> Response {
    Response::err(
        CODE_INPUT,
        format!("request is over {} bytes", limits.max_request),
    )
}

/// Reads request lines from one connection and answers each, until the
/// client closes it, it stays idle past `idle_timeout` (or a request
/// trickles in slower), a limit is broken, a client does not read its
/// answer within `write_timeout`, or the server stops.
fn serve_connection(shared: &Shared, id: u64, stream: &UnixStream, engine: &Engine) {
    let limits = &shared.limits;
    // A timeout lets the thread notice a stop and its idle deadline.
    let _ = stream.set_read_timeout(Some(TICK));
    let mut reader = stream;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut line = Partial::new(shared);
    let mut deadline = Instant::now() + limits.idle_timeout;
    let mut idle = true;
    loop {
        if Instant::now() >= deadline {
            // Idle, or a request that trickles in too slowly.
            if !line.is_empty() {
                let late = Response::err(
                    CODE_INPUT,
                    format!(
                        "the request did not arrive within {}",
                        crate::units::format_duration(limits.idle_timeout)
                    ),
                );
                let _ = send(stream, &late, limits.write_timeout);
            }
            return;
        }
        if idle {
            // An idle connection waits for bytes first and is marked busy
            // before it reads them: the server only evicts connections
            // that are idle and have nothing to read (see
            // `evict_longest_idle`), so it never takes one whose request
            // is being read.
            if !poll_in(stream.as_raw_fd(), TICK) {
                if shared.stopping() {
                    return;
                }
                continue;
            }
            shared.set_idle(id, false);
            idle = false;
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => {
                // Closed by the client (or shut by an eviction or a stop).
                // A request it began but did not end with a newline is
                // not run: say so, in case it still reads.
                // (A stop shuts the connection both ways: no answer.)
                if !line.is_empty() && !shared.stopping() {
                    let cut = Response::err(
                        CODE_INPUT,
                        format!(
                            "the request ended after {} bytes without a newline; nothing was done",
                            line.len
                        ),
                    );
                    let _ = send(stream, &cut, limits.write_timeout);
                }
                return;
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if shared.stopping() {
                    return;
                }
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        match take_lines(&buf[..n], &mut line, stream, engine) {
            Taken::Close => return,
            Taken::Answered => deadline = Instant::now() + limits.idle_timeout,
            Taken::Partial => {}
        }
        if line.is_empty() {
            shared.set_idle(id, true);
            idle = true;
        }
    }
}

/// What [`take_lines`] did with a chunk.
enum Taken {
    /// It answered one or more lines.
    Answered,
    /// It only added to the unfinished line.
    Partial,
    /// The connection must close.
    Close,
}

/// Answers every whole line in `chunk` (the first one completes `line`) and
/// keeps what follows the last newline in `line`, within the limits.
fn take_lines(
    mut chunk: &[u8],
    line: &mut Partial<'_>,
    stream: &UnixStream,
    engine: &Engine,
) -> Taken {
    let limits = &line.shared.limits;
    let mut taken = Taken::Partial;
    while let Some(pos) = chunk.iter().position(|b| *b == b'\n') {
        let head = &chunk[..pos];
        chunk = &chunk[pos + 1..];
        if line.len + head.len() > limits.max_request {
            // The rest of the line is garbage: answer and drop the connection.
            let _ = send(stream, &too_long(limits), limits.write_timeout);
            return Taken::Close;
        }
        let response = if line.is_empty() {
            respond(engine, head)
        } else {
            // The last piece of a line (at most READ_CHUNK bytes) is not
            // counted: the line is finished.
            let whole = line.take_with(head);
            let r = respond(engine, &whole);
            line.clear();
            r
        };
        if let Err(e) = send(stream, &response, limits.write_timeout) {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                log::warn!(
                    "control socket: a client did not read its answer within {:?}; closed its connection",
                    limits.write_timeout
                );
            }
            return Taken::Close;
        }
        taken = Taken::Answered;
    }
    if chunk.is_empty() {
        return taken;
    }
    if line.len + chunk.len() > limits.max_request {
        let _ = send(stream, &too_long(limits), limits.write_timeout);
        return Taken::Close;
    }
    if !line.try_extend(chunk) {
        let busy = Response::err(
            CODE_BUSY,
            format!(
                "the daemon's memory for unfinished requests ({}) is taken; try again",
                crate::units::format_size(limits.request_budget as u64)
            ),
        );
        let _ = send(stream, &busy, limits.write_timeout);
        return Taken::Close;
    }
    taken
}

/// A request line at least this long is parsed while no other such line
/// is: its parsed form (JSON values) can take many times its bytes (a
/// list of small numbers about 20 times), so the lines the request budget
/// holds are parsed one at a time, not all at once.
const LARGE_REQUEST: usize = 1 << 20;

/// Taken to parse a line of [`LARGE_REQUEST`] bytes or more.
static PARSING_LARGE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn respond(engine: &Engine, line: &[u8]) -> Response {
    let parsed = if line.len() >= LARGE_REQUEST {
        let _one = PARSING_LARGE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        parse_request(line)
    } else {
        parse_request(line)
    };
    let req = match parsed {
        Ok(req) => req,
        Err(r) => return r,
    };
    let read = req.access() == Access::Read;
    let answer = ops::execute(&Ctx::daemon(engine, &engine.kinds()), req);
    // A read answers only once what it saw is on disk (`Store::flush_seen`):
    // a change it shows cannot be lost after the client has seen it. (A
    // change answers once durable by itself.)
    if read
        && answer.is_ok()
        && let Err(e) = engine.store().flush_seen()
    {
        return Err::<serde_json::Value, _>(OpError::runtime(format!(
            "the daemon could not make what this read shows durable: {e}"
        )))
        .into();
    }
    answer.into()
}

/// Writes one answer line, all of it within `timeout`.
fn send(stream: &UnixStream, response: &Response, timeout: Duration) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response).unwrap_or_default();
    out.push(b'\n');
    write_within(stream, &out, Instant::now() + timeout)
}

#[cfg(test)]
mod tests {
    //! The server's limits, with small values, on real sockets.

    use std::io::{BufRead, BufReader};
    use std::sync::Arc;

    use super::*;
    use crate::control::client::connect_within;
    use crate::control::{CallError, Request, call};
    use crate::engine::{EngineConfig, Handlers};
    use crate::store::{Options, Store};

    /// Stops the server when the test ends, even by a panic, so that the
    /// scope it runs in can end.
    struct StopOnDrop<'a>(&'a Server);

    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.stop();
        }
    }

    /// Runs `test` against a server with `limits` on a fresh data dir, and
    /// returns what it returned and how long the stop after it took.
    fn with_server<T>(limits: Limits, test: impl FnOnce(&Server, &Path) -> T) -> (T, Duration) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Options::default(), crate::clock::system())
            .expect("open the store");
        let engine = Engine::new(Arc::new(store), Handlers::new(), EngineConfig::default())
            .expect("an engine");
        let (server, listener) = Server::bind_with(dir.path(), limits).expect("bind");
        let sock = socket_path(dir.path());
        let mut stopped = Instant::now();
        let out = std::thread::scope(|scope| {
            let (server, engine) = (&server, &engine);
            scope.spawn(move || server.serve(scope, listener, engine));
            let _stop = StopOnDrop(server);
            let out = test(server, &sock);
            stopped = Instant::now();
            out
        });
        (out, stopped.elapsed())
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn connect(sock: &Path) -> UnixStream {
        let s = UnixStream::connect(sock).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    }

    /// Reads one line; None at EOF (or a reset, which is how a closed
    /// socket with unread data ends).
    fn read_line(s: &UnixStream) -> Option<String> {
        let mut line = String::new();
        match BufReader::new(s).read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(line),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading: {e}"),
        }
    }

    fn ask(mut s: &UnixStream, line: &str) -> Response {
        s.write_all(format!("{line}\n").as_bytes()).expect("send");
        let answer = read_line(s).expect("an answer");
        serde_json::from_str(&answer).expect("a JSON answer")
    }

    const LIST: &str = r#"{"op":"queue_list"}"#;

    fn small() -> Limits {
        Limits {
            max_connections: 2,
            max_request: 800,
            request_budget: 1000,
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            stop_linger: Duration::from_millis(200),
        }
    }

    #[test]
    fn a_request_cut_off_by_the_end_of_its_connection_is_refused_not_dropped() {
        with_server(small(), |server, sock| {
            let mut a = connect(sock);
            a.write_all(br#"{"op":"enqueue","spec":{"queue":"main","kind":"K","name":"n"}}"#)
                .expect("send");
            a.shutdown(std::net::Shutdown::Write).expect("shutdown");
            let answer = read_line(&a).expect("an answer, not a silent close");
            let r: Response = serde_json::from_str(&answer).expect("JSON");
            let e = r.error.expect("an error");
            assert_eq!(e.code, CODE_INPUT);
            assert_eq!(
                e.message,
                "the request ended after 62 bytes without a newline; nothing was done"
            );
            assert_eq!(read_line(&a), None, "then the connection closes");
            // Nothing was enqueued.
            let b = connect(sock);
            let list = ask(&b, r#"{"op":"task_list","filter":{}}"#);
            assert_eq!(list.result, serde_json::json!([]), "{list:?}");
            assert_eq!(server.buffered(), 0);
        });
    }

    #[test]
    fn a_new_connection_takes_the_place_of_the_one_idle_the_longest() {
        with_server(small(), |server, sock| {
            let a = connect(sock);
            assert!(ask(&a, LIST).error.is_none());
            let b = connect(sock);
            assert!(ask(&b, LIST).error.is_none());
            assert_eq!(server.connections(), 2);
            // Both are idle; a has been idle longer, so c closes it.
            let c = connect(sock);
            assert!(ask(&c, LIST).error.is_none(), "c is served");
            assert_eq!(read_line(&a), None, "a was closed to make room");
            assert!(ask(&b, LIST).error.is_none(), "b is still served");
            assert!(server.connections() <= 2);
        });
    }

    #[test]
    fn when_no_connection_is_idle_a_new_one_gets_a_busy_error() {
        with_server(small(), |server, sock| {
            // Two connections in the middle of a request (a partial line each).
            let (mut a, mut b) = (connect(sock), connect(sock));
            a.write_all(b"{\"op\":").expect("send");
            b.write_all(b"{\"op\":").expect("send");
            wait_for("both partial lines", || server.buffered() == 12);
            let c = connect(sock);
            let answer = read_line(&c).expect("a busy error");
            let r: Response = serde_json::from_str(&answer).expect("JSON");
            let e = r.error.expect("an error");
            assert_eq!(
                (e.code, e.message.as_str()),
                (CODE_BUSY, "the daemon is serving 2 connections; try again")
            );
            assert_eq!(read_line(&c), None, "and closed");
            // The client asks again until its time is up, then returns the busy error.
            let dir = sock.parent().expect("the data dir");
            let r = call(
                dir,
                &Request::QueueList { all: false },
                Duration::from_millis(300),
            )
            .expect("an answer");
            assert_eq!(r.error.map(|e| e.code), Some(CODE_BUSY));
            // Once a finishes its request, a slot is free again.
            a.write_all(b"\"queue_list\"}\n").expect("send");
            assert!(read_line(&a).is_some_and(|l| l.starts_with("{\"result\":[")));
            drop(a);
            let r = call(
                dir,
                &Request::QueueList { all: false },
                Duration::from_secs(10),
            )
            .expect("an answer");
            assert!(r.error.is_none(), "{r:?}");
        });
    }

    #[test]
    fn unfinished_requests_share_one_memory_budget() {
        with_server(small(), |server, sock| {
            let mut a = connect(sock);
            a.write_all(&[b' '; 600]).expect("send");
            wait_for("a's 600 bytes", || server.buffered() == 600);
            // b's 600 bytes would take the total to 1200, over the budget of 1000.
            let mut b = connect(sock);
            b.write_all(&[b' '; 600]).expect("send");
            let r: Response =
                serde_json::from_str(&read_line(&b).expect("an error")).expect("JSON");
            let e = r.error.expect("an error");
            assert_eq!(e.code, CODE_BUSY);
            assert!(
                e.message.contains("memory for unfinished requests"),
                "{}",
                e.message
            );
            assert_eq!(read_line(&b), None, "and closed");
            assert_eq!(server.buffered(), 600, "b's bytes were given back");
            // a finishes its line: answered, and its bytes are given back.
            a.write_all(b"{\"op\":\"queue_list\"}\n").expect("send");
            assert!(read_line(&a).is_some_and(|l| l.starts_with("{\"result\":[")));
            assert_eq!(server.buffered(), 0);
            // A line over max_request is refused whole, budget or not.
            let mut c = connect(sock);
            c.write_all(&[b' '; 900]).expect("send");
            let r: Response =
                serde_json::from_str(&read_line(&c).expect("an error")).expect("JSON");
            assert_eq!(
                r.error.map(|e| (e.code, e.message)),
                Some((CODE_INPUT, "request is over 800 bytes".to_string()))
            );
            assert_eq!(read_line(&c), None, "and closed");
            drop(a);
            wait_for("every connection to end", || server.connections() == 0);
            assert_eq!(server.buffered(), 0);
        });
    }

    #[test]
    fn idle_and_slow_connections_are_closed_after_the_idle_timeout() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(300),
            ..small()
        };
        with_server(limits, |server, sock| {
            let idle = connect(sock);
            let mut slow = connect(sock);
            slow.write_all(b"{\"op\"").expect("send");
            assert_eq!(read_line(&idle), None, "the idle connection is closed");
            let r: Response =
                serde_json::from_str(&read_line(&slow).expect("an error")).expect("JSON");
            assert_eq!(
                r.error.map(|e| e.message),
                Some("the request did not arrive within 300ms".into())
            );
            wait_for("both to end", || server.connections() == 0);
            assert_eq!(server.buffered(), 0);
        });
    }

    #[test]
    fn a_client_that_does_not_read_is_cut_off_after_the_write_timeout() {
        let limits = Limits {
            write_timeout: Duration::from_millis(300),
            ..small()
        };
        with_server(limits, |server, sock| {
            let mut hog = connect(sock);
            hog.set_write_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            let req = format!("{LIST}\n");
            // Send until the server stops reading: its answers fill both buffers.
            let mut sent = 0;
            while hog.write_all(req.as_bytes()).is_ok() {
                sent += 1;
                assert!(sent < 10_000_000, "the server never stopped reading");
            }
            wait_for("the hog's connection to be closed", || {
                server.connections() == 0
            });
            // Another client is served.
            let other = connect(sock);
            assert!(ask(&other, LIST).error.is_none());
        });
    }

    #[test]
    fn a_stop_ends_every_connection_promptly() {
        let (open, took) = with_server(Limits::default(), |server, sock| {
            // One client that does not read (the server is stuck writing to it),
            // one in the middle of a request, some idle.
            let mut hog = connect(sock);
            hog.set_write_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            while hog.write_all(format!("{LIST}\n").as_bytes()).is_ok() {}
            let mut partial = connect(sock);
            partial.write_all(b"{").expect("send");
            let idle: Vec<UnixStream> = (0..10).map(|_| connect(sock)).collect();
            wait_for("12 connections", || server.connections() == 12);
            (hog, partial, idle) // still open at the stop
        });
        drop(open);
        assert!(
            took < Duration::from_secs(3),
            "the stop took {took:?} (linger 1s; the write timeout is 10s)"
        );
    }

    /// The engine publishes a step before its flush; a read through the
    /// socket must not show it until it is on disk.
    #[test]
    fn a_read_answers_only_once_what_it_saw_is_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Options::default(), crate::clock::system())
            .expect("open the store");
        let engine = Engine::new(Arc::new(store), Handlers::new(), EngineConfig::default())
            .expect("an engine");
        let store = engine.store();
        let commits = store.group_commit();
        // A commit published and not waited for, as a step the engine has
        // published while its flush is still to come.
        let task = crate::task::TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: "n".into(),
            ..Default::default()
        }
        .into_task(store.clock().now_ms(), store.budget())
        .expect("a task");
        let mut w = store.write();
        let id = w
            .enqueue(task, Some(crate::store::Placement::Last))
            .expect("enqueue");
        let published = w.publish().expect("publish");
        assert!(commits.pending(), "the commit waits for a flush");
        let flushes = commits.flushes();

        // A write's refusal is no read: it waits for nothing.
        let refused = respond(&engine, br#"{"op":"task_remove","id":999}"#);
        assert!(refused.error.is_some());
        assert!(commits.pending());

        let answer = respond(
            &engine,
            format!(r#"{{"op":"task_show","id":{id}}}"#).as_bytes(),
        );
        assert!(answer.error.is_none(), "{:?}", answer.error);
        assert!(
            !commits.pending(),
            "the read showed task {id} while its enqueue was not yet on disk"
        );
        assert_eq!(commits.flushes(), flushes + 1);
        published.wait().expect("durable");

        // Nothing pending: a read costs no flush.
        respond(&engine, br#"{"op":"queue_list"}"#);
        assert_eq!(commits.flushes(), flushes + 1);
    }

    #[test]
    fn call_tells_no_daemon_from_one_that_does_not_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let req = Request::QueueList { all: false };
        // No socket file.
        assert!(matches!(
            call(dir.path(), &req, Duration::from_secs(5)),
            Err(CallError::NoDaemon)
        ));
        // A stale socket file that nothing listens on.
        drop(UnixListener::bind(socket_path(dir.path())).expect("bind"));
        assert!(matches!(
            call(dir.path(), &req, Duration::from_secs(5)),
            Err(CallError::NoDaemon)
        ));
        // A socket that takes the connection but never answers.
        std::fs::remove_file(socket_path(dir.path())).expect("remove");
        let listener = UnixListener::bind(socket_path(dir.path())).expect("bind");
        let start = Instant::now();
        let r = call(dir.path(), &req, Duration::from_millis(300));
        let took = start.elapsed();
        match r {
            Err(e @ CallError::TimedOut { .. }) => {
                assert!(e.to_string().contains("did not answer within 300ms"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // A full backlog: the connect itself waits, and gives up in time.
        // SAFETY: listen(2) on the listener's own fd, to shrink its backlog.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let mut pending = Vec::new();
        while let Ok(s) = connect_within(&socket_path(dir.path()), Duration::from_millis(50)) {
            pending.push(s);
            assert!(pending.len() < 1000, "the backlog never filled");
        }
        let start = Instant::now();
        let r = call(dir.path(), &req, Duration::from_millis(300));
        assert!(matches!(r, Err(CallError::TimedOut { .. })), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
    }
}

//! The control socket (`berth::control`): request lines read by the real
//! `Server` from a real Unix socket, parsed and answered by `handle`
//! against a real engine and store.
//!
//! One daemon serves every input (a fresh one replaces it once its log
//! grows long). Each input is sent on a new connection as it is, then the
//! connection is half-closed, and everything the daemon answers is read up
//! to its end. The daemon's longest request line is 4 KiB here, so that
//! over-long lines are reached too.
//!
//! Asserts:
//! - every request line gets exactly one response line, in order: a line
//!   of at most 4 KiB gets its answer, a longer one gets `request is over`
//!   and ends the connection, and an unfinished last line (no newline
//!   before the input's end) gets `the request ended after N bytes
//!   without a newline` (code 2), or `request is over` when too long;
//! - every response is a JSON object with either a `result` or an `error`
//!   whose code is 1, 2 or 3;
//! - a line that is not a valid request gets code 2 (`malformed request`),
//!   and `queue_list` always gets a list;
//! - the daemon closes the connection after the input's end.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use berth::clock::FakeClock;
use berth::control::{self, Limits, Request, Response, Server};
use berth::engine::{Engine, EngineConfig, Handlers};
use berth::store::{Durability, Options, Role, Store};

const MAX_REQUEST: usize = 4096;
/// A daemon is replaced once its log has this many events.
const MAX_EVENTS: u64 = 2000;

struct Daemon {
    dir: PathBuf,
    server: Arc<Server>,
    engine: Arc<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    fn start() -> Daemon {
        // A client that writes after the daemon closed gets EPIPE, not a
        // signal (libFuzzer's main does not ignore SIGPIPE as Rust's does).
        // SAFETY: signal(2) with SIG_IGN installs no handler code.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = super::process_dir("berth-fuzz-control-");
        let opts = Options {
            durability: Durability::Batched {
                interval: Duration::from_secs(3600),
            },
            role: Role::Daemon,
            cache_bytes: 1 << 20,
            power_safe: false,
            disk_reserve: 0,
            ..Options::default()
        };
        let store = Store::open(&dir, opts, Arc::new(FakeClock::new(1_800_000_000_000)))
            .expect("open the daemon's store");
        let config = EngineConfig {
            parallel_queues: 2,
            workers: 1,
            ..EngineConfig::default()
        };
        let engine =
            Arc::new(Engine::new(Arc::new(store), Handlers::new(), config).expect("an engine"));
        let limits = Limits {
            max_connections: 4,
            max_request: MAX_REQUEST,
            request_budget: 1 << 20,
            idle_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            stop_linger: Duration::from_millis(10),
        };
        let (server, listener) = Server::bind_with(&dir, limits).expect("bind the socket");
        let server = Arc::new(server);
        let (s, e) = (server.clone(), engine.clone());
        let thread = std::thread::Builder::new()
            .name("fuzz-control-server".into())
            .spawn(move || std::thread::scope(|scope| s.serve(scope, listener, &e)))
            .expect("a server thread");
        Daemon {
            dir,
            server,
            engine,
            thread: Some(thread),
        }
    }

    fn socket(&self) -> PathBuf {
        control::socket_path(&self.dir)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.server.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static DAEMON: Mutex<Option<Daemon>> = Mutex::new(None);

/// What the daemon must answer to each line of `data`, in order.
enum Expect<'a> {
    Answer(&'a [u8]),
    TooLong,
    /// A last line of this many bytes with no newline.
    CutOff(usize),
}

fn expected(data: &[u8]) -> Vec<Expect<'_>> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(pos) = rest.iter().position(|b| *b == b'\n') {
        let line = &rest[..pos];
        rest = &rest[pos + 1..];
        if line.len() > MAX_REQUEST {
            out.push(Expect::TooLong);
            return out;
        }
        out.push(Expect::Answer(line));
    }
    if rest.len() > MAX_REQUEST {
        out.push(Expect::TooLong);
    } else if !rest.is_empty() {
        out.push(Expect::CutOff(rest.len()));
    }
    out
}

fn exchange(daemon: &Daemon, data: &[u8]) -> Vec<u8> {
    let stream = UnixStream::connect(daemon.socket()).expect("connect to the daemon");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("a read timeout");
    let mut answers = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The daemon may close early (an over-long line): EPIPE is fine.
            let _ = (&stream).write_all(data);
            let _ = stream.shutdown(std::net::Shutdown::Write);
        });
        if let Err(e) = (&stream).read_to_end(&mut answers) {
            // A reset after an over-long line still ends the answers.
            assert!(
                e.kind() == std::io::ErrorKind::ConnectionReset,
                "reading the answers: {e} (after {} bytes)",
                answers.len()
            );
        }
    });
    answers
}

pub fn control(data: &[u8]) {
    let mut guard = DAEMON.lock().unwrap_or_else(|p| p.into_inner());
    let daemon = guard.get_or_insert_with(Daemon::start);
    let answers = exchange(daemon, data);
    let expect = expected(data);
    let lines: Vec<&[u8]> = match answers.split_last() {
        None => Vec::new(),
        Some((b'\n', body)) => body.split(|b| *b == b'\n').collect(),
        Some(_) => panic!(
            "the last answer is not a whole line: {:?}",
            String::from_utf8_lossy(&answers)
        ),
    };
    assert_eq!(
        lines.len(),
        expect.len(),
        "{} request line(s) must get as many answers; got {:?}",
        expect.len(),
        String::from_utf8_lossy(&answers)
    );
    for (line, want) in lines.iter().zip(&expect) {
        let r: Response = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "an answer that is no response ({e}): {:?}",
                String::from_utf8_lossy(line)
            )
        });
        let shown = String::from_utf8_lossy(line);
        assert!(
            r.result.is_null() != r.error.is_none(),
            "a response has either a result or an error: {shown}"
        );
        if let Some(e) = &r.error {
            assert!((1..=3).contains(&e.code), "error code {}: {shown}", e.code);
        }
        match want {
            Expect::CutOff(n) => {
                let e = r.error.as_ref().expect("a line with no newline is refused");
                assert_eq!(
                    (e.code, e.message.as_str()),
                    (
                        2,
                        format!(
                            "the request ended after {n} bytes without a newline; nothing was done"
                        )
                        .as_str()
                    ),
                    "{shown}"
                );
            }
            Expect::TooLong => {
                let e = r.error.as_ref().expect("an over-long line is refused");
                assert!(
                    e.code == 2 && e.message.starts_with("request is over"),
                    "{shown}"
                );
            }
            Expect::Answer(request) => match serde_json::from_slice::<Request>(request) {
                Err(_) => {
                    let e = r.error.as_ref().unwrap_or_else(|| {
                        panic!(
                            "{:?} is no request but got {shown}",
                            String::from_utf8_lossy(request)
                        )
                    });
                    assert!(
                        e.code == 2 && e.message.starts_with("malformed request"),
                        "{shown}"
                    );
                }
                Ok(Request::QueueList { .. }) => {
                    assert!(r.result.is_array(), "queue_list: {shown}")
                }
                Ok(_) => {}
            },
        }
    }
    if daemon.engine.store().next_seq() > MAX_EVENTS {
        *guard = None;
    }
}

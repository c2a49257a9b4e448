//! The command's side of the control socket: [`call`] sends one request
//! and reads its answer within a timeout.

use std::io::{ErrorKind, Read};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{CODE_BUSY, MAX_REQUEST, Request, Response, socket_path, write_within};

/// Why [`call`] got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No daemon listens on the data dir's socket (there is none, or
    /// nothing accepts on it): the caller may open the data dir itself.
    #[error("no daemon listens on the data dir")]
    NoDaemon,
    /// The socket is there but this process cannot use it: permission
    /// denied (it belongs to another user), or a path too long to
    /// connect to (no daemon could have bound it either). It may be one a
    /// daemon left when it was killed, in a copy of its data dir: the caller
    /// may open the data dir itself if no daemon holds it. The message says
    /// why.
    #[error("{0}")]
    Unreachable(String),
    /// The daemon did not answer within the time the caller gave it.
    #[error(
        "the daemon on {} did not answer within {} (set the limit with --timeout or BERTH_TIMEOUT)",
        socket.display(),
        crate::units::format_duration(*after)
    )]
    TimedOut { socket: PathBuf, after: Duration },
    /// Anything else; the message says what.
    #[error("{0}")]
    Failed(String),
}

/// How one attempt of [`call`] ended.
enum Attempt {
    Answered(Response),
    /// The daemon closed the connection before it had the whole request,
    /// so it did nothing with it: try again.
    NotSent,
    Failed(CallError),
}

/// Sends one request to the daemon at `data_dir` and reads its answer,
/// giving up after `timeout` (connecting, sending, waiting and reading, all
/// told). A busy daemon (every connection taken, or the request memory
/// budget full) did nothing with the request, so it is asked again, with a
/// growing pause, until the time is up; then its busy error is returned.
pub fn call(data_dir: &Path, req: &Request, timeout: Duration) -> Result<Response, CallError> {
    let socket = socket_path(data_dir);
    let deadline = Instant::now() + timeout;
    let mut line = serde_json::to_vec(req).map_err(|e| CallError::Failed(e.to_string()))?;
    line.push(b'\n');
    let timed_out = || CallError::TimedOut {
        socket: socket.clone(),
        after: timeout,
    };
    let mut pause = Duration::from_millis(20);
    let mut busy: Option<Response> = None;
    loop {
        match call_once(&socket, &line, deadline) {
            Attempt::Answered(r) if r.error.as_ref().is_some_and(|e| e.code == CODE_BUSY) => {
                busy = Some(r);
            }
            Attempt::Answered(r) => return Ok(r),
            Attempt::NotSent => {}
            // Out of time: the daemon's last word, if it said it was busy.
            Attempt::Failed(CallError::TimedOut { .. }) => return busy.ok_or_else(timed_out),
            Attempt::Failed(e) => return Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return busy.ok_or_else(timed_out);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

fn call_once(socket: &Path, line: &[u8], deadline: Instant) -> Attempt {
    let left = deadline.saturating_duration_since(Instant::now());
    let timed_out = || {
        Attempt::Failed(CallError::TimedOut {
            socket: socket.to_path_buf(),
            after: left,
        })
    };
    let stream = match connect_within(socket, left) {
        Ok(s) => s,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT | libc::ECONNREFUSED) => Attempt::Failed(CallError::NoDaemon),
                Some(libc::EACCES | libc::EPERM) => Attempt::Failed(CallError::Unreachable(
                    format!("connecting to {}: {e}", socket.display()),
                )),
                _ if e.kind() == ErrorKind::InvalidInput => Attempt::Failed(
                    CallError::Unreachable(format!("connecting to {}: {e}", socket.display())),
                ),
                Some(libc::EAGAIN) => timed_out(),
                _ if e.kind() == ErrorKind::TimedOut => timed_out(),
                _ => Attempt::Failed(CallError::Failed(format!(
                    "connecting to {}: {e}",
                    socket.display()
                ))),
            };
        }
    };
    let sent = write_within(&stream, line, deadline);
    // Read even when sending failed: a refused connection carries a busy
    // error line before it closes.
    let answer = read_line_within(&stream, deadline);
    match (sent, answer) {
        (_, Ok(Some(a))) => match serde_json::from_slice(&a) {
            Ok(r) => Attempt::Answered(r),
            Err(e) => Attempt::Failed(CallError::Failed(format!(
                "the daemon's answer is malformed: {e}"
            ))),
        },
        (Err(e), _) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
            Attempt::NotSent
        }
        (Err(e), _) | (Ok(()), Err(e))
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            timed_out()
        }
        (Err(e), _) => Attempt::Failed(CallError::Failed(format!("sending to the daemon: {e}"))),
        (Ok(()), Err(e)) => Attempt::Failed(CallError::Failed(format!(
            "reading the daemon's answer: {e}"
        ))),
        (Ok(()), Ok(None)) => Attempt::Failed(CallError::Failed(
            "the daemon closed the connection without answering (is it stopping?)".into(),
        )),
    }
}

/// Reads one line (without its newline) before `deadline`; None at EOF
/// before any newline.
fn read_line_within(
    mut stream: &UnixStream,
    deadline: Instant,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(pos) = buf[..n].iter().position(|b| *b == b'\n') {
            answer.extend_from_slice(&buf[..pos]);
            return Ok(Some(answer));
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.len() > 2 * MAX_REQUEST as usize {
            return Err(std::io::Error::other("the daemon's answer is too long"));
        }
    }
}

/// Connects to a Unix socket, waiting at most `timeout` when its backlog
/// is full (SO_SNDTIMEO bounds a Unix socket's connect; it then fails
/// with EAGAIN).
pub(super) fn connect_within(path: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "the socket path is too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket that nothing else owns.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    stream.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    loop {
        // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
        let r = unsafe {
            libc::connect(
                fd,
                (&raw const addr).cast::<libc::sockaddr>(),
                len as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(stream);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

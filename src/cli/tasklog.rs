//! `berth task log ID [--attempt N] [--follow] [-o text|json]`: a task's
//! recorded attempts (`ops::task_log`), rendered by `attempt_view`.
//!
//! `--follow` then polls `ops::task_output` through the daemon: it prints
//! the running attempt's new output as it comes (a `--- stdout` or
//! `--- stderr` line whenever the stream changes), each attempt's record
//! once it is written (for the attempt it followed: what it had not shown
//! yet, then the record's header), and exits with 0 when the task has
//! finished. Without a daemon nothing runs: it prints what is recorded and
//! exits. With `-o json`, every record and every piece of output is one
//! JSON line.

use std::io::Write;
use std::time::Duration;

use berth::attempt_view::{self, Stream};
use berth::ops::Request;
use serde_json::{Value, json};

use super::args::Format;
use super::session::Session;
use super::{CliError, out};

/// How often `--follow` asks the daemon for new output.
const POLL: Duration = Duration::from_millis(100);

pub fn run(
    s: &Session,
    id: u64,
    attempt: Option<u32>,
    follow: bool,
    output: Format,
) -> Result<(), CliError> {
    let v = s.run(Request::TaskLog { id, attempt })?;
    let attempts = v["attempts"].as_array().cloned().unwrap_or_default();
    // A group parent runs no attempt of its own: say where its attempts
    // are (on stderr, which `-o json` leaves alone).
    if attempts.is_empty() && (follow || output == Format::Text) {
        let children = group_children(s, id)?;
        if !children.is_empty() {
            // Not eprintln!, which panics when stderr cannot be written.
            let _ = writeln!(
                std::io::stderr(),
                "berth: task {id} is a group parent: its children run the attempts (berth task \
                 log CHILD for each of {})",
                children.join(", ")
            );
        }
    }
    if !follow {
        return print_recorded(id, &v, &attempts, output);
    }
    let mut f = Follower {
        session: s,
        id,
        json: output == Format::Json,
        printed: 0,
        current: None,
        at_line_start: true,
    };
    for a in &attempts {
        f.record(a)?;
    }
    f.follow()
}

/// The ids of task `id`'s children, if it is a group parent.
fn group_children(s: &Session, id: u64) -> Result<Vec<String>, CliError> {
    let t = s.run(Request::TaskShow { id })?;
    Ok(t["children"]
        .as_array()
        .map(|c| c.iter().map(ToString::to_string).collect())
        .unwrap_or_default())
}

/// `task log` without `--follow`.
fn print_recorded(id: u64, v: &Value, attempts: &[Value], output: Format) -> Result<(), CliError> {
    match output {
        Format::Json => {
            let j = json!({
                "id": id,
                "status": v["status"],
                "attempts": attempts.iter().map(attempt_view::user_json).collect::<Vec<_>>(),
            });
            out(&format!(
                "{}\n",
                serde_json::to_string_pretty(&j).unwrap_or_default()
            ))
        }
        Format::Text if attempts.is_empty() => out(&format!(
            "task {id} has no attempt recorded ({})\n",
            v["status"].as_str().unwrap_or("?")
        )),
        Format::Text => out(&attempts.iter().map(attempt_view::text).collect::<String>()),
    }
}

/// Bytes of one stream not yet printed because they end inside a UTF-8
/// character (at most 3).
#[derive(Default)]
struct Carry(Vec<u8>);

impl Carry {
    /// The text of `bytes` after what was carried, keeping back an
    /// unfinished character at the end.
    fn text(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let cut = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(cut);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }
}

/// The running attempt being followed: how far each stream was printed.
struct Current {
    attempt: u64,
    stdout: u64,
    stderr: u64,
    last_stream: Option<&'static str>,
    carry: [Carry; 2],
}

struct Follower<'a> {
    session: &'a Session,
    id: u64,
    json: bool,
    /// The highest attempt whose record was printed.
    printed: u64,
    current: Option<Current>,
    /// The text printed so far ends with a newline.
    at_line_start: bool,
}

impl Follower<'_> {
    fn print(&mut self, text: &str) -> Result<(), CliError> {
        if !text.is_empty() {
            self.at_line_start = text.ends_with('\n');
        }
        out(text)
    }

    /// Ends a line left open by a piece of output.
    fn end_line(&mut self) -> Result<(), CliError> {
        if self.at_line_start {
            return Ok(());
        }
        self.print("\n")
    }

    /// Prints an attempt's record (for the attempt being followed: what was
    /// not shown yet, then its header).
    fn record(&mut self, a: &Value) -> Result<(), CliError> {
        let n = a["attempt"].as_u64().unwrap_or(0);
        self.printed = self.printed.max(n);
        let json = self
            .json
            .then(|| format!("{}\n", attempt_view::user_json(a)));
        match self.current.take() {
            Some(mut c) if c.attempt == n => {
                for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                    let s = Stream::of(a, name);
                    let from = if i == 0 { c.stdout } else { c.stderr };
                    if s.error.is_some() || s.total <= from {
                        continue;
                    }
                    let text = self.missed(&s, from, &mut c.carry[i]);
                    self.stream_part(&mut c, name, &text)?;
                }
                if let Some(line) = json {
                    return self.print(&line);
                }
                self.end_line()?;
                self.print(&attempt_view::header(a))
            }
            _ => {
                if let Some(line) = json {
                    return self.print(&line);
                }
                self.end_line()?;
                self.print(&attempt_view::text(a))
            }
        }
    }

    /// The text of the bytes of `s` from offset `from` on, with a note when
    /// some of them are no longer kept.
    fn missed(&self, s: &Stream, from: u64, carry: &mut Carry) -> String {
        let first = s.first();
        let skip = from.saturating_sub(first) as usize;
        let mut text = String::new();
        if first > from {
            text.push_str(&format!("[... {} bytes not shown]\n", first - from));
        }
        text.push_str(&carry.text(&s.bytes[skip.min(s.bytes.len())..]));
        text
    }

    /// Prints a piece of the followed attempt's `name` stream, with a
    /// marker line when the stream changes.
    fn stream_part(
        &mut self,
        c: &mut Current,
        name: &'static str,
        text: &str,
    ) -> Result<(), CliError> {
        if text.is_empty() {
            return Ok(());
        }
        if self.json {
            let line = json!({"attempt": c.attempt, "stream": name, "text": text});
            return self.print(&format!("{line}\n"));
        }
        if c.last_stream != Some(name) {
            self.end_line()?;
            self.print(&format!("--- {name}\n"))?;
            c.last_stream = Some(name);
        }
        self.print(text)
    }

    /// Prints the new output of the running attempt `live`.
    fn live(&mut self, live: &Value) -> Result<(), CliError> {
        let n = live["attempt"].as_u64().unwrap_or(0);
        if n <= self.printed {
            return Ok(());
        }
        let mut c = match self.current.take() {
            Some(c) if c.attempt == n => c,
            _ => {
                let started = live["started_at"].as_u64().unwrap_or(0);
                if self.json {
                    let line = json!({"attempt": n, "started_at": attempt_view::rfc3339(started), "running": true});
                    self.print(&format!("{line}\n"))?;
                } else {
                    self.end_line()?;
                    self.print(&attempt_view::running_header(n, started))?;
                }
                Current {
                    attempt: n,
                    stdout: 0,
                    stderr: 0,
                    last_stream: None,
                    carry: Default::default(),
                }
            }
        };
        for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
            let part = &live[name];
            let bytes = part["base64"]
                .as_str()
                .and_then(|s| {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.decode(s).ok()
                })
                .unwrap_or_default();
            let (from, to) = (
                part["from"].as_u64().unwrap_or(0),
                part["to"].as_u64().unwrap_or(0),
            );
            let seen = if i == 0 { c.stdout } else { c.stderr };
            let mut text = String::new();
            if from > seen {
                text.push_str(&format!("[... {} bytes not shown]\n", from - seen));
            }
            text.push_str(&c.carry[i].text(&bytes));
            self.stream_part(&mut c, name, &text)?;
            if i == 0 {
                c.stdout = to.max(c.stdout);
            } else {
                c.stderr = to.max(c.stderr);
            }
        }
        self.current = Some(c);
        Ok(())
    }

    /// Polls until the task has finished.
    fn follow(&mut self) -> Result<(), CliError> {
        let mut first = true;
        loop {
            let (attempt, stdout_from, stderr_from) = match &self.current {
                Some(c) => (Some(c.attempt as u32), c.stdout, c.stderr),
                None => (None, 0, 0),
            };
            let o = self.session.run(Request::TaskOutput {
                id: self.id,
                attempt,
                stdout_from,
                stderr_from,
            })?;
            let last = o["last_logged"].as_u64().unwrap_or(0);
            for n in self.printed + 1..=last {
                let req = Request::TaskLog {
                    id: self.id,
                    attempt: Some(n as u32),
                };
                // An attempt dropped meanwhile (only the last 20 are kept) is skipped.
                if let Ok(v) = self.session.run(req)
                    && let Some(a) = v["attempts"].get(0)
                {
                    self.record(a)?;
                }
            }
            self.printed = self.printed.max(last);
            if o["finished"] == Value::Bool(true) {
                return Ok(());
            }
            if o["daemon"] != Value::Bool(true) {
                if first {
                    // Nothing runs without a daemon: what is recorded is all.
                    return Ok(());
                }
                return Err(CliError::runtime(format!(
                    "the daemon stopped while task {} was {}",
                    self.id,
                    o["status"].as_str().unwrap_or("?")
                )));
            }
            if !o["live"].is_null() {
                self.live(&o["live"])?;
            }
            first = false;
            std::thread::sleep(POLL);
        }
    }
}

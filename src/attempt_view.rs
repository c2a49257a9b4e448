//! `task log`: an attempt log's wire form (what the `task_log` operation
//! sends, the same with and without a daemon) and its text and JSON
//! renderings (made by the CLI from the wire form alone).
//!
//! Text, per attempt: one header line,
//! `=== attempt 2: started 2026-05-01T10:00:00.123Z, took 1.2s, failed: boom, exit code 1`,
//! then `--- stdout (15 B)` and the stdout tail, then `--- stderr ...` and
//! the stderr tail. A tail that kept only the end of its stream says
//! `--- stderr (last 64 KiB of 1.2 MiB)`; an empty one `--- stdout (empty)`.
//! Bytes that are not UTF-8 are shown as U+FFFD.

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::budget::Budget;
use crate::store::{AttemptLog, OutputTail};
use crate::units::{format_duration, format_size};

/// A time (ms since the epoch) in RFC 3339, UTC, with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The wire form of one attempt log: its fields, with each tail's kept
/// bytes in base64 (inflated here: a tail is at most 64 KiB).
pub fn wire(l: &AttemptLog, budget: &Budget) -> Value {
    let tail = |t: &OutputTail| match t.bytes(budget) {
        Ok(b) => json!({"total": t.total, "base64": BASE64.encode(b)}),
        Err(e) => json!({"total": t.total, "error": e.to_string()}),
    };
    json!({
        "attempt": l.attempt,
        "started_at": l.started_at,
        "ended_at": l.ended_at,
        "outcome": l.outcome.word(),
        "message": l.outcome.message(),
        "exit_code": l.exit_code,
        "signal": l.signal,
        "stdout": tail(&l.stdout),
        "stderr": tail(&l.stderr),
    })
}

/// One stream of an attempt, from the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stream {
    /// Bytes the stream carried in all.
    pub total: u64,
    /// Its last bytes, as kept.
    pub bytes: Vec<u8>,
    /// Why the kept bytes cannot be shown, if they cannot.
    pub error: Option<String>,
}

impl Stream {
    /// `stdout` or `stderr` of a wire attempt.
    pub fn of(attempt: &Value, name: &str) -> Stream {
        let v = &attempt[name];
        let bytes = v["base64"].as_str().and_then(|s| BASE64.decode(s).ok());
        Stream {
            total: v["total"].as_u64().unwrap_or(0),
            error: match (&bytes, v["error"].as_str()) {
                (_, Some(e)) => Some(e.to_string()),
                (None, None) => Some("the daemon sent no output".into()),
                _ => None,
            },
            bytes: bytes.unwrap_or_default(),
        }
    }

    /// The offset of the first kept byte.
    pub fn first(&self) -> u64 {
        self.total.saturating_sub(self.bytes.len() as u64)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// `--- stdout (15 B)`, and the tail's text (ending with a newline).
pub fn section(name: &str, s: &Stream) -> String {
    let size = match (&s.error, s.total) {
        (Some(e), _) => format!("{}; cannot be shown: {e}", format_size(s.total)),
        (None, 0) => "empty".to_string(),
        (None, t) if s.bytes.len() as u64 >= t => format_size(t),
        (None, t) => format!(
            "last {} of {}",
            format_size(s.bytes.len() as u64),
            format_size(t)
        ),
    };
    let mut out = format!("--- {name} ({size})\n");
    if s.error.is_none() {
        out.push_str(&with_newline(&s.text()));
    }
    out
}

/// `text`, ending with a newline unless it is empty.
pub fn with_newline(text: &str) -> String {
    if text.is_empty() || text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

/// How the attempt ended, in words: `succeeded`, `failed: MESSAGE`,
/// `timed out after 10m`, `repeat`, `keep`, `cancelled`, `interrupted`.
fn outcome_text(a: &Value) -> String {
    let word = a["outcome"].as_str().unwrap_or("?");
    match (word, a["message"].as_str()) {
        ("failed", Some(m)) => format!("failed: {m}"),
        ("timed out", Some(m)) if m.contains("timed out") => m.to_string(),
        ("timed out", Some(m)) => format!("timed out: {m}"),
        _ => word.to_string(),
    }
}

/// The header of a running attempt.
pub fn running_header(attempt: u64, started_at: u64) -> String {
    format!(
        "=== attempt {attempt}: started {}, running\n",
        rfc3339(started_at)
    )
}

/// The header line of a recorded attempt.
pub fn header(a: &Value) -> String {
    let started = a["started_at"].as_u64().unwrap_or(0);
    let ended = a["ended_at"].as_u64().unwrap_or(started);
    let mut h = format!(
        "=== attempt {}: started {}, took {}, {}",
        a["attempt"],
        rfc3339(started),
        format_duration(Duration::from_millis(ended.saturating_sub(started))),
        outcome_text(a)
    );
    if let Some(c) = a["exit_code"].as_i64() {
        h.push_str(&format!(", exit code {c}"));
    } else if let Some(s) = a["signal"].as_i64() {
        h.push_str(&format!(", killed by signal {s}"));
    }
    h.push('\n');
    h
}

/// One recorded attempt as text: its header, then its stdout and stderr.
pub fn text(a: &Value) -> String {
    format!(
        "{}{}{}",
        header(a),
        section("stdout", &Stream::of(a, "stdout")),
        section("stderr", &Stream::of(a, "stderr"))
    )
}

/// One recorded attempt as `task log -o json` prints it: times in RFC
/// 3339, each stream as text with its size in all and the size kept.
pub fn user_json(a: &Value) -> Value {
    let started = a["started_at"].as_u64().unwrap_or(0);
    let ended = a["ended_at"].as_u64().unwrap_or(started);
    let mut j = json!({
        "attempt": a["attempt"],
        "started_at": rfc3339(started),
        "ended_at": rfc3339(ended),
        "duration_ms": ended.saturating_sub(started),
        "outcome": a["outcome"],
        "message": a["message"],
        "exit_code": a["exit_code"],
        "signal": a["signal"],
    });
    for name in ["stdout", "stderr"] {
        let s = Stream::of(a, name);
        j[name] = match &s.error {
            Some(e) => json!({"error": e}),
            None => json!(s.text()),
        };
        j[format!("{name}_bytes")] = json!(s.total);
        j[format!("{name}_kept")] = json!(s.bytes.len());
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::AttemptOutcome;

    fn log(outcome: AttemptOutcome, out: &[u8], err: &[u8], total_err: u64) -> AttemptLog {
        let b = Budget::default();
        AttemptLog {
            attempt: 2,
            started_at: 1_800_000_000_000,
            ended_at: 1_800_000_001_250,
            outcome,
            exit_code: Some(1),
            signal: None,
            stdout: OutputTail::new(out.len() as u64, out, &b),
            stderr: OutputTail::new(total_err, err, &b),
        }
    }

    #[test]
    fn an_attempt_reads_as_a_header_and_its_two_tails() {
        let l = log(
            AttemptOutcome::Failed {
                message: "boom".into(),
            },
            b"",
            b"warming up\nboom",
            100_000,
        );
        let w = wire(&l, &Budget::default());
        // Through the socket, as one JSON line.
        let w: Value = serde_json::from_str(&w.to_string()).unwrap();
        assert_eq!(
            text(&w),
            "=== attempt 2: started 2027-01-15T08:00:00.000Z, took 1.2s, failed: boom, exit code 1\n\
             --- stdout (empty)\n\
             --- stderr (last 15 B of 97.7 KiB)\n\
             warming up\nboom\n"
        );
        let j = user_json(&w);
        assert_eq!(j["stderr"], "warming up\nboom");
        assert_eq!(j["stderr_bytes"], 100_000);
        assert_eq!(j["stderr_kept"], 15);
        assert_eq!(j["duration_ms"], 1250);
        assert_eq!(j["started_at"], "2027-01-15T08:00:00.000Z");
        assert_eq!(j["outcome"], "failed");
        assert_eq!(j["message"], "boom");
    }

    #[test]
    fn outcomes_and_exits_read_plainly() {
        let mut l = log(
            AttemptOutcome::TimedOut {
                message: "timed out after 2s".into(),
            },
            b"x",
            b"",
            0,
        );
        l.exit_code = None;
        l.signal = Some(9);
        let w = wire(&l, &Budget::default());
        assert!(
            header(&w).ends_with("took 1.2s, timed out after 2s, killed by signal 9\n"),
            "{}",
            header(&w)
        );
        l.outcome = AttemptOutcome::Cancelled;
        l.signal = None;
        let w = wire(&l, &Budget::default());
        assert!(header(&w).ends_with(", cancelled\n"), "{}", header(&w));
        assert_eq!(
            running_header(3, 1_800_000_000_000),
            "=== attempt 3: started 2027-01-15T08:00:00.000Z, running\n"
        );
    }
}

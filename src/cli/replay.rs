//! `berth log` (the timeline, page by page, printed as it comes) and
//! `berth replay` (the queues after any event, as `queue list` prints
//! them). Both go through `ops` like the other read commands: a running
//! daemon answers from its own store, and without one the data dir is
//! opened read-only here.

use std::io::Write;

use berth::ops::Request;
use berth::timeline::{Entry, Filter};
use berth::units::format_time;
use serde::Deserialize;
use serde_json::Value;

use super::args::{Format, LogArgs};
use super::commands::{render_queues, time_flag};
use super::progress::Progress;
use super::session::Session;
use super::{CliError, now_ms, out};

/// One page of the timeline, as `ops::log_page` answers.
#[derive(Deserialize)]
struct Page {
    entries: Vec<Entry>,
    next: u64,
    last: u64,
    done: bool,
    /// With `--queue`, on a page that begins at a base checkpoint: the
    /// tasks in that queue in its state.
    #[serde(default)]
    seed: Vec<u64>,
}

/// Stdout for a long output: buffered; a closed pipe (`berth log | head`)
/// ends the output quietly.
struct Stream {
    w: std::io::BufWriter<std::io::Stdout>,
    closed: bool,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            w: std::io::BufWriter::new(std::io::stdout()),
            closed: false,
        }
    }

    fn write(&mut self, text: &str) -> Result<(), CliError> {
        if self.closed {
            return Ok(());
        }
        match self.w.write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(CliError::runtime(format!("writing to stdout: {e}"))),
            Ok(()) => Ok(()),
        }
    }

    fn finish(mut self) -> Result<(), CliError> {
        match self.w.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe && !self.closed => {
                Err(CliError::runtime(format!("writing to stdout: {e}")))
            }
            _ => Ok(()),
        }
    }
}

/// `berth log`: every event up to the last one there is when it starts,
/// in order, that the filters select; printed page by page.
pub fn log(s: &Session, a: LogArgs) -> Result<(), CliError> {
    let now = now_ms();
    // A queue no task can be in (enqueue refuses its name) is bad input,
    // not a filter that silently selects nothing.
    if let Some(q) = &a.queue {
        berth::task::check_name("queue", q)
            .map_err(|e| CliError::input(format!("--queue: {e}")))?;
    }
    let mut filter = Filter::new(
        a.task,
        a.queue.clone(),
        time_flag("since", a.since.as_deref(), now)?,
        time_flag("until", a.until.as_deref(), now)?,
    );
    let progress = Progress::new("events read");
    let mut stream = Stream::new();
    let json = a.output == Format::Json;
    let mut printed = 0u64;
    let first = Request::Log {
        after: 0,
        to: None,
        limit: None,
        queue: a.queue,
    };
    s.run_each(first, |v| {
        let page: Page = serde_json::from_value(v)
            .map_err(|e| CliError::runtime(format!("the log page is malformed: {e}")))?;
        filter.seed(&page.seed);
        for e in page.entries.iter().filter(|e| filter.selects(e)) {
            let text = match json {
                false => e.text(),
                true => {
                    let sep = if printed == 0 { "[\n  " } else { ",\n  " };
                    format!("{sep}{}", e.json())
                }
            };
            stream.write(&text)?;
            printed += 1;
        }
        progress.set(page.next, page.last);
        Ok((!page.done && !stream.closed).then_some(Request::Log {
            after: page.next,
            to: Some(page.last),
            limit: None,
            queue: None,
        }))
    })?;
    progress.finish();
    if json {
        stream.write(if printed == 0 { "[]\n" } else { "\n]\n" })?;
    }
    stream.finish()
}

/// `berth replay`: the queues after the last event up to `--seq`, or at or
/// before `--at` (the end without either), in `queue list`'s format. A
/// moment before the first event gives the empty state, one after the last
/// the last state; either is said on stderr.
pub fn replay(
    s: &Session,
    at: Option<String>,
    seq: Option<u64>,
    output: Format,
) -> Result<(), CliError> {
    let at_ms = time_flag("at", at.as_deref(), now_ms())?;
    let progress = Progress::new("events replayed");
    let v = s.run_with(
        Request::Replay { seq, at_ms },
        Some(&|n, total| progress.set(n, total)),
    )?;
    progress.finish();
    let text = render_queues(&v["queues"], output, false)?;
    let moment = match (seq, at.as_deref()) {
        (Some(n), _) => Some(format!("event {n}")),
        (None, Some(t)) => Some(t.to_string()),
        (None, None) => None,
    };
    let event = |n: &Value, t: &Value| match t.as_u64() {
        Some(t) => format!("event {n} at {}", format_time(t)),
        None => format!("event {n}"),
    };
    if let Some(moment) = moment {
        match v["position"].as_str() {
            Some("before") if v["first"].is_u64() => eprintln!(
                "berth: {moment} is before the first event ({}): the state is empty",
                event(&v["first"], &v["first_at"])
            ),
            Some("before") => eprintln!("berth: the log has no events: the state is empty"),
            Some("end") if after_last(&v, seq, at_ms) => eprintln!(
                "berth: {moment} is after the last event ({}): the state after it",
                event(&v["seq"], &v["at"])
            ),
            _ => {}
        }
    }
    out(&text)
}

/// Whether the moment asked for is past the last event (not at it).
fn after_last(v: &Value, seq: Option<u64>, at_ms: Option<u64>) -> bool {
    match (seq, at_ms) {
        (Some(n), _) => v["seq"].as_u64().is_none_or(|last| n > last),
        (None, Some(t)) => v["at"].as_u64().is_none_or(|last| t > last),
        (None, None) => false,
    }
}

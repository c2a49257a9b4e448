//! The operations on the history: `log_page` (one page of `berth log`'s
//! timeline) and `replay` (the queues after any event), both over the data
//! dir's archive segments and log (`replay::Source`), read only.

use serde_json::{Value, json};

use super::{Ctx, OpError};
use crate::replay::{Flow, Source, SourceError, Until, start_for, state_at};
use crate::report;
use crate::timeline::Entry;

/// The most entries one page of the timeline holds (and the default).
pub const LOG_PAGE: usize = 10_000;

fn source_error(e: SourceError) -> OpError {
    match e {
        // A moment the data dir no longer keeps: the request's fault.
        SourceError::TooOld { .. } | SourceError::TooEarly { .. } => OpError::input(e.to_string()),
        _ => OpError::runtime(e.to_string()),
    }
}

/// The timeline's events after event `after`, up to event `to` (the log's
/// last when `None`), at most `limit` (at most [`LOG_PAGE`]):
/// `{"entries": [Entry...], "next": the last event read, "last": the last
/// event of the log, "done": whether the page reached the end}`. A data dir
/// that does not exist has no events.
///
/// The timeline begins where the history kept here begins (`Source::base`:
/// event 1, or the event after the archive's base checkpoint; anywhere
/// else is an error), so `after` 0 asks for it from there. With `queue`
/// (`berth log --queue`), a page that begins at a base checkpoint also
/// says which tasks were in that queue in the checkpoint's state (`"seed"`:
/// their ids), since their `enqueued` and `placed` events are not kept.
pub fn log_page(
    ctx: &Ctx<'_>,
    after: u64,
    to: Option<u64>,
    limit: Option<usize>,
    queue: Option<&str>,
) -> Result<Value, OpError> {
    let limit = limit.unwrap_or(LOG_PAGE).clamp(1, LOG_PAGE);
    let Some(store) = ctx.store else {
        return Ok(json!({"entries": [], "next": after, "last": 0, "done": true}));
    };
    let source = Source::of_store(store).map_err(source_error)?;
    let base = source.base().map_err(source_error)?;
    let after = match after {
        0 => base,
        // A later page, of a history retention has since trimmed.
        a if a < base => return Err(source_error(SourceError::Trimmed { after: a, base })),
        a => a,
    };
    let seed = match queue {
        Some(q) if after == base && base > 0 => seed(store.dir(), base, q)?,
        _ => Vec::new(),
    };
    let last = to.unwrap_or(u64::MAX).min(source.last_seq());
    let mut entries = Vec::new();
    let (next, flow) = source
        .for_each(after, |ev| {
            if ev.seq > last {
                return Ok(Flow::Stop);
            }
            entries.push(Entry::of(&ev));
            Ok(match entries.len() >= limit || ev.seq == last {
                true => Flow::Stop,
                false => Flow::Continue,
            })
        })
        .map_err(source_error)?;
    let done = flow == Flow::Continue || next >= last;
    let mut page = json!({"entries": entries, "next": next, "last": last, "done": done});
    if !seed.is_empty() {
        page["seed"] = json!(seed);
    }
    Ok(page)
}

/// The ids of the tasks in `queue` in the state of the checkpoint of
/// event `base` (live and finished: a finished task's `removed` event may
/// follow).
fn seed(dir: &std::path::Path, base: u64, queue: &str) -> Result<Vec<u64>, OpError> {
    let path = crate::checkpoint::dir_of(dir).join(crate::checkpoint::file_name(base));
    let snap = crate::checkpoint::read(&path).map_err(|e| source_error(SourceError::Archive(e)))?;
    let m = &snap.model;
    Ok(m.live
        .values()
        .chain(m.history.values())
        .filter(|t| t.queue == queue)
        .map(|t| t.id)
        .collect())
}

/// The queues after the last event up to event `seq`, or at or before
/// `at_ms` (the end when neither), in `queue list`'s wire form, with where
/// the replay stopped: `{"queues": [...], "seq", "at" (of the last event
/// applied, null when none was), "first", "first_at" (the log's first
/// event), "last" (the log's last event), "position"}`. `position` is
/// `"before"` (the moment is before the first event: the empty state),
/// `"within"`, or `"end"` (the moment is at or after the last event).
pub fn replay(ctx: &Ctx<'_>, seq: Option<u64>, at_ms: Option<u64>) -> Result<Value, OpError> {
    let until = match (seq, at_ms) {
        (Some(_), Some(_)) => {
            return Err(OpError::input(
                "give either an event number or a time, not both",
            ));
        }
        (Some(s), None) => Until::Seq(s),
        (None, Some(t)) => Until::Time(t),
        (None, None) => Until::End,
    };
    let Some(store) = ctx.store else {
        let views = report::empty_views(crate::queues::DEFAULT_PARALLEL_QUEUES);
        return Ok(json!({
            "queues": report::views_to_json(&views), "seq": 0, "at": null,
            "first": null, "first_at": null, "last": 0, "position": "end",
        }));
    };
    let source = Source::of_store(store).map_err(source_error)?;
    let total = source.last_seq();
    let mut progress = |n: u64| {
        if let Some(p) = ctx.progress {
            p(n, total);
        }
    };
    let start = start_for(store.dir(), &source, until).map_err(source_error)?;
    // A checkpoint's state is the state after its event.
    let from_checkpoint = (start.model.last_seq > 0).then_some(start.model.last_seq);
    let r = state_at(start, &source, until, &mut progress).map_err(source_error)?;
    let views = report::model_views(&r.model, ctx.parallel_queues(store)?);
    let position = match (r.last, r.reached_end) {
        (_, true) => "end",
        (None, false) if from_checkpoint.is_none() => "before",
        _ => "within",
    };
    Ok(json!({
        "queues": report::views_to_json(&views),
        "seq": r.last.map(|(s, _)| s).or(from_checkpoint).unwrap_or(0),
        "at": r.last.map(|(_, t)| t),
        "first": r.first.map(|(s, _)| s),
        "first_at": r.first.map(|(_, t)| t),
        "last": r.log_last,
        "position": position,
    }))
}

//! Offline replay: the events of a data dir in order, and the state they
//! describe at any moment.
//!
//! A data dir's history is its archive segments (`DIR/archive/`, commit
//! records that retention moved out of the store's log; see `archive`)
//! followed by the store's own log (the `e` records). A [`Source`] reads
//! them in that order: segments decoded in parallel with rayon, a few
//! ahead of the one whose events are being handed out (the thread handing
//! them out decodes too while it waits), then the store's records one by
//! one, so a long history is never held whole. Events that two sources both hold (an overlap at the
//! start of a segment or of the store's log) are handed out once; a missing
//! event, or one out of order inside a source, is an error that names the
//! event numbers and where they came from.
//!
//! The state is rebuilt by [`state_at`], from a starting state (a `Model`
//! and the event it is after: empty and 0, or a checkpoint's) by the one
//! replay rule there is, `store::verify::Model::apply`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::archive::{self, ArchiveError, SegmentInfo};
use crate::store::CorruptRecord;
use crate::store::event::Event;
use crate::store::verify::{Model, ReplayError};
use crate::store::{ReadError, Store};

/// Up to where a replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Up to and including this event number.
    Seq(u64),
    /// Up to the last event at or before this time (ms since the epoch):
    /// the events before the first one after it. (Event times follow the
    /// system clock; one stepped back makes the first crossing count.)
    Time(u64),
    /// Every event.
    End,
}

/// Where an event came from, for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The starting state (empty, or a checkpoint).
    Start,
    /// An archive segment file.
    Segment(PathBuf),
    /// The store's log (`e` records).
    Store,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Start => f.write_str("the starting state"),
            Origin::Segment(p) => write!(f, "archive segment {}", p.display()),
            Origin::Store => f.write_str("the store's log"),
        }
    }
}

/// Why the events cannot be read or replayed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{path}: cannot list the archive: {source}")]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the store's log: {0}")]
    Corrupt(#[from] CorruptRecord),
    #[error("the store's log: {0}")]
    Read(#[from] ReadError),
    #[error("{}", gap_text(*.previous, .previous_from, *.found, .found_from))]
    Gap {
        previous: u64,
        previous_from: Origin,
        found: u64,
        found_from: Origin,
    },
    #[error("event {found} follows event {previous} in {from}: the events are out of order")]
    OutOfOrder {
        previous: u64,
        found: u64,
        from: Origin,
    },
    #[error("replaying the log: {0}")]
    Replay(#[from] ReplayError),
    #[error(
        "the history kept here begins after event {base}: the state at event {seq} is no \
         longer kept (the archive's oldest segments were deleted by retention, or are missing)"
    )]
    TooOld { seq: u64, base: u64 },
    #[error(
        "the history kept here begins with the state after event {base}, known to hold from {} \
         on ({}): the state at {} is no longer kept (the archive's oldest segments were deleted \
         by retention, or are missing)",
        crate::units::format_time(.from.ms()),
        .from.what(),
        crate::units::format_time(*.at)
    )]
    TooEarly { at: u64, base: u64, from: KnownFrom },
    #[error("{}: the state before the first event kept (event {}) is needed, and missing", .path.display(), .base + 1)]
    NoBase { path: PathBuf, base: u64 },
    #[error(
        "{}: the store's log begins after event {upto}, but the archive holds no segment, \
         not even the newest one, which retention always keeps (it ends at event {upto}): \
         the archive is missing",
        .path.display()
    )]
    NoArchive { path: PathBuf, upto: u64 },
    #[error(
        "{}: a berth archive segment that begins with event {first}, named as one that does \
         not (segments are named seg-<first event>.bsg)",
        .path.display()
    )]
    Misnamed { path: PathBuf, first: u64 },
    #[error(
        "the history kept here now begins after event {base}: the events after event {after} \
         up to it are no longer kept (retention deleted the archive's oldest segments while \
         they were read)"
    )]
    Trimmed { after: u64, base: u64 },
}

fn gap_text(previous: u64, previous_from: &Origin, found: u64, found_from: &Origin) -> String {
    let missing = match found - previous {
        2 => format!("event {} is missing", previous + 1),
        _ => format!("events {} to {} are missing", previous + 1, found - 1),
    };
    let before = match previous {
        0 => format!("{previous_from} is empty"),
        _ => format!("{previous_from} ends at event {previous}"),
    };
    format!("the log has a gap: {before}, and {found_from} goes on with event {found}: {missing}")
}

/// Whether a consumer wants more events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// A data dir's events: its archive segments, then its store's log.
pub struct Source<'a> {
    segments: Vec<SegmentInfo>,
    store: Option<&'a Store>,
    /// The last event of the store's log when the source was made; later
    /// ones (a daemon goes on writing) are not read.
    store_last: u64,
}

/// Where the continuity check takes an event from (an index into the
/// segments, to keep it cheap per event).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Start,
    Segment(usize),
    Store,
}

/// The continuity check: every event once, in order, from the start's.
struct Continuity {
    last: u64,
    last_from: Side,
    /// The source being read, and whether it has handed out an event yet
    /// (only a source's first events may overlap what came before).
    current: Side,
    fresh: bool,
}

impl Continuity {
    fn new(after: u64) -> Continuity {
        Continuity {
            last: after,
            last_from: Side::Start,
            current: Side::Start,
            fresh: true,
        }
    }

    /// Whether to hand out event `seq` from `from` (false: an overlap).
    fn accept(&mut self, seq: u64, from: Side, src: &Source<'_>) -> Result<bool, SourceError> {
        if from != self.current {
            self.current = from;
            self.fresh = true;
        }
        let expected = self.last.saturating_add(1);
        if seq < expected && self.fresh {
            return Ok(false);
        }
        if seq > expected {
            return Err(SourceError::Gap {
                previous: self.last,
                previous_from: src.origin(self.last_from),
                found: seq,
                found_from: src.origin(from),
            });
        }
        if seq < expected {
            return Err(SourceError::OutOfOrder {
                previous: self.last,
                found: seq,
                from: src.origin(from),
            });
        }
        self.last = seq;
        self.last_from = from;
        self.fresh = false;
        Ok(true)
    }
}

/// The segments in a data dir's `archive/`, by the first event their
/// names say. A file named like a segment that `archive::list` leaves out
/// (a header that cannot be read, or that disagrees with itself or with
/// the file's name) is an error here, not a silent hole: it is read whole,
/// so that the error says what is wrong with it (a checksum mismatch for a
/// damaged header), and a file that reads whole but is named for another
/// event than its first is refused too.
pub fn segments_in(data_dir: &Path) -> Result<Vec<SegmentInfo>, SourceError> {
    let dir = data_dir.join(archive::DIR);
    let listed = archive::list(&dir).map_err(|source| SourceError::List {
        path: dir.clone(),
        source,
    })?;
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(listed);
    };
    for e in entries.flatten() {
        let path = e.path();
        if archive::named_like_a_segment(&path) && !listed.iter().any(|s| s.path == path) {
            let (info, _) = archive::read_segment(&path)?;
            return Err(SourceError::Misnamed {
                path,
                first: info.first_seq,
            });
        }
    }
    Ok(listed)
}

/// A segment's events, decoded.
type Decoded = Result<Vec<Event>, ArchiveError>;

/// Decodes a segment (its records in parallel). Only the events are kept:
/// the records' key writes (copies of the tasks they changed) are freed
/// here, on a decoding thread, not by the one thread applying the events.
fn decode(s: &SegmentInfo) -> Decoded {
    archive::read_segment(&s.path)
        .map(|(_, recs)| recs.into_iter().flat_map(|r| r.events).collect())
}

/// Where a decoded segment waits for the thread handing out events.
#[derive(Default)]
struct Slot {
    value: Mutex<Option<Decoded>>,
    filled: Condvar,
}

impl Slot {
    fn fill(&self, d: Decoded) {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
        self.filled.notify_all();
    }

    /// The decoded segment. Until it is there, this thread runs rayon jobs
    /// that wait (other segments, or records of this one), and otherwise
    /// waits for the slot (looking again every millisecond for new jobs).
    fn take(&self) -> Decoded {
        loop {
            if let Some(d) = self.value.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return d;
            }
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                continue;
            }
            let value = self.value.lock().unwrap_or_else(|p| p.into_inner());
            if value.is_none() {
                let _ = self.filled.wait_timeout(value, Duration::from_millis(1));
            }
        }
    }
}

impl<'a> Source<'a> {
    /// The events of the data dir `store` has open: its `archive/`
    /// segments, then its log as it is now.
    pub fn of_store(store: &'a Store) -> Result<Source<'a>, SourceError> {
        Ok(Source {
            segments: segments_in(store.dir())?,
            store: Some(store),
            store_last: store.next_seq().saturating_sub(1),
        })
    }

    /// Archive segments alone (in event order).
    pub fn of_segments(segments: Vec<SegmentInfo>) -> Source<'static> {
        Source {
            segments,
            store: None,
            store_last: 0,
        }
    }

    fn origin(&self, from: Side) -> Origin {
        match from {
            Side::Start => Origin::Start,
            Side::Segment(i) => Origin::Segment(self.segments[i].path.clone()),
            Side::Store => Origin::Store,
        }
    }

    /// The segments read.
    pub fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// The number of the last event (0 when there is none): the store's
    /// last, which no archived event is after; without a store, as the
    /// segments' headers say.
    pub fn last_seq(&self) -> u64 {
        if self.store.is_some() {
            return self.store_last;
        }
        self.segments.iter().map(|s| s.last_seq).max().unwrap_or(0)
    }

    /// The event the history kept here begins after: 0 when it begins with
    /// event 1, else the event of the archive's base checkpoint (the state
    /// before its first segment, which retention keeps when it deletes the
    /// oldest segments). A history that begins anywhere else is an error:
    /// a first segment after event 1 without its base checkpoint
    /// ([`SourceError::NoBase`]), or a store's log cut after event N with
    /// no segment at all ([`SourceError::NoArchive`]; retention always
    /// keeps the newest). The first segment is the one whose name says the
    /// lowest event, and its header agrees (`segments_in`); whether its
    /// events begin there is checked as they are read.
    pub fn base(&self) -> Result<u64, SourceError> {
        let first = match (self.segments.first(), self.store) {
            (Some(s), _) => s.first_seq,
            (None, Some(store)) if self.store_last > 0 => {
                let start = store.log_start()?;
                if start > 1 {
                    return Err(SourceError::NoArchive {
                        path: store.dir().join(archive::DIR),
                        upto: start - 1,
                    });
                }
                return Ok(0);
            }
            (None, _) => return Ok(0),
        };
        let base = first.saturating_sub(1);
        if let Some(store) = self.store
            && base > 0
            && crate::checkpoint::path_of(store.dir(), base).is_none()
        {
            return Err(SourceError::NoBase {
                path: crate::checkpoint::dir_of(store.dir())
                    .join(crate::checkpoint::file_name(base)),
                base,
            });
        }
        Ok(base)
    }

    /// Where the source after segment `i` begins, as far as it can be
    /// known without reading it: the next segment's first event (its name
    /// and header agree), or for the last segment the store's first record
    /// (`log_start`; None without a store or when its log is empty).
    /// A segment is skipped only when what follows it begins at or before
    /// the first event wanted, so that skipping it loses nothing: the
    /// continuity check then sees that what follows does begin there.
    fn next_start(&self, i: usize, log_start: Option<u64>) -> Option<u64> {
        match self.segments.get(i + 1) {
            Some(next) => Some(next.first_seq),
            None => log_start,
        }
    }

    /// Hands every event after event `after` to `f`, in order, each once,
    /// until `f` says stop. Returns the number of the last event handed
    /// out (`after` if none) and whether `f` stopped before the end.
    pub fn for_each(
        &self,
        after: u64,
        mut f: impl FnMut(Event) -> Result<Flow, SourceError>,
    ) -> Result<(u64, Flow), SourceError> {
        let mut check = Continuity::new(after);
        // Segments wholly at or before `after` are not even read: those
        // followed by a source that begins at or before the first event
        // wanted (a segment's own last event is in its header, which is
        // not checked until the segment is read).
        let log_start = match self.store {
            Some(store) => store.first_logged_seq()?,
            None => None,
        };
        let todo: Vec<(usize, &SegmentInfo)> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(i, s)| match self.next_start(*i, log_start) {
                Some(next) => next > after.saturating_add(1),
                None => s.last_seq > after,
            })
            .collect();
        // Segments decode as rayon jobs, at most `ahead` of them beyond
        // the one whose events are being handed out here, in order; this
        // thread decodes too whenever it waits for the next segment.
        let ahead = 2 * rayon::current_num_threads().max(1);
        let slots: Vec<Slot> = todo.iter().map(|_| Slot::default()).collect();
        let flow = rayon::in_place_scope(|s| {
            let spawn = |k: usize| {
                if let (Some((_, seg)), Some(slot)) = (todo.get(k), slots.get(k)) {
                    s.spawn(move |_| slot.fill(decode(seg)));
                }
            };
            (0..ahead).for_each(spawn);
            for (k, (i, _)) in todo.iter().enumerate() {
                let events = slots[k].take();
                spawn(k + ahead);
                if self.hand_out(*i, events?, &mut check, &mut f)? == Flow::Stop {
                    return Ok(Flow::Stop);
                }
            }
            Ok::<_, SourceError>(Flow::Continue)
        })?;
        if flow == Flow::Stop {
            return Ok((check.last, Flow::Stop));
        }
        if let Some(store) = self.store
            && self.store_last > check.last
        {
            for ev in store.events_from(check.last.saturating_add(1)) {
                let ev = ev?;
                if ev.seq > self.store_last {
                    break;
                }
                if check.accept(ev.seq, Side::Store, self)? && f(ev)? == Flow::Stop {
                    return Ok((check.last, Flow::Stop));
                }
            }
            if check.last < self.store_last {
                // The store said its log went further than it holds.
                return Err(SourceError::Gap {
                    previous: check.last,
                    previous_from: self.origin(check.last_from),
                    found: self.store_last,
                    found_from: Origin::Store,
                });
            }
        }
        Ok((check.last, Flow::Continue))
    }

    /// Hands out a window's events, each moved to `f` (so the thread
    /// applying them never copies or frees what it keeps).
    fn hand_out(
        &self,
        i: usize,
        events: Vec<Event>,
        check: &mut Continuity,
        f: &mut impl FnMut(Event) -> Result<Flow, SourceError>,
    ) -> Result<Flow, SourceError> {
        for ev in events {
            if check.accept(ev.seq, Side::Segment(i), self)? && f(ev)? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

/// A replay's starting state.
#[derive(Debug)]
pub struct Start {
    pub model: Model,
    /// For a checkpoint: from when on its state is known to be the data
    /// dir's (ms since the epoch): the time of its event, which a
    /// checkpoint of format version 2 records; for one that does not (a
    /// version-1 file, or an event the writer no longer had), the time its
    /// file was last written (after its event, so never earlier than the
    /// event's own time), so a moment before that, and before the first
    /// event kept after the checkpoint, cannot be told apart from a moment
    /// before the checkpoint's event, which the history no longer holds.
    /// `None` for the empty state before event 1.
    pub known_from: Option<KnownFrom>,
}

/// From when a starting checkpoint's state is known to hold (ms since the
/// epoch), and how that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownFrom {
    /// The time of its event, which the checkpoint records.
    Event(u64),
    /// The time its file was written: a checkpoint without its event's time.
    Written(u64),
}

impl KnownFrom {
    pub fn ms(self) -> u64 {
        match self {
            KnownFrom::Event(ms) | KnownFrom::Written(ms) => ms,
        }
    }

    /// How it is known, in messages.
    fn what(self) -> &'static str {
        match self {
            KnownFrom::Event(_) => "the time of that event",
            KnownFrom::Written(_) => "when its checkpoint was written",
        }
    }
}

/// The empty state, or any other known to hold whatever the moment.
impl From<Model> for Start {
    fn from(model: Model) -> Start {
        Start {
            model,
            known_from: None,
        }
    }
}

/// When the file at `path` was last written, in ms since the epoch (`u64::MAX`,
/// known from no moment, when the file system cannot say).
fn written_ms(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(u64::MAX, |d| d.as_millis() as u64)
}

/// The state to replay from to reach `until`, with no counting (see
/// [`uncounted`]): for an event number, the newest checkpoint at or before
/// it (`checkpoint.rs`); otherwise the oldest state kept: the archive's
/// base checkpoint (the state before the first event the history holds),
/// or the empty state when the history begins at event 1.
pub fn start_for(data_dir: &Path, source: &Source<'_>, until: Until) -> Result<Start, SourceError> {
    let base = source.base()?;
    let list = |e: std::io::Error| SourceError::List {
        path: data_dir.join(crate::checkpoint::DIR),
        source: e,
    };
    let usable: Vec<(u64, PathBuf)> = crate::checkpoint::list(data_dir)
        .map_err(list)?
        .into_iter()
        .filter(|(seq, _)| *seq >= base)
        .collect();
    let chosen = match until {
        Until::Seq(s) if s < base => return Err(SourceError::TooOld { seq: s, base }),
        Until::Seq(s) => usable.iter().rev().find(|(seq, _)| *seq <= s),
        Until::End => usable.last(),
        Until::Time(_) => usable.first().filter(|(seq, _)| *seq == base),
    };
    let (mut model, known_from) = match chosen {
        Some((_, path)) => {
            let snap = crate::checkpoint::read(path)?;
            let from = match snap.at {
                Some(ms) => KnownFrom::Event(ms),
                None => KnownFrom::Written(written_ms(path)),
            };
            (snap.model, Some(from))
        }
        None if base == 0 => (Model::default(), None),
        None => {
            return Err(SourceError::NoBase {
                path: data_dir
                    .join(crate::checkpoint::DIR)
                    .join(crate::checkpoint::file_name(base)),
                base,
            });
        }
    };
    model.count_from = u64::MAX;
    Ok(Start { model, known_from })
}

/// What [`check_archive`] read: the archive's first and last event (none
/// when it has no segment), and how many checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveChecked {
    pub events: Option<(u64, u64)>,
    pub checkpoints: usize,
}

/// `berth verify`'s look at what a replay from the log's start never reads:
/// every checkpoint read whole, then every archive segment read whole (its
/// checksum and every record decoded), its events following one another
/// from the base checkpoint (when the archive begins after event 1) up to
/// the store's log, which must go on from there. A log cut after event N
/// with no segment at all is missing its archive (retention always keeps
/// the newest segment). `progress` hears the last event read.
pub fn check_archive(
    store: &Store,
    progress: &mut dyn FnMut(u64),
) -> Result<ArchiveChecked, SourceError> {
    let dir = store.dir();
    let listed = crate::checkpoint::list(dir).map_err(|source| SourceError::List {
        path: dir.join(crate::checkpoint::DIR),
        source,
    })?;
    for (_, path) in &listed {
        crate::checkpoint::read(path)?;
    }
    let checkpoints = listed.len();
    let source = Source::of_store(store)?;
    let log_start = store.log_start()?;
    // A cut log without an archive, or an archive without its base.
    source.base()?;
    let Some(first) = source.segments.first().map(|s| s.first_seq) else {
        return Ok(ArchiveChecked {
            events: None,
            checkpoints,
        });
    };
    if first > 1 {
        start_for(dir, &source, Until::Seq(first - 1))?;
    }
    let mut last = first - 1;
    let mut n = 0u64;
    // The store's first event is handed out only once the continuity
    // check has accepted it after the archive's last.
    source.for_each(first - 1, |ev| {
        if ev.seq >= log_start {
            return Ok(Flow::Stop);
        }
        last = ev.seq;
        n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            progress(last);
        }
        Ok(Flow::Continue)
    })?;
    progress(last);
    Ok(ArchiveChecked {
        events: Some((first, last)),
        checkpoints,
    })
}

/// The empty starting state for a replay that does not need the counters
/// (`berth replay` shows queues): the model counts no event, which saves
/// a fifth of the time it takes to apply one.
pub fn uncounted() -> Model {
    Model {
        count_from: u64::MAX,
        ..Model::default()
    }
}

/// What a replay ended with.
#[derive(Debug)]
pub struct Replayed {
    /// The state after the last event applied.
    pub model: Model,
    /// The last event applied: its number and time (`None`: none was,
    /// the state is the starting one).
    pub last: Option<(u64, u64)>,
    /// The first event after the starting state: its number and time.
    pub first: Option<(u64, u64)>,
    /// The number of the last event there is.
    pub log_last: u64,
    /// Whether the replay went to the end of the log (`until` was at or
    /// after its last event).
    pub reached_end: bool,
}

/// How often [`state_at`] reports its progress, in events.
pub const PROGRESS_EVERY: u64 = 4096;

/// The state after the last event up to `until`, from `start` (a state
/// and the number of the event it is after: `Model::default()` is empty
/// and after event 0). `progress` is told the number of each
/// [`PROGRESS_EVERY`]th event applied, and the last.
pub fn state_at(
    start: impl Into<Start>,
    source: &Source<'_>,
    until: Until,
    progress: &mut dyn FnMut(u64),
) -> Result<Replayed, SourceError> {
    let start = start.into();
    let mut model = start.model;
    let after = model.last_seq;
    let mut first = None;
    let mut last = None;
    let mut n = 0u64;
    let (_, flow) = source.for_each(after, |ev| {
        if first.is_none() {
            first = Some((ev.seq, ev.at));
        }
        let past = match until {
            Until::Seq(s) => ev.seq > s,
            Until::Time(t) => ev.at > t,
            Until::End => false,
        };
        if past {
            return Ok(Flow::Stop);
        }
        let (seq, at) = (ev.seq, ev.at);
        model.apply(ev)?;
        last = Some((seq, at));
        n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            progress(seq);
        }
        Ok(Flow::Continue)
    })?;
    if let Some((seq, _)) = last {
        progress(seq);
    }
    // A moment at which no event kept had happened yet, and before the
    // starting checkpoint is known to hold: it may be before the
    // checkpoint's own event.
    if let (Until::Time(at), Some(from), None) = (until, start.known_from, last)
        && at < from.ms()
    {
        return Err(SourceError::TooEarly {
            at,
            base: after,
            from,
        });
    }
    Ok(Replayed {
        model,
        last,
        first,
        log_last: source.last_seq(),
        reached_end: flow == Flow::Continue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::store::event::CommitRecord;
    use crate::store::event::EventKind;
    use crate::store::order::Placement;
    use crate::task::TaskSpec;

    fn enqueued(seq: u64) -> Event {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: format!("t{seq}"),
            ..Default::default()
        };
        let mut task = spec
            .into_task(1_000 * seq, &crate::budget::Budget::default())
            .expect("task");
        task.id = seq;
        Event {
            seq,
            at: 1_000 * seq,
            kind: EventKind::Enqueued {
                task: Box::new(task),
                placement: Some(Placement::Last),
            },
        }
    }

    fn segment(dir: &Path, seqs: std::ops::RangeInclusive<u64>) {
        let recs: Vec<Vec<u8>> = seqs
            .clone()
            .map(|s| {
                codec::encode(&CommitRecord {
                    next_id: s + 1,
                    events: vec![enqueued(s)],
                    writes: Vec::new(),
                })
            })
            .collect();
        archive::write_segment(dir, *seqs.start(), *seqs.end(), &recs).expect("segment");
    }

    fn seqs(source: &Source<'_>, after: u64) -> Result<Vec<u64>, SourceError> {
        let mut out = Vec::new();
        source.for_each(after, |e| {
            out.push(e.seq);
            Ok(Flow::Continue)
        })?;
        Ok(out)
    }

    #[test]
    fn segments_overlap_once_and_a_gap_names_both_sides() {
        let dir = tempfile::tempdir().expect("tmp");
        let arch = dir.path().join(archive::DIR);
        segment(&arch, 1..=10);
        segment(&arch, 8..=20);
        segment(&arch, 21..=25);
        let src = Source::of_segments(segments_in(dir.path()).expect("list"));
        assert_eq!(seqs(&src, 0).expect("read"), (1..=25).collect::<Vec<_>>());
        assert_eq!(seqs(&src, 12).expect("read"), (13..=25).collect::<Vec<_>>());
        assert_eq!(src.last_seq(), 25);

        segment(&arch, 30..=31);
        let src = Source::of_segments(segments_in(dir.path()).expect("list"));
        let e = seqs(&src, 0).expect_err("a gap").to_string();
        assert!(e.contains("ends at event 25"), "{e}");
        assert!(e.contains("goes on with event 30"), "{e}");
        assert!(e.contains("events 26 to 29 are missing"), "{e}");
        assert!(e.contains("seg-00000000000000000021.bsg"), "{e}");
        assert!(e.contains("seg-00000000000000000030.bsg"), "{e}");

        // A start after event 0 with the log beginning later.
        std::fs::remove_dir_all(&arch).expect("rm");
        segment(&arch, 5..=6);
        let src = Source::of_segments(segments_in(dir.path()).expect("list"));
        let e = seqs(&src, 0).expect_err("a gap").to_string();
        assert!(e.contains("the starting state is empty"), "{e}");
        assert!(e.contains("events 1 to 4 are missing"), "{e}");
        assert_eq!(seqs(&src, 4).expect("from 4"), vec![5, 6]);
    }

    #[test]
    fn a_damaged_segment_file_is_an_error_not_a_hole() {
        let dir = tempfile::tempdir().expect("tmp");
        let arch = dir.path().join(archive::DIR);
        segment(&arch, 1..=3);
        std::fs::write(arch.join(archive::segment_name(4)), b"garbage").expect("write");
        let e = segments_in(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("seg-00000000000000000004.bsg"), "{e}");
        assert!(e.contains("not a berth archive segment"), "{e}");
        // A whole segment under another segment's name: its header is not
        // believed, and the file is named.
        std::fs::remove_file(arch.join(archive::segment_name(4))).expect("rm");
        std::fs::rename(
            arch.join(archive::segment_name(1)),
            arch.join(archive::segment_name(2)),
        )
        .expect("rename");
        let e = segments_in(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("seg-00000000000000000002.bsg"), "{e}");
        assert!(
            e.contains("that begins with event 1, named as one that does not"),
            "{e}"
        );
    }

    #[test]
    fn state_at_stops_at_a_seq_or_a_time() {
        let dir = tempfile::tempdir().expect("tmp");
        let arch = dir.path().join(archive::DIR);
        segment(&arch, 1..=5);
        let src = Source::of_segments(segments_in(dir.path()).expect("list"));
        let at = |u| state_at(Model::default(), &src, u, &mut |_| {}).expect("replay");
        let r = at(Until::Seq(3));
        assert_eq!(r.model.live.len(), 3);
        assert_eq!((r.last, r.reached_end), (Some((3, 3_000)), false));
        let r = at(Until::Time(4_500));
        assert_eq!(r.model.last_seq, 4);
        let r = at(Until::Time(10));
        assert_eq!((r.last, r.first), (None, Some((1, 1_000))));
        assert_eq!(r.model, Model::default());
        let r = at(Until::End);
        assert_eq!((r.model.last_seq, r.reached_end, r.log_last), (5, true, 5));
        // A later start: the events after it only.
        let start = at(Until::Seq(2)).model;
        let r = state_at(start, &src, Until::End, &mut |_| {}).expect("replay");
        assert_eq!(r.first, Some((3, 3_000)));
        assert_eq!(r.model, at(Until::End).model);
    }
}

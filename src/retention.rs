//! Retention: what keeps an edge node's disk bounded. A daemon runs one
//! [`pass`] at its start and every `every` (`cli/daemon.rs`):
//!
//! 1. **History**: finished tasks that finished more than `history_age`
//!    ago, and the oldest beyond the newest `history_max`, are removed
//!    (`removed` events; a group goes whole, with its children).
//! 2. **Log**: once the store's log is over `log_size` or its oldest record
//!    is older than `log_age`, the records up to the newest checkpoint that
//!    the limits allow are appended to an archive segment, then cut from
//!    the store (`Store::cut_log`). A log is cut only at a checkpoint.
//! 3. **Checkpoints**: when the log holds more than a quarter of its limits
//!    since the newest checkpoint, a new one is written (the next pass can
//!    cut up to it). Checkpoints older than the log's start are deleted,
//!    except the archive's base (the state before its first segment).
//! 4. **Archive**: while its segments and base take more than
//!    `archive_size`, or its oldest segment is older than `archive_age`, the
//!    oldest segment goes; the base moves forward by replaying it.
//!
//! Every step makes its files durable before the step that depends on them
//! (a segment and a checkpoint before the cut; a new base before the old
//! segment goes), so a crash at any point leaves a replayable chain.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::archive::{self, ArchiveError, SegmentInfo};
use crate::checkpoint;
use crate::store::verify::Model;
use crate::store::{CorruptRecord, LogRecord, ReadError, Snapshot, Store, WriteError};

/// The retention limits (`[retention]` in the config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// How long a finished task stays in the history.
    pub history_age: Duration,
    /// The most finished tasks kept (the newest).
    pub history_max: usize,
    /// How long the store's log keeps a record before archiving it.
    pub log_age: Duration,
    /// The most bytes of log records the store keeps.
    pub log_size: u64,
    /// How long the archive keeps a segment (by the time it was written).
    pub archive_age: Duration,
    /// The most bytes the archive (segments and its base checkpoint) takes.
    pub archive_size: u64,
    /// How often a daemon runs a pass.
    pub every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Retention {
            history_age: Duration::from_secs(7 * DAY),
            history_max: 10_000,
            log_age: Duration::from_secs(DAY),
            log_size: 64 << 20,
            archive_age: Duration::from_secs(30 * DAY),
            archive_size: 256 << 20,
            every: Duration::from_secs(60),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Finished tasks removed from the history.
    pub pruned: usize,
    /// Commit records moved from the log to the archive, and their events.
    pub archived_records: usize,
    pub cut_upto: Option<u64>,
    /// The event of the checkpoint written, if one was.
    pub checkpoint: Option<u64>,
    /// Archive segments and checkpoints deleted.
    pub segments_deleted: usize,
    pub checkpoints_deleted: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("replaying archive segment {}: {why}", path.display())]
    Replay { path: PathBuf, why: String },
    #[error(transparent)]
    Verify(#[from] crate::store::verify::ReplayError),
    /// The archive's segments cannot be listed, or one of them is damaged.
    #[error("the archive: {0}")]
    Archived(#[from] crate::replay::SourceError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RetentionError {
    let path = path.to_path_buf();
    move |source| RetentionError::Io { what, path, source }
}

/// One retention pass over `store` (see the module doc), at the store's
/// clock's time.
pub fn pass(store: &Store, r: &Retention) -> Result<PassReport, RetentionError> {
    let mut report = PassReport {
        pruned: prune_history(store, r)?,
        ..PassReport::default()
    };
    // The log's records are read (decoded) once per pass: what the cut
    // leaves is what the checkpoint step looks at.
    let mut records = store.log_records()?;
    cut_log(store, r, &records, &mut report)?;
    if let Some(upto) = report.cut_upto {
        records.retain(|x| x.first_seq > upto);
    }
    checkpoint_if_due(store, r, &records, &mut report)?;
    delete_old_checkpoints(store.dir(), store.log_start()?, &mut report)?;
    let count_from = store.counting().since;
    trim_archive(
        store.dir(),
        r,
        store.clock().now_ms(),
        count_from,
        &mut report,
    )?;
    Ok(report)
}

/// Step 1: removes what the history keeps too long or beyond its count.
fn prune_history(store: &Store, r: &Retention) -> Result<usize, RetentionError> {
    let now = store.clock().now_ms();
    let oldest_kept = now.saturating_sub(r.history_age.as_millis() as u64);
    let mut top: Vec<(u64, u64, usize)> = Vec::new(); // (finished_at, id, tasks)
    let mut total = 0;
    let history = store.history();
    let ids: std::collections::BTreeSet<u64> = history
        .iter()
        .filter_map(|t| t.as_ref().ok())
        .map(|t| t.id)
        .collect();
    for t in history {
        let t = t?;
        total += 1;
        // A group's children go with their parent (live or finished).
        if t.parent
            .is_some_and(|p| ids.contains(&p) || matches!(store.live_task(p), Ok(Some(_))))
        {
            continue;
        }
        top.push((t.finished_at.unwrap_or(0), t.id, 1 + t.children.len()));
    }
    top.sort();
    let mut doomed = Vec::new();
    let mut left = total;
    for (finished, id, tasks) in top {
        if finished < oldest_kept || left > r.history_max {
            doomed.push(id);
            left = left.saturating_sub(tasks);
        } else {
            break;
        }
    }
    let mut pruned = 0;
    for chunk in doomed.chunks(256) {
        let mut w = store.write();
        for id in chunk {
            pruned += w.remove(*id)?.len();
        }
        w.commit()?;
    }
    Ok(pruned)
}

/// Step 2: archives and cuts the log up to the newest checkpoint the
/// limits allow.
fn cut_log(
    store: &Store,
    r: &Retention,
    records: &[LogRecord],
    report: &mut PassReport,
) -> Result<(), RetentionError> {
    let now = store.clock().now_ms();
    let too_old = now.saturating_sub(r.log_age.as_millis() as u64);
    let mut size: u64 = records.iter().map(|x| x.bytes).sum();
    let mut want = None;
    // Never the last record (the store re-applies it at open).
    for rec in records.iter().take(records.len().saturating_sub(1)) {
        if rec.at >= too_old && size <= r.log_size {
            break;
        }
        size -= rec.bytes;
        want = Some(rec.last_seq);
    }
    let Some(want) = want else { return Ok(()) };
    let start = store.log_start()?;
    let dir = store.dir();
    let Some((upto, _)) = checkpoint::newest_at_or_before(dir, want)
        .map_err(io("listing checkpoints in", dir))?
        .filter(|(c, _)| *c >= start)
    else {
        return Ok(());
    };
    let Some(cut) = store.log_cut(upto)? else {
        return Ok(());
    };
    let archive_dir = dir.join(archive::DIR);
    archive::write_segment(&archive_dir, start, upto, &cut.records)
        .map_err(io("writing an archive segment in", &archive_dir))?;
    report.archived_records = store.cut_log(cut)?;
    report.cut_upto = Some(upto);
    log::info!(
        "retention: moved {} log records (events {start} to {upto}) to the archive",
        report.archived_records
    );
    Ok(())
}

/// Step 3: a new checkpoint when the log since the newest one holds more
/// than a quarter of its limits.
fn checkpoint_if_due(
    store: &Store,
    r: &Retention,
    records: &[LogRecord],
    report: &mut PassReport,
) -> Result<(), RetentionError> {
    let dir = store.dir();
    let newest = checkpoint::list(dir)
        .map_err(io("listing checkpoints in", dir))?
        .last()
        .map_or(0, |(s, _)| *s);
    let since: Vec<_> = records.iter().filter(|x| x.first_seq > newest).collect();
    let Some(first) = since.first() else {
        return Ok(());
    };
    let bytes: u64 = since.iter().map(|x| x.bytes).sum();
    let age = store.clock().now_ms().saturating_sub(first.at);
    if bytes < r.log_size / 4 && u128::from(age) < r.log_age.as_millis() / 4 {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let snap = store.snapshot()?;
    let path = checkpoint::write(dir, &snap).map_err(io("writing checkpoint", dir))?;
    log::info!(
        "retention: checkpoint of event {} ({} live, {} finished tasks) in {:?}: {}",
        snap.model.last_seq,
        snap.model.live.len(),
        snap.model.history.len(),
        started.elapsed(),
        path.display()
    );
    report.checkpoint = Some(snap.model.last_seq);
    Ok(())
}

/// Step 3, continued: checkpoints before the log's start go, except the
/// archive's base.
fn delete_old_checkpoints(
    dir: &Path,
    log_start: u64,
    report: &mut PassReport,
) -> Result<(), RetentionError> {
    let base = base_seq(dir)?;
    for (seq, path) in checkpoint::list(dir).map_err(io("listing checkpoints in", dir))? {
        if seq + 1 < log_start && Some(seq) != base {
            std::fs::remove_file(&path).map_err(io("deleting checkpoint", &path))?;
            report.checkpoints_deleted += 1;
        }
    }
    Ok(())
}

/// The event of the archive's base checkpoint: the one before its first
/// segment (None when the archive is empty or begins at event 1).
fn base_seq(dir: &Path) -> Result<Option<u64>, RetentionError> {
    let segments = segments(dir)?;
    Ok(segments.first().map(|s| s.first_seq - 1).filter(|s| *s > 0))
}

/// The archive's segments, by their first event. A file named like a
/// segment whose header does not check out is an error
/// (`replay::segments_in`): which segment is the first, and so which
/// checkpoint is the base, is not known then, and a pass that guessed
/// could delete the base or the segments after the damaged one.
fn segments(dir: &Path) -> Result<Vec<SegmentInfo>, RetentionError> {
    Ok(crate::replay::segments_in(dir)?)
}

/// Step 4: the oldest segments go while the archive is over its limits;
/// the base moves forward over each.
fn trim_archive(
    dir: &Path,
    r: &Retention,
    now_ms: u64,
    count_from: u64,
    report: &mut PassReport,
) -> Result<(), RetentionError> {
    let mut segments = segments(dir)?;
    loop {
        let base = base_seq(dir)?.and_then(|s| checkpoint::path_of(dir, s));
        let base_bytes = base
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len());
        let total: u64 = base_bytes + segments.iter().map(|s| s.bytes).sum::<u64>();
        let Some(oldest) = segments.first() else {
            return Ok(());
        };
        let written = std::fs::metadata(&oldest.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(now_ms, |d| d.as_millis() as u64);
        let expired = now_ms.saturating_sub(written) > r.archive_age.as_millis() as u64;
        // The newest segment stays: it ends at the log's start.
        if segments.len() < 2 || (total <= r.archive_size && !expired) {
            return Ok(());
        }
        let oldest = segments.remove(0);
        rebase(dir, base.as_deref(), &oldest, count_from)?;
        std::fs::remove_file(&oldest.path).map_err(io("deleting segment", &oldest.path))?;
        if let Some(b) = base {
            std::fs::remove_file(&b).map_err(io("deleting checkpoint", &b))?;
            report.checkpoints_deleted += 1;
        }
        report.segments_deleted += 1;
        log::info!(
            "retention: deleted archive segment {} (events {} to {})",
            oldest.path.display(),
            oldest.first_seq,
            oldest.last_seq
        );
    }
}

/// Writes the checkpoint after `segment` (the new base) from the old base
/// (`None`: the empty state before event 1, counting from `count_from`)
/// and the segment's events.
fn rebase(
    dir: &Path,
    base: Option<&Path>,
    segment: &SegmentInfo,
    count_from: u64,
) -> Result<(), RetentionError> {
    if checkpoint::path_of(dir, segment.last_seq).is_some() {
        return Ok(());
    }
    let (mut model, mut next_id) = match base {
        Some(p) => {
            let s = checkpoint::read(p)?;
            (s.model, s.next_id)
        }
        None if segment.first_seq == 1 => (
            Model {
                count_from,
                ..Model::default()
            },
            1,
        ),
        None => {
            log::warn!(
                "retention: archive segment {} has no base checkpoint; the archive now starts later",
                segment.path.display()
            );
            return Ok(());
        }
    };
    let (_, records) = archive::read_segment(&segment.path)?;
    let mut at = None;
    for rec in records {
        for ev in rec.events {
            at = Some(ev.at);
            model.apply(ev).map_err(|e| RetentionError::Replay {
                path: segment.path.clone(),
                why: e.to_string(),
            })?;
        }
        next_id = rec.next_id;
    }
    let snap = Snapshot { model, next_id, at };
    checkpoint::write(dir, &snap).map_err(io("writing checkpoint", dir))?;
    Ok(())
}

/// The newest checkpoint at or before the store's log start, to verify or
/// replay from (None when the log begins at event 1).
pub fn log_base(store: &Store) -> Result<Option<Snapshot>, RetentionError> {
    let start = store.log_start()?;
    if start <= 1 {
        return Ok(None);
    }
    let dir = store.dir();
    let path = checkpoint::path_of(dir, start - 1).ok_or_else(|| RetentionError::Io {
        what: "reading the checkpoint of the log's start in",
        path: dir
            .join(checkpoint::DIR)
            .join(checkpoint::file_name(start - 1)),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "it is missing"),
    })?;
    Ok(Some(checkpoint::read(&path)?))
}

/// `verify` of a store whose log may have been cut: replays the log from
/// the checkpoint of its start, telling `progress` how far it is.
pub fn verify(
    store: &Store,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<String>, RetentionError> {
    let base = log_base(store)?;
    Ok(crate::store::verify::verify_from(
        store,
        base.map(|s| s.model),
        progress,
    )?)
}

//! Opening a data dir, as named steps (ARCHITECTURE.md lists them in the same
//! order, with other numbers: its step 0 is steps 1 to 3 here, its steps 1
//! and 2 are 4 and 5, its 3 (raising `next_id`) is part of 5, its 4 is 6,
//! and its 5 and 6 are 7):
//!
//! 1. [`prepare_dir`]: the data dir exists (or is created) with mode 0700.
//! 2. [`lock_dir`]: the `flock` on `DIR/berth.lock`; a command waits for
//!    another command, a daemon waits for commands (and tells them so), and
//!    nobody waits for a daemon.
//! 3. [`read_wal`]: the write-ahead log read, and refused if damaged
//!    before its end, before sled opens (sled writes when it opens, and a
//!    refused open leaves the data dir as it was); then [`open_sled`]:
//!    leftovers of an interrupted snapshot removed, a lost or damaged
//!    database refused with an error that says what to do.
//! 4. [`check_format`]: `mformat`, or a new store (format, mark, marker);
//!    an older format's counters moved to their tree ([`move_counters`]).
//! 5. [`replay_wal`]: the commits the write-ahead log holds and sled lost
//!    (a crash or a power cut before sled's own flush) put back into sled;
//!    then [`reapply`]: every commit record after the applied mark, in
//!    order; `next_id` and `next_seq` from the last one, which must reach
//!    the high-water mark ([`check_high_mark`], see `high_mark`); then
//!    [`fold_queue_keys`]: a format-6 dir's `q` keys go into their tasks'
//!    values. To write, sled is then flushed and the write-ahead log emptied.
//! 6. [`scan_live`]: one pass over the live tasks for their queue positions
//!    (the order index) and (to write) the ones that were running and the
//!    TTL deadlines; and [`load_counts`]: the counters from the `c` keys.
//! 7. `Store::open` starts the applier (the batched flusher, the sled flusher), then
//!    [`Store::recover`]s tasks that were running.
//!
//! After sled is open, any sled error marks the store failed (see `health`),
//! so that dropping the half-opened tree never waits on sled.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::SharedClock;
use crate::codec;
use crate::store::attempts::AttemptLog;
use crate::store::counters::{Counting, KindCounts};
use crate::store::db::{Inner, Options, Store};
use crate::store::deadlines::Deadlines;
use crate::store::durability::{Durability, GroupCommit};
use crate::store::error::{CorruptRecord, OpenError, WriteError};
use crate::store::event::{INTERRUPTED, KeyWrite};
use crate::store::files::{self, DbFiles};
use crate::store::health::Failed;
use crate::store::high_mark::{self, Mark};
use crate::store::keys::{self, COUNTER, HISTORY, QUEUE, TASK};
use crate::store::lock::{DirLock, Holder, LockError, Role};
use crate::store::order::{self, Order};
use crate::store::overlay::{self, Overlay, Trees};
use crate::store::panics;
use crate::store::records;
use crate::store::stored;
use crate::store::wal::{self, Wal};
use crate::store::write::WriteTxn;
use crate::task::Status;

/// How often a daemon waiting for commands says so in the log.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether an open that creates the data dir (`berth run`, an `enqueue`)
/// would take `dir`, as far as what it is tells: a berth data dir, or a
/// folder that is not there yet or holds nothing but berth's own names.
/// Only such a folder becomes a data dir: a mistyped path to some other
/// folder, or to a file, is refused before anything is written into it.
/// `berth check` asks this of the data dir `berth run` would use.
pub fn may_become_data_dir(dir: &Path) -> Result<(), OpenError> {
    check_kind(dir, true)
}

/// Refuses a data dir whose marker says it held a store that is no longer
/// there (see `files::check_not_lost`), as opening it would.
pub fn check_not_lost(dir: &Path) -> Result<(), OpenError> {
    match files::check_not_lost(dir) {
        Err(files::Damage::Lost(what)) => Err(OpenError::Lost {
            dir: dir.to_path_buf(),
            what,
        }),
        _ => Ok(()),
    }
}

/// `dir` is a folder (or not there), and a berth data dir, or (when
/// `may_create`) a folder that may become one.
fn check_kind(dir: &Path, may_create: bool) -> Result<(), OpenError> {
    not_a_folder(dir)?;
    let takes = files::is_data_dir(dir) || (may_create && files::holds_only_berth_names(dir));
    if !takes {
        // A folder this user may not look into is not known not to be one.
        if let Err(source) = std::fs::symlink_metadata(dir.join(files::MARKER))
            && source.kind() == std::io::ErrorKind::PermissionDenied
        {
            return Err(OpenError::Io {
                dir: dir.to_path_buf(),
                op: "looking into it",
                source,
            });
        }
        return Err(OpenError::NotADataDir {
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Refuses a `dir` that exists but is no folder (nor a link to one).
fn not_a_folder(dir: &Path) -> Result<(), OpenError> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(OpenError::NotAFolder {
            dir: dir.to_path_buf(),
            what: if m.is_file() {
                "a file"
            } else {
                crate::frame::file_kind(m.file_type()).unwrap_or("not a folder")
            },
        }),
        _ => Ok(()),
    }
}

/// Step 1: the data dir exists with mode 0700 (created if asked, or taken
/// if it is an empty folder). To read or to change it, it must exist and be
/// a berth data dir; to read, nothing in it is changed.
fn prepare_dir(dir: &Path, opts: &Options) -> Result<(), OpenError> {
    if let Err(source) = std::fs::metadata(dir)
        && source.kind() == std::io::ErrorKind::PermissionDenied
    {
        return Err(OpenError::Io {
            dir: dir.to_path_buf(),
            op: "looking it up",
            source,
        });
    }
    if !dir.exists() && (opts.read_only || !opts.create) {
        return Err(OpenError::Missing {
            dir: dir.to_path_buf(),
        });
    }
    check_kind(dir, opts.create && !opts.read_only)?;
    if opts.read_only {
        return Ok(());
    }
    files::private_dir(dir).map_err(|source| OpenError::Io {
        dir: dir.to_path_buf(),
        op: "making it (a private folder)",
        source,
    })
}

/// Step 2: takes the data dir's lock. A command waits up to
/// `opts.wait_for_lock` while another command holds it, and not at all for a
/// daemon or a daemon that waits to start. A daemon waits as long as
/// commands hold it, and announces itself (`berth.starting`) so that new
/// commands step aside and wait for its socket instead.
fn lock_dir(dir: &Path, opts: &Options) -> Result<Option<DirLock>, OpenError> {
    let started = Instant::now();
    let mut announced = None;
    let mut logged = started;
    loop {
        let in_use = |holder| OpenError::InUse {
            dir: dir.to_path_buf(),
            holder,
        };
        if opts.role == Role::Command
            && let Some(pid) = DirLock::daemon_starting(dir)
        {
            return Err(in_use(Holder {
                role: Some(Role::Daemon),
                pid,
            }));
        }
        let acquired = if opts.read_only {
            DirLock::try_acquire_reader(dir)
        } else {
            DirLock::try_acquire(dir, opts.role).map(Some)
        };
        match acquired {
            // An announcement is withdrawn when `announced` goes.
            Ok(l) => return Ok(l),
            Err(LockError::Io(source)) => {
                return Err(OpenError::Io {
                    dir: dir.to_path_buf(),
                    op: "taking its lock (berth.lock)",
                    source,
                });
            }
            Err(LockError::Held(holder)) => {
                let by_daemon = holder.role == Some(Role::Daemon);
                match opts.role {
                    Role::Daemon if !by_daemon => {
                        if announced.is_none() {
                            let a =
                                DirLock::announce_start(dir).map_err(|source| OpenError::Io {
                                    dir: dir.to_path_buf(),
                                    op: "announcing the daemon's start (berth.starting)",
                                    source,
                                })?;
                            log::info!(
                                "waiting for {} to release data dir {}",
                                holder,
                                dir.display()
                            );
                            announced = Some(a);
                        } else if logged.elapsed() >= WAIT_LOG_EVERY {
                            logged = Instant::now();
                            log::info!(
                                "still waiting for {} to release data dir {} ({} s)",
                                holder,
                                dir.display(),
                                started.elapsed().as_secs()
                            );
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Role::Command if !by_daemon && started.elapsed() < opts.wait_for_lock => {
                        std::thread::sleep(Duration::from_millis(10 + fastrand::u64(0..20)));
                    }
                    _ => return Err(in_use(holder)),
                }
            }
        }
    }
}

/// Step 3: opens sled on `db` (the data dir's `db/`, or a copy of it) after
/// checking what it would read (a database that the marker says existed
/// but is now missing or empty was refused before, by `Store::open`, ahead
/// of any copy): leftovers of an interrupted snapshot are removed, and a
/// damaged database (sled returns corruption, cannot read its `conf`, or
/// panics) is an error that says what to do, never a panic. Errors name
/// `dir`.
fn open_sled(dir: &Path, db: &Path, opts: &Options) -> Result<Trees, OpenError> {
    let own = dir.join(files::DB);
    for path in files::remove_leftovers(db) {
        match path.strip_prefix(db) {
            // A read-only command's private copy: the data dir keeps it.
            Ok(rel) if db != own => log::warn!(
                "{} was left by a sled snapshot that was interrupted; this command reads \
                 without it, and the next one that writes removes it",
                own.join(rel).display()
            ),
            _ => log::warn!(
                "removed {}, left by a sled snapshot that was interrupted",
                path.display()
            ),
        }
    }
    match files::restore_kept_blobs(db) {
        Ok(0) => {}
        Ok(n) => log::info!(
            "{}: {n} blob file(s) sled deleted after its last durable state given back \
             (see files::KEPT_BLOBS)",
            dir.display()
        ),
        Err(source) => {
            return Err(OpenError::Io {
                dir: dir.to_path_buf(),
                op: "giving back the blob files kept in db/blobs-kept",
                source,
            });
        }
    }
    let config = sled::Config::new()
        .path(db)
        .cache_capacity(opts.cache_bytes)
        .flush_every_ms(None)
        .mode(sled::Mode::HighThroughput);
    let damaged = |detail: String| OpenError::Damaged {
        dir: dir.to_path_buf(),
        detail,
    };
    match panics::catch(|| open_config(&config).and_then(Trees::open)) {
        Ok(Ok(trees)) => Ok(trees),
        Ok(Err(sled::Error::Io(source))) if source.raw_os_error() == Some(libc::ENOSPC) => {
            Err(OpenError::NoSpace {
                dir: dir.to_path_buf(),
                source,
            })
        }
        // sled's own text for this ("Read corrupted data at file offset
        // None backtrace ()") is for its developers.
        Ok(Err(sled::Error::Corruption { at, .. })) => {
            let db = dir.join(files::DB).join("db");
            Err(damaged(match at {
                Some(at) => format!("sled found corrupted data in {} ({at:?})", db.display()),
                None => format!("sled found corrupted data in {}", db.display()),
            }))
        }
        Ok(Err(e @ sled::Error::ReportableBug(_))) => Err(damaged(e.to_string())),
        // What sled 0.34 says of a `conf` it cannot parse: every berth has
        // written its databases with sled 0.34, so the file is damaged.
        Ok(Err(sled::Error::Unsupported(why))) => Err(damaged(format!(
            "sled cannot read its settings file {}: {why}",
            dir.join(files::DB).join("conf").display()
        ))),
        Ok(Err(source)) => Err(OpenError::Database {
            dir: dir.to_path_buf(),
            source,
        }),
        Err(panic) => Err(damaged(format!("sled panicked while reading it: {panic}"))),
    }
}

/// How long opening waits for sled's own lock on `db/db`.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens sled, waiting while its lock on `db/db` is still held. sled 0.34
/// drops a `Db` before its IO threads have closed the file, so opening the
/// same data dir again in the same process (a library user, or a test, that
/// closes and reopens a store) can find the lock taken for a moment (sled
/// issue 1289). The caller holds the data dir's lock, so no other berth
/// holds sled's: it is ours, on its way out.
fn open_config(config: &sled::Config) -> sled::Result<sled::Db> {
    let started = Instant::now();
    loop {
        match config.open() {
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock on")
                    && started.elapsed() < SLED_LOCK_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// The open sled tree with the means to report its errors: a sled error
/// marks the store failed (so the tree's drop never flushes) and becomes an
/// `OpenError` naming the data dir.
struct Opening<'a> {
    dir: &'a Path,
    /// The default tree (`trees.main`).
    tree: &'a sled::Db,
    trees: &'a Trees,
    failed: &'a Failed,
}

impl Opening<'_> {
    fn db(&self, source: sled::Error) -> OpenError {
        self.failed.fail(self.tree, &source);
        match source {
            sled::Error::Io(source) if source.raw_os_error() == Some(libc::ENOSPC) => {
                OpenError::NoSpace {
                    dir: self.dir.to_path_buf(),
                    source,
                }
            }
            source => OpenError::Database {
                dir: self.dir.to_path_buf(),
                source,
            },
        }
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> OpenError {
        self.failed.fail(self.tree, &source);
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return OpenError::NoSpace {
                dir: self.dir.to_path_buf(),
                source,
            };
        }
        OpenError::Io {
            dir: self.dir.to_path_buf(),
            op,
            source,
        }
    }

    fn format_error(&self, found: String) -> OpenError {
        OpenError::Format {
            dir: self.dir.to_path_buf(),
            found,
            expected: keys::STORE_FORMAT,
        }
    }
}

/// Step 4: the store format. An empty tree becomes a new store: format,
/// applied mark, a flush, and the marker file (unless the marker says a
/// store was here: then its data was lost).
fn check_format(o: &Opening<'_>, files: &DbFiles, read_only: bool) -> Result<u64, OpenError> {
    let tree = o.tree;
    let format = match tree.get(keys::META_FORMAT).map_err(|e| o.db(e))? {
        None => {
            if tree.iter().next().is_some() {
                return Err(o.format_error("missing".into()));
            }
            if read_only && !files::has_marker(o.dir) {
                return Err(OpenError::NotADataDir {
                    dir: o.dir.to_path_buf(),
                });
            }
            if files::has_marker(o.dir) {
                return Err(OpenError::Lost {
                    dir: o.dir.to_path_buf(),
                    what: "its database holds no data".into(),
                });
            }
            overlay::write_mark(tree, 0).map_err(|e| o.db(e))?;
            tree.insert(keys::META_FORMAT, codec::encode(&keys::STORE_FORMAT))
                .map_err(|e| o.db(e))?;
            tree.flush().map_err(|e| o.db(e))?;
            files
                .sync()
                .map_err(|e| o.io("syncing the new database's files", e))?;
            keys::STORE_FORMAT
        }
        Some(v) => match codec::decode::<u64>(&v) {
            Ok(
                f @ (keys::STORE_FORMAT
                | keys::STORE_FORMAT_V9
                | keys::STORE_FORMAT_V8
                | keys::STORE_FORMAT_V7
                | keys::STORE_FORMAT_V6
                | keys::STORE_FORMAT_V5
                | keys::STORE_FORMAT_V4
                | keys::STORE_FORMAT_V3
                | keys::STORE_FORMAT_V2
                | keys::STORE_FORMAT_V1),
            ) => f,
            Ok(other) => return Err(o.format_error(other.to_string())),
            Err(e) => return Err(o.format_error(format!("unreadable ({e})"))),
        },
    };
    if !read_only && !files::has_marker(o.dir) {
        files::write_marker(o.dir).map_err(|e| o.io("writing berth.dir", e))?;
    }
    Ok(format)
}

/// Step 4½, for a dir of format 3 or older: its `c` keys move from the
/// default tree to their own (format 4, see `overlay::Trees`). Copied,
/// then deleted: a crash in between leaves the copies, and the next open
/// (the format is still old) copies the same values again. `reapply` then
/// writes the current format.
fn move_counters(o: &Opening<'_>) -> Result<(), OpenError> {
    let mut moved = Vec::new();
    for item in o.tree.scan_prefix([COUNTER]) {
        let (k, v) = item.map_err(|e| o.db(e))?;
        o.trees.counters.insert(&k, v).map_err(|e| o.db(e))?;
        moved.push(k);
    }
    for k in moved {
        o.tree.remove(k).map_err(|e| o.db(e))?;
    }
    Ok(())
}

/// What [`reapply`] found.
struct Replayed {
    /// The key (first event number) of the last commit record.
    last_record: u64,
    next_id: u64,
    next_seq: u64,
}

impl Replayed {
    /// Where the database's state goes on, as a high-water mark says it.
    fn found(&self) -> Mark {
        Mark {
            next_event: self.next_seq,
            next_id: self.next_id,
        }
    }
}

/// Step 5's check: the re-applied database reaches the data dir's
/// high-water mark (`mark`, read before anything else, and refused there,
/// before sled opens, when it cannot be read; see `high_mark`), or it is
/// refused as damaged, and nothing it re-applied is flushed.
/// Returns the mark.
fn check_high_mark(
    o: &Opening<'_>,
    r: &Replayed,
    mark: Option<Mark>,
) -> Result<Option<Mark>, OpenError> {
    let Some(m) = mark else {
        return Ok(None);
    };
    high_mark::check(o.dir, r.found(), m)
        .map(|()| Some(m))
        .map_err(|detail| {
            o.failed.refuse(o.tree, &detail);
            OpenError::Damaged {
                dir: o.dir.to_path_buf(),
                detail,
            }
        })
}

/// Step 5: applies again, in order, every commit record after the applied
/// mark (they may be unapplied or partly applied), and always the last one
/// (re-applying an applied record is harmless; see [`keep_positions`]). A format-1 dir has no mark,
/// and only its last record can be partly applied. Then `next_id` is raised
/// past the highest task id.
/// Step 5's first half: the commits in the write-ahead log (`wal`) from
/// sled's last record on go (back) into sled, so that `reapply` finds them.
/// sled's last record is written again: sled may hold it torn. The log must
/// go on from that record; if it begins later, commits that were
/// acknowledged are missing and the dir is refused. A frame cut short at
/// the log's end (a commit never acknowledged) is logged; damage before the
/// end refuses the dir, saying where.
/// Step 3's first half, before sled opens (which writes: a refused open
/// must leave the data dir as it was): reads the write-ahead log and
/// refuses one damaged before its end. Acknowledged commits may be in or
/// after the damage: refused, not guessed.
fn read_wal(dir: &Path, db: &Path) -> Result<wal::Replay, OpenError> {
    let mut found = wal::read(db).map_err(|source| OpenError::Io {
        dir: dir.to_path_buf(),
        op: "reading the write-ahead log (db/wal)",
        source,
    })?;
    // To read, `db` is a private copy: messages name the data dir's files.
    let shown = dir.join(files::DB).join(wal::DIR);
    let own = |why: &str| {
        why.replace(
            &db.join(wal::DIR).display().to_string(),
            &shown.display().to_string(),
        )
    };
    found.torn = found.torn.as_deref().map(own);
    if let Some(why) = &found.damage {
        let why = own(why);
        return Err(OpenError::Damaged {
            dir: dir.to_path_buf(),
            detail: format!(
                "its write-ahead log is damaged before its end: {why}; the commits from there \
                 on cannot be trusted (to open without them, move that segment and the ones \
                 after it out of {})",
                shown.display()
            ),
        });
    }
    Ok(found)
}

fn replay_wal(o: &Opening<'_>, found: &wal::Replay) -> Result<usize, OpenError> {
    if let Some(why) = &found.torn {
        log::info!(
            "{}: the write-ahead log ends with a write cut short, a commit that was never \
             acknowledged: {why}",
            o.dir.display()
        );
    }
    let last = records::last_seq(o.tree).map_err(|e| o.db(e))?;
    let todo: Vec<&wal::Frame> = found
        .frames
        .iter()
        .filter(|f| last.is_none_or(|l| f.first_seq >= l))
        .collect();
    let Some(first) = todo.first() else {
        return Ok(0);
    };
    // Where sled's log ends: after its last record, or (none) where the log
    // starts.
    let ends = match last {
        Some(l) if first.first_seq <= l => None,
        Some(l) => Some(
            records::read(o.tree, l, l)
                .next()
                .and_then(|r| r.ok())
                .and_then(|r| r.record().ok())
                .and_then(|r| r.events.last().map(|e| e.seq + 1)),
        ),
        None => Some(
            match o.tree.get(keys::META_LOG_START).map_err(|e| o.db(e))? {
                Some(v) => codec::decode::<u64>(&v).ok(),
                None => Some(1),
            },
        ),
    };
    if let Some(ends) = ends
        && ends != Some(first.first_seq)
    {
        let ends = ends.map_or("(unreadable)".to_string(), |e| format!("before event {e}"));
        return Err(OpenError::Damaged {
            dir: o.dir.to_path_buf(),
            detail: format!(
                "its write-ahead log goes on at event {} but the database's log ends {ends}: \
                 acknowledged commits are missing",
                first.first_seq
            ),
        });
    }
    put_back(o, &todo)
}

fn put_back(o: &Opening<'_>, frames: &[&wal::Frame]) -> Result<usize, OpenError> {
    for f in frames {
        records::writes(f.first_seq, &f.body)
            .apply(o.tree)
            .map_err(|e| o.db(e))?;
    }
    if let (Some(a), Some(b)) = (frames.first(), frames.last()) {
        log::info!(
            "{}: {} commit(s) from the write-ahead log put back (events {} to {})",
            o.dir.display(),
            frames.len(),
            a.first_seq,
            b.next_seq - 1
        );
    }
    Ok(frames.len())
}

fn reapply(
    o: &Opening<'_>,
    format: u64,
    corrupt: &mut Vec<CorruptRecord>,
) -> Result<Replayed, OpenError> {
    let tree = o.tree;
    let mut last_record = records::last_seq(tree).map_err(|e| o.db(e))?.unwrap_or(0);
    let mark = match tree.get(keys::META_APPLIED).map_err(|e| o.db(e))? {
        Some(v) if format != keys::STORE_FORMAT_V1 => {
            codec::decode::<u64>(&v).unwrap_or_else(|e| {
                corrupt.push(CorruptRecord::new(keys::META_APPLIED, e));
                0
            })
        }
        Some(_) | None if format == keys::STORE_FORMAT_V1 => last_record.saturating_sub(1),
        // A format-2 or 3 dir always has its mark; without it, re-apply everything.
        _ => 0,
    };
    let (mut next_id, mut next_seq) = (1, 1);
    let from = (mark + 1).min(last_record.max(1));
    // A record in pieces that do not make it whole, with no record after
    // it (see below); one with a record after it is a corrupt record.
    let mut torn: Option<(u64, Vec<sled::IVec>, CorruptRecord)> = None;
    for item in records::read(tree, from, u64::MAX) {
        if let Some((_, _, c)) = torn.take() {
            corrupt.push(c);
        }
        let l = match item {
            Ok(l) => l,
            Err(records::Unread::Torn { seq, keys, record }) => {
                // Never numbered again, whatever it held.
                next_seq = seq + 1;
                torn = Some((seq, keys, record));
                continue;
            }
            Err(records::Unread::BadKey(c)) => {
                corrupt.push(c);
                continue;
            }
            Err(records::Unread::Db(e)) => return Err(o.db(e)),
        };
        match l.record() {
            Ok(mut rec) => {
                if l.seq <= mark {
                    keep_positions(tree, &mut rec.writes).map_err(|e| o.db(e))?;
                }
                o.trees.apply_writes(&rec.writes).map_err(|e| o.db(e))?;
                next_id = rec.next_id;
                next_seq = rec.events.last().map_or(1, |e| e.seq + 1);
            }
            // Pieces that do not decode: torn.
            Err(record) if l.in_pieces() => {
                next_seq = l.seq + 1;
                torn = Some((l.seq, l.keys, record));
            }
            Err(record) => {
                corrupt.push(record);
                next_seq = l.seq + 1;
            }
        }
    }
    if let Some((seq, keys, why)) = torn {
        // The log's last record, in pieces that are not whole, and not in
        // the write-ahead log (`replay_wal` would have put it back whole):
        // its commit was never acknowledged. The applier writes a record's
        // pieces one by one, and a sled flush (or the sled batch of a store
        // without the log, which sled 0.34 can keep part of when it fails
        // to write it) may have kept some of them before a crash or the
        // error that stopped the store. Its pieces go, and the next commit
        // takes its number.
        log::warn!(
            "{}: the last commit record (event {seq} on) was cut short by a crash or by the \
             failure that stopped the store, and was never acknowledged; removing it ({})",
            o.dir.display(),
            why.reason
        );
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k);
        }
        tree.apply_batch(batch).map_err(|e| o.db(e))?;
        last_record = records::last_seq(tree).map_err(|e| o.db(e))?.unwrap_or(0);
        next_seq = seq;
    }

    overlay::write_mark(tree, last_record).map_err(|e| o.db(e))?;
    if format != keys::STORE_FORMAT {
        // Upgrade: format 1 now has its mark; format 2 (and 1) records stay
        // as they are, readable as version-1 records.
        tree.insert(keys::META_FORMAT, codec::encode(&keys::STORE_FORMAT))
            .map_err(|e| o.db(e))?;
    }
    for prefix in [TASK, HISTORY] {
        if let Some((k, _)) = tree
            .scan_prefix([prefix])
            .next_back()
            .transpose()
            .map_err(|e| o.db(e))?
            && let Some(id) = keys::parse_id_key(&k)
        {
            next_id = next_id.max(id + 1);
        }
    }
    Ok(Replayed {
        last_record,
        next_id,
        next_seq,
    })
}

/// For a record the applied mark covers, re-applied all the same (the
/// log's last one): a live task's value it writes as a record alone (a
/// format-6 record) keeps the position the tree's value holds, which a fold
/// gave it (`fold_queue_keys`) after the record was first applied. Without
/// this, opening a folded dir again before its first commit would take
/// those tasks out of their queues.
fn keep_positions(tree: &sled::Db, writes: &mut [KeyWrite]) -> Result<(), sled::Error> {
    for w in writes {
        let Some(v) = w.value.as_mut() else {
            continue;
        };
        if w.key.first() != Some(&TASK) || stored::split(v).position.is_some() {
            continue;
        }
        if let Some(now) = tree.get(&w.key)?
            && let Some(p) = stored::split(&now).position
        {
            *v = stored::with_position(p, v);
        }
    }
    Ok(())
}

/// How many `q` keys one sled batch of [`fold_queue_keys`] folds.
const FOLD_BATCH: usize = 10_000;

/// Step 5½: a dir written by store format 6 or older keeps each queue
/// position in a `q` key; each goes into its task's value (`stored`), in
/// sled batches that each put the values and remove their `q` keys, so a
/// crash between two leaves every position in one place or the other, and
/// the next open folds the rest. A `q` key whose task already holds that
/// position (a format-6 record re-applied) just goes. One that is malformed,
/// names a task that is not live, or gives a task a second position is a
/// corrupt record, and stays. Returns how many were folded.
fn fold_queue_keys(
    o: &Opening<'_>,
    read_only: bool,
    corrupt: &mut Vec<CorruptRecord>,
) -> Result<usize, OpenError> {
    let mut folded = 0;
    let mut seen = std::collections::HashSet::new();
    let mut batch = sled::Batch::default();
    let mut in_batch = 0;
    for item in o.tree.scan_prefix([QUEUE]) {
        let (k, v) = item.map_err(|e| o.db(e))?;
        let Some((queue, pos)) = keys::parse_queue_key_ref(&k) else {
            corrupt.push(CorruptRecord::new(&k, "malformed queue key"));
            continue;
        };
        let id = match codec::decode::<u64>(&v) {
            Ok(id) => id,
            Err(e) => {
                corrupt.push(CorruptRecord::new(&k, e));
                continue;
            }
        };
        let tk = keys::id_key(TASK, id);
        let Some(tv) = o.tree.get(tk).map_err(|e| o.db(e))? else {
            corrupt.push(CorruptRecord::new(
                &k,
                format!("a queue position of task {id}, which is not live"),
            ));
            continue;
        };
        let wanted = stored::position_bytes(queue, pos);
        match stored::split(&tv).position {
            Some(p) if p == wanted.as_slice() => {}
            None if seen.insert(id) => {
                batch.insert(&tk[..], stored::with_position(&wanted, &tv));
                folded += 1;
            }
            _ => {
                corrupt.push(CorruptRecord::new(
                    &k,
                    format!("task {id} is in more than one queue position"),
                ));
                continue;
            }
        }
        batch.remove(k);
        in_batch += 1;
        if in_batch == FOLD_BATCH {
            o.tree
                .apply_batch(std::mem::take(&mut batch))
                .map_err(|e| o.db(e))?;
            in_batch = 0;
        }
    }
    if in_batch > 0 {
        o.tree.apply_batch(batch).map_err(|e| o.db(e))?;
    }
    if folded > 0 && !read_only {
        log::info!(
            "{}: {folded} queue position(s) of store format 6 moved into their tasks' records",
            o.dir.display()
        );
    }
    Ok(folded)
}

/// Step 6, continued: every kind's counters from the `c` keys, and the
/// event where counting began (`mcounted`; without it, counting begins
/// with the next event). A corrupt record is reported, and its kind counts
/// again from zero.
fn load_counts(
    o: &Opening<'_>,
    next_seq: u64,
    corrupt: &mut Vec<CorruptRecord>,
) -> Result<Counting, OpenError> {
    let mut counting = Counting {
        since: next_seq,
        ..Counting::default()
    };
    if let Some(v) = o.tree.get(keys::META_COUNTED).map_err(|e| o.db(e))? {
        match codec::decode::<u64>(&v) {
            Ok(since) => {
                counting.since = since;
                counting.stored = true;
            }
            Err(e) => corrupt.push(CorruptRecord::new(keys::META_COUNTED, e)),
        }
    }
    for item in o.trees.counters.scan_prefix([COUNTER]) {
        let (k, v) = item.map_err(|e| o.db(e))?;
        let kind = String::from_utf8_lossy(&k[1..]).into_owned();
        match codec::decode::<KindCounts>(&v) {
            Ok(c) => {
                counting.counts.insert(kind, c);
            }
            Err(e) => corrupt.push(CorruptRecord::new(&k, e)),
        }
    }
    Ok(counting)
}

/// What steps 4 to 6 read from the tree.
struct Loaded {
    files: Arc<DbFiles>,
    /// To write: the write-ahead log, empty.
    wal: Option<Arc<Wal>>,
    /// The high-water mark the data dir has now.
    mark: Option<Mark>,
    replayed: Replayed,
    order: Order,
    counting: Counting,
    corrupt: Vec<CorruptRecord>,
    /// The live tasks' pass, for a writable open.
    live: Option<LiveScan>,
}

/// What one pass over the live tasks found: the queue positions (the
/// order index's entries), the tasks that were running (id, attempt,
/// start), the TTL deadlines, the records it could not read.
#[derive(Default)]
struct LiveScan {
    entries: Vec<(order::Name, i64, u64)>,
    interrupted: Vec<(u64, u32, Option<u64>)>,
    deadlines: Deadlines,
    corrupt: Vec<CorruptRecord>,
}

impl LiveScan {
    fn merge(&mut self, other: LiveScan) {
        self.entries.extend(other.entries);
        self.interrupted.extend(other.interrupted);
        self.deadlines.merge(other.deadlines);
        self.corrupt.extend(other.corrupt);
    }
}

/// Step 6: one pass over the live tasks, in two threads (each a half of
/// their ids). To read, only each task's position is decoded; to write,
/// its record too, for the running tasks and the deadlines. A position
/// still counts when its task's record is damaged: its queue stops there.
fn scan_live(tree: &sled::Db, records: bool) -> Result<LiveScan, sled::Error> {
    let id_of = |k: Option<Result<(sled::IVec, sled::IVec), sled::Error>>| {
        k.transpose()
            .map(|kv| kv.and_then(|(k, _)| keys::parse_id_key(&k)))
    };
    let (Some(lo), Some(hi)) = (
        id_of(tree.scan_prefix([TASK]).next())?,
        id_of(tree.scan_prefix([TASK]).next_back())?,
    ) else {
        return scan_range(tree, vec![TASK], vec![TASK + 1], records);
    };
    let mid = keys::id_key(TASK, lo + (hi - lo) / 2).to_vec();
    std::thread::scope(|scope| {
        let upper = mid.clone();
        let low = scope.spawn(move || scan_range(tree, vec![TASK], upper, records));
        let high = scan_range(tree, mid, vec![TASK + 1], records)?;
        // In id order, as one pass finds them.
        let mut scan = low
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        scan.merge(high);
        Ok(scan)
    })
}

/// [`scan_live`] over the keys from `from` to before `to`.
fn scan_range(
    tree: &sled::Db,
    from: Vec<u8>,
    to: Vec<u8>,
    records: bool,
) -> Result<LiveScan, sled::Error> {
    let mut scan = LiveScan::default();
    // One shared name per queue.
    let mut names: std::collections::HashMap<String, order::Name> = Default::default();
    for item in tree.range(from..to) {
        let (k, v) = item?;
        let Some(id) = keys::parse_id_key(&k) else {
            scan.corrupt
                .push(CorruptRecord::new(&k, "malformed live task key"));
            continue;
        };
        // To write, a record is decoded only if the value has no summary
        // (format 7), or the summary or the record's frame is damaged, or
        // it says the task was running.
        let summary = records.then(|| stored::summary(&v)).flatten();
        let decode = records && summary.is_none_or(|s| s.id != id || s.running);
        let (position, task) = match decode {
            true => {
                let (p, t) = stored::decode_live(&v);
                (p, Some(t))
            }
            false => (stored::position(&v), None),
        };
        if let Some(s) = summary.filter(|_| !decode)
            && let Some(at) = s.deadline
        {
            scan.deadlines.add_at(id, at);
        }
        match position {
            Ok(Some((queue, pos))) => {
                let name = match names.get(&queue) {
                    Some(n) => n.clone(),
                    None => names
                        .entry(queue)
                        .or_insert_with_key(|q| q.as_str().into())
                        .clone(),
                };
                scan.entries.push((name, pos, id));
            }
            Ok(None) => {}
            Err(e) => scan
                .corrupt
                .push(CorruptRecord::new(&k, format!("its queue position: {e}"))),
        }
        let Some(task) = task else {
            continue;
        };
        match task {
            Ok(t) if t.id != id => scan.corrupt.push(CorruptRecord::new(
                &k,
                format!("the record under it is task {}", t.id),
            )),
            Ok(t) if t.status == Status::Running => {
                scan.interrupted.push((t.id, t.attempts, t.started_at))
            }
            Ok(t) => scan.deadlines.add(&t),
            Err(e) => scan.corrupt.push(CorruptRecord::new(&k, e)),
        }
    }
    Ok(scan)
}

/// An `OpenError` for a panic of sled's while it read the database.
fn damaged(dir: &Path, panic: String) -> OpenError {
    OpenError::Damaged {
        dir: dir.to_path_buf(),
        detail: format!("sled panicked while reading it: {panic}"),
    }
}

impl Store {
    /// Opens (and if asked, creates) the data dir, recovering interrupted
    /// tasks. The steps are in this module's doc.
    pub fn open(dir: &Path, opts: Options, clock: SharedClock) -> Result<Store, OpenError> {
        opts.budget.validate().map_err(OpenError::Options)?;
        prepare_dir(dir, &opts)?;
        let lock = lock_dir(dir, &opts)?;
        // Before the copy below: the mark a running daemon writes later may
        // cover commits the copy has not got (see `high_mark`).
        // A mark that cannot be read refuses the dir before sled opens (and
        // writes): a refused open leaves the data dir as it was.
        let mark = high_mark::read(dir).map_err(|e| match e {
            high_mark::MarkError::NotAllowed(source) => OpenError::Io {
                dir: dir.to_path_buf(),
                op: "reading its high-water mark (berth.high)",
                source,
            },
            high_mark::MarkError::Damaged(why) => OpenError::Damaged {
                dir: dir.to_path_buf(),
                detail: format!(
                    "its high-water mark {} is damaged: {why}; to open the data dir without \
                     that check, remove it",
                    dir.join(high_mark::FILE).display()
                ),
            },
        })?;
        // Before the copy too: a missing `db/` is a lost database, not a
        // failed copy.
        if let Err(files::Damage::Lost(what)) = files::check_not_lost(dir) {
            return Err(OpenError::Lost {
                dir: dir.to_path_buf(),
                what,
            });
        }
        // To read, sled opens a private copy: it writes when it opens (a
        // snapshot), and the data dir may be read-only.
        let copy = match opts.read_only {
            true => Some(
                files::copy_for_reading(dir).map_err(|source| OpenError::Io {
                    dir: dir.to_path_buf(),
                    op: "copying db/ to read it privately",
                    source,
                })?,
            ),
            false => None,
        };
        let db = copy.as_ref().map_or(dir, |c| c.path()).join(files::DB);
        let wal_found = read_wal(dir, &db)?;
        let trees = open_sled(dir, &db, &opts)?;
        let failed = Arc::new(Failed::default());
        // sled panics on some damaged pages only when they are read: every
        // read of the open is under `panics::catch`.
        let loaded = panics::catch(|| {
            let o = Opening {
                dir,
                tree: &trees.main,
                trees: &trees,
                failed: &failed,
            };
            let files = match opts.read_only {
                true => DbFiles::read_only(&db),
                false => DbFiles::open(dir, opts.power_safe),
            };
            let files = Arc::new(files.map_err(|e| o.io("listing the database's files", e))?);
            let format = check_format(&o, &files, opts.read_only)?;
            if format < keys::STORE_FORMAT_V4 {
                move_counters(&o)?;
            }
            let mut corrupt = Vec::new();
            replay_wal(&o, &wal_found)?;
            let replayed = reapply(&o, format, &mut corrupt)?;
            let mut mark = check_high_mark(&o, &replayed, mark)?;
            // To read, in the private copy: the data dir stays as it is.
            fold_queue_keys(&o, opts.read_only, &mut corrupt)?;
            // To write: sled now holds every commit; the log starts empty.
            let wal = match opts.read_only {
                true => None,
                false => {
                    super::db::flush_durable(o.tree, &files, o.failed)
                        .map_err(|e| o.io("flushing and syncing the recovered database", e))?;
                    let wal = Wal::open(&db, opts.power_safe, opts.sled_flush_every)
                        .map_err(|e| o.io("opening the write-ahead log (db/wal)", e))?;
                    wal.clear()
                        .map_err(|e| o.io("emptying the write-ahead log (db/wal)", e))?;
                    // A mark that cannot be written (a full disk) leaves the
                    // older one, still behind the disk: the open goes on.
                    if opts.power_safe && mark != Some(replayed.found()) {
                        match high_mark::write(dir, &replayed.found()) {
                            Ok(()) => mark = Some(replayed.found()),
                            Err(e) => log::warn!(
                                "{}: cannot write the high-water mark ({}): {e}",
                                dir.display(),
                                high_mark::FILE
                            ),
                        }
                    }
                    opts.write_ahead_log.then(|| Arc::new(wal))
                }
            };
            let mut live = scan_live(o.tree, !opts.read_only).map_err(|e| o.db(e))?;
            corrupt.append(&mut live.corrupt);
            let (order, twice) = Order::load(std::mem::take(&mut live.entries));
            // Each id has one key: never a second position (kept as a check).
            for (q, pos, id) in twice {
                corrupt.push(CorruptRecord::new(
                    &keys::id_key(TASK, id),
                    format!("a second queue position ({pos} in queue '{q}')"),
                ));
            }
            let live = (!opts.read_only).then_some(live);
            let counting = load_counts(&o, replayed.next_seq, &mut corrupt)?;
            Ok(Loaded {
                files,
                wal,
                mark,
                replayed,
                order,
                counting,
                corrupt,
                live,
            })
        })
        .map_err(|panic| {
            failed.fail(&trees.main, &panic);
            damaged(dir, panic)
        })??;
        let mut loaded = loaded;
        let live = loaded.live.take();
        let lock = lock.map(DirLock::opened);
        let mut store = Store::start(dir, opts, clock, lock, trees, failed, loaded)?;
        store.read_copy = copy;
        let Some(live) = live else {
            // Reading shows the data dir as it is: a task that was running
            // when its daemon stopped is still `running` here.
            return Ok(store);
        };
        let recovered = panics::catch(|| store.recover(live)).map_err(|panic| {
            store.failed.fail(&store.trees.main, &panic);
            damaged(dir, panic)
        })?;
        recovered.map_err(|source| OpenError::Recover {
            dir: dir.to_path_buf(),
            source: Box::new(source),
        })?;
        for c in store.corrupt_records() {
            log::warn!("{}: {c}", dir.display());
        }
        Ok(store)
    }

    /// Step 7's first half: starts the applier (and the batched flusher)
    /// and assembles the store.
    fn start(
        dir: &Path,
        opts: Options,
        clock: SharedClock,
        lock: Option<DirLock>,
        trees: Trees,
        failed: Arc<Failed>,
        loaded: Loaded,
    ) -> Result<Store, OpenError> {
        let io = |op| {
            move |source| OpenError::Io {
                dir: dir.to_path_buf(),
                op,
                source,
            }
        };
        let Loaded {
            files,
            wal,
            mark,
            replayed,
            order,
            counting,
            corrupt,
            live: _,
        } = loaded;
        let overlay = Arc::new(Overlay::new(replayed.last_record));
        let applier = overlay
            .spawn(trees.clone(), failed.clone())
            .map_err(io("starting the applier thread"))?;
        let commit = Arc::new(GroupCommit::default());
        let flusher = match opts.durability {
            Durability::Batched { interval } if !opts.read_only => Some(
                super::db::spawn_flusher(
                    trees.clone(),
                    files.clone(),
                    wal.clone(),
                    failed.clone(),
                    commit.clone(),
                    interval,
                )
                .map_err(io("starting the flusher thread"))?,
            ),
            _ => None,
        };
        let sled_flusher = match &wal {
            Some(wal) => Some(
                super::db::spawn_sled_flusher(
                    trees.clone(),
                    overlay.clone(),
                    wal.clone(),
                    files.clone(),
                    failed.clone(),
                )
                .map_err(io("starting the sled flusher thread"))?,
            ),
            None => None,
        };
        Ok(Store {
            trees,
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                order,
                next_id: replayed.next_id,
                next_seq: replayed.next_seq,
                counting,
                deadlines: None,
                groups: Default::default(),
                children: Default::default(),
                warm: Default::default(),
            }),
            commit,
            clock,
            budget: opts.budget,
            durability: opts.durability,
            reserve: opts.disk_reserve,
            space: crate::store::health::Space::new(dir),
            overlay,
            files,
            applier: Some(applier),
            corrupt,
            recovered: Vec::new(),
            failed,
            flusher,
            wal,
            sled_flusher,
            read_only: opts.read_only,
            high_mark: Mutex::new(mark),
            marks: opts.power_safe && !opts.read_only,
            discard: Mutex::new(None),
            _lock: lock,
            read_copy: None,
        })
    }

    /// Step 7's second half: puts tasks that were running when the process died back to
    /// waiting: one `failed` event each with [`INTERRUPTED`] and no delay,
    /// after an `attempt-logged` event whose outcome is `interrupted`, in one
    /// ordinary commit. They keep their place at the head. A group child's
    /// interrupted attempt counts on its parent as any failed attempt of a
    /// child does (`failures`, its `Errors:` line), in the same commit:
    /// whoever opens the dir next, a daemon or a command, and whenever it
    /// is killed, the parent never misses it.
    fn recover(&mut self, live: LiveScan) -> Result<(), WriteError> {
        let LiveScan {
            interrupted,
            deadlines,
            ..
        } = live;
        // The same one pass over the live tasks built the TTL deadlines.
        self.lock_inner().deadlines = Some(deadlines);
        if interrupted.is_empty() {
            return Ok(());
        }
        let mut txn = self.write();
        let now = txn.now();
        let mut parents: BTreeMap<u64, u32> = BTreeMap::new();
        for &(id, attempt, started_at) in &interrupted {
            txn.log_attempt(id, AttemptLog::interrupted(attempt, started_at, now))?;
            txn.fail(id, INTERRUPTED.to_string(), None)?;
            if let Some(p) = txn.task(id)?.parent {
                *parents.entry(p).or_default() += 1;
            }
        }
        let mut cancelled = Vec::new();
        for (parent, failures) in parents {
            // A parent that is gone or unreadable has nothing to update
            // (the corrupt record is reported with the others).
            let g = match txn.group_progress(parent, failures) {
                Ok(g) => g,
                Err(WriteError::NoSuchTask(_) | WriteError::Corrupt(_)) => continue,
                Err(e) => return Err(e),
            };
            txn.update_group(parent, g.name, g.failures, g.message)?;
            if cancel_under_way(&mut txn, parent)? {
                // The cancel waited for these children's handlers to stop
                // when the process died: it ends now, as it would have.
                txn.cancel(parent, &|_| false)?;
                cancelled.push(parent);
            }
        }
        txn.commit()?;
        if !cancelled.is_empty() {
            log::info!(
                "{}: the cancel of group(s) {cancelled:?} was under way; they ended cancelled",
                self.dir().display()
            );
        }
        let interrupted: Vec<u64> = interrupted.into_iter().map(|(id, _, _)| id).collect();
        log::info!(
            "{}: {} interrupted task(s) put back to wait: {:?}",
            self.dir().display(),
            interrupted.len(),
            interrupted
        );
        self.recovered = interrupted;
        Ok(())
    }
}

/// Whether a cancel of group `parent` was under way when the process died:
/// a child is cancelled only with its group (`WriteTxn::cancel` refuses a
/// child alone), and a group whose children do not run ends in the same
/// commit as they do, so a live group with a cancelled child is one whose
/// cancel waited for its running children.
fn cancel_under_way(txn: &mut WriteTxn<'_>, parent: u64) -> Result<bool, WriteError> {
    let children = txn.task(parent)?.children.clone();
    for &c in children.iter() {
        if txn.peek(c)?.is_some_and(|t| t.status == Status::Cancelled) {
            return Ok(true);
        }
    }
    Ok(false)
}

//! The files of a data dir: made durable, kept private, and checked before
//! sled reads them.
//!
//! **Durable.** sled 0.34 flushes its log (`db/db`) with `sync_file_range`.
//! That survives a process crash, but not a power cut: it does not flush the
//! drive's cache or the file's size, and sled 0.34 never syncs its `conf`,
//! its snapshots or the directories that hold them. [`DbFiles::sync`] runs
//! after every sled flush and before any commit it covers is acknowledged:
//! it `fdatasync`s the log, and `fsync`s each new file in `db/` (a snapshot
//! renamed into place) and then `db/`. Blob files (`db/blobs/*`, values over
//! about 128 KiB) are synced by berth's sled itself, with `blobs/`, before a
//! log message can point to one (`vendor/sled/BERTH.md`, which also says
//! why its log is synced before it may reuse log space); a flush lists
//! them only to keep a second name of each ([`KEPT_BLOBS`]).
//! [`DbFiles::open`] syncs everything once (blob files an older sled left
//! too), and the data dir itself.
//!
//! **Private.** The data dir and `db/` are mode 0700 and every file berth or
//! sled creates is 0600, whatever the umask: directories are created and
//! chmod-ed here, sled's files are chmod-ed when they are first synced,
//! except blob files, which berth's sled creates 0600.
//!
//! **Checked.** A data dir that ever held a store has a marker file,
//! `berth.dir`, written (and synced) once its database exists. If the marker
//! is there but the database is missing or empty, the data was lost (a
//! power cut before an older berth synced, or files deleted) and opening
//! refuses instead of starting a new, empty store. Leftovers of an
//! interrupted sled snapshot (`db/snap.*.generating`), which sled would
//! otherwise read as a corrupt snapshot for ever, are removed before sled
//! opens.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::store::dirwatch::DirWatch;

/// The marker file: this data dir has held a berth store.
pub const MARKER: &str = "berth.dir";
/// sled's directory inside the data dir.
pub const DB: &str = "db";

const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// Creates `dir` (and its parents) if missing, and makes it mode 0700.
pub(crate) fn private_dir(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)?;
    }
    set_mode(dir, DIR_MODE)
}

/// Sets a file's or directory's mode unless it already has it.
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    let meta = fs::metadata(path)?;
    if meta.mode() & 0o7777 != mode {
        fs::set_permissions(path, Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Opens (creating it with mode 0600) a file in a data dir, read-write.
pub(crate) fn open_private(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)?;
    if f.metadata()?.mode() & 0o7777 != FILE_MODE {
        f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(f)
}

/// Creates a new file (it must not exist) with mode 0600, read-write.
pub(crate) fn create_private(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)?;
    if f.metadata()?.mode() & 0o7777 != FILE_MODE {
        f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(f)
}

pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What is wrong with a data dir's files before sled may read them.
#[derive(Debug)]
pub(crate) enum Damage {
    /// The marker says a store lived here, but its database is gone or empty.
    Lost(String),
}

/// Removes what an interrupted sled snapshot left in `db` (a
/// `snap.*.generating` file, which sled would read as a corrupt snapshot for
/// ever); returns what it removed. Nothing else writes those names while
/// the data dir's lock is held.
pub(crate) fn remove_leftovers(db: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    if let Ok(entries) = fs::read_dir(db) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("snap.") && name.ends_with(".generating") {
                let path = e.path();
                if fs::remove_file(&path).is_ok() {
                    removed.push(path);
                }
            }
        }
    }
    removed
}

/// Checks, before sled opens it, that a data dir whose marker says it held
/// a store still has its database.
pub(crate) fn check_not_lost(dir: &Path) -> Result<(), Damage> {
    if !dir.join(MARKER).exists() {
        return Ok(());
    }
    let db = dir.join(DB);
    let size = |name: &str| fs::metadata(db.join(name)).ok().map(|m| m.len());
    let lost = match (db.exists(), size("conf"), size("db")) {
        (false, _, _) => Some(format!("its database folder {} is missing", db.display())),
        (true, _, _) if !db.is_dir() => Some(format!(
            "its database folder {} is not a folder",
            db.display()
        )),
        (true, None, _) => Some(format!("{} is missing", db.join("conf").display())),
        // sled treats a conf of 8 bytes or less as absent.
        (true, Some(0), _) => Some(format!("{} is empty (0 bytes)", db.join("conf").display())),
        (true, Some(n), _) if n <= 8 => Some(format!(
            "{} is cut short ({n} bytes, too few to hold a config)",
            db.join("conf").display()
        )),
        (true, _, None) => Some(format!("{} is missing", db.join("db").display())),
        (true, _, Some(0)) => Some(format!("{} is empty (0 bytes)", db.join("db").display())),
        _ => None,
    };
    match lost {
        Some(what) => Err(Damage::Lost(what)),
        None => Ok(()),
    }
}

/// Writes the marker (and makes it and its directory entry durable).
pub(crate) fn write_marker(dir: &Path) -> io::Result<()> {
    let path = dir.join(MARKER);
    let mut f = open_private(&path)?;
    f.set_len(0)?;
    f.write_all(b"berth data dir: the database in db/ belongs to berth; do not delete it alone\n")?;
    f.sync_all()?;
    fsync_dir(dir)
}

pub(crate) fn has_marker(dir: &Path) -> bool {
    dir.join(MARKER).exists()
}

/// Whether `dir` looks like a berth data dir: it has the marker, or (made
/// by a berth from before the marker) a sled database.
pub(crate) fn is_data_dir(dir: &Path) -> bool {
    has_marker(dir) || dir.join(DB).join("conf").exists()
}

/// Whether `dir` holds nothing but names berth gives its own files (an
/// empty folder, or one where a first open stopped early, or whose `db` is
/// a link made on purpose): such a folder may become a data dir.
pub(crate) fn holds_only_berth_names(dir: &Path) -> bool {
    const OWN: [&str; 5] = [DB, MARKER, "berth.lock", "berth.sock", "berth.starting"];
    if !dir.exists() {
        return true;
    }
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .all(|e| OWN.iter().any(|n| e.file_name() == *n))
    })
}

/// Copies sled's files (`DIR/db`, with its blob files) into a new private
/// temporary folder, for reading a data dir that cannot be written (sled
/// writes when it opens). The copy goes when the returned folder is dropped.
pub(crate) fn copy_for_reading(dir: &Path) -> io::Result<tempfile::TempDir> {
    let tmp = tempfile::Builder::new().prefix("berth-read-").tempdir()?;
    let from = dir.join(DB);
    let to = tmp.path().join(DB);
    // An error names the data dir's file it was about.
    fn at(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
        move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    }
    let mut stack = vec![(from, to)];
    while let Some((from, to)) = stack.pop() {
        DirBuilder::new().mode(DIR_MODE).create(&to)?;
        for e in fs::read_dir(&from).map_err(at(&from))? {
            let e = e.map_err(at(&from))?;
            let (src, dst) = (e.path(), to.join(e.file_name()));
            if e.file_type().map_err(at(&src))?.is_dir() {
                stack.push((src, dst));
            } else if from.ends_with(super::wal::DIR) && super::wal::is_spare(&e.file_name()) {
                // 16 MiB of zeros that reading never looks at.
            } else {
                fs::copy(&src, &dst).map_err(at(&src))?;
                fs::set_permissions(&dst, Permissions::from_mode(FILE_MODE))?;
            }
        }
    }
    Ok(tmp)
}

/// What [`DbFiles::sync`] remembers between flushes.
#[derive(Debug)]
struct Synced {
    in_db: BTreeSet<OsString>,
    /// The blob names the kept names were last brought up to date with.
    kept_for: Option<BTreeSet<OsString>>,
    /// Tells when a name changed in `db/` or `db/blobs/` (None: it could
    /// not be set up, and every sync lists both).
    watch: Option<DirWatch>,
    /// The next sync lists both folders whatever the watch says: none was
    /// made yet, or the last one failed.
    must_list: bool,
    /// What the last listing of `db/blobs/` found (None: no such folder).
    blobs_listed: Option<BTreeSet<OsString>>,
    /// Listings made (for tests).
    listings: u64,
}

impl Synced {
    fn new(db: &Path, enabled: bool) -> Synced {
        let watch = enabled.then(DirWatch::new).flatten().filter(|w| w.add(db));
        Synced {
            in_db: BTreeSet::new(),
            kept_for: None,
            watch,
            must_list: true,
            blobs_listed: None,
            listings: 0,
        }
    }

    /// Whether this sync must list the folders (see `DbFiles::sync`). The
    /// watch's events are taken either way.
    fn must_list(&mut self) -> bool {
        match &self.watch {
            Some(w) => w.changed() | self.must_list,
            None => true,
        }
    }
}

/// sled's files, for making them durable after each flush.
#[derive(Debug)]
pub(crate) struct DbFiles {
    db: PathBuf,
    log: File,
    /// Sync at all (off only to measure what it costs).
    enabled: bool,
    /// Names already synced in `db/` and in `db/blobs/`, and the blob
    /// names (synced, listed) the kept names were last brought up to date
    /// with: most flushes change no blob, and then do no more work.
    synced: Mutex<Synced>,
}

/// Where berth keeps a second name (a hard link) for each of sled's blob
/// files that the last durable sled state may refer to.
///
/// sled deletes a blob file once the page that referred to it is written
/// anew; the deletion is a metadata change that the file system may make
/// durable at once (any `fsync`, the journal's own commit), while sled's
/// log is synced only at berth's next sled flush (`wal`). A power cut in
/// between left a durable sled log that referred to a deleted blob, which
/// sled 0.34 cannot read ("tried to serialize Uninitialized": 5 LazyFS
/// power cuts in 80). With a second name, the file's data stays; opening
/// gives it its first name back ([`restore_kept_blobs`]) before sled reads
/// anything. A kept name goes once a sync of sled's log that came after the
/// blob's deletion has returned.
pub const KEPT_BLOBS: &str = "blobs-kept";

/// Before sled opens: every kept blob whose file in `db/blobs/` is gone
/// gets it back (a hard link). Returns how many.
pub(crate) fn restore_kept_blobs(db: &Path) -> io::Result<usize> {
    let kept = db.join(KEPT_BLOBS);
    if !kept.exists() {
        return Ok(0);
    }
    let blobs = db.join("blobs");
    let mut restored = 0;
    for entry in fs::read_dir(&kept)? {
        let entry = entry?;
        let to = blobs.join(entry.file_name());
        if !to.exists() {
            private_dir(&blobs)?;
            fs::hard_link(entry.path(), &to)?;
            restored += 1;
        }
    }
    if restored > 0 {
        fsync_dir(&blobs)?;
    }
    Ok(restored)
}

impl DbFiles {
    /// Takes sled's files in `DIR/db` (after sled opened them) and makes all
    /// of them, the directories and the data dir durable and private.
    pub fn open(dir: &Path, enabled: bool) -> io::Result<DbFiles> {
        let db = dir.join(DB);
        set_mode(&db, DIR_MODE)?;
        let blobs = db.join("blobs");
        if blobs.exists() {
            set_mode(&blobs, DIR_MODE)?;
            // Once: blob files an older sled wrote (without a sync or mode
            // 0600 of its own); a flush only lists them.
            sync_new_files(&blobs, &mut BTreeSet::new(), blob_complete)?;
        }
        let log = File::open(db.join("db"))?;
        let files = DbFiles {
            synced: Mutex::new(Synced::new(&db, enabled)),
            db,
            log,
            enabled: true,
        };
        files.sync()?;
        fsync_dir(dir)?;
        Ok(DbFiles { enabled, ..files })
    }

    /// sled's files of a data dir opened read-only: nothing is synced or
    /// changed.
    pub fn read_only(db: &Path) -> io::Result<DbFiles> {
        Ok(DbFiles {
            db: db.to_path_buf(),
            log: File::open(db.join("db"))?,
            enabled: false,
            synced: Mutex::new(Synced::new(db, false)),
        })
    }

    /// Makes everything sled has written so far durable. Call it after
    /// `sled::Db::flush` returned, before acknowledging what it covered.
    pub fn sync(&self) -> io::Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        // A flush after which no name changed in `db/` or `db/blobs/` has
        // no new file to sync: it skips both listings, and the blob names
        // it would have found are those of the last one (`dirwatch`).
        let list = synced.must_list();
        let Synced {
            in_db,
            kept_for,
            watch,
            must_list,
            blobs_listed,
            listings,
        } = &mut *synced;
        let blobs = self.db.join("blobs");
        if list {
            *listings += 1;
            // Until this listing is whole, the next sync lists again.
            *must_list = true;
            // The blob files there before the log's sync: one missing from
            // it was deleted before, so the state that sync makes durable
            // no longer refers to it. sled wrote and synced each one (and
            // `blobs/`) before any log message could point to it, and made
            // it 0600 (`vendor/sled/BERTH.md`, changes 3 and 6), so this
            // only lists them. The folder is watched before it is listed,
            // so that a name that comes after is seen next time.
            *blobs_listed = match blobs.exists() {
                true => {
                    if watch.as_ref().is_some_and(|w| !w.add(&blobs)) {
                        *watch = None;
                    }
                    Some(list_names(&blobs)?)
                }
                false => None,
            };
        }
        self.log.sync_data()?;
        if list {
            sync_new_files(&self.db, in_db, |_| Ok(true))?;
            *must_list = false;
        }
        if let Some(present) = blobs_listed.clone()
            && kept_for.as_ref() != Some(&present)
        {
            self.keep_blobs(&blobs, &present)?;
            *kept_for = Some(present);
        }
        Ok(())
    }

    /// Gives every blob file listed a kept name, and drops the kept names
    /// of the blob files that were gone before the last log sync (see
    /// [`KEPT_BLOBS`]). A blob still being written for a later message may
    /// get a kept name too: a second name of a file sled has not finished
    /// is harmless, no log message on the disk points to it.
    fn keep_blobs(&self, blobs: &Path, present: &BTreeSet<OsString>) -> io::Result<()> {
        let kept = self.db.join(KEPT_BLOBS);
        private_dir(&kept)?;
        let have = list_names(&kept)?;
        let mut changed = false;
        for name in present.difference(&have) {
            match fs::hard_link(blobs.join(name), kept.join(name)) {
                Ok(()) => changed = true,
                // Deleted meanwhile: the durable state is past it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        for name in have.difference(present) {
            match fs::remove_file(kept.join(name)) {
                Ok(()) => changed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if changed {
            fsync_dir(&kept)?;
        }
        Ok(())
    }
}

/// The names in `dir`.
fn list_names(dir: &Path) -> io::Result<BTreeSet<OsString>> {
    fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

/// Whether a sled blob file is completely written: sled writes a blob as a
/// CRC-32 (little-endian) of the rest, a kind byte, and the value, and its
/// log message only after the whole file. A blob whose log message a flush
/// covered is complete when the flush returns; one being written meanwhile
/// (for a later message) fails this check and is synced at a later round.
fn blob_complete(f: &mut File) -> io::Result<bool> {
    use std::io::Read;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    if bytes.len() < 5 {
        return Ok(false);
    }
    let (crc, rest) = bytes.split_at(4);
    Ok(u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) == crc32fast::hash(rest))
}

/// Syncs (and makes private) every regular file in `dir` that is not in
/// `synced` and that `complete` accepts, then the directory itself if there
/// was one. `synced` becomes the names synced and still present (a file
/// `complete` refused is left out, and tried again at the next call).
fn sync_new_files(
    dir: &Path,
    synced: &mut BTreeSet<OsString>,
    complete: impl Fn(&mut File) -> io::Result<bool>,
) -> io::Result<()> {
    let mut now = BTreeSet::new();
    let mut new = false;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !synced.contains(&name) {
            let path = entry.path();
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                // Removed meanwhile (sled collects old blobs and snapshots).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_file() {
                let mut f = match File::open(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                if !complete(&mut f)? {
                    continue;
                }
                // A file removed after it was opened needs no sync. (A FUSE
                // file system that answers by path, as LazyFS does, then
                // says "not found" to the fsync or the chmod.)
                let synced = f.sync_all().and_then(|()| match meta.mode() & 0o7777 {
                    FILE_MODE => Ok(()),
                    _ => f.set_permissions(Permissions::from_mode(FILE_MODE)),
                });
                match synced {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !path.exists() => continue,
                    Err(e) => return Err(e),
                }
            }
            new = true;
        }
        now.insert(name);
    }
    if new {
        fsync_dir(dir)?;
    }
    *synced = now;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob file as sled writes it: CRC-32 of the rest, a kind byte, the value.
    fn blob(value: &[u8]) -> Vec<u8> {
        let mut rest = vec![1u8];
        rest.extend_from_slice(value);
        let mut out = crc32fast::hash(&rest).to_le_bytes().to_vec();
        out.extend_from_slice(&rest);
        out
    }

    /// A data dir whose `db/` holds a log file and an empty `blobs/`.
    fn fake_db() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB);
        fs::create_dir_all(db.join("blobs")).unwrap();
        fs::write(db.join("db"), b"log").unwrap();
        (dir, db)
    }

    #[test]
    fn a_blob_sled_deleted_after_the_last_log_sync_is_given_back_and_dropped_after_the_next() {
        let (dir, db) = fake_db();
        let (a, b) = (db.join("blobs/0000000001"), db.join("blobs/0000000002"));
        fs::write(&a, blob(b"first")).unwrap();
        let files = DbFiles::open(dir.path(), true).unwrap();
        let kept = db.join(KEPT_BLOBS);
        assert!(kept.join("0000000001").exists());

        // sled deletes it after a rewrite; a power cut comes before the
        // next sync of its log: opening gives it back, whole.
        fs::remove_file(&a).unwrap();
        assert_eq!(restore_kept_blobs(&db).unwrap(), 1);
        assert_eq!(fs::read(&a).unwrap(), blob(b"first"));
        assert_eq!(
            restore_kept_blobs(&db).unwrap(),
            0,
            "nothing more to give back"
        );

        // Deleted again, and a new one written, then a sync of the log:
        // that state no longer refers to the first, so its kept name goes;
        // the second is kept.
        fs::remove_file(&a).unwrap();
        fs::write(&b, blob(b"second")).unwrap();
        files.sync().unwrap();
        assert!(!kept.join("0000000001").exists());
        assert!(kept.join("0000000002").exists());
        assert_eq!(restore_kept_blobs(&db).unwrap(), 0);
        assert!(!a.exists());
    }

    #[test]
    fn leftover_snapshots_are_removed_and_a_lost_database_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB);
        fs::create_dir(&db).unwrap();
        fs::write(db.join("snap.0000000000000ABC.generating"), b"").unwrap();
        fs::write(db.join("snap.0000000000000ABB"), b"kept").unwrap();
        fs::write(db.join("conf"), b"0123456789abcdef").unwrap();
        fs::write(db.join("db"), b"x").unwrap();
        // No marker: a dir of an older berth, or a new one.
        assert!(check_not_lost(dir.path()).is_ok());
        let removed = remove_leftovers(&db);
        assert_eq!(removed, vec![db.join("snap.0000000000000ABC.generating")]);
        assert!(db.join("snap.0000000000000ABB").exists());

        write_marker(dir.path()).unwrap();
        assert!(check_not_lost(dir.path()).is_ok());
        fs::write(db.join("db"), b"").unwrap();
        let Err(Damage::Lost(what)) = check_not_lost(dir.path()) else {
            panic!("an empty db/db was accepted");
        };
        assert!(what.ends_with("db/db is empty (0 bytes)"), "{what}");
        fs::write(db.join("db"), b"x").unwrap();
        // sled reads a conf of 8 bytes or less as none.
        for (conf, said) in [
            (&b""[..], "db/conf is empty (0 bytes)"),
            (
                &b"garbage"[..],
                "db/conf is cut short (7 bytes, too few to hold a config)",
            ),
        ] {
            fs::write(db.join("conf"), conf).unwrap();
            let Err(Damage::Lost(what)) = check_not_lost(dir.path()) else {
                panic!("a conf of {} bytes was accepted", conf.len());
            };
            assert!(what.ends_with(said), "{what}");
        }
        fs::remove_dir_all(&db).unwrap();
        let Err(Damage::Lost(what)) = check_not_lost(dir.path()) else {
            panic!("a missing db/ was accepted");
        };
        assert!(what.contains("is missing"), "{what}");
    }

    #[test]
    fn private_dirs_and_files_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b");
        private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
        fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
        let f = d.join("f");
        fs::write(&f, b"x").unwrap();
        fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
        open_private(&f).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
    }

    #[test]
    fn opening_makes_the_blobs_of_an_older_sled_private_and_a_flush_only_lists_them() {
        let (dir, db) = fake_db();
        // Written by a sled without berth's changes: mode 0644. One is
        // whole, one was cut short (its CRC does not match): left as it is.
        let (old, cut) = (db.join("blobs/1"), db.join("blobs/2"));
        fs::write(&old, blob(b"old")).unwrap();
        fs::write(&cut, b"\0\0\0\0half").unwrap();
        for f in [&old, &cut] {
            fs::set_permissions(f, Permissions::from_mode(0o644)).unwrap();
        }
        let files = DbFiles::open(dir.path(), true).unwrap();
        let mode = |f: &Path| fs::metadata(f).unwrap().mode() & 0o7777;
        assert_eq!(mode(&old), 0o600);
        assert_eq!(mode(&cut), 0o644);
        // A blob this sled writes is synced and private from the start
        // (vendor/sled/BERTH.md): a flush does not open it. Given a mode
        // sled would never give, it keeps it, and it is kept by name.
        let new = db.join("blobs/3");
        fs::write(&new, blob(b"new")).unwrap();
        fs::set_permissions(&new, Permissions::from_mode(0o640)).unwrap();
        files.sync().unwrap();
        assert_eq!(mode(&new), 0o640, "a flush opened the blob");
        assert!(db.join(KEPT_BLOBS).join("3").exists());
    }

    #[test]
    fn a_flush_lists_the_folders_only_after_a_name_changed_there() {
        let (dir, db) = fake_db();
        let files = DbFiles::open(dir.path(), true).unwrap();
        let listings = || files.synced.lock().unwrap().listings;
        if files.synced.lock().unwrap().watch.is_none() {
            eprintln!("skipped: no inotify watch to be had (every sync lists)");
            return;
        }
        files.sync().unwrap();
        let quiet = listings();
        // Writing to sled's log changes no name: no listing.
        fs::write(db.join("db"), b"more log").unwrap();
        files.sync().unwrap();
        files.sync().unwrap();
        assert_eq!(listings(), quiet);
        // A new file in `db/` (sled's snapshot), then one in `db/blobs/`:
        // each is found at the next flush, the snapshot synced (made
        // private), the blob kept by name.
        let snap = db.join("snap.0000000000001234");
        fs::write(&snap, b"snapshot").unwrap();
        fs::set_permissions(&snap, Permissions::from_mode(0o644)).unwrap();
        files.sync().unwrap();
        assert_eq!(listings(), quiet + 1);
        assert_eq!(fs::metadata(&snap).unwrap().mode() & 0o7777, 0o600);
        let blob = db.join("blobs").join("77");
        fs::write(&blob, blob_bytes()).unwrap();
        files.sync().unwrap();
        assert_eq!(listings(), quiet + 2);
        assert!(
            db.join(KEPT_BLOBS).join("77").exists(),
            "kept under a second name"
        );
        // Quiet again; then the blob goes, and its kept name after it.
        files.sync().unwrap();
        let quiet = listings();
        files.sync().unwrap();
        assert_eq!(listings(), quiet);
        fs::remove_file(&blob).unwrap();
        files.sync().unwrap();
        files.sync().unwrap();
        assert!(!db.join(KEPT_BLOBS).join("77").exists());
    }

    fn blob_bytes() -> Vec<u8> {
        blob(b"value")
    }
}

//! The files the store keeps beside sled's: write-ahead log segments
//! (`db/wal/*.wal`) and the high-water mark (`berth.high`), as a damaged
//! disk or a copied data dir gives them (`berth::store::fuzzing`).
//!
//! The first byte picks the file (even: a log segment, odd: a mark); the
//! rest is its bytes.
//!
//! Asserts:
//! - reading never panics, and a segment's read takes at most five times
//!   its bytes and 1 MiB (the bodies, and a frame's 40 bytes for each 24 or
//!   more of the file, twice while the list grows: a frame's length claim
//!   costs nothing until its bytes are there);
//! - the frames read are exactly the bytes read: the segment's header and
//!   each frame written again as the log writes it (`wal_bytes`) give back
//!   the input up to where reading stopped; a read that did not stop leaves
//!   only zeros (reserved space) after them;
//! - each frame follows the one before, and covers at least one event;
//! - the whole log read from a folder with this one segment (`wal_read`,
//!   as opening reads it) gives the same frames, and says how it ends:
//!   cut short or damaged exactly when reading stopped, never both, and
//!   damaged when it stopped in the header with bytes that could be frames
//!   after it (not a header that never reached the disk);
//! - a mark that reads back is written again (`high_mark_bytes`) to one
//!   that reads back to the same values.

use berth::store::fuzzing;

use super::alloc;

pub fn store_files(data: &[u8]) {
    let [kind, file @ ..] = data else {
        return;
    };
    if kind % 2 == 1 {
        if let Ok((event, id)) = fuzzing::high_mark(file) {
            let again = fuzzing::high_mark_bytes(event, id);
            assert_eq!(fuzzing::high_mark(again.as_bytes()), Ok((event, id)));
        }
        return;
    }
    let ((frames, stop), peak) = alloc::measure(|| fuzzing::wal_segment(file));
    assert!(
        peak <= 5 * file.len() + (1 << 20),
        "a segment of {} bytes took {peak} bytes to read",
        file.len()
    );
    for w in frames.windows(2) {
        assert_eq!(w[0].1, w[1].0, "a frame that does not follow");
    }
    for (first, next, _) in &frames {
        assert!(first < next, "a frame of events {first} to {next}");
    }
    let written = fuzzing::wal_bytes(&frames);
    match &stop {
        // A header that does not read: nothing is taken from the file.
        Some((at, _)) if frames.is_empty() && *at < 16 => {}
        Some((at, why)) => {
            assert_eq!(*at, written.len(), "stopped at {at} ({why})");
            assert_eq!(&file[..*at], &written[..], "the frames are the bytes read");
        }
        None => {
            assert_eq!(&file[..written.len()], &written[..]);
            assert!(file[written.len()..].iter().all(|b| *b == 0));
        }
    }
    let dir = super::temp_dir("berth-fuzz-wal-");
    let wal = dir.path().join("wal");
    std::fs::create_dir(&wal).expect("mkdir");
    std::fs::write(wal.join("00000000000000000001.wal"), file).expect("write");
    let (read, damage, torn) = fuzzing::wal_read(dir.path()).expect("read");
    assert_eq!(read, frames, "the log's frames are the segment's");
    assert!(
        damage.is_none() || torn.is_none(),
        "{damage:?} and {torn:?}"
    );
    assert_eq!(
        stop.is_some(),
        damage.is_some() || torn.is_some(),
        "{stop:?}: {damage:?} {torn:?}"
    );
    if let Some((at, _)) = stop
        && at < 16
        && file.get(16..).is_some_and(|r| r.iter().any(|b| *b != 0))
    {
        assert!(
            damage.is_some(),
            "a bad header with frames after it: {torn:?}"
        );
    }
}

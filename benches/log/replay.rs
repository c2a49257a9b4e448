//! Offline replay: decoding archive segments and replaying their events
//! into the model (`replay::state_at`), on one rayon thread and on all.
//!
//! Run with `cargo bench --bench replay`. Every figure is one line:
//! `bench: NAME VALUE UNIT`. The history is 500,000 events (100,000 tasks,
//! each enqueued, started, logged, succeeded and moved to the history, in
//! three commit records as the engine writes them) in segments of 10,000
//! records. Decoding is the parallel part (segments, and records within a
//! segment, with rayon, a few segments ahead of the one being applied);
//! applying to the model is sequential. The one-thread and all-thread
//! replays take turns, five each, and the best of each is reported.

use std::time::{Duration, Instant};

use berth::archive::{self, SegmentInfo};
use berth::budget::Budget;
use berth::codec;
use berth::store::event::{CommitRecord, Event, EventKind};
use berth::store::{AttemptLog, AttemptOutcome, OutputTail, Placement};
use berth::task::{Status, TaskSpec};

const TASKS: u64 = 100_000;
const RECORDS_PER_SEGMENT: usize = 10_000;
const RUNS: usize = 3;
/// Replays of each kind (the best is reported).
const REPLAY_RUNS: usize = 5;

use super::figure;

/// The records of the history, in order, as the codec frames them.
fn history() -> (Vec<Vec<u8>>, u64) {
    let budget = Budget::default();
    let mut seq = 0u64;
    const T0: u64 = 1_800_000_000_000;
    let mut records = Vec::new();
    let mut record = |events: Vec<EventKind>, next_id: u64| {
        let events = events
            .into_iter()
            .map(|kind| {
                seq += 1;
                Event {
                    seq,
                    at: T0 + seq * 3,
                    kind,
                }
            })
            .collect();
        records.push(codec::encode(&CommitRecord {
            next_id,
            events,
            writes: Vec::new(),
        }));
    };
    for id in 1..=TASKS {
        let at = T0 + id * 15;
        let spec = TaskSpec {
            queue: format!("q{}", id % 8),
            kind: "ModuleRun".into(),
            name: format!("module-{id}"),
            description: Some("doStartup:OperatorStartup".into()),
            payload: serde_json::json!({"id": id, "values": {"replicas": 2, "image": "registry/x:1.2.3"}}),
            ..Default::default()
        };
        let mut task = spec.into_task(at, &budget).expect("task");
        task.id = id;
        record(
            vec![EventKind::Enqueued {
                task: Box::new(task),
                placement: Some(Placement::Last),
            }],
            id + 1,
        );
        record(vec![EventKind::Started { id }], id + 1);
        let tail = |t: &str| OutputTail::new(t.len() as u64, t.as_bytes(), &budget);
        let log = AttemptLog {
            attempt: 1,
            started_at: at,
            ended_at: at + 250,
            outcome: AttemptOutcome::Succeeded,
            exit_code: Some(0),
            signal: None,
            stdout: tail("helm upgrade --install module\nrelease \"module\" upgraded\n"),
            stderr: tail(""),
        };
        record(
            vec![
                EventKind::AttemptLogged {
                    id,
                    log: Box::new(log),
                },
                EventKind::Succeeded { id, result: None },
                EventKind::MovedToHistory {
                    id,
                    status: Status::Succeeded,
                },
            ],
            id + 1,
        );
    }
    (records, seq)
}

/// Writes the segments; returns them in order.
fn write_segments(dir: &std::path::Path, records: &[Vec<u8>]) -> Vec<SegmentInfo> {
    let mut first = 1u64;
    for chunk in records.chunks(RECORDS_PER_SEGMENT) {
        let last_rec: CommitRecord =
            codec::decode(chunk.last().expect("a record")).expect("decode");
        let last = last_rec.events.last().expect("an event").seq;
        archive::write_segment(dir, first, last, chunk).expect("write a segment");
        first = last + 1;
    }
    archive::list(dir).expect("list")
}

/// CPU time (user and system) this process has used so far.
fn cpu_time() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    // SAFETY: zeroed is a valid rusage, and getrusage filled it when it returned 0.
    let u = unsafe { u.assume_init() };
    if r != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A run's wall time and how many cores it kept busy on average (CPU
/// time over wall time): on a machine others load, fewer than it asked for.
struct Timed {
    wall: Duration,
    cores: f64,
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Timed) {
    let (cpu, start) = (cpu_time(), Instant::now());
    let out = f();
    let wall = start.elapsed();
    let cores = (cpu_time() - cpu).as_secs_f64() / wall.as_secs_f64();
    (out, Timed { wall, cores })
}

/// One replay of everything on `pool`.
fn replay_once(pool: &rayon::ThreadPool, segments: &[SegmentInfo], events: u64) -> Timed {
    let (r, t) = timed(|| {
        pool.install(|| {
            let source = berth::replay::Source::of_segments(segments.to_vec());
            berth::replay::state_at(
                berth::replay::uncounted(),
                &source,
                berth::replay::Until::End,
                &mut |_| {},
            )
            .expect("replay")
        })
    });
    assert_eq!(r.model.last_seq, events);
    assert_eq!(r.model.history.len() as u64, TASKS);
    t
}

/// The best times of replays on a pool of one thread and on a pool of
/// `all`, taken in turns (one, all, one, all, ...) so that a machine
/// slower for a while slows both alike.
fn replay_times(segments: &[SegmentInfo], all: usize, events: u64) -> (Timed, Timed) {
    let pool = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a pool")
    };
    let (one_pool, all_pool) = (pool(1), pool(all));
    let best = |a: Option<Timed>, b: Timed| match a {
        Some(a) if a.wall <= b.wall => Some(a),
        _ => Some(b),
    };
    let (mut one, mut many) = (None, None);
    for _ in 0..REPLAY_RUNS {
        one = best(one, replay_once(&one_pool, segments, events));
        many = best(many, replay_once(&all_pool, segments, events));
    }
    (one.expect("a run"), many.expect("a run"))
}

/// The best time of a few decodings of every segment (`archive::read_all`)
/// on a pool of `threads`.
fn decode_time(segments: &[SegmentInfo], threads: usize) -> Timed {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool");
    (0..RUNS)
        .map(|_| timed(|| pool.install(|| archive::read_all(segments).expect("decode").len())).1)
        .min_by_key(|t| t.wall)
        .expect("a run")
}

pub fn run() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (records, events) = history();
    let segments = write_segments(dir.path(), &records);
    drop(records);
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (one, many) = replay_times(&segments, all, events);
    let (decode_one, decode_all) = (decode_time(&segments, 1), decode_time(&segments, all));
    let rate = |t: &Timed| events as f64 / t.wall.as_secs_f64();
    let ms = |t: &Timed| {
        format!(
            "{:.0} ms ({:.2} cores busy)",
            t.wall.as_secs_f64() * 1e3,
            t.cores
        )
    };
    eprintln!(
        "{events} events in {} segments, {all} threads. Decoding alone: {} on 1 thread, {} on {all}. \
         Replay: {} on 1 thread, {} on {all}",
        segments.len(),
        ms(&decode_one),
        ms(&decode_all),
        ms(&one),
        ms(&many),
    );
    figure("replay_1_thread", rate(&one), "events/s");
    figure("replay_all_threads", rate(&many), "events/s");
    figure(
        "replay_parallel_speedup",
        one.wall.as_secs_f64() / many.wall.as_secs_f64(),
        "x",
    );
}

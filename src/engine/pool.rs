//! A fixed pool of worker threads on crossbeam-deque: jobs go into a global
//! `Injector`; each worker pops its own `Worker` deque, then steals a batch
//! from the injector, then steals from its siblings (the canonical loop from
//! crossbeam-deque's docs). Idle workers park on a condvar, so an idle pool
//! uses no CPU.
//!
//! Workers are woken one at a time: a submit wakes one, and a worker that
//! takes a job while more are waiting wakes the next before it runs its own
//! (unless one is already waking up). Quick jobs are then run by the first
//! worker or two, and a batch of ten costs two wake-ups, not ten (on this
//! 2-core VM a wake-up takes 50 µs, and ten woken workers took the CPU
//! from the engine's loop); slow jobs still each get a worker, about one
//! wake-up apart.

use std::iter;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crossbeam_deque::{Injector, Stealer, Worker};

pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct Shared {
    injector: Injector<Job>,
    stealers: Vec<Stealer<Job>>,
    sleep: Mutex<Sleep>,
    wake: Condvar,
    stop: AtomicBool,
    busy: AtomicUsize,
}

/// Parked workers, and those woken that have not looked for work yet.
#[derive(Default)]
struct Sleep {
    parked: usize,
    waking: usize,
}

pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn find_job(local: &Worker<Job>, shared: &Shared) -> Option<Job> {
    local.pop().or_else(|| {
        iter::repeat_with(|| {
            shared
                .injector
                .steal_batch_and_pop(local)
                .or_else(|| shared.stealers.iter().map(|s| s.steal()).collect())
        })
        .find(|s| !s.is_retry())
        .and_then(|s| s.success())
    })
}

impl Pool {
    /// Starts `size` workers (at least one).
    pub fn new(size: usize, name: &str) -> std::io::Result<Pool> {
        let size = size.max(1);
        let locals: Vec<Worker<Job>> = (0..size).map(|_| Worker::new_fifo()).collect();
        let shared = Arc::new(Shared {
            injector: Injector::new(),
            stealers: locals.iter().map(Worker::stealer).collect(),
            sleep: Mutex::default(),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
        });
        let mut threads = Vec::with_capacity(size);
        for (i, local) in locals.into_iter().enumerate() {
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || worker_loop(local, &shared))?,
            );
        }
        Ok(Pool { shared, threads })
    }

    /// Queues several jobs, then wakes one parked worker (which wakes the
    /// next if jobs are left when it takes one: see the module doc).
    pub fn submit_all(&self, jobs: Vec<Job>) {
        let n = jobs.len();
        for job in jobs {
            self.shared.injector.push(job);
        }
        if n > 0 {
            self.shared.wake_one();
        }
    }

    /// Workers running a job now.
    pub fn busy(&self) -> usize {
        self.shared.busy.load(Ordering::SeqCst)
    }

    pub fn size(&self) -> usize {
        self.threads.len()
    }
}

impl Shared {
    /// Wakes a parked worker, unless one is waking up already (it looks
    /// for work, and wakes the next if it finds more) or none is parked.
    fn wake_one(&self) {
        let mut sleep = self.sleep.lock().unwrap_or_else(|p| p.into_inner());
        if sleep.waking == 0 && sleep.parked > 0 {
            sleep.waking += 1;
            self.wake.notify_one();
        }
    }

    /// Whether jobs wait (in the injector or in a worker's deque).
    fn more(&self) -> bool {
        !self.injector.is_empty() || !self.stealers.iter().all(Stealer::is_empty)
    }
}

fn worker_loop(local: Worker<Job>, shared: &Shared) {
    loop {
        if let Some(job) = find_job(&local, shared) {
            if shared.more() {
                shared.wake_one();
            }
            shared.busy.fetch_add(1, Ordering::SeqCst);
            job();
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let mut sleep = shared.sleep.lock().unwrap_or_else(|p| p.into_inner());
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        // Checked under the lock `wake_one` takes after a push: no lost
        // wake-up.
        if !shared.more() {
            sleep.parked += 1;
            sleep = shared.wake.wait(sleep).unwrap_or_else(|p| p.into_inner());
            sleep.parked -= 1;
            sleep.waking = sleep.waking.saturating_sub(1);
        }
    }
}

impl Drop for Pool {
    /// Stops the workers once the queued jobs are done. Workers stuck in a
    /// job are not waited for.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.sleep.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            if t.is_finished() || self.shared.busy.load(Ordering::SeqCst) == 0 {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_every_job_on_several_threads() {
        let pool = Pool::new(4, "test").unwrap();
        let (tx, rx) = mpsc::channel();
        let jobs: Vec<Job> = (0..200)
            .map(|i| {
                let tx = tx.clone();
                Box::new(move || {
                    tx.send((i, std::thread::current().name().unwrap_or("").to_string()))
                        .unwrap();
                }) as Job
            })
            .collect();
        pool.submit_all(jobs);
        drop(tx);
        let got: Vec<_> = rx.iter().collect();
        assert_eq!(got.len(), 200);
        let mut ids: Vec<_> = got.iter().map(|(i, _)| *i).collect();
        ids.sort();
        assert_eq!(ids, (0..200).collect::<Vec<_>>());
        assert!(got.iter().all(|(_, n)| n.starts_with("test-")));
    }

    #[test]
    fn submit_all_runs_every_job_with_fewer_or_more_jobs_than_workers() {
        let pool = Pool::new(4, "all").unwrap();
        // Fewer jobs than workers, then more: every job runs once.
        for n in [3usize, 50] {
            let (tx, rx) = mpsc::channel();
            let jobs: Vec<Job> = (0..n)
                .map(|i| {
                    let tx = tx.clone();
                    Box::new(move || tx.send(i).unwrap()) as Job
                })
                .collect();
            pool.submit_all(jobs);
            drop(tx);
            let mut got: Vec<usize> = rx.iter().collect();
            got.sort();
            assert_eq!(got, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn jobs_run_concurrently() {
        // Four jobs that each wait for all four to have started: only
        // possible if four workers run at once.
        let pool = Pool::new(4, "conc").unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(5));
        let jobs: Vec<Job> = (0..4)
            .map(|_| {
                let b = barrier.clone();
                Box::new(move || {
                    b.wait();
                }) as Job
            })
            .collect();
        pool.submit_all(jobs);
        barrier.wait();
    }

    #[test]
    fn jobs_that_block_each_get_a_worker_from_several_submits() {
        // Workers are woken one at a time (each that takes a job wakes
        // the next): eight jobs that block until all eight have started,
        // submitted in two batches while the first ones already block,
        // all start.
        let pool = Pool::new(8, "chain").unwrap();
        let (started, starts) = mpsc::channel();
        let (release, released) = crossbeam_channel::bounded::<()>(0);
        let batch = |n: usize| -> Vec<Job> {
            (0..n)
                .map(|_| {
                    let (started, released) = (started.clone(), released.clone());
                    Box::new(move || {
                        started.send(()).unwrap();
                        let _ = released.recv();
                    }) as Job
                })
                .collect()
        };
        pool.submit_all(batch(3));
        pool.submit_all(batch(5));
        for n in 1..=8 {
            starts
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("job {n} of 8 never started: no worker was woken"));
        }
        drop(release);
    }
}

//! Scheduling hints for berth's own threads, on Linux (elsewhere, or when
//! the kernel refuses one, nothing changes and a debug line says so).
//!
//! On a two-core node the threads a task's turn waits for (the engine's
//! step loop, its launcher, which leads the flushes, and the workers), and
//! those a client's commit waits for (the control socket's connection
//! threads, each of which may lead a flush), share the cores with threads
//! nobody waits for (the applier, sled's). Two hints keep the first ones
//! from waiting for a core:
//!
//! - [`set_nice`] lowers a background thread's priority (the applier).
//! - [`short_slice`] asks for a short time slice (0.1 ms) for a thread
//!   that runs in short bursts between waits. Since Linux 6.12 (EEVDF) a
//!   waking thread whose slice is shorter than the running thread's may
//!   preempt it at once; with the default slice it often waited for the
//!   running one's slice to end (up to about a millisecond, measured as
//!   such gaps in one flush cycle in eight). Kernels before 6.12 ignore
//!   the slice. Not for the workers: a handler may be busy on the CPU for
//!   long, and a short slice would only switch it out more often. For
//!   committers (the connection threads; the store bench's producers do
//!   the same): 8 producers each committing one task at a time ran 27,600-
//!   28,000 tasks/s with the default slice against 30,100-31,500 with the
//!   short one, the flush leader no longer waiting for a core after its
//!   `fdatasync` or the last commit it gathers; one producer the same.

/// The slice asked for by [`short_slice`], in nanoseconds (the kernel's
/// least).
const SHORT_SLICE_NS: u64 = 100_000;

/// Gives the calling thread the nice value `nice` (`who` names it in the
/// debug line if that is refused).
pub fn set_nice(nice: i32, who: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain system call on the calling thread's own id.
        let r =
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
        if r != 0 {
            log::debug!(
                "{who} keeps its priority: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (nice, who);
}

/// `struct sched_attr` of `sched_setattr(2)` (the size the kernel knows
/// since 4.13).
#[cfg(target_os = "linux")]
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Asks for a short time slice for the calling thread, keeping its policy
/// (`SCHED_OTHER`) and its nice value (`who` names it in the debug line if
/// that is refused).
pub fn short_slice(who: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread; `attr` lives
        // across the call and has the size it says.
        let r = unsafe {
            let tid = libc::gettid();
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            if nice == -1 && *libc::__errno_location() != 0 {
                -1
            } else {
                let attr = SchedAttr {
                    size: std::mem::size_of::<SchedAttr>() as u32,
                    policy: libc::SCHED_OTHER as u32,
                    flags: 0,
                    nice,
                    priority: 0,
                    runtime: SHORT_SLICE_NS,
                    deadline: 0,
                    period: 0,
                    util_min: 0,
                    util_max: 0,
                };
                libc::syscall(libc::SYS_sched_setattr, tid, &attr as *const SchedAttr, 0) as i32
            }
        };
        if r != 0 {
            log::debug!(
                "{who} keeps the default time slice: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = who;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The nice value of the calling thread.
    fn nice() -> i32 {
        // SAFETY: a plain system call on the calling thread's own id.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    /// The `se.slice` line of the calling thread's `sched` file, if the
    /// kernel shows it.
    fn slice_ns() -> Option<u64> {
        let tid = unsafe { libc::gettid() };
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).ok()?;
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("se.slice"))?;
        line.split(':')
            .nth(1)?
            .trim()
            .split('.')
            .next()?
            .parse()
            .ok()
    }

    #[test]
    fn a_short_slice_keeps_the_threads_nice_value() {
        std::thread::spawn(|| {
            set_nice(7, "the test thread");
            assert_eq!(nice(), 7);
            short_slice("the test thread");
            assert_eq!(nice(), 7, "sched_setattr must not reset the nice value");
            match slice_ns() {
                // /proc shows the slice where the kernel has one (EEVDF).
                Some(ns) => assert_eq!(ns, SHORT_SLICE_NS),
                None => eprintln!("skipped the slice check: no se.slice in /proc"),
            }
        })
        .join()
        .unwrap();
    }
}

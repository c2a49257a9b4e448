//! The allocator's settings. The `berth` binary (and the benches, to
//! measure what it does) allocate with mimalloc: with glibc's malloc the
//! engine's loop spent a quarter of its time in `_int_malloc` and
//! `malloc_consolidate`. [`tune`], which `berth run` calls, makes mimalloc
//! give freed memory back to the system after 10 ms instead of its default
//! (1 s in mimalloc 3), so that what the control socket's request budget
//! (`control/server.rs`, 128 MiB) caps is about what the daemon holds.
//! Measured on 2026-12-06, 8 clients sending 60 MiB each
//! (`tests/faults_socket.rs`, four runs each), peak growth: 130 MiB with
//! 2 ms, 130-145 with 10, 136-160 with 25, 167-181 with 50, 194-196 with
//! 100, and 196 to over 200 with 1 s. Memory given back too soon is
//! faulted in again at the next allocations: with 2 ms (until 2026-12-06)
//! a long batch enqueue spent half of its committing thread's time in
//! page faults. With 10 ms, over the second half of that enqueue, page
//! faults fall from 17.5 % of all samples to 13.5 % and `madvise` from
//! 6.5 % to 4.6 %, and it runs 8-13 % faster once the overlay is full
//! (`enqueue_batch_1m_last_100k` 147,324 against 130,162 tasks/s; windows
//! of 155-160k against 140-148k in three alternating pairs) and
//! `e2e_noop_sync` 2-3 % faster (three pairs), with eight producers'
//! enqueues the same within the noise. The other commands run and exit,
//! and keep mimalloc's default: an offline replay of 500,000 events took
//! 450 ms with a delay of 0 and 270 ms with the default.
//!
//! **No transparent huge pages.** mimalloc asks for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`) where the system allows them; then every
//! fault on memory freshly given back zeroes 2 MiB (`clear_page_erms`, 6 %
//! of the engine loop's time in `e2e_noop_sync`), and a process holds
//! whole 2 MiB pages of which it uses a part. [`no_huge_pages`], which
//! every `berth` command calls first, turns them off for the process
//! (measured on a 1,000,000-task dir: a daemon's open 272 -> 224 MiB peak
//! RSS, `queue list` 324 -> 272 MiB, `e2e_noop_sync` 190 -> 130-147 MiB,
//! with no change in speed beyond the noise).

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (`mi_option_e`,
/// right before `mi_option_use_numa_nodes`, in versions 2 and 3); the
/// Rust binding has no name for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t =
    libmimalloc_sys::mi_option_use_numa_nodes - 1;

/// How long mimalloc keeps freed memory before giving it back (ms).
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Turns transparent huge pages off for this process (and the processes
/// it starts): `prctl(PR_SET_THP_DISABLE)`, which the kernel checks at each
/// fault, whatever was `madvise`d before. Call it before the process
/// allocates much. Elsewhere than on Linux, or if refused, nothing changes.
pub fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sets a flag of the calling process; no pointer is passed.
        let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if r != 0 {
            log::debug!(
                "transparent huge pages stay as the system sets them: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Sets mimalloc's options for a long-running daemon (and turns huge pages
/// off, see [`no_huge_pages`]); call it before the daemon allocates much.
/// Harmless when mimalloc is not the global allocator.
pub fn tune() {
    no_huge_pages();
    // SAFETY: mi_option_set only stores an option's value.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The purge delay's option number is derived (the binding names no
    /// such option): mimalloc 3 gives it a default of 1 s, which no option
    /// near it has, so a wrong number shows here; and `tune` sets it.
    #[test]
    fn tune_sets_mimallocs_purge_delay() {
        // SAFETY: reads an option's value.
        let get = || unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // Options are process-wide: another test may have tuned first.
            let before = get();
            assert!(
                before == 1000 || before == super::PURGE_DELAY_MS,
                "option {} holds {before}: not mimalloc's purge delay",
                super::MI_OPTION_PURGE_DELAY
            );
        }
        super::tune();
        assert_eq!(get(), super::PURGE_DELAY_MS);
    }

    #[test]
    fn huge_pages_are_off_after_no_huge_pages() {
        super::no_huge_pages();
        // SAFETY: reads a flag of the calling process.
        let r = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(r, 1, "PR_GET_THP_DISABLE after no_huge_pages");
    }
}

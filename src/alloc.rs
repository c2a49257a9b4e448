//! The allocator's settings. The `berth` binary (and the benches, to
//! measure what it does) allocate with mimalloc: with glibc's malloc the
//! engine's loop spent a quarter of its time in `_int_malloc` and
//! `malloc_consolidate`. [`tune`], which `berth run` calls, makes mimalloc
//! give freed memory back to the system at once instead of after 10 ms, so
//! that what the control socket's request budget (`control/server.rs`)
//! caps is about what the daemon holds (measured: 8 clients sending 60 MiB
//! each, peak growth 147 MiB with it, 208 MiB without, 134 MiB with
//! glibc). That costs some of the speed (e2e_noop_sync about 11.5k
//! tasks/s with it, 14k without, 9.5k with glibc). The other commands run
//! and exit, and keep mimalloc's default: memory given back at once is
//! faulted in again at the next allocation, and an offline replay of
//! 500,000 events took 450 ms with it and 270 ms without.

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (`mi_option_e`,
/// right before `mi_option_use_numa_nodes`, in versions 2 and 3); the
/// Rust binding has no name for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t =
    libmimalloc_sys::mi_option_use_numa_nodes - 1;

/// Sets mimalloc's options for a long-running daemon; call it before the
/// daemon allocates much. Harmless when mimalloc is not the global
/// allocator.
pub fn tune() {
    // SAFETY: mi_option_set only stores an option's value.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

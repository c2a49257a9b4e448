//! The allocator's settings. The `berth` binary (and the benches, to
//! measure what it does) allocate with mimalloc: with glibc's malloc the
//! engine's loop spent a quarter of its time in `_int_malloc` and
//! `malloc_consolidate`. [`tune`], which `berth run` calls, makes mimalloc
//! give freed memory back to the system after 2 ms instead of 10, so that
//! what the control socket's request budget (`control/server.rs`) caps is
//! about what the daemon holds (measured: 8 clients sending 60 MiB each,
//! peak growth 144 MiB with 2 ms, 145 with 0, 208 with 10, 134 with
//! glibc). 2 ms costs less speed than 0 (e2e_noop_sync 14.4k tasks/s with
//! 2 ms, 12.5k with 0; 9.5k with glibc). The other commands run and exit,
//! and keep mimalloc's default: memory given back soon is faulted in again
//! at the next allocation, and an offline replay of 500,000 events took
//! 450 ms with a delay of 0 and 270 ms with the default.

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (`mi_option_e`,
/// right before `mi_option_use_numa_nodes`, in versions 2 and 3); the
/// Rust binding has no name for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t =
    libmimalloc_sys::mi_option_use_numa_nodes - 1;

/// How long mimalloc keeps freed memory before giving it back (ms).
const PURGE_DELAY_MS: std::ffi::c_long = 2;

/// Sets mimalloc's options for a long-running daemon; call it before the
/// daemon allocates much. Harmless when mimalloc is not the global
/// allocator.
pub fn tune() {
    // SAFETY: mi_option_set only stores an option's value.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

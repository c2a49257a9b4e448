//! A counting allocator, per thread: how many bytes the calling thread has
//! allocated and not freed, and the peak of that since [`measure`] began.
//! Counting per thread keeps a measurement honest while other threads (other
//! tests, sled's threads) allocate at the same time.
//!
//! `realloc` is left to `GlobalAlloc`'s default (allocate, copy, free), so a
//! vector that grows is counted with both its old and its new buffer, as a
//! real reallocation that moves may need.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    // `try_with`: a thread being torn down may still free memory.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + n;
        live.set(now);
        let _ = PEAK.try_with(|peak| {
            if now > peak.get() {
                peak.set(now);
            }
        });
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counters are plain thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }
}

/// Runs `f` and returns its value with the peak of the bytes this thread
/// held during it beyond what it held before (the value's own memory
/// included, if it is still held).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, (peak - base).max(0) as usize)
}

/// Whether the counting allocator is the global one (it is wherever this
/// module is compiled in; this guards the memory assertions against a
/// build that left it out).
pub fn counting() -> bool {
    let (_, peak) = measure(|| std::hint::black_box(vec![0u8; 4096]));
    peak >= 4096
}

//! Running sled code that may panic on damaged data, and turning the panic
//! into an error message instead of a crash (and instead of the panic hook's
//! noise on stderr).
//!
//! sled 0.34 panics on some damaged files (a `db/db` truncated to 256 KiB,
//! for example). [`catch`] runs a closure under `catch_unwind`; a panic on
//! that thread while it runs is recorded, not printed, and returned as its
//! message and location. Panics on other threads still go to the previous
//! hook.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs [`catch`]: where its panic message goes.
    static CAUGHT: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let handled = CAUGHT.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        let msg = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(no message)".into());
                        let at = info
                            .location()
                            .map(|l| format!(" at {}:{}", l.file(), l.line()))
                            .unwrap_or_default();
                        *slot = Some(format!("{msg}{at}"));
                        true
                    }
                    None => false,
                }
            });
            if !handled {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic becomes `Err(message)`.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    CAUGHT.with(|c| *c.borrow_mut() = Some(None));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    let msg = CAUGHT.with(|c| c.borrow_mut().take()).flatten();
    r.map_err(|_| msg.unwrap_or_else(|| "a panic".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_its_message() {
        assert_eq!(catch(|| 7), Ok(7));
        let err = catch(|| -> u8 { panic!("bad page {}", 3) }).unwrap_err();
        assert!(err.starts_with("bad page 3 at "), "{err}");
        assert!(err.contains("panics.rs"), "{err}");
    }
}

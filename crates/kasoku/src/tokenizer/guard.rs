//! Calls into third-party parsers (the `tokenizers` library, minijinja) made so that a panic
//! inside them becomes an error instead of taking the process down: a tokenizer.json or a chat
//! template comes from a file anyone may hand over, and some malformed ones make the libraries
//! index out of bounds on every encode.
//!
//! The panic still reaches the process's panic hook (Rust's default hook prints it to stderr):
//! replacing the hook would be a process-wide side effect, racing any other thread that panics
//! meanwhile, so the message is left as it is and the caller gets an error naming the panic.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic inside it becomes `Err` with `what` and the panic's message.
///
/// `AssertUnwindSafe`: whatever `f` was mutating when it panicked is either dropped with it or
/// is a library object whose later calls are guarded the same way (a broken one keeps failing,
/// as errors).
pub fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        format!("{what} failed inside a third-party library (it panicked: {message})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        assert_eq!(guarded("adding", || 1 + 1), Ok(2));
        let e = guarded("indexing", || {
            let v: Vec<u32> = Vec::new();
            v[std::hint::black_box(3)]
        })
        .unwrap_err();
        assert!(
            e.contains("indexing") && e.contains("index out of bounds"),
            "{e}"
        );
        let e = guarded("formatting", || -> u32 { panic!("{} apples", 3) }).unwrap_err();
        assert!(e.contains("3 apples"), "{e}");
    }
}

//! The allocator of the `cairn-agent` binary and its one setting that matters here.
//!
//! Histories, archived originals and request bodies are megabytes that come and go every
//! turn. glibc's allocator hands such memory back to the kernel and faults it in again on the
//! next turn; mimalloc reuses it, but by default it still returns ("purges") freed memory
//! one second after it was freed, and turns are further apart than that whenever the model
//! thinks. The fresh pages of the next turn's request body are then faulted in and zeroed
//! again: on a 4 MB history that was a third of the agent's own work per turn
//! (`cargo bench -p cairn-agent --bench turn`). The agent keeps freed memory for
//! [`PURGE_DELAY_MS`] instead, so a session in use runs on its own warm working set; an idle
//! one still gives it back. `MIMALLOC_PURGE_DELAY` in the environment overrides the default.

/// The allocator the binary (and the benches that stand for it) install.
pub type Allocator = mimalloc::MiMalloc;

/// How long freed memory stays with the process before it goes back to the kernel.
pub const PURGE_DELAY_MS: i64 = 5 * 60 * 1000;

/// mimalloc's `mi_option_purge_delay` (its option enum does not change within a version;
/// the crate pins the version and [`tests::the_purge_delay_option_is_the_one_meant`] checks
/// the index against the option's documented default).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies the agent's allocator defaults; call once at start-up, before the work begins.
pub fn configure() {
    let delay = std::os::raw::c_long::try_from(PURGE_DELAY_MS).unwrap_or(std::os::raw::c_long::MAX);
    // SAFETY: sets a plain integer option of the allocator by its documented enum index;
    // mimalloc reads options atomically and only keeps the value if the environment did not
    // set it.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, delay) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_meant() {
        // SAFETY: reads an integer option.
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                before, 1000,
                "mimalloc v3 documents a 1000 ms default purge delay"
            );
        }
        configure();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                Some(after),
                std::os::raw::c_long::try_from(PURGE_DELAY_MS).ok()
            );
        }
    }
}

//! The allocator of every binary built on this crate (`stephost`, the
//! tests' `stephost-crash`, and `stephost-bench`, so that its in-process
//! figures measure what the binary does).
//!
//! mimalloc: a run records and replays hundreds of thousands of small
//! strings, many allocated on one thread and freed on another, where it was
//! measured 20% faster than the system allocator (figure 3 of the bench,
//! replay; 5–10% on observe and read calls). It is built without
//! transparent huge pages (the `no_thp` feature, in the workspace's
//! `Cargo.toml`): with them, the first touch of its memory zeroed 2 MiB
//! pages, 17% of the CPU time of a `stephost run` that lasts 7 ms.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long freed memory is kept before it is given back to the system, in
/// milliseconds (mimalloc's default is 10). A replay frees a long history's
/// records and allocates the next one's at once: given back after 10 ms,
/// the same memory came back as fresh pages the kernel zeroed again, which
/// cost 12% of replay speed (figure 3). Memory freed and not used again is
/// still given back, 10 s later (mimalloc's arenas, ten times that).
pub const FREED_MEMORY_KEPT_MS: i64 = 10_000;

/// mimalloc's `mi_option_purge_delay` (the 16th `mi_option_e`, in its v2
/// and v3 alike); `libmimalloc-sys` names only the options before it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets the allocator's options; `MIMALLOC_PURGE_DELAY` in the environment
/// still overrides [`FREED_MEMORY_KEPT_MS`]. Call first thing in `main`.
pub fn configure() {
    // mimalloc reads its options from the environment as the process
    // starts, so a default set now would be ignored: set it unless the
    // environment named it.
    set_unless_named(
        "MIMALLOC_PURGE_DELAY",
        MI_OPTION_PURGE_DELAY,
        FREED_MEMORY_KEPT_MS,
    );
}

fn set_unless_named(variable: &str, option: libmimalloc_sys::mi_option_t, value: i64) {
    if std::env::var_os(variable).is_some() {
        return;
    }
    // SAFETY: mimalloc's options may be set at any time from any thread;
    // the option number and value are in range.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(option, value as _);
    }
}

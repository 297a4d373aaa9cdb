//! Randomness the host trusts for keys and ids, from the operating system
//! (a leaf: it uses nothing else of the crate). A step's own randomness is
//! recorded ([`crate::imports::random`]); this is the host's.

/// Fresh random bytes from the host's operating system.
pub fn os_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    // The WASI context's default generator is seeded from the OS; use the
    // same source the host trusts for keys.
    let mut rng = wasmtime_wasi::random::thread_rng();
    rand_core::Rng::fill_bytes(&mut rng, &mut bytes);
    bytes
}

/// A random number from [`os_bytes`].
pub fn os_u64() -> u64 {
    u64::from_le_bytes(os_bytes(8).try_into().unwrap_or_default())
}

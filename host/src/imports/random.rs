//! `stephost:step/random`.

use crate::bindings::stephost::step::random::Host;
use crate::imports::{StepState, as_u64, lock, observe, trap};
use crate::journal::Stop;

pub const INTERFACE: &str = "stephost:step/random";

/// Fresh random bytes from the host's operating system.
pub fn os_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    // The WASI context's default generator is seeded from the OS; use the
    // same source the host trusts for keys.
    let mut rng = wasmtime_wasi::random::thread_rng();
    rand_core::Rng::fill_bytes(&mut rng, &mut bytes);
    bytes
}

/// Decodes recorded bytes (hex).
pub fn recorded_bytes(value: &serde_json::Value, len: usize) -> Result<Vec<u8>, Stop> {
    value
        .as_str()
        .and_then(|s| hex::decode(s).ok())
        .filter(|b| b.len() == len)
        .ok_or_else(|| Stop::Corrupt(format!("recorded random bytes are not {len} hex bytes")))
}

impl Host for StepState {
    fn get_bytes(&mut self, len: u32) -> wasmtime::Result<Vec<u8>> {
        let max = lock(&self.journal).limits().payload_bytes_max;
        if u64::from(len) > max {
            return Err(self.fail(Stop::Limit(format!(
                "random.get-bytes asked for {len} bytes; payload_bytes_max is {max}"
            ))));
        }
        let len = len as usize;
        let value = observe(
            &self.journal,
            INTERFACE,
            "get-bytes",
            &len.to_string(),
            || hex::encode(os_bytes(len)).into(),
        )
        .map_err(trap)?;
        recorded_bytes(&value, len).map_err(|s| self.fail(s))
    }

    fn get_u64(&mut self) -> wasmtime::Result<u64> {
        let value = observe(&self.journal, INTERFACE, "get-u64", "", || {
            u64::from_le_bytes(os_bytes(8).try_into().unwrap_or_default()).into()
        })
        .map_err(trap)?;
        as_u64(&value, "random.get-u64").map_err(|s| self.fail(s))
    }
}

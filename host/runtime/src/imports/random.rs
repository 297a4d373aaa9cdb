//! `stephost:step/random`.

use crate::bindings::stephost::step::random::Host;
use std::sync::Mutex;

use crate::imports::{StepState, as_u64, lock, observe, trap};
use stephost_core::journal::{Journal, Stop};

pub const INTERFACE: &str = "stephost:step/random";

pub use crate::randomness::os_bytes;

/// Decodes recorded bytes (hex).
pub fn recorded_bytes(value: &serde_json::Value, len: usize) -> Result<Vec<u8>, Stop> {
    value
        .as_str()
        .and_then(|s| hex::decode(s).ok())
        .filter(|b| b.len() == len)
        .ok_or_else(|| Stop::Corrupt(format!("recorded random bytes are not {len} hex bytes")))
}

/// `len` random bytes through the journal, as one recorded `get-bytes`
/// call of `interface`: fresh from the OS when live, the recorded ones on
/// replay. More than the payload limit is a [`Stop::Limit`]. Every random
/// import (this one, WASI's and preview1's) draws its bytes here.
pub fn recorded_random(
    journal: &Mutex<Journal>,
    interface: &str,
    len: u64,
) -> Result<Vec<u8>, Stop> {
    let max = lock(journal).limits().payload_bytes_max;
    if len > max {
        return Err(Stop::Limit(format!(
            "{interface} get-bytes asked for {len} bytes; payload_bytes_max is {max}"
        )));
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    let value = observe(journal, interface, "get-bytes", &len.to_string(), || {
        hex::encode(os_bytes(len)).into()
    })?;
    recorded_bytes(&value, len)
}

impl Host for StepState {
    fn get_bytes(&mut self, len: u32) -> wasmtime::Result<Vec<u8>> {
        recorded_random(&self.journal, INTERFACE, len.into()).map_err(|s| self.fail(s))
    }

    fn get_u64(&mut self) -> wasmtime::Result<u64> {
        let value = observe(&self.journal, INTERFACE, "get-u64", "", || {
            u64::from_le_bytes(os_bytes(8).try_into().unwrap_or_default()).into()
        })
        .map_err(trap)?;
        as_u64(&value, "random.get-u64").map_err(|s| self.fail(s))
    }
}

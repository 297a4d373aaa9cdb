//! Test guest: allocates 1 MiB chunks and keeps them, forever. The host's
//! memory limit must stop it and record the run as failed.

use serde_json::Value;
use stephost_guest::{Ctx, Error, log};

const CHUNK: usize = 1 << 20;

fn run(_ctx: &mut Ctx, _input: Value) -> Result<Value, Error> {
    log::info("allocating without bound");
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        // Non-zero contents so every page is really written.
        chunks.push(std::hint::black_box(vec![0xA5; CHUNK]));
    }
}

stephost_guest::export_step!(run);

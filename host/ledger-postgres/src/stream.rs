//! A long history read while it is replayed: a reader thread reads it in
//! chunks, on a connection of the pool's, a few chunks ahead of the
//! execution, which takes them in order as it reaches them.

use std::sync::{Arc, mpsc};

use stephost_core::history::Chunks;
use stephost_core::{StoreError, StoreResult};

use crate::{Shared, rows};

/// Calls per chunk.
pub const CHUNK_CALLS: usize = 1024;

/// Chunks the reader reads ahead of the execution.
const CHUNKS_AHEAD: usize = 2;

/// The `total` calls of `run_id`, in chunks, as the reader reads them.
pub fn chunks(shared: Arc<Shared>, run_id: &str, total: usize) -> StoreResult<Chunks> {
    let count = total.div_ceil(CHUNK_CALLS);
    let (send, queue) = mpsc::sync_channel(CHUNKS_AHEAD);
    let run_id = run_id.to_string();
    std::thread::Builder::new()
        .name("stephost-read".into())
        .spawn(move || {
            for k in 0..count {
                let from = (k * CHUNK_CALLS) as u64 + 1;
                let id = run_id.clone();
                let chunk = shared.block(move |mut conn| async move {
                    rows::calls(&mut conn, &id, from, CHUNK_CALLS).await
                });
                let failed = chunk.is_err();
                // The execution stopped reading: so does the reader.
                if send.send(chunk).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("cannot start a history reader: {e}")))?;
    let lost = || StoreError::Unavailable("the history reader stopped".into());
    Ok(Box::new((0..count).map(move |_| {
        queue.recv().unwrap_or_else(|_| Err(lost()))
    })))
}

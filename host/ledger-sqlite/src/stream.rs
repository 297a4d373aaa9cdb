//! A long history read while it is replayed: reader threads, each on a
//! connection of its own, read it in chunks (chunk `k` by reader
//! `k % STREAM_READERS`) into bounded queues, and the execution takes the
//! chunks in order as it reaches them. Reading 100,000 calls and replaying
//! them then overlap instead of following each other.

use std::path::Path;
use std::sync::mpsc;

use stephost_core::history::Chunks;
use stephost_core::{StoreError, StoreResult};

use crate::conn::Conn;
use crate::segments;

/// Calls per chunk.
pub const CHUNK_CALLS: usize = 1024;

/// Reader threads per history.
pub const STREAM_READERS: usize = 2;

/// Chunks a reader reads ahead of the execution.
const CHUNKS_AHEAD: usize = 2;

/// The `total` calls of run number `run_no` of the ledger at `path`, in
/// chunks, as reader threads read them.
pub fn chunks(path: &Path, run_no: i64, total: usize) -> StoreResult<Chunks> {
    let count = total.div_ceil(CHUNK_CALLS);
    let mut queues = Vec::with_capacity(STREAM_READERS);
    for reader in 0..STREAM_READERS.min(count) {
        let (send, queue) = mpsc::sync_channel(CHUNKS_AHEAD);
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("stephost-read".into())
            .spawn(move || {
                let conn = match Conn::connect(&path) {
                    Ok(conn) => conn,
                    Err(e) => {
                        let _ = send.send(Err(e));
                        return;
                    }
                };
                for k in (reader..count).step_by(STREAM_READERS) {
                    let from = (k * CHUNK_CALLS) as u64 + 1;
                    let chunk = segments::calls(&conn.conn, run_no, from, CHUNK_CALLS);
                    let failed = chunk.is_err();
                    // The execution stopped reading: so does this reader.
                    if send.send(chunk).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start a history reader: {e}")))?;
        queues.push(queue);
    }
    let lost = || StoreError::Unavailable("a history reader stopped".into());
    Ok(Box::new((0..count).map(move |k| {
        queues[k % queues.len()]
            .recv()
            .unwrap_or_else(|_| Err(lost()))
    })))
}

//! A run's recorded calls, in order, as an execution consumes them.
//!
//! A short history is read at once. A long one arrives in chunks from
//! threads of the ledger's while the guest already replays its first calls
//! (see [`super::Ledger::history`]): reading 100,000 rows and replaying them
//! then overlap instead of following each other. With several readers,
//! chunk `k` comes from reader `k % readers`.

use std::sync::mpsc::{Receiver, Sender};

use super::{CallRecord, LedgerError};

/// Chunks of rows in order, or the error that ended them.
pub type Chunks = Receiver<Result<Vec<CallRecord>, LedgerError>>;

/// Where chunks go back to the reader that made them once they are let go,
/// to be filled again there with later calls, their strings' buffers
/// reused: allocating 100,000s of strings on the reader and freeing them on
/// the replaying thread cost about a fifth of a long replay's time.
pub type Spent = Sender<Vec<CallRecord>>;

pub struct History {
    run_id: String,
    /// The calls arrived so far, in chunks as they came (not copied into
    /// one vector); every chunk but the last holds `chunk_len` calls
    /// (`receive` refuses any other).
    chunks: Vec<Vec<CallRecord>>,
    chunk_len: usize,
    arrived: usize,
    /// How many calls the ledger holds for the run.
    total: usize,
    /// The readers still delivering, in turn; empty once all has arrived
    /// or reading failed.
    incoming: Vec<Chunks>,
    /// Where let-go chunks go back, by reader (may be empty).
    spent: Vec<Spent>,
    /// Chunks received so far.
    received: usize,
    /// Leading chunks let go (emptied): an execution consumes its history
    /// in order, so the calls more than a chunk behind the last one asked
    /// for are freed while the rest is still arriving, not all at the end.
    released: usize,
}

impl History {
    /// A history read at once (or from a fixture).
    pub fn loaded(run_id: &str, rows: Vec<CallRecord>) -> Self {
        History {
            run_id: run_id.to_string(),
            total: rows.len(),
            arrived: rows.len(),
            chunk_len: rows.len().max(1),
            chunks: vec![rows],
            incoming: Vec::new(),
            spent: Vec::new(),
            received: 0,
            released: 0,
        }
    }

    /// A history of `total` calls still arriving in chunks of `chunk_len`
    /// (the last may be shorter), chunk `k` from
    /// `incoming[k % incoming.len()]`; a chunk let go is sent back to
    /// `spent[k % spent.len()]`, if there is one, to be reused there.
    pub fn streamed(
        run_id: &str,
        total: usize,
        chunk_len: usize,
        incoming: Vec<Chunks>,
        spent: Vec<Spent>,
    ) -> Self {
        History {
            run_id: run_id.to_string(),
            chunks: Vec::new(),
            chunk_len: chunk_len.max(1),
            arrived: 0,
            total,
            incoming,
            spent,
            received: 0,
            released: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Call `index + 1`, waiting for it if it has not arrived yet. The
    /// calls before the chunk of call `index` are let go (a history read at
    /// once is one chunk, and keeps every call).
    pub fn get(&mut self, index: usize) -> Result<Option<&CallRecord>, LedgerError> {
        if index >= self.total {
            return Ok(None);
        }
        self.wait_for(index)?;
        let keep_from = index.saturating_sub(1) / self.chunk_len;
        while self.released < keep_from {
            let chunk = std::mem::take(&mut self.chunks[self.released]);
            if let Some(back) = self.spent.get(self.released % self.spent.len().max(1)) {
                // A reader that has finished takes nothing back: the chunk
                // comes back in the error and is freed here.
                let _ = back.send(chunk);
            }
            self.released += 1;
        }
        Ok(self.arrived(index))
    }

    /// A call that has arrived already and is still kept: the one `get`
    /// returned last, the one before it, and any after them.
    pub fn arrived(&self, index: usize) -> Option<&CallRecord> {
        self.chunks
            .get(index / self.chunk_len)?
            .get(index % self.chunk_len)
    }

    /// Every call still kept (from the one before the last that `get`
    /// returned), waiting for those still to come.
    pub fn all(&mut self) -> Result<impl Iterator<Item = &CallRecord>, LedgerError> {
        if let Some(last) = self.total.checked_sub(1) {
            self.wait_for(last)?;
        }
        Ok(self.chunks.iter().flatten())
    }

    /// Receives chunks until call `index + 1` has arrived.
    fn wait_for(&mut self, index: usize) -> Result<(), LedgerError> {
        while self.arrived <= index {
            self.receive()?;
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<(), LedgerError> {
        let reader = self
            .incoming
            .get(self.received % self.incoming.len().max(1));
        let chunk = match reader.map(Receiver::recv) {
            Some(Ok(Ok(chunk))) => chunk,
            Some(Ok(Err(e))) => {
                self.incoming.clear();
                return Err(e);
            }
            // The reader stopped without an error, or there is none.
            Some(Err(_)) | None => {
                self.incoming.clear();
                return Err(LedgerError::Corrupt(format!(
                    "run {}: the ledger holds calls up to #{} but its rows end after #{}",
                    self.run_id, self.total, self.arrived
                )));
            }
        };
        self.received += 1;
        // Each call in its place.
        let first = self.arrived as u64 + 1;
        if let Some((at, call)) = chunk
            .iter()
            .enumerate()
            .find(|(at, call)| call.seq != first + *at as u64)
        {
            self.incoming.clear();
            return Err(LedgerError::Corrupt(format!(
                "run {}: call #{} found where #{} was expected",
                self.run_id,
                call.seq,
                first + at as u64
            )));
        }
        // Every chunk but the last is full, so call `i` is in chunk
        // `i / chunk_len`: a short one has lost its last calls.
        let end = self.arrived + chunk.len();
        let expected_end = (self.arrived + self.chunk_len).min(self.total);
        if end != expected_end {
            self.incoming.clear();
            return Err(LedgerError::Corrupt(format!(
                "run {}: call #{} is missing (the ledger holds calls up to #{})",
                self.run_id,
                end.min(expected_end) + 1,
                self.total
            )));
        }
        self.arrived += chunk.len();
        self.chunks.push(chunk);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{CallClass, CallState};

    fn call(seq: u64) -> CallRecord {
        CallRecord {
            seq,
            class: CallClass::Observe,
            interface: "i".into(),
            function: "f".into(),
            operation_id: String::new(),
            request: String::new(),
            request_hash: String::new(),
            state: CallState::Succeeded,
            outcome: Some("{\"ok\":1}".into()),
            started_at_ms: 0,
            finished_at_ms: Some(0),
            resolved_by: None,
            chain: None,
        }
    }

    #[test]
    fn chunks_let_go_go_back_to_the_reader_that_made_them() {
        // Two readers, chunks of 2: reader 0 makes chunks 0 and 2, reader 1
        // chunks 1 and 3.
        let mut incoming = Vec::new();
        let mut spent = Vec::new();
        let mut freed = Vec::new();
        for reader in 0..2u64 {
            let (send, receive) = std::sync::mpsc::sync_channel(4);
            for chunk in [reader, reader + 2] {
                send.send(Ok(vec![call(2 * chunk + 1), call(2 * chunk + 2)]))
                    .unwrap();
            }
            incoming.push(receive);
            let (back, returned) = std::sync::mpsc::channel();
            spent.push(back);
            freed.push(returned);
        }
        let mut history = History::streamed("r", 8, 2, incoming, spent);
        for index in 0..8 {
            assert_eq!(history.get(index).unwrap().unwrap().seq, index as u64 + 1);
        }
        // Calls 7 and 8 are asked for last: chunks 0, 1 and 2 are let go,
        // each to its own reader; chunk 3 holds the call before the last.
        let back: Vec<Vec<u64>> = freed
            .iter()
            .map(|r| r.try_iter().flatten().map(|c| c.seq).collect())
            .collect();
        assert_eq!(back, vec![vec![1, 2, 5, 6], vec![3, 4]]);
        assert_eq!(history.arrived(6).unwrap().seq, 7);
    }
}

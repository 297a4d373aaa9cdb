//! A run's recorded calls, in order, as an execution consumes them.
//!
//! A history is read at once, or arrives in chunks that a backend reads
//! while the first calls are already being replayed
//! ([`History::streamed`]): reading a long history and replaying it then
//! overlap instead of following each other.

use crate::error::StoreError;
use crate::records::CallRecord;

/// The chunks of a streamed history, in order, or the error that ended them.
pub type Chunks = Box<dyn Iterator<Item = Result<Vec<CallRecord>, StoreError>> + Send>;

pub struct History {
    run_id: String,
    /// The calls arrived so far, in order.
    calls: Vec<CallRecord>,
    /// How many calls the ledger holds for the run.
    total: usize,
    /// The chunks still to come.
    incoming: Option<Chunks>,
    /// For the last call, if it is still in flight: the number of attempts
    /// already recorded for it (reconciliation numbers its own after them).
    last_attempts: u32,
}

impl History {
    /// A history read at once (or from a fixture).
    pub fn loaded(run_id: &str, calls: Vec<CallRecord>) -> Self {
        History {
            run_id: run_id.to_string(),
            total: calls.len(),
            calls,
            incoming: None,
            last_attempts: 0,
        }
    }

    /// A history read at once, checked: call `i` must have seq `i + 1`
    /// (a gap means a lost or damaged row).
    pub fn checked(run_id: &str, calls: Vec<CallRecord>) -> Result<Self, StoreError> {
        for (index, call) in calls.iter().enumerate() {
            if call.seq != index as u64 + 1 {
                return Err(StoreError::Corrupt(format!(
                    "run {run_id}: call #{} found where #{} was expected",
                    call.seq,
                    index + 1
                )));
            }
        }
        Ok(Self::loaded(run_id, calls))
    }

    /// A history of `total` calls arriving as `chunks`.
    pub fn streamed(run_id: &str, total: usize, chunks: Chunks) -> Self {
        History {
            run_id: run_id.to_string(),
            calls: Vec::with_capacity(total),
            total,
            incoming: Some(chunks),
            last_attempts: 0,
        }
    }

    /// The history of a run that has recorded nothing.
    pub fn empty(run_id: &str) -> Self {
        Self::loaded(run_id, Vec::new())
    }

    /// Sets how many attempts the last call already has.
    pub fn with_last_attempts(mut self, attempts: u32) -> Self {
        self.last_attempts = attempts;
        self
    }

    pub fn last_attempts(&self) -> u32 {
        self.last_attempts
    }

    /// How many calls the run recorded.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The call at `index` (seq `index + 1`), waiting for it to arrive if
    /// need be; `None` past the end.
    pub fn get(&mut self, index: usize) -> Result<Option<&CallRecord>, StoreError> {
        if index >= self.total {
            return Ok(None);
        }
        while self.calls.len() <= index {
            self.receive()?;
        }
        Ok(self.calls.get(index))
    }

    /// A call that has arrived already.
    pub fn arrived(&self, index: usize) -> Option<&CallRecord> {
        self.calls.get(index)
    }

    /// Every call, once all have arrived.
    pub fn all(&mut self) -> Result<&[CallRecord], StoreError> {
        while self.calls.len() < self.total {
            self.receive()?;
        }
        Ok(&self.calls)
    }

    /// Takes the calls out, once all have arrived.
    pub fn into_calls(mut self) -> Result<Vec<CallRecord>, StoreError> {
        self.all()?;
        Ok(self.calls)
    }

    fn receive(&mut self) -> Result<(), StoreError> {
        let gap = || {
            StoreError::Corrupt(format!(
                "run {} has {} recorded calls but fewer could be read",
                self.run_id, self.total
            ))
        };
        let chunk = match self.incoming.as_mut().and_then(Iterator::next) {
            Some(chunk) => chunk?,
            None => return Err(gap()),
        };
        for call in chunk {
            let expected = self.calls.len() as u64 + 1;
            if call.seq != expected {
                return Err(StoreError::Corrupt(format!(
                    "run {}: call #{} found where #{expected} was expected",
                    self.run_id, call.seq
                )));
            }
            self.calls.push(call);
        }
        if self.calls.len() > self.total {
            return Err(StoreError::Corrupt(format!(
                "run {} has more calls than the {} it counted",
                self.run_id, self.total
            )));
        }
        Ok(())
    }
}

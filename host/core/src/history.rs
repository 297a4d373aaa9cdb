//! A run's recorded calls, in order, as an execution consumes them.
//!
//! A history is read at once, or arrives in chunks that a backend reads
//! while the first calls are already being replayed
//! ([`History::streamed`]): reading a long history and replaying it then
//! overlap instead of following each other. The chunks are kept as they
//! came (not copied into one vector), and a long history is freed on a
//! thread of its own, so that an execution that replayed 100,000 calls does
//! not wait for their memory to be given back.

use crate::error::StoreError;
use crate::records::CallRecord;

/// The chunks of a streamed history, in order, or the error that ended them.
pub type Chunks = Box<dyn Iterator<Item = Result<Vec<CallRecord>, StoreError>> + Send>;

/// Histories of at least this many calls are freed on a thread of their own.
const FREED_APART_CALLS_MIN: usize = 4096;

pub struct History {
    run_id: String,
    /// The calls arrived so far, in chunks, in order.
    chunks: Vec<Vec<CallRecord>>,
    /// The index of each chunk's first call.
    starts: Vec<usize>,
    /// How many calls have arrived.
    arrived: usize,
    /// The chunk the last call asked for was in (calls are mostly asked
    /// for in order).
    current: usize,
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
        let total = calls.len();
        History {
            run_id: run_id.to_string(),
            chunks: vec![calls],
            starts: vec![0],
            arrived: total,
            current: 0,
            total,
            incoming: None,
            last_attempts: 0,
        }
    }

    /// A history read at once, checked: call `i` must have seq `i + 1`
    /// (a gap means a lost or damaged row).
    pub fn checked(run_id: &str, calls: Vec<CallRecord>) -> Result<Self, StoreError> {
        check_order(run_id, &calls, 0)?;
        Ok(Self::loaded(run_id, calls))
    }

    /// A history of `total` calls arriving as `chunks`.
    pub fn streamed(run_id: &str, total: usize, chunks: Chunks) -> Self {
        History {
            run_id: run_id.to_string(),
            chunks: Vec::new(),
            starts: Vec::new(),
            arrived: 0,
            current: 0,
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
        while self.arrived <= index {
            self.receive()?;
        }
        self.current = self.chunk_of(index);
        Ok(self.arrived(index))
    }

    /// A call that has arrived already.
    pub fn arrived(&self, index: usize) -> Option<&CallRecord> {
        if index >= self.arrived {
            return None;
        }
        let chunk = self.chunk_of(index);
        self.chunks[chunk].get(index - self.starts[chunk])
    }

    /// The chunk that holds call `index` (which has arrived).
    fn chunk_of(&self, index: usize) -> usize {
        let current = self.current.min(self.starts.len().saturating_sub(1));
        let in_current = self.starts.get(current).is_some_and(|&s| s <= index)
            && self
                .starts
                .get(current + 1)
                .is_none_or(|&next| index < next);
        if in_current {
            return current;
        }
        self.starts.partition_point(|&start| start <= index) - 1
    }

    /// Every call, once all have arrived.
    pub fn all(&mut self) -> Result<impl Iterator<Item = &CallRecord>, StoreError> {
        while self.arrived < self.total {
            self.receive()?;
        }
        Ok(self.chunks.iter().flatten())
    }

    /// Takes the calls out, once all have arrived.
    pub fn into_calls(mut self) -> Result<Vec<CallRecord>, StoreError> {
        while self.arrived < self.total {
            self.receive()?;
        }
        Ok(std::mem::take(&mut self.chunks)
            .into_iter()
            .flatten()
            .collect())
    }

    fn receive(&mut self) -> Result<(), StoreError> {
        let chunk = match self.incoming.as_mut().and_then(Iterator::next) {
            Some(chunk) => chunk?,
            None => {
                return Err(StoreError::Corrupt(format!(
                    "run {} has {} recorded calls but fewer could be read",
                    self.run_id, self.total
                )));
            }
        };
        check_order(&self.run_id, &chunk, self.arrived)?;
        if chunk.is_empty() || self.arrived + chunk.len() > self.total {
            return Err(StoreError::Corrupt(format!(
                "run {} does not hold the {} calls it counted",
                self.run_id, self.total
            )));
        }
        self.starts.push(self.arrived);
        self.arrived += chunk.len();
        self.chunks.push(chunk);
        Ok(())
    }
}

impl Drop for History {
    fn drop(&mut self) {
        if self.arrived >= FREED_APART_CALLS_MIN {
            let chunks = std::mem::take(&mut self.chunks);
            // Without a thread, freed here.
            let _ = std::thread::Builder::new()
                .name("stephost-free".into())
                .spawn(move || drop(chunks));
        }
    }
}

/// Refuses calls that are not numbered `first + 1`, `first + 2`, ….
fn check_order(run_id: &str, calls: &[CallRecord], first: usize) -> Result<(), StoreError> {
    for (offset, call) in calls.iter().enumerate() {
        let expected = (first + offset) as u64 + 1;
        if call.seq != expected {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: call #{} found where #{expected} was expected",
                call.seq
            )));
        }
    }
    Ok(())
}

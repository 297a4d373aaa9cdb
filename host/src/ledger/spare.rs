//! String buffers of recorded calls, reused instead of allocated anew.
//!
//! A run allocates every recorded call's strings: interface, function,
//! operation id, request, request hash, outcome and chain link. A committer
//! applies them on its own thread and hands them back (see
//! [`super::group`]); they are kept here, per thread, and the next calls
//! made on the same thread refill their buffers. A buffered read or observe
//! call then allocates none of them. A run on a thread of its own frees
//! nothing another thread allocated; a run executed as a task may go on on
//! another of its runtime's threads after an await, and keeps its buffers
//! there.
//! History readers refill the records of a replay the same way ([`refill`]).
//!
//! Memory stays bounded: at most [`KEPT_BYTES_MAX`] of buffers per thread,
//! none larger than [`REFILL_CAPACITY_MAX`].

use std::cell::RefCell;

use super::{CallRecord, WriteOp};

/// Largest string buffer kept for another call: a large request or outcome
/// is not carried from call to call, holding its memory.
pub const REFILL_CAPACITY_MAX: usize = 4096;

/// Most buffer bytes kept per thread (a batch of a thousand small calls').
pub const KEPT_BYTES_MAX: usize = 1 << 20;

/// The string buffers of one recorded call, empty or holding stale text.
#[derive(Debug, Default)]
pub struct Buffers {
    pub interface: String,
    pub function: String,
    pub operation_id: String,
    pub request: String,
    pub request_hash: String,
    pub outcome: String,
    pub chain: String,
}

impl Buffers {
    fn of(call: CallRecord) -> Self {
        Buffers {
            interface: call.interface,
            function: call.function,
            operation_id: call.operation_id,
            request: call.request,
            request_hash: call.request_hash,
            outcome: call.outcome.unwrap_or_default(),
            chain: call.chain.unwrap_or_default(),
        }
    }

    fn strings(&self) -> [&String; 7] {
        [
            &self.interface,
            &self.function,
            &self.operation_id,
            &self.request,
            &self.request_hash,
            &self.outcome,
            &self.chain,
        ]
    }

    fn bytes(&self) -> usize {
        self.strings().iter().map(|s| s.capacity()).sum()
    }

    /// Whether every buffer is one a refill keeps ([`emptied`]): a call
    /// with a larger one would take the thread's budget for nothing.
    fn reusable(&self) -> bool {
        self.strings()
            .iter()
            .all(|s| s.capacity() <= REFILL_CAPACITY_MAX)
    }
}

#[derive(Default)]
struct Kept {
    buffers: Vec<Buffers>,
    bytes: usize,
}

thread_local! {
    static KEPT: RefCell<Kept> = RefCell::default();
}

/// Keeps the buffers of the calls among `ops`, writes applied and no longer
/// needed, for this thread's next calls (up to [`KEPT_BYTES_MAX`], and
/// none larger than [`REFILL_CAPACITY_MAX`]); drops the rest.
pub fn keep(ops: Vec<WriteOp>) {
    KEPT.with_borrow_mut(|kept| {
        for op in ops {
            if let WriteOp::Call(call) | WriteOp::Started(call) = op {
                let buffers = Buffers::of(call);
                if !buffers.reusable() {
                    continue;
                }
                let bytes = buffers.bytes();
                if kept.bytes + bytes > KEPT_BYTES_MAX {
                    return;
                }
                kept.bytes += bytes;
                kept.buffers.push(buffers);
            }
        }
    });
}

/// Buffers kept on this thread, or new empty ones.
pub fn take() -> Buffers {
    KEPT.with_borrow_mut(|kept| {
        kept.buffers.pop().map_or_else(Buffers::default, |buffers| {
            kept.bytes -= buffers.bytes();
            buffers
        })
    })
}

/// `buffer`, emptied, unless it is larger than [`REFILL_CAPACITY_MAX`]:
/// then a new one.
pub fn emptied(mut buffer: String) -> String {
    if buffer.capacity() > REFILL_CAPACITY_MAX {
        return String::new();
    }
    buffer.clear();
    buffer
}

/// A new string, written by `fill` (which writes into a buffer it is given,
/// to serve both a kept buffer and a new one).
pub fn filled(fill: impl FnOnce(&mut String)) -> String {
    let mut out = String::new();
    fill(&mut out);
    out
}

/// Sets `into` to `value`, in its own buffer unless that is larger than
/// [`REFILL_CAPACITY_MAX`].
pub fn refill(into: &mut String, value: &str) {
    *into = emptied(std::mem::take(into));
    into.push_str(value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{CallClass, CallState};

    fn call(request: &str) -> CallRecord {
        CallRecord {
            seq: 1,
            class: CallClass::Read,
            interface: "stephost:step/effects".into(),
            function: "noop.read".into(),
            operation_id: "0".repeat(64),
            request: request.into(),
            request_hash: "1".repeat(64),
            state: CallState::Succeeded,
            outcome: Some("{\"ok\":1}".into()),
            started_at_ms: 1,
            finished_at_ms: Some(2),
            resolved_by: None,
            chain: Some("2".repeat(64)),
        }
    }

    #[test]
    fn a_thread_gets_back_the_buffers_it_kept_and_memory_stays_bounded() {
        std::thread::spawn(|| {
            assert!(take().request.capacity() == 0, "nothing kept yet");
            let first = call("{\"i\":1}");
            let request = first.request.as_ptr();
            keep(vec![
                WriteOp::Call(first),
                WriteOp::Finish(
                    crate::ledger::RunEnd::Failed {
                        error: "x".into(),
                        exit_code: None,
                    },
                    0,
                ),
            ]);
            let buffers = take();
            assert_eq!(buffers.request.as_ptr(), request, "the same buffer");
            assert_eq!(buffers.outcome, "{\"ok\":1}", "stale text, to be refilled");
            assert_eq!(take().request.capacity(), 0, "kept once");
            // A call with a buffer a refill would let go is not kept.
            keep(vec![WriteOp::Call(call(
                &"x".repeat(REFILL_CAPACITY_MAX + 1),
            ))]);
            assert_eq!(take().request.capacity(), 0, "a large request is not kept");
            // Many calls: only so many bytes are kept.
            let many: Vec<WriteOp> = (0..100_000).map(|_| WriteOp::Call(call("{}"))).collect();
            keep(many);
            let mut kept = 0;
            let mut bytes = 0;
            loop {
                let buffers = take();
                if buffers.interface.capacity() == 0 {
                    break;
                }
                kept += 1;
                bytes += buffers.bytes();
            }
            assert!(
                kept > 100 && bytes <= KEPT_BYTES_MAX,
                "{kept} calls, {bytes} bytes"
            );
            // Each thread keeps its own.
            keep(vec![WriteOp::Call(call("{}"))]);
            std::thread::spawn(|| assert_eq!(take().interface.capacity(), 0))
                .join()
                .unwrap();
            assert!(take().interface.capacity() > 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_refilled_string_reuses_a_small_buffer_and_lets_a_large_one_go() {
        let mut small = String::with_capacity(64);
        let kept = small.as_ptr();
        refill(&mut small, "a chain link");
        assert_eq!(small, "a chain link");
        assert_eq!(small.as_ptr(), kept, "a small buffer is filled again");
        let mut large = "x".repeat(1 << 20);
        refill(&mut large, "{\"ok\":1}");
        assert_eq!(large, "{\"ok\":1}");
        assert!(
            large.capacity() <= REFILL_CAPACITY_MAX,
            "{}",
            large.capacity()
        );
    }
}

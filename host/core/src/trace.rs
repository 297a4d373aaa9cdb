//! The trace a run belongs to (W3C trace context), kept with the run so
//! that every execution of it, on whichever worker, reports into one trace,
//! and the ids of the spans in it.
//!
//! A run's trace is fixed when the run is recorded: the caller's, when it
//! was submitted with a `traceparent` (the run's span is then a child of the
//! caller's span), else a new trace id. It is not sealed with the run: it
//! says where the run is reported, not what it does.
//!
//! Span ids are derived, not drawn: the run's span from its run id, an
//! execution's from its fencing token, a call's from its sequence number and
//! the fencing token it was performed under. So the `traceparent` a receiver
//! gets names the span the host reports for that call, whichever process
//! reports it (an execution that dies is reported by the one that takes its
//! run over), and nothing about spans is written to the ledger.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A run's place in a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTrace {
    /// 32 lowercase hex digits, never all zero.
    pub trace_id: String,
    /// The caller's span the run continues (16 lowercase hex digits), when
    /// it was submitted with a `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// Whether the trace is sampled (the W3C `sampled` flag): the spans of
    /// a run whose trace is not are not exported.
    pub sampled: bool,
    /// The caller's `tracestate`, passed on unchanged to receivers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// The most bytes of a `tracestate` kept (W3C: 32 members, 512 bytes is
/// what a vendor must propagate).
pub const TRACESTATE_BYTES_MAX: usize = 512;

impl RunTrace {
    /// A new trace for a run nobody's trace contains.
    pub fn new(sampled: bool) -> RunTrace {
        RunTrace {
            trace_id: nonzero(crate::ids::unique("stephost/trace-id/v1")[..32].to_string()),
            parent_span_id: None,
            sampled,
            tracestate: None,
        }
    }

    /// The trace of a run recorded before traces were kept: derived from
    /// its id, so that all its executions agree on it.
    pub fn of_run_id(run_id: &str) -> RunTrace {
        let h = Sha256::digest(format!("stephost/trace-id/run/v1/{run_id}").as_bytes());
        RunTrace {
            trace_id: nonzero(crate::ids::to_hex(&h[..16])),
            parent_span_id: None,
            sampled: true,
            tracestate: None,
        }
    }

    /// The trace a caller's `traceparent` (and `tracestate`) puts a run
    /// in. Version 00's form is required (`00-<32 hex>-<16 hex>-<2 hex>`,
    /// lowercase, ids not all zero); a later version is read by its first
    /// four fields, as W3C asks.
    pub fn from_traceparent(
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Result<RunTrace, String> {
        let bad = |why: &str| {
            format!(
                "traceparent {:?} is not a W3C trace context ({why}); it looks like \
                 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                crate::journal::truncate(traceparent, 80)
            )
        };
        let header = traceparent.trim();
        let fields: Vec<&str> = header.split('-').collect();
        if fields.len() < 4 {
            return Err(bad("it has fewer than four fields"));
        }
        let [version, trace_id, span_id, flags] = [fields[0], fields[1], fields[2], fields[3]];
        let lower_hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version, 2) || version == "ff" {
            return Err(bad("its version is not two lowercase hex digits below ff"));
        }
        if version == "00" && fields.len() != 4 {
            return Err(bad("version 00 has exactly four fields"));
        }
        if !lower_hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
            return Err(bad(
                "its trace id is not 32 lowercase hex digits, not all zero",
            ));
        }
        if !lower_hex(span_id, 16) || span_id.bytes().all(|b| b == b'0') {
            return Err(bad(
                "its parent id is not 16 lowercase hex digits, not all zero",
            ));
        }
        if !lower_hex(flags, 2) {
            return Err(bad("its flags are not two lowercase hex digits"));
        }
        let sampled = u8::from_str_radix(flags, 16).map_err(|_| bad("its flags"))? & 1 == 1;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.len() > TRACESTATE_BYTES_MAX || s.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
                    Err(format!(
                        "tracestate is refused: it holds more than {TRACESTATE_BYTES_MAX} bytes \
                         or a byte that is not printable ASCII"
                    ))
                } else {
                    Ok(s.to_string())
                }
            })
            .transpose()?;
        Ok(RunTrace {
            trace_id: trace_id.to_string(),
            parent_span_id: Some(span_id.to_string()),
            sampled,
            tracestate,
        })
    }

    /// The trace as a run's row keeps it (JSON).
    pub fn to_column(&self) -> String {
        serde_json::to_string(self).expect("a trace serializes")
    }

    /// The trace of run `run_id` from its row's column: the one kept, or,
    /// for a run recorded before traces were kept, one derived from its id.
    pub fn from_column(text: Option<&str>, run_id: &str) -> Result<RunTrace, String> {
        match text {
            None => Ok(RunTrace::of_run_id(run_id)),
            Some(t) => serde_json::from_str(t)
                .map_err(|e| format!("a run's trace {t:?} is unreadable: {e}")),
        }
    }

    /// The `traceparent` that names span `span_id` of this trace.
    pub fn traceparent(&self, span_id: &str) -> String {
        format!(
            "00-{}-{span_id}-{}",
            self.trace_id,
            if self.sampled { "01" } else { "00" }
        )
    }

    /// The `traceparent` and `tracestate` a request of call `seq`, made by
    /// the execution under `fence`, carries to its receiver.
    pub fn call_context(&self, run_id: &str, seq: u64, fence: i64) -> (String, Option<&str>) {
        let span = self.call_span_id(run_id, seq, fence);
        (self.traceparent(&span), self.tracestate.as_deref())
    }

    /// The span of the run as a whole.
    pub fn run_span_id(&self, run_id: &str) -> String {
        self.span_id(&[b"run", run_id.as_bytes()])
    }

    /// The span of the execution of run `run_id` under fencing token `fence`.
    pub fn execution_span_id(&self, run_id: &str, fence: i64) -> String {
        self.span_id(&[b"execution", run_id.as_bytes(), &fence.to_le_bytes()])
    }

    /// The span of call `seq` as the execution under `fence` went through it.
    pub fn call_span_id(&self, run_id: &str, seq: u64, fence: i64) -> String {
        self.span_id(&[
            b"call",
            run_id.as_bytes(),
            &seq.to_le_bytes(),
            &fence.to_le_bytes(),
        ])
    }

    /// The span of the wait that ended when the execution under `fence`
    /// claimed the run.
    pub fn wait_span_id(&self, run_id: &str, fence: i64) -> String {
        self.span_id(&[b"wait", run_id.as_bytes(), &fence.to_le_bytes()])
    }

    fn span_id(&self, fields: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        h.update(b"stephost/span-id/v1");
        h.update(self.trace_id.as_bytes());
        for field in fields {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
        nonzero(crate::ids::to_hex(&h.finalize()[..8]))
    }
}

/// When an execution went through one of its run's calls: what its span
/// covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTiming {
    pub seq: u64,
    /// Answered from the ledger, not performed.
    pub replayed: bool,
    pub start_unix_ns: i64,
    pub end_unix_ns: i64,
}

/// Now, in nanoseconds since the Unix epoch.
pub fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// `id` (lowercase hex) as a valid id: all zero is not one, so such an id
/// ends in 1 instead.
fn nonzero(mut id: String) -> String {
    if id.bytes().all(|b| b == b'0') {
        id.pop();
        id.push('1');
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_traceparent_is_read_and_bad_ones_are_refused_by_name() {
        let t = RunTrace::from_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("vendor=x"),
        )
        .unwrap();
        assert_eq!(t.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent_span_id.as_deref(), Some("b7ad6b7169203331"));
        assert!(t.sampled);
        assert_eq!(t.tracestate.as_deref(), Some("vendor=x"));
        let unsampled = RunTrace::from_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            None,
        )
        .unwrap();
        assert!(!unsampled.sampled);
        for (bad, why) in [
            ("", "four fields"),
            (
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "trace id",
            ),
            (
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "trace id",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "parent id",
            ),
            (
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "version",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
                "exactly four",
            ),
        ] {
            let e = RunTrace::from_traceparent(bad, None).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        // A later version is read by its first four fields.
        assert!(
            RunTrace::from_traceparent(
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later",
                None
            )
            .is_ok()
        );
    }

    #[test]
    fn span_ids_are_derived_distinct_and_named_in_a_traceparent() {
        let t = RunTrace::new(true);
        assert_eq!(t.trace_id.len(), 32);
        assert_ne!(t.trace_id, RunTrace::new(true).trace_id);
        let ids = [
            t.run_span_id("r"),
            t.execution_span_id("r", 1),
            t.execution_span_id("r", 2),
            t.call_span_id("r", 1, 1),
            t.call_span_id("r", 1, 2),
            t.call_span_id("r", 2, 1),
            t.wait_span_id("r", 2),
        ];
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(id.len(), 16);
            assert!(ids[i + 1..].iter().all(|other| other != id));
        }
        assert_eq!(t.call_span_id("r", 1, 1), t.call_span_id("r", 1, 1));
        let header = t.traceparent(&ids[3]);
        let back = RunTrace::from_traceparent(&header, None).unwrap();
        assert_eq!(back.trace_id, t.trace_id);
        assert_eq!(back.parent_span_id.as_deref(), Some(ids[3].as_str()));
    }

    #[test]
    fn a_trace_survives_its_column_and_a_run_without_one_gets_one_from_its_id() {
        let t = RunTrace::from_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            Some("a=b"),
        )
        .unwrap();
        assert_eq!(RunTrace::from_column(Some(&t.to_column()), "r").unwrap(), t);
        let old = RunTrace::from_column(None, "r").unwrap();
        assert_eq!(old, RunTrace::from_column(None, "r").unwrap());
        assert_ne!(
            old.trace_id,
            RunTrace::from_column(None, "s").unwrap().trace_id
        );
        assert!(RunTrace::from_column(Some("{"), "r").is_err());
    }
}

//! The tamper-evident chain over a run's calls. Each finished call carries
//! `chain = sha256(previous chain, seq, class, interface, function,
//! operation id, request hash, state, outcome)`, so changing, dropping or
//! reordering any recorded call breaks every link after it. Timestamps are
//! not covered: they are not part of what a replay feeds back.

use sha2::{Digest, Sha256};

use crate::records::{CallRecord, CallState};

/// The chain value of `call`, following `previous` (empty for the first).
pub fn link(previous: &str, call: &CallRecord) -> String {
    link_finished(previous, call, call.state, call.outcome.as_deref())
}

/// The chain value of `call` as it will be once finished with `state` and
/// `outcome` (no copy of the call needed).
pub fn link_finished(
    previous: &str,
    call: &CallRecord,
    state: CallState,
    outcome: Option<&str>,
) -> String {
    let mut out = String::new();
    link_finished_into(&mut out, previous, call, state, outcome);
    out
}

/// [`link_finished`] into `out`'s buffer.
pub fn link_finished_into(
    out: &mut String,
    previous: &str,
    call: &CallRecord,
    state: CallState,
    outcome: Option<&str>,
) {
    let mut h = Sha256::new();
    h.update(b"stephost/chain/v1");
    let fields: [&[u8]; 9] = [
        previous.as_bytes(),
        &call.seq.to_le_bytes(),
        call.class.as_str().as_bytes(),
        call.interface.as_bytes(),
        call.function.as_bytes(),
        call.operation_id.as_bytes(),
        call.request_hash.as_bytes(),
        state.as_str().as_bytes(),
        outcome.unwrap_or("").as_bytes(),
    ];
    for field in fields {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    crate::ids::to_hex_into(out, &h.finalize());
}

/// Checks the chain of a run's calls (in order). Returns the number of
/// links checked, or the first call whose link does not hold.
pub fn verify(calls: &[CallRecord]) -> Result<usize, (u64, String)> {
    let mut previous = String::new();
    let mut checked = 0;
    for (index, call) in calls.iter().enumerate() {
        if call.seq != index as u64 + 1 {
            return Err((
                call.seq,
                format!("call #{} stands where #{} belongs", call.seq, index + 1),
            ));
        }
        if crate::ids::request_hash(&call.interface, &call.function, &call.request)
            != call.request_hash
            && !call.request.starts_with("{\"stephost_request_bytes\"")
        {
            return Err((call.seq, "the request does not match its hash".to_string()));
        }
        match &call.chain {
            Some(found) => {
                let expected = link(&previous, call);
                if *found != expected {
                    return Err((
                        call.seq,
                        "its chain link does not match its content and the calls before it"
                            .to_string(),
                    ));
                }
                previous = expected;
                checked += 1;
            }
            // Only a call still in flight, waiting or unknown has no link,
            // and nothing can follow it.
            None if call.state.has_outcome() => {
                return Err((call.seq, "a finished call has no chain link".to_string()));
            }
            None if index + 1 != calls.len() => {
                return Err((
                    call.seq,
                    "an unfinished call is followed by other calls".to_string(),
                ));
            }
            None => {}
        }
    }
    Ok(checked)
}

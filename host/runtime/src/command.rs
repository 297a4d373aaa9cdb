//! WASI command programs as steps: a program with a `main`, in any language
//! that targets WASI, run without component tooling of the step world.
//!
//! - Its stdin is the run's input: a JSON string as its text, `null` (no
//!   input given) as nothing, any other JSON document as itself.
//! - Its stdout is the output: stdout that is a JSON document is the output
//!   as it is, any other text becomes a JSON string.
//! - Its exit status is kept with the run; a non-zero status fails the step.
//! - Its clocks and randomness are recorded and replayed like a step's (the
//!   WASI context carries the journal's recorded clocks and RNG).
//!
//! Components exporting `wasi:cli/run` run on the component linker; WASI
//! preview1 core modules exporting `_start` run on wasmtime's preview1, so
//! that `proc_exit(n)` keeps `n` (the preview1 component adapter reduces it
//! to success or failure).

use std::sync::{Arc, Mutex};

use wasmtime::{InstancePre, Store};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::sync::CommandPre;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

use crate::imports::random::recorded_random;
use crate::imports::{StepState, lock, trap};
use stephost_core::journal::Journal;
use stephost_core::journal::Stop;

/// The data of a preview1 command's store.
pub struct Preview1State {
    pub wasi: WasiP1Ctx,
    pub limits: crate::limiter::RunLimiter,
    /// For the calls recorded outside the WASI context (`random_get`).
    pub journal: Arc<Mutex<Journal>>,
    /// The clock WASI reads (shared with the WASI context).
    pub monotonic: crate::imports::wasi::RecordedMonotonicClock,
}

/// Gives a command its stdin and a stdout of at most `stdout_max` bytes;
/// returns the stdout to read after the run.
pub fn wire_stdio(wasi: &mut WasiCtxBuilder, input: &str, stdout_max: u64) -> MemoryOutputPipe {
    let stdout = MemoryOutputPipe::new(usize::try_from(stdout_max).unwrap_or(usize::MAX));
    wasi.stdin(MemoryInputPipe::new(stdin_bytes(input)))
        .stdout(stdout.clone())
        .args(&["step"]);
    stdout
}

/// A command's stdin for the run input `input`.
fn stdin_bytes(input: &str) -> Vec<u8> {
    match serde_json::from_str::<serde_json::Value>(input) {
        Ok(serde_json::Value::String(text)) => text.into_bytes(),
        Ok(serde_json::Value::Null) => Vec::new(),
        _ => input.as_bytes().to_vec(),
    }
}

/// Runs a command component's `wasi:cli/run`; its exit status.
pub fn run_component(
    pre: &CommandPre<StepState>,
    store: &mut Store<StepState>,
) -> Result<i32, wasmtime::Error> {
    let command = pre.instantiate(&mut *store)?;
    exit_status(command.wasi_cli_run().call_run(store).map(|r| match r {
        Ok(()) => 0,
        Err(()) => 1,
    }))
}

/// Runs a preview1 module's `_start`; its exit status.
pub fn run_preview1(
    pre: &InstancePre<Preview1State>,
    store: &mut Store<Preview1State>,
) -> Result<i32, wasmtime::Error> {
    let instance = pre.instantiate(&mut *store)?;
    let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
    exit_status(start.call(store, ()).map(|()| 0))
}

/// An exit through `exit`/`proc_exit` is a status, not a trap.
fn exit_status(ran: Result<i32, wasmtime::Error>) -> Result<i32, wasmtime::Error> {
    match ran {
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => Ok(exit.0),
            None => Err(e),
        },
        ok => ok,
    }
}

/// The step's result from a command's exit status and stdout.
pub fn result(code: i32, stdout: &[u8]) -> Result<String, String> {
    if code != 0 {
        return Err(format!("the program exited with code {code}"));
    }
    let text = String::from_utf8_lossy(stdout);
    let trimmed = text.trim();
    if !trimmed.is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_ok() {
        Ok(trimmed.to_string())
    } else {
        Ok(serde_json::Value::String(text.into_owned()).to_string())
    }
}

/// Replaces preview1's `random_get` with one that records one ledger call
/// per guest call (see [`crate::imports::wasi::record_random_bytes_per_call`]),
/// and its `poll_oneoff` with one whose clock waits are durable sleeps (see
/// [`crate::imports::wasi::record_waits`]).
pub fn record_preview1_random_per_call(
    linker: &mut wasmtime::Linker<Preview1State>,
) -> wasmtime::Result<()> {
    /// preview1 errno values.
    const FAULT: i32 = 21;
    const INVAL: i32 = 28;
    linker.allow_shadowing(true);
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "random_get",
        |mut caller: wasmtime::Caller<'_, Preview1State>,
         buf: i32,
         len: i32|
         -> wasmtime::Result<i32> {
            let journal = caller.data().journal.clone();
            let bytes = match recorded_random(&journal, "wasi:random/random", u64::from(len as u32))
            {
                Ok(bytes) => bytes,
                // Too many bytes asked: an error for the program, not a stop.
                Err(Stop::Limit(_)) => return Ok(INVAL),
                Err(stop) => {
                    lock(&journal).set_stop(stop.clone());
                    return Err(trap(stop));
                }
            };
            let Some(memory) = caller
                .get_export("memory")
                .and_then(wasmtime::Extern::into_memory)
            else {
                return Ok(FAULT);
            };
            Ok(
                match memory.write(&mut caller, buf as u32 as usize, &bytes) {
                    Ok(()) => 0,
                    Err(_) => FAULT,
                },
            )
        },
    )?;
    linker.func_wrap("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// preview1's `poll_oneoff`, its waits recorded: the earliest clock
/// subscription is a durable sleep ([`crate::imports::timers::durable_sleep`]),
/// after which it (and every subscription due by then) is reported; stdin
/// and stdout subscriptions are always ready (a command's streams are in
/// memory), so nothing waits for real and a replay answers alike.
fn poll_oneoff(
    mut caller: wasmtime::Caller<'_, Preview1State>,
    subscriptions: i32,
    events: i32,
    count: i32,
    events_written: i32,
) -> wasmtime::Result<i32> {
    const FAULT: i32 = 21;
    const INVAL: i32 = 28;
    /// Bytes of a `subscription` and of an `event`.
    const SUBSCRIPTION: usize = 48;
    const EVENT: usize = 32;
    /// `subclockflags::abstime`.
    const ABSTIME: u16 = 1;
    let Some(memory) = caller
        .get_export("memory")
        .and_then(wasmtime::Extern::into_memory)
    else {
        return Ok(FAULT);
    };
    let count = count as u32 as usize;
    if count == 0 {
        return Ok(INVAL);
    }
    // The subscriptions (and the events written back) must lie within the
    // guest's memory before anything is allocated for them: a count the
    // guest chose is not a size to allocate.
    let size = memory.data_size(&caller);
    let within = |at: i32, each: usize| {
        count
            .checked_mul(each)
            .and_then(|len| (at as u32 as usize).checked_add(len))
            .is_some_and(|end| end <= size)
    };
    if !within(subscriptions, SUBSCRIPTION) || !within(events, EVENT) {
        return Ok(FAULT);
    }
    let mut raw = vec![0u8; count * SUBSCRIPTION];
    if memory
        .read(&caller, subscriptions as u32 as usize, &mut raw)
        .is_err()
    {
        return Ok(FAULT);
    }
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let journal = caller.data().journal.clone();
    let clock = caller.data().monotonic.clone();
    // (userdata, tag, nanoseconds to wait: clock subscriptions only)
    let mut subs = Vec::with_capacity(count);
    for sub in raw.chunks_exact(SUBSCRIPTION) {
        let (userdata, tag) = (u64_at(sub, 0), sub[8]);
        let wait = (tag == 0).then(|| {
            let timeout = u64_at(sub, 24);
            let flags = u16::from_le_bytes([sub[40], sub[41]]);
            if flags & ABSTIME != 0 {
                timeout.saturating_sub(wasmtime_wasi::HostMonotonicClock::now(&clock))
            } else {
                timeout
            }
        });
        subs.push((userdata, tag, wait));
    }
    let streams_ready = subs.iter().any(|(_, tag, _)| *tag != 0);
    let earliest = subs.iter().filter_map(|(_, _, w)| *w).min();
    if !streams_ready && let Some(nanos) = earliest {
        crate::imports::timers::durable_wait(&journal, "poll_oneoff", nanos)?;
    }
    // Every stream subscription, or else every clock due by now.
    let waited = if streams_ready {
        0
    } else {
        earliest.unwrap_or(0)
    };
    let mut out = Vec::new();
    for (userdata, tag, wait) in &subs {
        let ready = match wait {
            Some(nanos) => !streams_ready && *nanos <= waited,
            None => true,
        };
        if ready {
            let mut event = [0u8; EVENT];
            event[0..8].copy_from_slice(&userdata.to_le_bytes());
            event[10] = *tag;
            out.extend_from_slice(&event);
        }
    }
    let written = (out.len() / EVENT) as u32;
    if memory
        .write(&mut caller, events as u32 as usize, &out)
        .and_then(|()| {
            memory.write(
                &mut caller,
                events_written as u32 as usize,
                &written.to_le_bytes(),
            )
        })
        .is_err()
    {
        return Ok(FAULT);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_takes_a_json_string_as_text_and_other_json_as_is() {
        assert_eq!(stdin_bytes(r#""exit=3""#), b"exit=3");
        assert_eq!(stdin_bytes(r#"{"a":1}"#), br#"{"a":1}"#);
        assert_eq!(stdin_bytes("null"), b"");
        assert_eq!(stdin_bytes(" 7 "), b" 7 ");
    }

    #[test]
    fn stdout_json_is_the_output_and_text_becomes_a_string() {
        assert_eq!(result(0, b"{\"a\":1}\n").unwrap(), r#"{"a":1}"#);
        assert_eq!(result(0, b"hello\n").unwrap(), r#""hello\n""#);
        assert_eq!(result(0, b"").unwrap(), r#""""#);
        assert_eq!(
            result(7, b"{}").unwrap_err(),
            "the program exited with code 7"
        );
    }
}

//! Test guest: reaches for ambient authority through std alone — the WASI
//! clock, a randomly seeded `HashMap`, the environment, the file system and
//! the network (a TCP connection to 127.0.0.1 at the input's `port`) — and
//! reports what it got:
//! `{"env_count": n, "fs_error": "...", "net_error": "...", "wasi_now_ms": t,
//! "runs_in_this_memory": 1, "heap_was_zero": true}`.
//! `fs_error` / `net_error` are `null` if the access unexpectedly succeeded.
//! With `"sleep_ms": N` it first sleeps N ms with `std::thread::sleep`.
//! It also looks for what a run before it left in memory: a static counter
//! of runs (1 in a fresh instance) and a zeroed heap buffer, which every run
//! fills before it returns.

use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use stephost_guest::{Ctx, Error};

#[derive(Debug, Serialize)]
struct Output {
    env_count: usize,
    fs_error: Option<String>,
    net_error: Option<String>,
    wasi_now_ms: u128,
    runs_in_this_memory: u64,
    heap_was_zero: bool,
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Bytes of heap each run checks are zero and then fills.
const HEAP_BYTES: usize = 512 << 10;

fn run(_ctx: &mut Ctx, input: Value) -> Result<Output, Error> {
    // `{"sleep_ms": N}`: waits through WASI first, as a step calling
    // `std::thread::sleep` does.
    if let Some(ms) = input.get("sleep_ms").and_then(Value::as_u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let runs_in_this_memory = RUNS.fetch_add(1, Ordering::Relaxed) + 1;
    let mut heap = std::hint::black_box(vec![0u8; HEAP_BYTES]);
    let heap_was_zero = heap.iter().all(|&b| b == 0);
    heap.fill(0xA5);
    std::hint::black_box(&heap);
    // The test listens on this port: a connection would reach a real socket.
    let port = input.get("port").and_then(Value::as_u64).unwrap_or(1);
    let wasi_now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(Error::msg)?
        .as_millis();
    let map: HashMap<&str, usize> = [("a", 1), ("b", 2)].into_iter().collect();
    std::hint::black_box(&map);

    let env_count = std::env::vars().count();
    let fs_error = std::fs::read_dir("/").err().map(|e| e.to_string());
    let net_error = std::net::TcpStream::connect(("127.0.0.1", port as u16))
        .err()
        .map(|e| e.to_string());
    Ok(Output {
        env_count,
        fs_error,
        net_error,
        wasi_now_ms,
        runs_in_this_memory,
        heap_was_zero,
    })
}

stephost_guest::export_step!(run);

//! Test guest: reaches for ambient authority through std alone — the WASI
//! clock, a randomly seeded `HashMap`, the environment, the file system and
//! the network (a TCP connection to 127.0.0.1 at the input's `port`) — and
//! reports what it got:
//! `{"env_count": n, "fs_error": "...", "net_error": "...", "wasi_now_ms": t}`.
//! `fs_error` / `net_error` are `null` if the access unexpectedly succeeded.

use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};
use stephost_guest::{Ctx, Error};

#[derive(Debug, Serialize)]
struct Output {
    env_count: usize,
    fs_error: Option<String>,
    net_error: Option<String>,
    wasi_now_ms: u128,
}

fn run(_ctx: &mut Ctx, input: Value) -> Result<Output, Error> {
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
    })
}

stephost_guest::export_step!(run);

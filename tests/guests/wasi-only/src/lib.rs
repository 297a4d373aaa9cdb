//! Test guest: reaches for ambient authority through std alone — the WASI
//! clock, a randomly seeded `HashMap`, the environment, the file system and
//! the network — and reports what it got:
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

fn run(_ctx: &mut Ctx, _input: Value) -> Result<Output, Error> {
    let wasi_now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(Error::msg)?
        .as_millis();
    let map: HashMap<&str, usize> = [("a", 1), ("b", 2)].into_iter().collect();
    std::hint::black_box(&map);

    let env_count = std::env::vars().count();
    let fs_error = std::fs::read_dir("/").err().map(|e| e.to_string());
    let net_error = std::net::TcpStream::connect("127.0.0.1:1")
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

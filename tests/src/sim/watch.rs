//! A console's view of the runs: `GET /api/events` of the cluster's
//! `stephost serve`, read for the whole seed and opened again each time
//! the server is killed and started again (a stream cut mid-way). What it
//! saw is checked against the ledger: a run that ended while a stream was
//! open is seen ending on it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// How long after a change an open stream has surely sent it: the
/// server's look for changed runs comes every 500 ms (`watch_ms`).
pub const SENT_WITHIN_MS: i64 = 2_000;

/// What the streams brought.
#[derive(Default)]
pub struct Seen {
    /// The last status each run's `runs` events named.
    pub last: HashMap<String, String>,
    /// When each stream was opened (its response's head read) and when it
    /// ended, on the wall clock (ms).
    pub streams: Vec<(i64, Option<i64>)>,
}

impl Seen {
    /// Whether one stream was open from `at` until the server had surely
    /// sent what changed at `at`.
    pub fn open_at(&self, at: i64) -> bool {
        self.streams.iter().any(|(opened, ended)| {
            *opened <= at && ended.is_none_or(|ended| ended >= at + SENT_WITHIN_MS)
        })
    }
}

pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// Reads the event stream of the `serve` whose log is the newest
    /// `worker-0.N.log` in `dir`, until stopped.
    pub fn start(dir: PathBuf) -> Watch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(addr) = newest_address(&dir) {
                        read_stream(&addr, &seen, &stop);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Watch {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The address the newest `serve` in `dir` listens on, once it does.
fn newest_address(dir: &std::path::Path) -> Option<String> {
    let newest = (0..)
        .map(|start| dir.join(format!("worker-0.{start}.log")))
        .take_while(|path| path.exists())
        .last()?;
    let log = std::fs::read_to_string(newest).ok()?;
    let rest = log.split("listening on http://").nth(1)?;
    Some(rest.split(['/', '\n', ' ']).next()?.to_string())
}

/// Reads one stream until it ends, the server goes, or the watch stops.
fn read_stream(addr: &str, seen: &Mutex<Seen>, stop: &AtomicBool) {
    let Ok(mut socket) = TcpStream::connect(addr) else {
        return;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let request =
        format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    if socket.write_all(request.as_bytes()).is_err() {
        return;
    }
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    let mut index = None;
    let mut event = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => break,
        }
        let text = line.trim_end();
        if index.is_none() {
            if text.starts_with("HTTP/") && !text.contains(" 200") {
                return;
            }
            // The end of the response's head: the stream is open.
            if text.is_empty() {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.streams.push((stephost_core::clock::now_ms(), None));
                index = Some(seen.streams.len() - 1);
            }
            continue;
        }
        if let Some(name) = text.strip_prefix("event:") {
            event = name.trim().to_string();
        } else if let Some(data) = text.strip_prefix("data:")
            && event == "runs"
        {
            let changed: Value = serde_json::from_str(data.trim()).unwrap_or_default();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for run in changed.as_array().into_iter().flatten() {
                if let (Some(id), Some(status)) = (run["run_id"].as_str(), run["status"].as_str()) {
                    seen.last.insert(id.to_string(), status.to_string());
                }
            }
        }
    }
    if let Some(i) = index {
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.streams[i].1 = Some(stephost_core::clock::now_ms());
    }
}

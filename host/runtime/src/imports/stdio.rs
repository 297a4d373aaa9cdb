//! WASI stdout and stderr: what a step prints goes to its run's log, a line
//! at a time (levels `stdout` and `stderr`), not to the host's terminal. It
//! is recorded like a `log` call, so `show` lists it and a replay or resume
//! does not print its replayed prefix again. What a run prints is bounded
//! per execution by `guest_output_bytes_max`; past it a marker line says so
//! and the rest is dropped.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use stephost_core::journal::Journal;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::imports::lock;

/// The longest line kept whole, in bytes; a longer one is cut into lines
/// of this size.
pub const LINE_BYTES_MAX: usize = 4096;

/// One of a step's output streams.
#[derive(Clone)]
pub struct GuestOutput {
    journal: Arc<Mutex<Journal>>,
    level: &'static str,
    budget: Arc<Mutex<Budget>>,
}

/// What is left of an execution's output budget (shared by stdout and
/// stderr).
#[derive(Debug)]
pub struct Budget {
    left: u64,
    limit: u64,
    cut: bool,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Mutex<Budget>> {
        Arc::new(Mutex::new(Budget {
            left: limit,
            limit,
            cut: false,
        }))
    }
}

impl GuestOutput {
    pub fn stdout(journal: &Arc<Mutex<Journal>>, budget: &Arc<Mutex<Budget>>) -> Self {
        Self::new(journal, "stdout", budget)
    }

    pub fn stderr(journal: &Arc<Mutex<Journal>>, budget: &Arc<Mutex<Budget>>) -> Self {
        Self::new(journal, "stderr", budget)
    }

    fn new(
        journal: &Arc<Mutex<Journal>>,
        level: &'static str,
        budget: &Arc<Mutex<Budget>>,
    ) -> Self {
        GuestOutput {
            journal: journal.clone(),
            level,
            budget: budget.clone(),
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineWriter {
            out: self.clone(),
            line: Vec::new(),
        })
    }

    /// Only WASIp3 asks for this, and a step does not link it.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

/// Collects bytes into lines and records each line as it ends, in the
/// guest's call order (a write records before it returns).
struct LineWriter {
    out: GuestOutput,
    line: Vec<u8>,
}

impl LineWriter {
    fn take(&mut self, bytes: &[u8]) {
        let (allowed, cut_now, limit) = {
            let mut budget = self.out.budget.lock().unwrap_or_else(|p| p.into_inner());
            let n = (bytes.len() as u64).min(budget.left) as usize;
            budget.left -= n as u64;
            let cut_now = n < bytes.len() && !budget.cut;
            budget.cut |= cut_now;
            (n, cut_now, budget.limit)
        };
        for &b in &bytes[..allowed] {
            if b == b'\n' {
                self.flush_line();
            } else {
                self.line.push(b);
                if self.line.len() >= LINE_BYTES_MAX {
                    self.flush_line();
                }
            }
        }
        if cut_now {
            if !self.line.is_empty() {
                self.flush_line();
            }
            self.emit_text(&format!(
                "stephost: the step's output was cut here: it printed more than \
                 guest_output_bytes_max = {limit} bytes in this execution"
            ));
        }
    }

    fn flush_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let text = String::from_utf8_lossy(&line);
        self.emit_text(text.trim_end_matches('\r'));
    }

    fn emit_text(&self, text: &str) {
        // A stopped execution (fenced, out of calls) refuses the line; the
        // stop itself surfaces at the step's next call.
        let _ = lock(&self.out.journal).log(self.out.level, text);
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.flush_line();
        }
    }
}

#[async_trait::async_trait]
impl OutputStream for LineWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.take(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(LINE_BYTES_MAX * 16)
    }
}

#[async_trait::async_trait]
impl Pollable for LineWriter {
    async fn ready(&mut self) {}
}

//! Built-in handlers: `echo`, `static`, `reject` and the `file` receiver.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::handler::{Failure, Handler, Lookup, Reply, Request};

/// Answers every request with the request itself.
pub struct Echo;

impl Handler for Echo {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        Ok(Reply::new(request.body))
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn blocks(&self) -> bool {
        false
    }
}

/// Answers every request with a fixed JSON document.
pub struct Static {
    pub response: String,
}

impl Handler for Static {
    fn perform(&self, _request: &Request<'_>) -> Result<Reply, Failure> {
        Ok(Reply::new(self.response.clone()))
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn blocks(&self) -> bool {
        false
    }
}

/// Refuses every request.
pub struct Reject {
    pub message: String,
}

impl Handler for Reject {
    fn perform(&self, _request: &Request<'_>) -> Result<Reply, Failure> {
        Err(Failure::Rejected(self.message.clone()))
    }

    fn blocks(&self) -> bool {
        false
    }
}

/// A receiver that appends one JSON line per operation to a file, fsync'd,
/// and deduplicates by operation id: a resend of a recorded operation gets
/// the original receipt and adds nothing. It answers lookups by operation id
/// and refuses a writer whose fencing token is older than one it has seen
/// for the same run. Several processes may share the file: each request
/// holds an exclusive lock on `<file>.lock`.
pub struct FileReceiver {
    path: PathBuf,
    lock: Mutex<()>,
    reply_delay: std::time::Duration,
    deduplicate: bool,
    lookup: bool,
}

/// One line of the receiver's file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    pub operation_id: String,
    pub run_id: String,
    pub effect: String,
    pub fence: i64,
    pub request: serde_json::Value,
    pub receipt: String,
}

impl FileReceiver {
    pub fn new(path: PathBuf) -> Self {
        FileReceiver {
            path,
            lock: Mutex::new(()),
            reply_delay: std::time::Duration::ZERO,
            deduplicate: true,
            lookup: true,
        }
    }

    /// With `false`, every request is appended, even a resend: the receiver
    /// then cannot be resent to safely.
    pub fn with_deduplication(mut self, deduplicate: bool) -> Self {
        self.deduplicate = deduplicate;
        self
    }

    /// With `false`, the receiver answers no lookups.
    pub fn with_lookup(mut self, lookup: bool) -> Self {
        self.lookup = lookup;
        self
    }

    /// Waits `delay` after committing each new operation before replying.
    pub fn with_reply_delay(mut self, delay: std::time::Duration) -> Self {
        self.reply_delay = delay;
        self
    }

    /// The entry for `operation_id`, and the newest fence seen for `run_id`.
    fn find(&self, operation_id: &str, run_id: &str) -> Result<(Option<FileEntry>, i64), Failure> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, 0)),
            Err(e) => return Err(self.io_failure(e)),
        };
        let mut found = None;
        let mut fence = 0;
        for line in BufReader::new(file).lines() {
            let line = line.map_err(|e| self.io_failure(e))?;
            // A torn last line (the receiver crashed mid-append) is not an entry.
            let Ok(entry) = serde_json::from_str::<FileEntry>(&line) else {
                continue;
            };
            if entry.run_id == run_id {
                fence = fence.max(entry.fence);
            }
            if entry.operation_id == operation_id && found.is_none() {
                found = Some(entry);
            }
        }
        Ok((found, fence))
    }

    /// Holds the cross-process lock for one request.
    fn lock_file(&self) -> Result<File, Failure> {
        let mut name = self.path.clone().into_os_string();
        name.push(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&name)
            .map_err(|e| self.io_failure(e))?;
        file.lock().map_err(|e| self.io_failure(e))?;
        Ok(file)
    }

    fn io_failure(&self, e: std::io::Error) -> Failure {
        Failure::retryable(format!("receiver file {}: {e}", self.path.display()))
    }

    fn receipt(entry: &FileEntry) -> String {
        serde_json::json!({
            "receipt": entry.receipt,
            "operation_id": entry.operation_id,
        })
        .to_string()
    }
}

impl Handler for FileReceiver {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let body: serde_json::Value = serde_json::from_str(request.body)
            .map_err(|e| Failure::Invalid(format!("request is not JSON: {e}")))?;
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let file_lock = self.lock_file()?;
        let (existing, newest_fence) = self.find(request.operation_id, request.run_id)?;
        if request.fence < newest_fence {
            return Err(Failure::Rejected(format!(
                "stale fencing token {} for run {} (newest seen: {newest_fence})",
                request.fence, request.run_id
            )));
        }
        if self.deduplicate
            && let Some(existing) = existing
        {
            return Ok(Reply {
                duplicate: true,
                ..Reply::new(Self::receipt(&existing))
            });
        }
        let entry = FileEntry {
            operation_id: request.operation_id.to_string(),
            run_id: request.run_id.to_string(),
            effect: request.effect.to_string(),
            fence: request.fence,
            request: body,
            receipt: format!(
                "R-{}",
                &request.operation_id[..12.min(request.operation_id.len())]
            ),
        };
        let mut line =
            serde_json::to_string(&entry).map_err(|e| Failure::Invalid(e.to_string()))?;
        line.push('\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.io_failure(e))?;
        file.write_all(line.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| self.io_failure(e))?;
        // Committed: let other requests in while the reply is slow.
        drop(file_lock);
        drop(guard);
        std::thread::sleep(self.reply_delay);
        Ok(Reply::new(Self::receipt(&entry)))
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        if !self.lookup {
            return Ok(Lookup::Unsupported);
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _file_lock = self.lock_file()?;
        Ok(match self.find(request.operation_id, request.run_id)?.0 {
            Some(entry) => Lookup::Found(Self::receipt(&entry)),
            None => Lookup::NotFound,
        })
    }

    fn idempotent(&self) -> bool {
        self.deduplicate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(op: &'a str, body: &'a str) -> Request<'a> {
        Request {
            seq: 1,
            services: &crate::services::Services::NONE,
            redacted: false,
            trace: None,
            spend: &crate::handler::TEST_SPEND,
            deadline: None,
            control: None,
            run_id: "r",
            effect: "orders",
            class: stephost_core::CallClass::Write,
            operation_id: op,
            fence: 1,
            body,
        }
    }

    #[test]
    fn the_file_receiver_records_an_operation_once_and_answers_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.jsonl");
        let receiver = FileReceiver::new(path.clone());
        let op = "a".repeat(64);
        assert_eq!(
            receiver.lookup(&request(&op, "{}")).unwrap(),
            Lookup::NotFound
        );
        let first = receiver.perform(&request(&op, r#"{"n":1}"#)).unwrap();
        let again = receiver.perform(&request(&op, r#"{"n":1}"#)).unwrap();
        assert_eq!(first.body, again.body);
        assert!(again.duplicate && !first.duplicate);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
        assert_eq!(
            receiver.lookup(&request(&op, "{}")).unwrap(),
            Lookup::Found(first.body)
        );
        receiver.perform(&request(&"b".repeat(64), "{}")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn the_file_receiver_refuses_a_stale_fencing_token() {
        let dir = tempfile::tempdir().unwrap();
        let receiver = FileReceiver::new(dir.path().join("o.jsonl"));
        let mut newer = request("op-2", "{}");
        newer.fence = 2;
        receiver.perform(&newer).unwrap();
        let err = receiver.perform(&request("op-3", "{}")).unwrap_err();
        assert!(
            matches!(err, Failure::Rejected(ref m) if m.contains("stale fencing token")),
            "{err:?}"
        );
    }

    #[test]
    fn the_file_receiver_refuses_a_request_that_is_not_json() {
        let dir = tempfile::tempdir().unwrap();
        let receiver = FileReceiver::new(dir.path().join("o.jsonl"));
        let err = receiver.perform(&request("op", "not json")).unwrap_err();
        assert!(matches!(err, Failure::Invalid(_)));
    }
}

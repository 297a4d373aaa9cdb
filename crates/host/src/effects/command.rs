//! The `command` effect kind: runs a program with the request JSON on stdin
//! and takes the result JSON from stdout. The operation id, run id and
//! fencing token are in its environment (`STEPHOST_OPERATION_ID`,
//! `STEPHOST_RUN_ID`, `STEPHOST_FENCE`, `STEPHOST_EFFECT`).
//!
//! Exit status: 0 is success; 75 (`EX_TEMPFAIL`) is retryable, as is a
//! timeout or a kill by signal; anything else is a rejection carrying the
//! end of stderr. A `lookup` command prints the receipt and exits 0 when the
//! operation is done, exits 3 when it is not found; anything else is a
//! failed lookup.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Failure, Handler, Lookup, Reply, Request};

/// Exit status a command uses to ask for a retry.
pub const EXIT_RETRY: i32 = 75;
/// Exit status a lookup command uses for "not found".
pub const EXIT_NOT_FOUND: i32 = 3;

pub struct CommandEffect {
    argv: Vec<String>,
    lookup: Option<Vec<String>>,
    idempotent: bool,
    timeout: Duration,
}

struct Finished {
    status: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

impl CommandEffect {
    pub fn new(
        argv: Vec<String>,
        lookup: Option<Vec<String>>,
        idempotent: bool,
        timeout: Duration,
    ) -> Self {
        CommandEffect {
            argv,
            lookup,
            idempotent,
            timeout,
        }
    }

    fn run(
        &self,
        argv: &[String],
        request: &Request<'_>,
        stdin: &str,
    ) -> Result<Finished, Failure> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Failure::Invalid("the command's argv is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .env("STEPHOST_OPERATION_ID", request.operation_id)
            .env("STEPHOST_RUN_ID", request.run_id)
            .env("STEPHOST_FENCE", request.fence.to_string())
            .env("STEPHOST_EFFECT", request.effect)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::Rejected(format!("cannot start {program}: {e}")))?;
        let mut input = child.stdin.take();
        let stdin_text = stdin.to_string();
        let writer = std::thread::spawn(move || {
            if let Some(pipe) = input.as_mut() {
                let _ = pipe.write_all(stdin_text.as_bytes());
            }
        });
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(pipe) = out.as_mut() {
                let _ = pipe.read_to_string(&mut s);
            }
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(pipe) = err.as_mut() {
                let _ = pipe.read_to_string(&mut s);
            }
            s
        });
        let deadline = Instant::now() + self.timeout;
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    timed_out = true;
                    break child
                        .wait()
                        .map_err(|e| Failure::retryable(format!("{program}: {e}")))?;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(Failure::retryable(format!("{program}: {e}"))),
            }
        };
        let _ = writer.join();
        Ok(Finished {
            status: status.code(),
            timed_out,
            stdout: reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        })
    }
}

fn tail(s: &str) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(300);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

impl Handler for CommandEffect {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let done = self.run(&self.argv, request, request.body)?;
        let program = &self.argv[0];
        if done.timed_out {
            return Err(Failure::retryable(format!(
                "{program} did not finish within {} ms",
                self.timeout.as_millis()
            )));
        }
        match done.status {
            Some(0) => {
                let out = done.stdout.trim();
                if out.is_empty() {
                    return Ok(Reply::new("null"));
                }
                serde_json::from_str::<serde::de::IgnoredAny>(out).map_err(|e| {
                    Failure::Rejected(format!("{program} printed something that is not JSON: {e}"))
                })?;
                Ok(Reply::new(out))
            }
            // By contract, exit 75 means the command did not act.
            Some(EXIT_RETRY) => Err(Failure::not_received(format!(
                "{program} asked for a retry: {}",
                tail(&done.stderr)
            ))),
            Some(code) => Err(Failure::Rejected(format!(
                "{program} exited with {code}: {}",
                tail(&done.stderr)
            ))),
            None => Err(Failure::retryable(format!(
                "{program} was killed by a signal"
            ))),
        }
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        let Some(argv) = &self.lookup else {
            return Ok(Lookup::Unsupported);
        };
        let done = self.run(argv, request, request.body)?;
        match (done.timed_out, done.status) {
            (false, Some(0)) => Ok(Lookup::Found(
                Some(done.stdout.trim())
                    .filter(|s| !s.is_empty())
                    .unwrap_or("null")
                    .to_string(),
            )),
            (false, Some(EXIT_NOT_FOUND)) => Ok(Lookup::NotFound),
            _ => Err(Failure::retryable(format!(
                "lookup {} failed: {}",
                argv[0],
                tail(&done.stderr)
            ))),
        }
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stephost_core::CallClass;

    fn request(body: &str) -> Request<'_> {
        Request {
            run_id: "r1",
            effect: "cmd",
            class: CallClass::Write,
            operation_id: "op-1",
            fence: 7,
            body,
        }
    }

    fn sh(script: &str) -> CommandEffect {
        CommandEffect::new(
            vec!["sh".into(), "-c".into(), script.into()],
            None,
            false,
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_command_gets_the_request_on_stdin_and_the_ids_in_its_environment() {
        let effect = sh(
            r#"read body; printf '{"got":%s,"op":"%s","fence":%s}' "$body" "$STEPHOST_OPERATION_ID" "$STEPHOST_FENCE""#,
        );
        let reply = effect.perform(&request(r#"{"n":1}"#)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["got"]["n"], 1);
        assert_eq!(v["op"], "op-1");
        assert_eq!(v["fence"], 7);
    }

    #[test]
    fn exit_statuses_are_classified() {
        let retry = sh("echo busy >&2; exit 75")
            .perform(&request("{}"))
            .unwrap_err();
        assert!(matches!(retry, Failure::Retryable { .. }), "{retry:?}");
        let reject = sh("echo no such sku >&2; exit 1")
            .perform(&request("{}"))
            .unwrap_err();
        assert_eq!(
            reject,
            Failure::Rejected("sh exited with 1: no such sku".into())
        );
        let garbage = sh("echo not json").perform(&request("{}")).unwrap_err();
        assert!(matches!(garbage, Failure::Rejected(_)));
    }

    #[test]
    fn a_command_that_outlives_its_timeout_is_killed_and_retryable() {
        let slow = CommandEffect::new(
            vec!["sleep".into(), "5".into()],
            None,
            false,
            Duration::from_millis(100),
        );
        let err = slow.perform(&request("{}")).unwrap_err();
        assert!(matches!(err, Failure::Retryable { .. }));
        assert!(
            err.message().contains("did not finish within 100 ms"),
            "{err:?}"
        );
    }
}

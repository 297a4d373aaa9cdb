//! The `command` effect kind: runs a program with the request JSON on stdin
//! and takes the result JSON from stdout. The operation id, run id and
//! fencing token are in its environment (`STEPHOST_OPERATION_ID`,
//! `STEPHOST_RUN_ID`, `STEPHOST_FENCE`, `STEPHOST_EFFECT`), which holds
//! nothing else but the variables the effect names: the host's secrets are
//! not a command's.
//!
//! A command runs in a process group of its own, in the configuration's
//! folder (a relative program path is resolved there). When it ends, or its
//! timeout passes, the whole group is killed: a process it left in the
//! background cannot hold its output open or outlive it. Its output is read
//! up to the payload limit.
//!
//! Exit status: 0 is success; 75 (`EX_TEMPFAIL`) is retryable, as is a
//! timeout or a kill by signal; any other is a refusal, final only if the
//! effect lists it in `final_exit_codes`. A `lookup` command prints the
//! receipt and exits 0 when the operation is done, exits 3 (or the effect's
//! `lookup_not_found_exit`) when it is not found; anything else is a failed
//! lookup.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Failure, Handler, Lookup, Reply, Request};

/// Exit status a command uses to ask for a retry.
pub const EXIT_RETRY: i32 = 75;
/// Exit status a lookup command uses for "not found", unless the effect
/// names another.
pub const EXIT_NOT_FOUND: i32 = 3;

/// How a command effect runs.
#[derive(Debug, Clone)]
pub struct CommandOptions {
    pub argv: Vec<String>,
    pub lookup: Option<Vec<String>>,
    pub idempotent: bool,
    pub timeout: Duration,
    /// The folder the command runs in and relative program paths are
    /// resolved against (the configuration's); `None`: the host's.
    pub dir: Option<PathBuf>,
    /// Variables passed on from the host's environment, by name.
    pub env: Vec<String>,
    /// Most bytes of stdout (and of stderr) read.
    pub output_bytes_max: usize,
    /// Exit codes that are final refusals even after an earlier attempt
    /// may have acted.
    pub final_exit_codes: Vec<i32>,
    /// The lookup's exit code for "not found".
    pub lookup_not_found_exit: i32,
}

pub struct CommandEffect {
    options: CommandOptions,
}

struct Finished {
    status: Option<i32>,
    timed_out: bool,
    stdout: Output,
    stderr: Output,
}

/// What a command printed on one stream.
#[derive(Default)]
struct Output {
    text: String,
    /// It printed more than the limit (the rest was not read).
    cut: bool,
}

impl CommandEffect {
    pub fn new(options: CommandOptions) -> Self {
        CommandEffect { options }
    }

    fn run(
        &self,
        argv: &[String],
        request: &Request<'_>,
        stdin: &str,
    ) -> Result<Finished, Failure> {
        use std::os::unix::process::CommandExt;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Failure::Invalid("the command's argv is empty".into()))?;
        let mut command = match &self.options.dir {
            Some(dir) if program.contains('/') => Command::new(dir.join(program)),
            _ => Command::new(program),
        };
        if let Some(dir) = &self.options.dir {
            command.current_dir(dir);
        }
        command.env_clear();
        for name in &self.options.env {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        let mut child = command
            .args(args)
            .env("STEPHOST_OPERATION_ID", request.operation_id)
            .env("STEPHOST_RUN_ID", request.run_id)
            .env("STEPHOST_FENCE", request.fence.to_string())
            .env("STEPHOST_EFFECT", request.effect)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::Rejected(format!("cannot start {program}: {e}")))?;
        let group = child.id();
        let mut input = child.stdin.take();
        let stdin_text = stdin.to_string();
        let writer = std::thread::spawn(move || {
            if let Some(pipe) = input.as_mut() {
                let _ = pipe.write_all(stdin_text.as_bytes());
            }
        });
        let limit = self.options.output_bytes_max;
        let out = child.stdout.take();
        let err = child.stderr.take();
        let reader = std::thread::spawn(move || read_bounded(out, limit));
        let err_reader = std::thread::spawn(move || read_bounded(err, limit));
        let deadline = Instant::now() + self.options.timeout;
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    timed_out = true;
                    kill_group(group);
                    break child
                        .wait()
                        .map_err(|e| Failure::retryable(format!("{program}: {e}")))?;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    kill_group(group);
                    return Err(Failure::retryable(format!("{program}: {e}")));
                }
            }
        };
        // What it left behind goes with it, and its output ends here.
        kill_group(group);
        let _ = writer.join();
        Ok(Finished {
            status: status.code(),
            timed_out,
            stdout: reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        })
    }
}

/// Reads `pipe` to its end, keeping at most `limit` bytes; past them the
/// pipe is closed (a writer then fails or is killed with its group).
fn read_bounded(pipe: Option<impl Read>, limit: usize) -> Output {
    let Some(pipe) = pipe else {
        return Output::default();
    };
    let mut bytes = Vec::new();
    let _ = pipe.take(limit as u64 + 1).read_to_end(&mut bytes);
    let cut = bytes.len() > limit;
    bytes.truncate(limit);
    Output {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        cut,
    }
}

/// Kills every process of the group `group` leads.
fn kill_group(group: u32) {
    let Ok(pid) = i32::try_from(group) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals a process group; it reads
    // no memory of ours. A group already gone answers ESRCH, ignored.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
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
        let done = self.run(&self.options.argv, request, request.body)?;
        let program = &self.options.argv[0];
        if done.timed_out {
            return Err(Failure::retryable(format!(
                "{program} did not finish within {} ms",
                self.options.timeout.as_millis()
            )));
        }
        if done.stdout.cut {
            // Its pipe was closed past the limit (which may have killed it):
            // whatever it did, its answer is lost.
            return Err(Failure::retryable(format!(
                "{program} printed more than {} bytes (the effect's output limit, \
                 payload_bytes_max); its answer is lost",
                self.options.output_bytes_max
            )));
        }
        let stderr = tail(&done.stderr.text);
        match done.status {
            Some(0) => {
                let out = done.stdout.text.trim();
                if out.is_empty() {
                    return Ok(Reply::new("null"));
                }
                // It acted, but its answer cannot be read: in doubt.
                serde_json::from_str::<serde::de::IgnoredAny>(out).map_err(|e| {
                    Failure::retryable(format!("{program} printed something that is not JSON: {e}"))
                })?;
                Ok(Reply::new(out))
            }
            // By contract, exit 75 means the command did not act.
            Some(EXIT_RETRY) => Err(Failure::not_received(format!(
                "{program} asked for a retry: {stderr}"
            ))),
            Some(code) if self.options.final_exit_codes.contains(&code) => Err(Failure::Rejected(
                format!("{program} exited with {code}: {stderr}"),
            )),
            Some(code) => Err(Failure::Refused(format!(
                "{program} exited with {code}: {stderr}"
            ))),
            None => Err(Failure::retryable(format!(
                "{program} was killed by a signal"
            ))),
        }
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        let Some(argv) = &self.options.lookup else {
            return Ok(Lookup::Unsupported);
        };
        let done = self.run(argv, request, request.body)?;
        match (done.timed_out, done.status) {
            (false, Some(code)) if code == self.options.lookup_not_found_exit => {
                Ok(Lookup::NotFound)
            }
            // Checked by the caller: only a receipt naming this operation
            // proves it happened (an empty answer proves nothing).
            (false, Some(0)) if !done.stdout.cut => {
                Ok(Lookup::Found(done.stdout.text.trim().to_string()))
            }
            _ => Err(Failure::retryable(format!(
                "lookup {} failed: {}",
                argv[0],
                tail(&done.stderr.text)
            ))),
        }
    }

    fn idempotent(&self) -> bool {
        self.options.idempotent
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

    fn options(argv: &[&str]) -> CommandOptions {
        CommandOptions {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            lookup: None,
            idempotent: false,
            timeout: Duration::from_secs(5),
            dir: None,
            env: Vec::new(),
            output_bytes_max: 1024,
            final_exit_codes: Vec::new(),
            lookup_not_found_exit: EXIT_NOT_FOUND,
        }
    }

    fn sh(script: &str) -> CommandEffect {
        CommandEffect::new(options(&["sh", "-c", script]))
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
    fn a_command_sees_only_the_variables_its_effect_names() {
        let home = std::env::var("HOME").ok();
        let mut named = options(&[
            "sh",
            "-c",
            r#"printf '{"home":"%s","cargo":"%s"}' "$HOME" "$CARGO""#,
        ]);
        named.env = vec!["HOME".into()];
        let reply = CommandEffect::new(named).perform(&request("{}")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["home"].as_str(), Some(home.as_deref().unwrap_or("")));
        // Cargo sets CARGO for tests; the command does not see it.
        assert_eq!(v["cargo"], "");
    }

    #[test]
    fn exit_statuses_are_classified() {
        let retry = sh("echo busy >&2; exit 75")
            .perform(&request("{}"))
            .unwrap_err();
        assert!(matches!(retry, Failure::Retryable { .. }), "{retry:?}");
        let refused = sh("echo no such sku >&2; exit 1")
            .perform(&request("{}"))
            .unwrap_err();
        assert_eq!(
            refused,
            Failure::Refused("sh exited with 1: no such sku".into())
        );
        let mut final_one = options(&["sh", "-c", "exit 2"]);
        final_one.final_exit_codes = vec![2];
        assert_eq!(
            CommandEffect::new(final_one)
                .perform(&request("{}"))
                .unwrap_err(),
            Failure::Rejected("sh exited with 2: ".into())
        );
        let garbage = sh("echo not json").perform(&request("{}")).unwrap_err();
        assert!(matches!(garbage, Failure::Retryable { .. }), "{garbage:?}");
    }

    #[test]
    fn a_command_that_outlives_its_timeout_is_killed_and_retryable() {
        let mut slow = options(&["sleep", "5"]);
        slow.timeout = Duration::from_millis(100);
        let err = CommandEffect::new(slow)
            .perform(&request("{}"))
            .unwrap_err();
        assert!(matches!(err, Failure::Retryable { .. }));
        assert!(
            err.message().contains("did not finish within 100 ms"),
            "{err:?}"
        );
    }

    #[test]
    fn output_past_the_limit_is_not_kept() {
        let loud = sh("head -c 100000 /dev/zero | tr '\\0' 'x'; echo");
        let err = loud.perform(&request("{}")).unwrap_err();
        assert!(err.message().contains("more than 1024 bytes"), "{err:?}");
    }
}

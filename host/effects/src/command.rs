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
//! up to the payload limit. The timeout holds whatever the command does: a
//! process it started outside its group (`setsid`) that keeps the pipes
//! open makes the attempt a timeout, not a wait. A program that cannot be
//! started for want of descriptors, processes or memory is retryable (it
//! never ran); a missing or forbidden one is a refusal.
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

use crate::handler::{Failure, Handler, Lookup, Reply, Request};

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
    /// It exited before its timeout, but a process it started outside its
    /// process group kept its output open past it.
    held_open: bool,
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
            .map_err(|e| spawn_failure(program, &e))?;
        let group = child.id();
        let deadline = Instant::now() + self.options.timeout;
        let mut pipes = Pipes::new(
            child.stdin.take(),
            child.stdout.take(),
            child.stderr.take(),
            stdin.as_bytes().to_vec(),
            self.options.output_bytes_max,
        );
        let mut status = None;
        let mut timed_out = false;
        let mut held_open = false;
        // Until the command has exited and its output ended, or the
        // deadline: whichever comes first. A process that left the group
        // (`setsid`) may hold the pipes open after the group is killed; the
        // deadline holds all the same.
        loop {
            if status.is_none() {
                match child.try_wait() {
                    Ok(Some(exited)) => {
                        status = Some(exited);
                        // What it left behind in its group goes with it.
                        kill_group(group);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        kill_group(group);
                        return Err(Failure::retryable(format!("{program}: {e}")));
                    }
                }
            }
            if status.is_some() && pipes.output_ended() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                timed_out = true;
                held_open = status.is_some();
                break;
            }
            // While it runs, look at it again every few milliseconds.
            let wait = match status {
                None => POLL_WAIT.min(deadline - now),
                Some(_) => deadline - now,
            };
            pipes.pump(wait);
        }
        kill_group(group);
        let status = match status {
            Some(status) => status,
            None => child
                .wait()
                .map_err(|e| Failure::retryable(format!("{program}: {e}")))?,
        };
        let (stdout, stderr) = pipes.finish();
        Ok(Finished {
            status: status.code(),
            timed_out,
            held_open,
            stdout,
            stderr,
        })
    }
}

/// How often a running command is looked at while its pipes are quiet.
const POLL_WAIT: Duration = Duration::from_millis(5);

/// Why a command could not be started: a resource the host lacks for now
/// (file descriptors, processes, memory) is worth another attempt, and the
/// command never ran; a missing or forbidden program is a refusal.
fn spawn_failure(program: &str, e: &std::io::Error) -> Failure {
    let message = format!("cannot start {program}: {e}");
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM) => {
            Failure::not_received(message)
        }
        _ => Failure::Rejected(message),
    }
}

/// A command's three pipes, driven from one thread without blocking: the
/// request written to stdin, stdout and stderr read up to the limit (past
/// it the pipe is closed: a writer then fails or is killed with its group).
struct Pipes {
    stdin: Option<std::process::ChildStdin>,
    input: Vec<u8>,
    written: usize,
    stdout: Stream<std::process::ChildStdout>,
    stderr: Stream<std::process::ChildStderr>,
}

struct Stream<R> {
    pipe: Option<R>,
    bytes: Vec<u8>,
    limit: usize,
}

impl<R: Read + std::os::fd::AsRawFd> Stream<R> {
    fn new(pipe: Option<R>, limit: usize) -> Self {
        if let Some(p) = &pipe {
            nonblocking(p.as_raw_fd());
        }
        Stream {
            pipe,
            bytes: Vec::new(),
            limit,
        }
    }

    /// Reads what is there; closes the pipe at its end or past the limit.
    fn read(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => {
                    self.pipe = None;
                    return;
                }
                Ok(n) => {
                    self.bytes.extend_from_slice(&chunk[..n]);
                    if self.bytes.len() > self.limit {
                        self.pipe = None;
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.pipe = None;
                    return;
                }
            }
        }
    }

    fn output(self) -> Output {
        let cut = self.bytes.len() > self.limit;
        let mut bytes = self.bytes;
        bytes.truncate(self.limit);
        Output {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            cut,
        }
    }
}

impl Pipes {
    fn new(
        stdin: Option<std::process::ChildStdin>,
        stdout: Option<std::process::ChildStdout>,
        stderr: Option<std::process::ChildStderr>,
        input: Vec<u8>,
        limit: usize,
    ) -> Self {
        use std::os::fd::AsRawFd;
        if let Some(p) = &stdin {
            nonblocking(p.as_raw_fd());
        }
        let mut pipes = Pipes {
            stdin,
            input,
            written: 0,
            stdout: Stream::new(stdout, limit),
            stderr: Stream::new(stderr, limit),
        };
        pipes.write();
        pipes
    }

    /// Whether stdout and stderr have both ended (or were closed).
    fn output_ended(&self) -> bool {
        self.stdout.pipe.is_none() && self.stderr.pipe.is_none()
    }

    /// Writes what the stdin pipe takes; closes it once all is written (or
    /// the command closed its end).
    fn write(&mut self) {
        let Some(pipe) = self.stdin.as_mut() else {
            return;
        };
        while self.written < self.input.len() {
            match pipe.write(&self.input[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => break,
            }
        }
        self.stdin = None;
    }

    /// Waits up to `wait` for any pipe to be ready, then moves what it can.
    fn pump(&mut self, wait: Duration) {
        use std::os::fd::AsRawFd;
        let mut fds = Vec::with_capacity(3);
        if let Some(p) = &self.stdin {
            fds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            });
        }
        for fd in [
            self.stdout.pipe.as_ref().map(|p| p.as_raw_fd()),
            self.stderr.pipe.as_ref().map(|p| p.as_raw_fd()),
        ]
        .into_iter()
        .flatten()
        {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if fds.is_empty() {
            std::thread::sleep(wait);
            return;
        }
        let millis = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: poll(2) reads and writes `fds.len()` pollfd entries of a
        // vector we own, which outlives the call.
        #[allow(unsafe_code)]
        unsafe {
            libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis);
        }
        self.write();
        self.stdout.read();
        self.stderr.read();
    }

    fn finish(mut self) -> (Output, Output) {
        self.stdout.read();
        self.stderr.read();
        (self.stdout.output(), self.stderr.output())
    }
}

/// Makes `fd` non-blocking, so that one thread can drive all three pipes.
fn nonblocking(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl(2) on a descriptor we own, reading and setting its
    // status flags; no memory of ours is touched.
    #[allow(unsafe_code)]
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
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
            let held = if done.held_open {
                " (it exited, but a process it started outside its process group kept its \
                 output open)"
            } else {
                ""
            };
            return Err(Failure::retryable(format!(
                "{program} did not finish within {} ms{held}",
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

    fn request(body: &str) -> Request<'_> {
        crate::handler::test_request("r1", "cmd", "op-1", 7, body)
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
    fn the_timeout_holds_when_a_descendant_leaves_the_group_with_the_pipes_open() {
        // The pause lets `setsid` leave the group before the command exits.
        let mut escaping = options(&["sh", "-c", "setsid sleep 20 & sleep 0.3; echo '{}'"]);
        escaping.timeout = Duration::from_millis(1000);
        let started = Instant::now();
        let err = CommandEffect::new(escaping)
            .perform(&request("{}"))
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "returned after {:?}",
            started.elapsed()
        );
        assert!(matches!(err, Failure::Retryable { .. }), "{err:?}");
        assert!(err.message().contains("kept its output open"), "{err:?}");
    }

    #[test]
    fn a_large_request_reaches_a_command_that_reads_it_all() {
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(300_000));
        let mut counting = options(&["sh", "-c", "wc -c | tr -d ' '"]);
        counting.output_bytes_max = 64;
        let reply = CommandEffect::new(counting)
            .perform(&request(&body))
            .unwrap();
        assert_eq!(reply.body, body.len().to_string());
    }

    #[test]
    fn a_program_that_cannot_start_for_want_of_resources_is_retryable() {
        let busy = spawn_failure("p", &std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(
            matches!(
                busy,
                Failure::Retryable {
                    maybe_received: false,
                    ..
                }
            ),
            "{busy:?}"
        );
        let missing = spawn_failure("p", &std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(matches!(missing, Failure::Rejected(_)), "{missing:?}");
    }

    #[test]
    fn output_past_the_limit_is_not_kept() {
        let loud = sh("head -c 100000 /dev/zero | tr '\\0' 'x'; echo");
        let err = loud.perform(&request("{}")).unwrap_err();
        assert!(err.message().contains("more than 1024 bytes"), "{err:?}");
    }
}

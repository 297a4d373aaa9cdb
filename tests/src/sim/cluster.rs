//! The worker processes of a seed: the real binary, started, killed with
//! SIGKILL, armed at a crash point, frozen with SIGSTOP past their lease,
//! drained with SIGTERM, and started again.

use std::fs::OpenOptions;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::plan::Plan;
use crate::Sandbox;

/// One worker slot: the process in it now, and what is being done to it.
struct Slot {
    child: Child,
    /// Started with a crash point armed.
    armed: bool,
    /// Frozen until this instant.
    frozen_until: Option<Instant>,
    /// Sent SIGTERM; started again once it has exited.
    draining: bool,
    /// Processes started in this slot so far.
    starts: usize,
}

pub struct Cluster<'a> {
    sb: &'a Sandbox,
    plan: &'a Plan,
    args: Vec<String>,
    breaks: Option<String>,
    slots: Vec<Slot>,
    /// What happened, for the report.
    pub events: Vec<String>,
}

impl<'a> Cluster<'a> {
    pub fn start(sb: &'a Sandbox, plan: &'a Plan, breaks: Option<String>) -> Cluster<'a> {
        let args = vec![
            "--concurrency".to_string(),
            plan.concurrency.to_string(),
            "--lease-ms".to_string(),
            plan.lease_ms.to_string(),
            // Wake-ups reach a worker at once; a lost one is found soon.
            "--poll-ms".to_string(),
            "500".to_string(),
        ];
        let mut cluster = Cluster {
            sb,
            plan,
            args,
            breaks,
            slots: Vec::new(),
            events: Vec::new(),
        };
        for i in 0..plan.workers {
            let child = cluster.spawn(i, 0, None);
            cluster.slots.push(Slot {
                child,
                armed: false,
                frozen_until: None,
                draining: false,
                starts: 1,
            });
        }
        cluster
    }

    fn spawn(&self, slot: usize, start: usize, crash_at: Option<&str>) -> Child {
        let id = format!("sim-{slot}.{start}");
        let mut args: Vec<&str> = match self.plan.serve && slot == 0 {
            true => vec!["serve", "--listen", "127.0.0.1:0"],
            false => vec!["worker"],
        };
        args.extend(self.args.iter().map(String::as_str));
        args.extend(["--worker-id", &id]);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.sb.path(&format!("worker-{slot}.{start}.log")))
            .expect("open a worker's log");
        let mut command = self.sb.command(&args);
        command.stdout(Stdio::null()).stderr(Stdio::from(log));
        if let Some(point) = crash_at {
            command.env("STEPHOST_CRASH_AT", point);
        }
        if self.plan.ledger_faults_percent > 0 {
            // Each process its own draws, the same for the same seed.
            let percent = self.plan.ledger_faults_percent;
            let seed = self.plan.seed * 1000 + slot as u64 * 100 + start as u64;
            command.env(
                "STEPHOST_LEDGER_FAULTS",
                format!("seed={seed},percent={percent}"),
            );
        }
        if self.plan.mcp {
            // The MCP servers this process starts: where they keep their
            // orders and ids, and what they do wrong.
            command
                .env("SUPPLIER_ORDERS", self.sb.path(super::MCP_ORDERS))
                .env("SUPPLIER_MCP_PIDFILE", self.sb.path(super::MCP_PIDS))
                .env(
                    "SUPPLIER_MCP_FAULT",
                    self.plan.mcp_fault(slot, start).unwrap_or_default(),
                );
        }
        if let Some(breaks) = &self.breaks {
            command.env("STEPHOST_BREAK", breaks);
        }
        command.spawn().expect("start a worker")
    }

    fn restart(&mut self, i: usize, crash_at: Option<&str>) {
        let start = self.slots[i].starts;
        let child = self.spawn(i, start, crash_at);
        let slot = &mut self.slots[i];
        slot.child = child;
        slot.armed = crash_at.is_some();
        slot.frozen_until = None;
        slot.draining = false;
        slot.starts += 1;
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to worker `i` with kill(1).
    fn signal(&self, i: usize, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.slots[i].child.id().to_string()])
            .status();
    }

    fn kill_now(&mut self, i: usize) {
        if self.slots[i].frozen_until.is_some() {
            self.signal(i, "CONT");
        }
        let _ = self.slots[i].child.kill();
        let _ = self.slots[i].child.wait();
    }

    /// `kill -9` of worker `i`, then a fresh one in its place (armed at
    /// `crash_at` if given).
    pub fn kill(&mut self, i: usize, crash_at: Option<&str>) {
        self.kill_now(i);
        self.restart(i, crash_at);
    }

    /// Freezes worker `i` until `r#for` has passed.
    pub fn pause(&mut self, i: usize, r#for: Duration) {
        if self.slots[i].frozen_until.is_none() && !self.slots[i].draining {
            self.signal(i, "STOP");
            self.slots[i].frozen_until = Some(Instant::now() + r#for);
        }
    }

    /// Freezes every worker until `r#for` has passed.
    pub fn outage(&mut self, r#for: Duration) {
        for i in 0..self.slots.len() {
            self.pause(i, r#for);
        }
    }

    /// SIGTERM to worker `i`: it drains; [`Cluster::tend`] starts another.
    pub fn drain(&mut self, i: usize) {
        if self.slots[i].frozen_until.is_none() && !self.slots[i].draining {
            self.signal(i, "TERM");
            self.slots[i].draining = true;
        }
    }

    /// Thaws frozen workers whose time is up and starts a worker again in
    /// every slot whose process has exited (a crash point fired, a drain
    /// ended, or it failed).
    pub fn tend(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i]
                .frozen_until
                .is_some_and(|until| Instant::now() >= until)
            {
                self.signal(i, "CONT");
                self.slots[i].frozen_until = None;
                self.events.push(format!("worker {i} thawed"));
            }
            if let Ok(Some(status)) = self.slots[i].child.try_wait() {
                let why = if self.slots[i].draining {
                    "drained"
                } else if self.slots[i].armed {
                    "crashed at its point"
                } else {
                    "exited"
                };
                self.events.push(format!("worker {i} {why} ({status})"));
                self.restart(i, None);
            }
        }
    }

    /// Ends the faults: a worker still armed is replaced by one that is
    /// not, a frozen one thawed.
    pub fn calm(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].frozen_until.is_some() {
                self.signal(i, "CONT");
                self.slots[i].frozen_until = None;
            }
            if self.slots[i].armed {
                self.kill(i, None);
                self.events
                    .push(format!("worker {i} disarmed (killed, started again)"));
            }
        }
    }

    /// Stops every worker (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        for i in 0..self.slots.len() {
            self.signal(i, "CONT");
            self.signal(i, "TERM");
        }
        let deadline = Instant::now() + grace;
        for slot in &mut self.slots {
            while slot.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = slot.child.kill();
            let _ = slot.child.wait();
        }
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let _ = slot.child.kill();
            let _ = slot.child.wait();
        }
    }
}

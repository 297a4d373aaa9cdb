//! What an execution may spend ([`Limits`]: wall time, import calls,
//! recorded bytes, log lines) and what it has spent; past a limit, the
//! run stops with the limit named.

use std::time::{Duration, Instant};

use super::Stop;
use crate::limits::Limits;

pub(super) struct Budget {
    pub(super) limits: Limits,
    started: Instant,
    /// Bytes the run has recorded in calls and log lines so far (replayed
    /// ones counted again as they are replayed), against
    /// `recorded_bytes_max`.
    recorded_bytes: u64,
    /// `recorded_bytes` at the last commit of the buffer.
    recorded_at_flush: u64,
    /// Log lines and their bytes the run has written so far.
    log_lines: u64,
    log_bytes: u64,
}

impl Budget {
    pub(super) fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            started: Instant::now(),
            recorded_bytes: 0,
            recorded_at_flush: 0,
            log_lines: 0,
            log_bytes: 0,
        }
    }

    /// Time since the execution started.
    pub(super) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left of this execution's `wall_ms_max`.
    pub(super) fn wall_left(&self) -> Duration {
        Duration::from_millis(self.limits.wall_ms_max).saturating_sub(self.started.elapsed())
    }

    /// When this execution's `wall_ms_max` is up (`None`: past what an
    /// instant can name). The one rule of the wall time: a wait outside
    /// the guest's calls that ends at this instant finds [`Self::check_wall`]
    /// stopping the run.
    pub(super) fn wall_deadline(&self) -> Option<Instant> {
        self.started
            .checked_add(Duration::from_millis(self.limits.wall_ms_max))
    }

    /// Stops the run once this execution has reached `wall_ms_max`.
    pub(super) fn check_wall(&self) -> Result<(), Stop> {
        let max = self.limits.wall_ms_max;
        if self
            .wall_deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(Stop::Limit(format!(
                "the execution took longer than wall_ms_max = {max} ms; raise [limits] \
                 wall_ms_max if the step is meant to"
            )));
        }
        Ok(())
    }

    /// Stops the run at a call numbered past `calls_max`.
    pub(super) fn check_calls(&self, seq: u64) -> Result<(), Stop> {
        let calls_max = self.limits.calls_max.min(crate::records::CALLS_PER_RUN_MAX);
        if seq > calls_max {
            return Err(Stop::Limit(format!(
                "the run made more than calls_max = {calls_max} import calls"
            )));
        }
        Ok(())
    }

    /// Counts `bytes` more recorded by the run; past `recorded_bytes_max`
    /// the run stops with the limit named (what it recorded stays within
    /// the budget and one payload).
    pub(super) fn charge(&mut self, bytes: u64) -> Result<(), Stop> {
        self.recorded_bytes = self.recorded_bytes.saturating_add(bytes);
        let max = self.limits.recorded_bytes_max;
        if self.recorded_bytes > max {
            return Err(Stop::Limit(format!(
                "the run recorded more than recorded_bytes_max = {max} bytes in its calls and \
                 log lines; raise [limits] recorded_bytes_max if it is meant to"
            )));
        }
        Ok(())
    }

    /// Counts one more log line of `bytes` against `log_lines_max`,
    /// `log_bytes_max` and the run's recorded bytes.
    pub(super) fn charge_log(&mut self, bytes: u64) -> Result<(), Stop> {
        self.log_lines += 1;
        self.log_bytes = self.log_bytes.saturating_add(bytes);
        let limits = &self.limits;
        let past = if self.log_lines > limits.log_lines_max {
            format!(
                "more than log_lines_max = {} log lines",
                limits.log_lines_max
            )
        } else if self.log_bytes > limits.log_bytes_max {
            format!(
                "more than log_bytes_max = {} bytes of log lines",
                limits.log_bytes_max
            )
        } else {
            return self.charge(bytes);
        };
        Err(Stop::Limit(format!(
            "the run wrote {past}; raise it in [limits] if the step is meant to"
        )))
    }

    /// Bytes recorded since the buffer was last committed.
    pub(super) fn unflushed_bytes(&self) -> u64 {
        self.recorded_bytes - self.recorded_at_flush
    }

    /// The buffer was committed.
    pub(super) fn flushed(&mut self) {
        self.recorded_at_flush = self.recorded_bytes;
    }
}

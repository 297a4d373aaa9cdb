//! What a worker or server says on stderr: text for people (the default),
//! or one JSON object a line for a log pipeline (`--log-format json`, or
//! `STEPHOST_LOG_FORMAT=json`), with `time`, `level`, `source`, `message`
//! and, where they apply, `run_id`, `seq` and `trace_id`.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};

/// The run a step's log line is of.
#[derive(Debug, Clone, Copy)]
pub struct RunOfLine<'a> {
    pub run_id: &'a str,
    /// The trace the run reports into (32 hex digits).
    pub trace_id: &'a str,
}

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `stephost worker: run X completed`.
    Text,
    /// `{"time":"…","level":"info","source":"worker","message":"run X completed","run_id":"X"}`.
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

/// Sets how this process writes its lines (once, at start-up).
pub fn set_format(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}

pub fn format() -> LogFormat {
    if JSON.load(Ordering::Relaxed) {
        LogFormat::Json
    } else {
        LogFormat::Text
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// A line from `source` (`worker`, `serve`, or `stephost` for the host
/// itself), about run `run_id` when it concerns one.
pub fn line(level: Level, source: &str, run_id: Option<&str>, message: impl Display) {
    run_line(level, source, run_id, None, message)
}

/// [`line`], with the trace the run reports into when it is known.
pub fn run_line(
    level: Level,
    source: &str,
    run_id: Option<&str>,
    trace_id: Option<&str>,
    message: impl Display,
) {
    match format() {
        LogFormat::Text if source == "stephost" => eprintln!("stephost: {message}"),
        LogFormat::Text => eprintln!("stephost {source}: {message}"),
        LogFormat::Json => {
            let mut line = json(
                stephost_core::clock::now_ms(),
                level.as_str(),
                source,
                &message.to_string(),
                run_id,
                None,
            );
            if let Some(trace_id) = trace_id {
                line["trace_id"] = trace_id.into();
            }
            eprintln!("{line}")
        }
    }
}

pub fn info(source: &str, run_id: Option<&str>, message: impl Display) {
    line(Level::Info, source, run_id, message)
}

pub fn warn(source: &str, run_id: Option<&str>, message: impl Display) {
    line(Level::Warn, source, run_id, message)
}

pub fn error(source: &str, run_id: Option<&str>, message: impl Display) {
    line(Level::Error, source, run_id, message)
}

/// A line a step logged (live, not replayed): `[RUN] LEVEL: MESSAGE` in
/// text, whose message the caller has made safe for a terminal; in JSON
/// with the run's `seq` (the calls it had made).
pub fn step_line(of: &RunOfLine<'_>, record: &stephost_core::LogRecord, shown: impl Display) {
    match format() {
        LogFormat::Text => eprintln!("[{}] {}: {shown}", of.run_id, record.level),
        LogFormat::Json => {
            let mut line = json(
                record.at_ms,
                &record.level,
                "step",
                &record.message,
                Some(of.run_id),
                Some(record.after_seq),
            );
            line["trace_id"] = of.trace_id.into();
            eprintln!("{line}")
        }
    }
}

fn json(
    at_ms: i64,
    level: &str,
    source: &str,
    message: &str,
    run_id: Option<&str>,
    seq: Option<u64>,
) -> serde_json::Value {
    let mut line = serde_json::json!({
        "time": stephost_core::clock::format_time(at_ms),
        "level": level,
        "source": source,
        "message": message,
    });
    if let Some(run_id) = run_id {
        line["run_id"] = run_id.into();
    }
    if let Some(seq) = seq {
        line["seq"] = seq.into();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_with_its_fields() {
        let line = json(
            0,
            "warn",
            "worker",
            "lost \"x\"\nthen",
            Some("r-1"),
            Some(3),
        )
        .to_string();
        assert!(!line.contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(value["level"], "warn");
        assert_eq!(value["source"], "worker");
        assert_eq!(value["message"], "lost \"x\"\nthen");
        assert_eq!(value["run_id"], "r-1");
        assert_eq!(value["seq"], 3);
        let bare: serde_json::Value =
            serde_json::from_str(&json(0, "info", "serve", "up", None, None).to_string()).unwrap();
        assert!(bare.get("run_id").is_none() && bare.get("seq").is_none());
    }
}

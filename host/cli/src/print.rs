//! What the command line prints: plain text for people, `--json` for
//! scripts (the service layer's types, as the server sends them).

use std::io::Write;

use serde::Serialize;
use stephost_core::RunRecord;
use stephost_core::RunStatus;
use stephost_core::clock::format_time;
use stephost_runtime::exit;
use stephost_runtime::replay::{ReplayReport, ReplayVerdict};
use stephost_runtime::runner::RunReport;
use stephost_runtime::runner::UpgradeOutcome;
use stephost_runtime::service::{self, ApprovalView, RunDetail};

/// Text a step chose (log lines, subjects, effect names, errors, requests),
/// shown on a terminal: a line break is followed by an indent, so the text
/// cannot start a line of its own, and every other control character (C0,
/// DEL, C1: escape sequences, carriage returns) is written as a `\u{..}`
/// escape.
pub struct Safe<'a>(pub &'a str);

impl std::fmt::Display for Safe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            if c == '\n' {
                f.write_str("\n    ")?;
            } else if c.is_control() {
                write!(f, "\\u{{{:x}}}", c as u32)?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

pub fn print_json<T: Serialize>(value: &T) {
    let text =
        serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// The exit code for how a run ended.
pub fn run_exit_code(status: RunStatus) -> i32 {
    match status {
        RunStatus::Completed => exit::OK,
        RunStatus::Failed => exit::STEP_FAILED,
        RunStatus::Parked => exit::PARKED,
        RunStatus::Diverged => exit::DIVERGED,
        RunStatus::Cancelled => exit::CANCELLED,
        // A run left running was released or abandoned by this process.
        RunStatus::Waiting => exit::WAITING,
        RunStatus::Pending | RunStatus::Running => exit::CLAIMED,
    }
}

pub fn print_run(report: &RunReport, json: bool) -> i32 {
    if json {
        print_json(report);
    } else if let Some(output) = &report.output {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{output}");
    }
    let s = &report.stats;
    match report.status {
        RunStatus::Completed => eprintln!(
            "stephost: run {} completed ({} calls performed, {} replayed)",
            report.run_id, s.live, s.replayed
        ),
        RunStatus::Waiting => eprintln!(
            "stephost: run {} is waiting{}; a worker or `stephost resume {}` continues it when \
             due or decided (`stephost approvals` lists pending approvals)",
            report.run_id,
            report
                .wake_at_ms
                .map(|t| format!(" until {}", format_time(t)))
                .unwrap_or_default(),
            report.run_id
        ),
        RunStatus::Parked
            if report
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(stephost_core::lifecycle::OVER_BUDGET)) =>
        {
            eprintln!(
                "stephost: run {} is parked and needs a person: {}\n  \
                 raise its budget as you resume it: `stephost resume {} --model-tokens-max N \
                 --model-cost-micro-usd-max N` (or raise them in [limits], then resume it)",
                report.run_id,
                Safe(report.error.as_deref().unwrap_or("")),
                report.run_id
            )
        }
        RunStatus::Parked => eprintln!(
            "stephost: run {} is parked and needs a person: {}\n  \
             check the receiver by hand, then `stephost resolve {} SEQ --succeeded JSON | \
             --failed MESSAGE --by NAME` and `stephost resume {}`",
            report.run_id,
            Safe(report.error.as_deref().unwrap_or("")),
            report.run_id,
            report.run_id
        ),
        status => eprintln!(
            "stephost: run {} {}: {}",
            report.run_id,
            status.as_str(),
            Safe(report.error.as_deref().unwrap_or(""))
        ),
    }
    run_exit_code(report.status)
}

/// A run `submit --wait MS` waited for, as it was at the end of the wait:
/// its output (or, with `json`, its row) and the exit code of how it ended
/// (6 if it is still pending or running).
pub fn print_waited(run: &RunRecord, wait_ms: u64, json: bool) -> i32 {
    if json {
        print_json(run);
    } else if let Some(output) = &run.output {
        let _ = writeln!(std::io::stdout().lock(), "{output}");
    } else if !run.status.answers_a_wait() {
        let _ = writeln!(std::io::stdout().lock(), "{}", run.run_id);
    }
    match run.status {
        RunStatus::Pending | RunStatus::Running => eprintln!(
            "stephost: run {} is still {} after {wait_ms} ms; `stephost show {}` follows it",
            run.run_id,
            run.status.as_str(),
            run.run_id
        ),
        RunStatus::Completed => eprintln!("stephost: run {} completed", run.run_id),
        status => eprintln!(
            "stephost: run {} is {}{}{}",
            run.run_id,
            status.as_str(),
            run.error.as_deref().map_or("", |_| ": "),
            Safe(run.error.as_deref().unwrap_or(""))
        ),
    }
    run_exit_code(run.status)
}

pub fn print_replay(report: &ReplayReport, json: bool) {
    if json {
        print_json(report);
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = match &report.verdict {
        ReplayVerdict::Consistent { calls, output } => {
            let _ = writeln!(
                out,
                "consistent: run {} replayed {calls} call(s) with no divergence",
                report.run_id
            );
            match output {
                Some(o) => writeln!(out, "output: {o}"),
                None => Ok(()),
            }
        }
        ReplayVerdict::Incomplete { calls, reason } => writeln!(
            out,
            "consistent so far: run {} is unfinished; {calls} recorded call(s) matched; {reason}",
            report.run_id
        ),
        ReplayVerdict::Diverged { divergence } => {
            writeln!(
                out,
                "divergence in run {}: {}",
                report.run_id,
                Safe(&divergence.to_string())
            )
        }
        ReplayVerdict::OutputDiffers { recorded, new } => writeln!(
            out,
            "divergence in run {}: same calls, different output\n  recorded: {}\n  new:      {}",
            report.run_id,
            Safe(recorded),
            Safe(new)
        ),
        ReplayVerdict::EndDiffers { recorded, new } => writeln!(
            out,
            "divergence in run {}: same calls, different end\n  recorded: {}\n  new:      {}",
            report.run_id,
            Safe(recorded),
            Safe(new)
        ),
        ReplayVerdict::StepFailed { error } => {
            writeln!(
                out,
                "replay of run {} failed: {}",
                report.run_id,
                Safe(error)
            )
        }
    };
}

pub fn print_runs(runs: &[RunRecord]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<26} {:<10} {:<14} {:<24} {:<6} {:<24} OWNER",
        "RUN", "STATUS", "MODULE", "UPDATED", "FENCE", "LEASE UNTIL"
    );
    for run in runs {
        let _ = writeln!(
            out,
            "{:<26} {:<10} {:<14} {:<24} {:<6} {:<24} {}",
            run.run_id,
            run.status.as_str(),
            &run.module_digest[..12.min(run.module_digest.len())],
            format_time(run.updated_at_ms),
            run.fence,
            run.lease_until_ms
                .map(format_time)
                .unwrap_or_else(|| "-".into()),
            run.owner.as_deref().unwrap_or("-")
        );
    }
}

pub fn print_show(detail: &RunDetail) {
    let RunDetail {
        run,
        tokens_total: tokens,
        cost_micro_usd_total: cost,
        calls,
        attempts,
        logs,
        forks,
    } = detail;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "run      {}", run.run_id);
    let _ = writeln!(out, "status   {}", run.status.as_str());
    let _ = writeln!(out, "module   {}", run.module_digest);
    let _ = writeln!(
        out,
        "step     {} ({})",
        run.step.as_deref().unwrap_or("(no declared version)"),
        run.world
    );
    let _ = writeln!(out, "created  {}", format_time(run.created_at_ms));
    let _ = writeln!(out, "updated  {}", format_time(run.updated_at_ms));
    let _ = writeln!(
        out,
        "owner    {} (fence {})",
        run.owner.as_deref().unwrap_or("-"),
        run.fence
    );
    let _ = writeln!(out, "input    {}", Safe(&run.input));
    if let Some(fork) = &run.fork {
        let _ = writeln!(
            out,
            "fork of  {} at #{} (calls before it are {}'s)",
            fork.run_id, fork.seq, fork.run_id
        );
    }
    for f in forks {
        let _ = writeln!(
            out,
            "forked   {} at #{} ({})",
            f.run_id,
            f.at,
            f.status.as_str()
        );
    }
    if let Some(o) = &run.output {
        let _ = writeln!(out, "output   {}", Safe(o));
    }
    if let Some(code) = run.exit_code {
        let _ = writeln!(out, "exit     {code}");
    }
    if let Some(e) = &run.error {
        let _ = writeln!(out, "error    {}", Safe(e));
    }
    if *tokens > 0 {
        let _ = writeln!(
            out,
            "tokens   {tokens} (model calls; a resume or a replay spends none again)"
        );
    }
    if *cost > 0 {
        let _ = writeln!(
            out,
            "cost     ${}.{:06} (by the models' price tables)",
            cost / 1_000_000,
            cost % 1_000_000
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>5}  {:<8} {:<32} {:<10} {:<14} {:>8} {:>4}",
        "SEQ", "CLASS", "CALL", "STATE", "OPERATION", "MS", "TRY"
    );
    for call in calls {
        let tries = attempts.iter().filter(|a| a.seq == call.seq).count();
        let ms = call
            .finished_at_ms
            .map(|f| (f - call.started_at_ms).to_string())
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:>5}  {:<8} {:<32} {:<10} {:<14} {:>8} {:>4}",
            call.seq,
            call.class.as_str(),
            Safe(&service::call_name(call)).to_string(),
            call.state.as_str(),
            if call.operation_id.is_empty() {
                "-"
            } else {
                &call.operation_id[..12.min(call.operation_id.len())]
            },
            ms,
            tries
        );
    }
    if !logs.is_empty() {
        let _ = writeln!(out, "\nlog");
        for log in logs {
            let _ = writeln!(
                out,
                "  after #{:<4} {:<5} {}",
                log.after_seq,
                log.level,
                Safe(&log.message)
            );
        }
    }
}

/// What `upgrade` did, run by run.
pub fn print_upgrades(outcomes: &[UpgradeOutcome]) {
    for o in outcomes {
        if o.moved {
            let _ = writeln!(
                std::io::stdout().lock(),
                "moved      {}  {} -> {}",
                o.run_id,
                short(&o.from),
                short(&o.to)
            );
        } else {
            let _ = writeln!(
                std::io::stdout().lock(),
                "not moved  {}  (stays on {})",
                o.run_id,
                short(&o.from)
            );
            print_replay(&o.report, false);
        }
    }
    if outcomes.is_empty() {
        let _ = writeln!(std::io::stdout().lock(), "no unfinished runs to upgrade");
    }
}

/// The approvals inbox.
pub fn print_promises(rows: &[stephost_runtime::service::PromiseView]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<26} {:>5}  {:>7}  {:<24} {:<24} NAME",
        "RUN", "SEQ", "PROMISE", "WAITING SINCE", "EXPIRES"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<26} {:>5}  {:>7}  {:<24} {:<24} {}",
            r.run_id,
            r.seq,
            r.promise,
            format_time(r.waiting_since_ms),
            r.expires_at_ms.map_or("-".to_string(), format_time),
            Safe(&r.name)
        );
    }
}

pub fn print_approvals(rows: &[ApprovalView]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<26} {:>5}  {:<24} {:<24} {:<14} SUBJECT",
        "RUN", "SEQ", "ASKED", "EXPIRES", "DETAILS"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<26} {:>5}  {:<24} {:<24} {:<14} {}",
            r.run_id,
            r.seq,
            format_time(r.asked_at_ms),
            format_time(r.expires_at_ms),
            short(r.details_sha256.as_str().unwrap_or("")),
            Safe(r.subject.as_str().unwrap_or(""))
        );
        // What is approved: the details, as the guest asked (their sha256
        // is what `approve --details` names).
        let details = r.details.to_string();
        let shown = stephost_core::journal::truncate(&details, DETAILS_SHOWN_BYTES_MAX);
        let cut = if shown.len() < details.len() {
            " … (`approvals --json` shows all)"
        } else {
            ""
        };
        let _ = writeln!(out, "{:>33}details {}{cut}", "", Safe(shown));
    }
}

/// The most bytes of an approval's details the plain listing shows.
const DETAILS_SHOWN_BYTES_MAX: usize = 400;

/// The first 12 characters of a digest, as listings show it.
fn short(digest: &str) -> &str {
    &digest[..12.min(digest.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_printed_in_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_795_941_296_789), "2026-11-29T08:34:56.789Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}

#[cfg(test)]
mod safe_tests {
    use super::Safe;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            Safe("ok \u{1b}[31mred\nFORGED\r\u{7f}\u{9b} é").to_string(),
            "ok \\u{1b}[31mred\n    FORGED\\u{d}\\u{7f}\\u{9b} é"
        );
    }
}

/// A tree of runs, one line a run, indented by depth.
pub fn print_tree(tree: &stephost_runtime::service::TreeNode) {
    let mut out = std::io::stdout().lock();
    print_node(&mut out, tree, 0);
}

fn print_node(out: &mut impl Write, node: &stephost_runtime::service::TreeNode, depth: usize) {
    let mut line = format!(
        "{}{} {}",
        "  ".repeat(depth),
        node.run_id,
        node.status.as_str()
    );
    if let Some(step) = &node.step {
        line.push_str(&format!(" {step}"));
    }
    if let Some(set) = &node.join_set {
        line.push_str(&format!(" [set {set}]"));
    }
    if node.tokens_total > 0 {
        line.push_str(&format!(" {} tokens", node.tokens_total));
    }
    if node.cost_micro_usd_total > 0 {
        line.push_str(&format!(" {} micro-USD", node.cost_micro_usd_total));
    }
    if let Some(waits) = &node.waits_for {
        line.push_str(&format!(" waits for {waits}"));
    }
    if let Some(error) = &node.error {
        line.push_str(&format!(": {error}"));
    }
    // The root says what waits for a person anywhere below it.
    if depth == 0 && !node.needs_a_person.is_empty() {
        line.push_str(&format!(
            "; needs a person: {}",
            node.needs_a_person.join(", ")
        ));
    }
    let _ = writeln!(out, "{}", Safe(&line));
    for child in &node.children {
        print_node(out, child, depth + 1);
    }
}

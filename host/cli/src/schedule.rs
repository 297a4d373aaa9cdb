//! `stephost schedule`: add, list, pause, resume and remove schedules.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use stephost_core::clock::format_time;
use stephost_core::schedules::{Overlap, Schedule};
use stephost_runtime::schedules::{self as runtime, NewSchedule};
use stephost_runtime::{HostError, exit};

use crate::print::{Safe, print_json};
use crate::{Ctx, open, options, read_file, read_input};

/// The arguments of `stephost schedule`.
#[derive(Args, Debug)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add a schedule: each slot its cron expression names starts one run
    /// of the build, whose id is the schedule's name and the slot
    /// (`NAME@2026-12-07T07:00:00Z`), fired once by whichever worker looks
    /// first.
    Add(AddArgs),
    /// List the schedules.
    List(ListArgs),
    /// Pause a schedule: it fires nothing until resumed.
    Pause(NameArgs),
    /// Resume a paused schedule from its next slot (the slots that came
    /// while it was paused are not caught up).
    Resume(NameArgs),
    /// Remove a schedule; the runs it fired stay.
    Remove(NameArgs),
}

/// The arguments of `stephost schedule add`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("build").required(true).args(["module", "step"])))]
pub struct AddArgs {
    /// The schedule's name: ASCII letters, digits, `-`, `_` and `.`.
    pub name: String,
    /// When it fires: a cron expression of 5 fields (minute hour
    /// day-of-month month day-of-week) or 6 with seconds first.
    #[arg(long)]
    pub cron: String,
    /// The build each firing runs (stored in the ledger now).
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// Or a step the ledger has run (`name@version`, as `stephost runs`
    /// shows it): the build its newest run ran.
    #[arg(long)]
    pub step: Option<String>,
    /// Each firing's input JSON.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// Read the input JSON from a file (`-` for stdin).
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// The IANA time zone the cron expression is read in.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
    /// What a slot does while the last firing's run is unfinished: `skip`
    /// it, `buffer-one` (fire the newest such slot when that run ends), or
    /// `allow` runs to overlap.
    #[arg(long, default_value = "skip", value_parser = ["skip", "buffer-one", "allow"])]
    pub overlap: String,
    /// How late a slot missed while no worker ran may still fire (e.g.
    /// `30s`, `10m`, `2h`, `1d`); older ones are skipped.
    #[arg(long, default_value = "1m")]
    pub catch_up: String,
    /// Print the schedule as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost schedule list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print them as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A schedule named.
#[derive(Args, Debug)]
pub struct NameArgs {
    pub name: String,
}

pub fn schedule(ctx: &Ctx, args: ScheduleArgs) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let mut host = open(ledger, options(config)?)?;
    match args.command {
        ScheduleCommand::Add(add) => {
            let input = match (add.input, add.input_file) {
                (None, None) => "{}".to_string(),
                (input, file) => read_input(input, file)?,
            };
            let new = NewSchedule {
                name: add.name,
                cron: add.cron,
                timezone: add.timezone,
                input,
                overlap: Overlap::parse(&add.overlap).map_err(HostError::BadInput)?,
                catch_up_ms: duration_ms(&add.catch_up).map_err(HostError::BadInput)?,
            };
            let module = add.module.as_deref().map(read_file).transpose()?;
            let what = add.module.as_ref().map(|m| m.display().to_string());
            let added = host.add_schedule(
                module.as_deref().zip(what.as_deref()),
                add.step.as_deref(),
                new,
            )?;
            if add.json {
                print_json(&added);
            } else {
                print_schedules(std::slice::from_ref(&added));
            }
        }
        ScheduleCommand::List(list) => {
            let all = host.schedules()?.list()?;
            if list.json {
                print_json(&all);
            } else {
                print_schedules(&all);
            }
        }
        ScheduleCommand::Pause(NameArgs { name }) => {
            runtime::set_paused(host.schedules()?.as_ref(), &name, true)?;
        }
        ScheduleCommand::Resume(NameArgs { name }) => {
            runtime::set_paused(host.schedules()?.as_ref(), &name, false)?;
        }
        ScheduleCommand::Remove(NameArgs { name }) => {
            runtime::remove(host.schedules()?.as_ref(), &name)?;
        }
    }
    Ok(exit::OK)
}

/// A duration as `500ms`, `30s`, `10m`, `2h` or `1d` (a bare number is
/// seconds), in ms.
pub fn duration_ms(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => 0,
    };
    number
        .parse::<i64>()
        .ok()
        .filter(|_| scale > 0)
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| {
            format!("{text:?} is not a duration: write a whole number and a unit, as 500ms, 30s, 10m, 2h or 1d")
        })
}

fn print_schedules(rows: &[Schedule]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<20} {:<16} {:<16} {:<10} {:<8} {:<24} LAST RUN",
        "NAME", "CRON", "TIMEZONE", "OVERLAP", "STATE", "NEXT"
    );
    for s in rows {
        let _ = writeln!(
            out,
            "{:<20} {:<16} {:<16} {:<10} {:<8} {:<24} {}",
            s.name,
            // Made a string first: the padding is of what is shown.
            Safe(&s.cron).to_string(),
            s.timezone,
            s.overlap.as_str(),
            if s.paused { "paused" } else { "active" },
            if s.next_at_ms == i64::MAX {
                "-".to_string()
            } else {
                format_time(s.next_at_ms)
            },
            s.last_run_id.as_deref().unwrap_or("-")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::duration_ms;

    #[test]
    fn durations_are_a_whole_number_and_a_unit() {
        assert_eq!(duration_ms("500ms"), Ok(500));
        assert_eq!(duration_ms("30s"), Ok(30_000));
        assert_eq!(duration_ms("45"), Ok(45_000));
        assert_eq!(duration_ms("10m"), Ok(600_000));
        assert_eq!(duration_ms("2h"), Ok(7_200_000));
        assert_eq!(duration_ms("1d"), Ok(86_400_000));
        assert!(duration_ms("1.5h").is_err());
        assert!(duration_ms("m").is_err());
        assert!(duration_ms("3 weeks").is_err());
    }
}

//! Schedules: a step started on a cron schedule, kept in the ledger and
//! fired by whichever worker looks first.
//!
//! The rules, written once here:
//! - a schedule's slots are the times its cron expression names in its
//!   time zone; each slot fires at most one run, whose id is made of the
//!   schedule's name and the slot ([`firing_run_id`]) and is inserted once
//!   whatever number of workers fire it;
//! - a worker fires the slots due since the schedule's `next_at_ms` and
//!   moves `next_at_ms` past now by compare-and-set on the row's version: a
//!   worker that lost the race fired the same run ids (found, not made
//!   again) and writes nothing;
//! - slots older than the catch-up window (`catch_up_ms` before now) are
//!   skipped, never fired late; a paused schedule fires nothing, and on
//!   resuming goes on from the next slot after then;
//! - overlap: `allow` fires every due slot; `skip` fires a due slot only if
//!   the schedule's last run has finished (and then the newest slot alone);
//!   `buffer-one` keeps the newest slot that came while the last run was
//!   unfinished and fires it when that run finishes.

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};

use crate::error::StoreResult;

/// The longest schedule name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;

/// The most slots one worker fires for one schedule at a time (with
/// `allow`, after downtime within a long catch-up window); the rest are
/// fired on its next look.
pub const SLOTS_PER_LOOK_MAX: usize = 100;

/// What a due slot does while the schedule's last run is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Skips the slot.
    Skip,
    /// Keeps the newest such slot and fires it when the last run finishes.
    BufferOne,
    /// Fires it: runs of the schedule may overlap.
    Allow,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer-one",
            Overlap::Allow => "allow",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "buffer-one" => Ok(Overlap::BufferOne),
            "allow" => Ok(Overlap::Allow),
            other => Err(format!(
                "overlap {other:?} is not one of skip, buffer-one, allow"
            )),
        }
    }
}

/// A schedule as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub name: String,
    /// A cron expression: 5 fields, or 6 with seconds first.
    pub cron: String,
    /// An IANA time zone name (`UTC`, `Europe/Paris`).
    pub timezone: String,
    /// The build each firing runs, pinned when the schedule was added.
    pub module_digest: String,
    pub world: String,
    /// The module's declared `name@version`, if it declares one.
    pub step: Option<String>,
    /// Each firing's input (JSON text).
    pub input: String,
    pub overlap: Overlap,
    /// How late a missed slot may still fire, in ms.
    pub catch_up_ms: i64,
    pub paused: bool,
    /// The first slot not yet handled.
    pub next_at_ms: i64,
    /// The run of the newest slot fired.
    pub last_run_id: Option<String>,
    /// With `buffer-one`: the slot kept to fire when the last run finishes.
    pub buffered_at_ms: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Compare-and-set version: every change of the row bumps it.
    pub version: i64,
}

/// A cron expression in a time zone, parsed.
#[derive(Debug, Clone)]
pub struct Timing {
    cron: Cron,
    zone: chrono_tz::Tz,
}

impl Timing {
    /// Parses `cron` (5 fields, or 6 with seconds first) in time zone
    /// `timezone`; the error says what is wrong.
    pub fn new(cron: &str, timezone: &str) -> Result<Self, String> {
        let zone = chrono_tz::Tz::from_str(timezone).map_err(|_| {
            format!("time zone {timezone:?} is not an IANA time zone name (e.g. UTC, Europe/Paris)")
        })?;
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(cron)
            .map_err(|e| {
                format!(
                    "cron expression {cron:?}: {e} (5 fields: minute hour day-of-month month \
                     day-of-week, or 6 with seconds first)"
                )
            })?;
        Ok(Timing { cron: parsed, zone })
    }

    /// The first slot strictly after `after_ms`, if the expression names
    /// one.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.slot_from(after_ms, false)
    }

    /// The first slot at or after `from_ms`.
    pub fn next_from(&self, from_ms: i64) -> Option<i64> {
        self.slot_from(from_ms, true)
    }

    fn slot_from(&self, ms: i64, inclusive: bool) -> Option<i64> {
        // Slots are whole seconds: from a time within a second, the first
        // after the second it is in.
        let second = ms.div_euclid(1000) * 1000;
        let at = Utc.timestamp_millis_opt(second).single()?;
        let local = at.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, inclusive && ms == second)
            .ok()
            .map(|slot| slot.timestamp_millis())
    }
}

/// Checks a schedule name: 1 to [`NAME_BYTES_MAX`] ASCII letters, digits,
/// `-`, `_` and `.`, starting with a letter or digit (it is part of each
/// firing's run id).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(format!(
            "a schedule name has 1 to {NAME_BYTES_MAX} bytes; this one has {}",
            name.len()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("a schedule name starts with an ASCII letter or digit".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(*c)))
    {
        return Err(format!(
            "a schedule name holds only ASCII letters, digits and - _ .; this one holds {bad:?}"
        ));
    }
    Ok(())
}

/// The run id of schedule `name`'s firing of slot `slot_ms`:
/// `NAME@2026-12-07T07:00:00Z`, the same in every process.
pub fn firing_run_id(name: &str, slot_ms: i64) -> String {
    let at = Utc
        .timestamp_millis_opt(slot_ms)
        .single()
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| slot_ms.to_string());
    format!("{name}@{at}")
}

/// What a look at a due schedule decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    /// The slots to fire now, oldest first.
    pub fire: Vec<i64>,
    /// Slots passed over: older than the catch-up window, or skipped while
    /// the last run was unfinished (not counted past the window's start).
    pub skipped: u64,
    /// The schedule's row after the look (its version not yet bumped).
    pub next: Schedule,
}

/// Decides what schedule `s` fires at `now_ms`, given whether its last run
/// is unfinished (`last_busy`).
pub fn look(s: &Schedule, timing: &Timing, now_ms: i64, last_busy: bool) -> Look {
    let mut next = s.clone();
    let mut look = Look {
        fire: Vec::new(),
        skipped: 0,
        next: s.clone(),
    };
    if s.paused {
        return look;
    }
    // The slots due, within the window: older ones are skipped unseen.
    let window_start = now_ms.saturating_sub(s.catch_up_ms.max(0));
    let mut due = Vec::new();
    let mut slot = if s.next_at_ms < window_start {
        look.skipped += 1;
        timing.next_from(window_start)
    } else {
        Some(s.next_at_ms)
    };
    while let Some(at) = slot.filter(|at| *at <= now_ms) {
        if due.len() == SLOTS_PER_LOOK_MAX {
            break;
        }
        due.push(at);
        slot = timing.next_after(at);
    }
    // Past the slots fired (the rest of them, if more than a look fires);
    // an expression that names no slot after now (a date past): never due.
    next.next_at_ms = slot.unwrap_or(i64::MAX);
    match s.overlap {
        Overlap::Allow => look.fire = due,
        Overlap::Skip => {
            let newest = due.pop();
            look.skipped += due.len() as u64;
            match newest {
                Some(at) if !last_busy => look.fire.push(at),
                Some(_) => look.skipped += 1,
                None => {}
            }
        }
        Overlap::BufferOne => {
            let newest = due.pop().or(s.buffered_at_ms);
            look.skipped += due.len() as u64;
            next.buffered_at_ms = None;
            match newest {
                Some(at) if !last_busy => look.fire.push(at),
                Some(at) => next.buffered_at_ms = Some(at),
                None => {}
            }
        }
    }
    if let Some(at) = look.fire.last() {
        next.last_run_id = Some(firing_run_id(&s.name, *at));
    }
    look.next = next;
    look
}

/// Whether a look at `s` is due at `now_ms`: a slot came, or a buffered
/// one waits.
pub fn is_due(s: &Schedule, now_ms: i64) -> bool {
    !s.paused && (s.next_at_ms <= now_ms || s.buffered_at_ms.is_some())
}

/// Schedules, shared by every process on the ledger.
pub trait Schedules: Send + Sync {
    /// Adds `schedule` (version 1); `Ok(false)` if one of that name exists.
    fn add(&self, schedule: &Schedule) -> StoreResult<bool>;

    /// Every schedule, by name.
    fn list(&self) -> StoreResult<Vec<Schedule>>;

    fn get(&self, name: &str) -> StoreResult<Option<Schedule>>;

    /// Schedules a worker should look at now ([`is_due`]), at most `limit`.
    fn due(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Schedule>>;

    /// The earliest `next_at_ms` of a schedule not paused, if any.
    fn next_at(&self) -> StoreResult<Option<i64>>;

    /// Writes `schedule`'s state (paused, next slot, last run, buffered
    /// slot) over its row if the row still has version `expected`, bumping
    /// it; `Ok(false)` if it changed meanwhile (or is gone). `durable`: a
    /// person's change, on disk before it is answered (a worker's move past
    /// the slots it fired need not be: fired again, their runs are found).
    fn swap(&self, expected: i64, schedule: &Schedule, durable: bool) -> StoreResult<bool>;

    /// Removes the schedule; `Ok(false)` if there was none. Its runs stay.
    fn remove(&self, name: &str) -> StoreResult<bool>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn schedule(overlap: Overlap, next_at_ms: i64, catch_up_ms: i64) -> Schedule {
        Schedule {
            name: "nightly".into(),
            cron: "* * * * *".into(),
            timezone: "UTC".into(),
            module_digest: "d".into(),
            world: "w".into(),
            step: None,
            input: "{}".into(),
            overlap,
            catch_up_ms,
            paused: false,
            next_at_ms,
            last_run_id: None,
            buffered_at_ms: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 1,
        }
    }

    fn every_minute() -> Timing {
        Timing::new("* * * * *", "UTC").expect("a cron")
    }

    #[test]
    fn a_slot_in_a_time_zone_is_the_zones_wall_clock() {
        let paris = Timing::new("0 7 * * *", "Europe/Paris").expect("a cron");
        // 2026-12-07T00:00:00Z: 07:00 in Paris (UTC+1 in winter) is 06:00Z.
        let midnight = 1_796_601_600_000;
        assert_eq!(paris.next_after(midnight), Some(midnight + 6 * 60 * MIN));
        let seconds = Timing::new("*/10 * * * * *", "UTC").expect("a cron");
        assert_eq!(seconds.next_after(midnight + 1), Some(midnight + 10_000));
        assert_eq!(seconds.next_from(midnight), Some(midnight));
        assert!(Timing::new("61 * * * *", "UTC").is_err());
        assert!(Timing::new("* * * * *", "Mars/Olympus").is_err());
    }

    #[test]
    fn slots_within_the_window_fire_and_older_ones_are_skipped() {
        let now = 1_796_601_600_000 + 30_000;
        // Down for an hour, a window of 5 minutes: the 5 slots in it fire.
        let s = schedule(Overlap::Allow, now - 60 * MIN, 5 * MIN);
        let look = look(&s, &every_minute(), now, false);
        assert_eq!(look.fire.len(), 5, "{look:?}");
        assert_eq!(look.fire[0], now - 30_000 - 4 * MIN);
        assert_eq!(look.next.next_at_ms, now + 30_000);
        assert_eq!(
            look.next.last_run_id.as_deref(),
            Some("nightly@2026-12-07T00:00:00Z")
        );
    }

    #[test]
    fn skip_fires_only_the_newest_slot_and_none_while_the_last_run_is_busy() {
        let now = 1_796_601_600_000;
        let s = schedule(Overlap::Skip, now - 2 * MIN, 10 * MIN);
        let idle = look(&s, &every_minute(), now, false);
        assert_eq!(idle.fire, vec![now]);
        assert_eq!(idle.skipped, 2);
        let busy = look(&s, &every_minute(), now, true);
        assert!(busy.fire.is_empty());
        assert_eq!(busy.next.last_run_id, None);
    }

    #[test]
    fn buffer_one_keeps_the_newest_slot_until_the_last_run_finishes() {
        let now = 1_796_601_600_000;
        let s = schedule(Overlap::BufferOne, now - MIN, 10 * MIN);
        let busy = look(&s, &every_minute(), now, true);
        assert!(busy.fire.is_empty());
        assert_eq!(busy.next.buffered_at_ms, Some(now));
        assert!(is_due(&busy.next, now + 1));
        let later = look(&busy.next, &every_minute(), now + 1, false);
        assert_eq!(later.fire, vec![now]);
        assert_eq!(later.next.buffered_at_ms, None);
    }

    #[test]
    fn a_paused_schedule_fires_nothing() {
        let now = 1_796_601_600_000;
        let mut s = schedule(Overlap::Allow, now - MIN, 10 * MIN);
        s.paused = true;
        assert!(!is_due(&s, now));
        assert!(look(&s, &every_minute(), now, false).fire.is_empty());
    }

    #[test]
    fn names_are_checked_and_run_ids_are_made_of_the_name_and_the_slot() {
        assert!(check_name("triage.nightly-1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("-x").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
        let id = firing_run_id("triage", 1_796_601_600_000);
        assert_eq!(id, "triage@2026-12-07T00:00:00Z");
        assert!(crate::ids::check_run_id(&id).is_ok());
    }
}

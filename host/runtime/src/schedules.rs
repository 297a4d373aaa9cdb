//! Schedules as an operator changes them and as workers fire them (the
//! rules are in [`stephost_core::schedules`]).

use stephost_core::chain::{Head, Signer};
use stephost_core::schedules::{self, Overlap, Schedule, Schedules, Timing};
use stephost_core::{NewRun, RunBudget, RunRecord, RunTrace, Store, StoreError, Views};

use crate::error::HostError;

/// The catch-up window of a schedule added without one, in ms: a slot a
/// worker sees up to a minute late still fires.
pub const CATCH_UP_MS_DEFAULT: i64 = 60_000;

/// Due schedules one look fires at most (the rest on the next look).
const SCHEDULES_PER_LOOK_MAX: usize = 64;

/// A schedule as an operator adds it.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub input: String,
    pub overlap: Overlap,
    pub catch_up_ms: i64,
}

/// The build a schedule fires.
#[derive(Debug, Clone)]
pub struct Target {
    pub module_digest: String,
    pub world: String,
    pub step: Option<String>,
}

impl Target {
    /// The build the newest run of step `step` (`name@version`) ran:
    /// how `--step` names a build already in the ledger.
    pub fn of_step(store: &dyn Views, step: &str) -> Result<Target, HostError> {
        let newest = store
            .runs(&stephost_core::store::RunQuery {
                step: Some(step.to_string()),
                limit: Some(1),
                ..Default::default()
            })?
            .pop()
            .ok_or_else(|| {
                HostError::BadInput(format!(
                    "no run of step {step} is in the ledger, so no build of it is known here; \
                     name the build with --module (or module_digest), or give the step as \
                     name@version as `stephost runs` shows it"
                ))
            })?;
        Ok(Target {
            module_digest: newest.module_digest,
            world: newest.world,
            step: newest.step,
        })
    }
}

/// Adds a schedule firing `target`; its first slot is the first after now.
pub fn add(
    schedules: &dyn Schedules,
    target: Target,
    new: NewSchedule,
) -> Result<Schedule, HostError> {
    schedules::check_name(&new.name).map_err(HostError::BadInput)?;
    let timing = Timing::new(&new.cron, &new.timezone).map_err(HostError::BadInput)?;
    serde_json::from_str::<serde_json::Value>(&new.input)
        .map_err(|e| HostError::BadInput(format!("the schedule's input is not JSON: {e}")))?;
    if new.catch_up_ms < 0 {
        return Err(HostError::BadInput(
            "a catch-up window is a duration of 0 or more".into(),
        ));
    }
    let now = stephost_core::clock::now_ms();
    let next_at_ms = timing.next_after(now).ok_or_else(|| {
        HostError::BadInput(format!(
            "cron expression {:?} names no time after now: it would never fire",
            new.cron
        ))
    })?;
    let schedule = Schedule {
        name: new.name,
        cron: new.cron,
        timezone: new.timezone,
        module_digest: target.module_digest,
        world: target.world,
        step: target.step,
        input: new.input,
        overlap: new.overlap,
        catch_up_ms: new.catch_up_ms,
        paused: false,
        next_at_ms,
        last_run_id: None,
        buffered_at_ms: None,
        created_at_ms: now,
        updated_at_ms: now,
        version: 1,
    };
    if !schedules.add(&schedule)? {
        return Err(StoreError::ScheduleExists(schedule.name).into());
    }
    Ok(schedule)
}

/// Pauses or resumes schedule `name`. A resumed schedule goes on from its
/// first slot after now: what came while it was paused is not caught up.
pub fn set_paused(
    schedules: &dyn Schedules,
    name: &str,
    paused: bool,
) -> Result<Schedule, HostError> {
    loop {
        let found = schedules
            .get(name)?
            .ok_or_else(|| StoreError::UnknownSchedule(name.to_string()))?;
        if found.paused == paused {
            return Ok(found);
        }
        let now = stephost_core::clock::now_ms();
        let mut changed = found.clone();
        changed.paused = paused;
        changed.updated_at_ms = now;
        if !paused {
            let timing = Timing::new(&found.cron, &found.timezone).map_err(HostError::BadInput)?;
            changed.next_at_ms = timing.next_after(now).unwrap_or(i64::MAX);
            changed.buffered_at_ms = None;
        }
        if schedules.swap(found.version, &changed, true)? {
            changed.version += 1;
            return Ok(changed);
        }
    }
}

/// Removes schedule `name`; the runs it fired stay.
pub fn remove(schedules: &dyn Schedules, name: &str) -> Result<(), HostError> {
    match schedules.remove(name)? {
        true => Ok(()),
        false => Err(StoreError::UnknownSchedule(name.to_string()).into()),
    }
}

/// What a worker's look at the schedules did.
#[derive(Debug, Default)]
pub struct Fired {
    /// The runs this look recorded for due slots (not those another
    /// worker had recorded first).
    pub runs: Vec<String>,
    /// Slots passed over: older than the catch-up window, or skipped while
    /// the last firing's run was unfinished.
    pub skipped: u64,
    /// The earliest next slot of any schedule, to look again then.
    pub next_at_ms: Option<i64>,
}

/// Fires every due slot of the schedules in the ledger at `now_ms`: each a
/// run inserted once (its id made of the name and the slot), then the
/// schedule moved past them by compare-and-set. Any number of workers may
/// do this at once: each slot still makes one run.
pub fn fire_due(
    store: &dyn Store,
    schedules: &dyn Schedules,
    signer: &Signer,
    now_ms: i64,
) -> Result<Fired, HostError> {
    let mut fired = Fired::default();
    for schedule in schedules.due(now_ms, SCHEDULES_PER_LOOK_MAX)? {
        let timing = match Timing::new(&schedule.cron, &schedule.timezone) {
            Ok(timing) => timing,
            // Checked when added: only a row changed by hand gets here.
            Err(e) => {
                crate::logs::error(
                    "schedules",
                    None,
                    format_args!("schedule {} cannot fire: {e}", schedule.name),
                );
                continue;
            }
        };
        let last_busy = match &schedule.last_run_id {
            Some(run_id) => match store.run(run_id) {
                Ok(run) => !run.status.is_finished(),
                Err(StoreError::UnknownRun(_)) => false,
                Err(e) => return Err(e.into()),
            },
            None => false,
        };
        let look = schedules::look(&schedule, &timing, now_ms, last_busy);
        let mut made = Vec::new();
        for slot in &look.fire {
            let run = firing(&schedule, *slot, signer);
            // Found as another worker made it (its own trace), or made now.
            if store.insert_run(&run)? == run {
                made.push(run.run_id);
            }
        }
        let mut next = look.next;
        next.updated_at_ms = now_ms;
        // Lost to another worker: it fired the same slots (the same runs)
        // and counts them.
        if schedules.swap(schedule.version, &next, false)? {
            fired.skipped += look.skipped;
        }
        fired.runs.extend(made);
    }
    if !fired.runs.is_empty() || fired.skipped > 0 {
        let mut counters = stephost_core::journal::Counters::new();
        counters.insert("schedule_runs_fired_total", fired.runs.len() as i64);
        counters.insert("schedule_slots_skipped_total", fired.skipped as i64);
        store.add_counters(&counters)?;
    }
    fired.next_at_ms = schedules.next_at()?;
    Ok(fired)
}

/// The run of `schedule`'s slot `slot_ms`: pending, sealed, in a trace of
/// its own.
fn firing(schedule: &Schedule, slot_ms: i64, signer: &Signer) -> RunRecord {
    let run_id = schedules::firing_run_id(&schedule.name, slot_ms);
    let run = NewRun {
        run_id: &run_id,
        module_digest: &schedule.module_digest,
        step: schedule.step.as_deref(),
        world: &schedule.world,
        input: &schedule.input,
        now_ms: stephost_core::clock::now_ms(),
        budget: RunBudget::default(),
    }
    .record(None);
    RunRecord {
        seal: Some(signer.seal(&run, &Head::default())),
        trace: Some(RunTrace::new(true)),
        ..run
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use stephost_core::Pool;
    use stephost_core::memory::MemoryPool;

    fn every_second(name: &str, overlap: Overlap) -> NewSchedule {
        NewSchedule {
            name: name.into(),
            cron: "* * * * * *".into(),
            timezone: "UTC".into(),
            input: "{\"n\": 1}".into(),
            overlap,
            catch_up_ms: 10_000,
        }
    }

    fn target() -> Target {
        Target {
            module_digest: "d".into(),
            world: "stephost:step/step@0.3.0".into(),
            step: None,
        }
    }

    /// An in-memory ledger's schedules and store.
    fn ledger() -> (Arc<dyn Schedules>, Box<dyn Store>) {
        let pool = MemoryPool::new();
        (
            pool.schedules().expect("schedules"),
            pool.store().expect("store"),
        )
    }

    #[test]
    fn two_workers_firing_the_same_slots_make_each_run_once() {
        let (schedules, store) = ledger();
        let added = add(
            schedules.as_ref(),
            target(),
            every_second("tick", Overlap::Allow),
        )
        .expect("added");
        let later = added.next_at_ms + 2_500;
        let signer = Signer::plain();
        let a = fire_due(store.as_ref(), schedules.as_ref(), &signer, later).expect("fired");
        let b = fire_due(store.as_ref(), schedules.as_ref(), &signer, later).expect("fired");
        assert_eq!(a.runs.len(), 3, "{a:?}");
        assert!(b.runs.is_empty(), "the slots were fired already: {b:?}");
        let runs = store
            .runs(&stephost_core::store::RunQuery::default())
            .expect("runs");
        assert_eq!(runs.len(), 3);
        assert!(runs.iter().all(|r| r.run_id.starts_with("tick@")));
    }

    #[test]
    fn a_paused_schedule_fires_nothing_and_resumes_from_the_next_slot() {
        let (schedules, store) = ledger();
        let added = add(
            schedules.as_ref(),
            target(),
            every_second("p", Overlap::Skip),
        )
        .expect("added");
        set_paused(schedules.as_ref(), "p", true).expect("paused");
        let later = added.next_at_ms + 5_000;
        let signer = Signer::plain();
        let fired = fire_due(store.as_ref(), schedules.as_ref(), &signer, later).expect("fired");
        assert!(fired.runs.is_empty());
        let resumed = set_paused(schedules.as_ref(), "p", false).expect("resumed");
        assert!(resumed.next_at_ms > stephost_core::clock::now_ms() - 1_000);
        assert!(matches!(
            add(
                schedules.as_ref(),
                target(),
                every_second("p", Overlap::Skip)
            ),
            Err(HostError::Ledger(StoreError::ScheduleExists(_)))
        ));
        remove(schedules.as_ref(), "p").expect("removed");
        assert!(remove(schedules.as_ref(), "p").is_err());
    }
}

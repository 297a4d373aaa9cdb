//! The embedded SQLite ledger (WAL mode).
//!
//! Durable writes (`started`, run end) commit with `synchronous=FULL`: one
//! fsync of the WAL. Other writes commit with `synchronous=NORMAL`: they are
//! in the WAL, in order, and become durable with the next FULL commit, which
//! is all the ordering invariant 2 needs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};

use super::attempts;
use super::checkpoint::Checkpointer;
use super::known::Known;
use super::schema::{self, APPLICATION_ID};
use super::spans::{self, CALL_AT};
use super::spare::refill;
use super::{
    AttemptRecord, CallClass, CallRecord, CallState, Claim, History, Ledger, LedgerError,
    LogRecord, NewRun, RunEnd, RunRecord, RunStatus, WriteOp,
};

/// How long a writer waits for another process's transaction.
pub const BUSY_TIMEOUT_MS: u64 = 10_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sync {
    Normal,
    Full,
}

impl Sync {
    /// `Full` (an fsync at commit) for a commit that must be durable.
    fn when(durable: bool) -> Self {
        if durable { Sync::Full } else { Sync::Normal }
    }
}

pub struct SqliteLedger {
    conn: Connection,
    path: PathBuf,
    sync: Sync,
    /// Whether commits are fsync'd now (`sync` is `Full`), for the
    /// checkpoint hook.
    fsyncs_at_commit: Arc<AtomicBool>,
    /// What this connection knows from its own writes.
    known: Known,
}

impl SqliteLedger {
    /// Opens (creating if absent) the ledger at `path` and migrates it.
    /// A file that is not a stephost ledger is refused and left untouched.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let shown = path.display().to_string();
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| not_a_ledger(&shown, e))?;
        conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
        // Every statement on the hot paths is prepared once and kept; the
        // default cache of 16 would evict some of them.
        conn.set_prepared_statement_cache_capacity(64);
        // And kept: without the query planner stability guarantee, SQLite
        // prepares a statement again whenever a parameter its plan looked
        // at is bound to another value (a `LIMIT`, as in listing runnable
        // runs), which costs more than the statement's work.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        // Reading the header is the first thing that fails on a non-database file.
        let app_id: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| not_a_ledger(&shown, e))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let tables: i64 = conn.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
            [],
            |r| r.get(0),
        )?;
        if app_id != APPLICATION_ID && !(app_id == 0 && version == 0 && tables == 0) {
            return Err(LedgerError::NotALedger {
                path: shown,
                detail: format!("application_id is {app_id:#x}, not {APPLICATION_ID:#x}"),
            });
        }
        if version > schema::current_version() {
            return Err(LedgerError::TooNew {
                path: shown,
                found: version,
                supported: schema::current_version(),
            });
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let fsyncs_at_commit = Arc::new(AtomicBool::new(true));
        Checkpointer::for_ledger(path).install(&mut conn, fsyncs_at_commit.clone())?;
        let mut ledger = SqliteLedger {
            conn,
            path: path.to_path_buf(),
            sync: Sync::Full,
            fsyncs_at_commit,
            known: Known::default(),
        };
        ledger.migrate(version)?;
        Ok(ledger)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The highest sequence number among the run's calls (their count, in
    /// a sound ledger); 0 for none.
    fn last_seq(&self, run_id: &str) -> Result<usize, LedgerError> {
        let run_no: Option<i64> = self
            .conn
            .prepare_cached("SELECT run_no FROM runs WHERE run_id = ?1")?
            .query_row([run_id], |r| r.get(0))
            .optional()?;
        match run_no {
            Some(run_no) => Ok(spans::last_seq(&self.conn, run_no)? as usize),
            None => Ok(0),
        }
    }

    /// The calls of `run_id` numbered `1..=last` (its count, from
    /// `last_seq`), each present once, in order: anything else is damage.
    fn calls_upto(&self, run_id: &str, last: usize) -> Result<Vec<CallRecord>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare_cached(&spans::calls_between_sql(CALL_COLUMNS, "TRUE"))?;
        // Sized up front: a long run has 100,000s of calls, and growing the
        // vector by doubling copies them and faults in fresh pages again.
        // (Capped, in case a damaged ledger's count is huge.)
        let mut calls = Vec::with_capacity(last.min(1 << 20));
        for call in stmt.query_map(params![run_id, 0, last as i64], call_from_row)? {
            calls.push(call?);
        }
        // Sequence numbers must be 1..=last without gaps.
        for (index, call) in calls.iter().enumerate() {
            if call.seq != index as u64 + 1 {
                return Err(LedgerError::Corrupt(format!(
                    "run {run_id}: call #{} found where #{} was expected",
                    call.seq,
                    index + 1
                )));
            }
        }
        if calls.len() != last {
            return Err(LedgerError::Corrupt(format!(
                "run {run_id}: {} calls found where {last} were expected",
                calls.len()
            )));
        }
        Ok(calls)
    }

    fn migrate(&mut self, from: i64) -> Result<(), LedgerError> {
        if from >= schema::current_version() {
            return Ok(());
        }
        // A migration that rebuilds a table drops the old one, which
        // foreign keys would refuse. The pragma cannot change inside a
        // transaction, so it is off around the migrations, and each one
        // checks every reference before it commits.
        self.conn.pragma_update(None, "foreign_keys", "OFF")?;
        let migrated = self.migrate_from(from);
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        migrated
    }

    fn migrate_from(&mut self, from: i64) -> Result<(), LedgerError> {
        for (index, sql) in schema::MIGRATIONS.iter().enumerate().skip(from as usize) {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Exclusive)?;
            // Another process may have migrated while we waited for the lock.
            let now: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            if now > index as i64 {
                tx.commit()?;
                continue;
            }
            if let Err(e) = tx.execute_batch(sql) {
                if e.to_string().contains("spans_in_rowid_order") {
                    return Err(LedgerError::Corrupt(format!(
                        "migrating the ledger to schema v{} found a run whose calls are not \
                         stored in the order of their numbers (written by an unreleased build); \
                         the ledger was left at v{index}",
                        index + 1
                    )));
                }
                if e.to_string().contains("every_call_has_its_run") {
                    return Err(LedgerError::Corrupt(format!(
                        "migrating the ledger to schema v{} found calls whose run is \
                         missing; the ledger was left at v{index}",
                        index + 1
                    )));
                }
                return Err(e.into());
            }
            let broken: Option<String> = tx
                .query_row("PRAGMA foreign_key_check", [], |r| r.get(0))
                .optional()?;
            if let Some(table) = broken {
                return Err(LedgerError::Corrupt(format!(
                    "migrating the ledger to schema v{} found a row of `{table}` that refers \
                     to a missing row; the ledger was left at v{index}",
                    index + 1
                )));
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)?;
            tx.pragma_update(None, "user_version", index as i64 + 1)?;
            tx.commit()?;
        }
        Ok(())
    }

    fn set_sync(&mut self, sync: Sync) -> Result<(), LedgerError> {
        if self.sync != sync {
            // Prepared once, like the hot statements: a run switches twice.
            let pragma = match sync {
                Sync::Normal => "PRAGMA synchronous = NORMAL",
                Sync::Full => "PRAGMA synchronous = FULL",
            };
            self.conn.prepare_cached(pragma)?.execute([])?;
            self.sync = sync;
            self.fsyncs_at_commit
                .store(sync == Sync::Full, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Group commit: applies many writes (of any runs) in one transaction,
    /// committed without an fsync. One stale or failing writer affects only
    /// its own result: the batch is applied in one go, and if a write fails,
    /// undone and applied again with each write in a savepoint of its own.
    /// No write is applied after a write of the same execution failed
    /// (`failed`, kept from batch to batch). Also says whether any of
    /// the writes must be durable: then the caller syncs the WAL
    /// ([`SqliteLedger::wal_path`]) before it answers any writer of the
    /// batch, while the next batch is applied.
    pub fn apply_batch(
        &mut self,
        batch: &[(&Claim, &[WriteOp])],
        failed: &mut FailedExecutions,
    ) -> (Vec<Result<(), LedgerError>>, bool) {
        let durable = batch
            .iter()
            .any(|(_, ops)| ops.iter().any(WriteOp::durable));
        // `apply_jobs` remembers each job that failed alone; an error that
        // failed the whole transaction fails every job in it.
        let results = self.apply_jobs(batch, failed).unwrap_or_else(|e| {
            let message = e.to_string();
            batch
                .iter()
                .map(|(claim, _)| {
                    let error = LedgerError::Batch(message.clone());
                    failed.add(claim, &error);
                    Err(error)
                })
                .collect()
        });
        (results, durable)
    }

    /// Claims `run_id` for a worker, as [`Ledger::claim`], only if it is
    /// due now: pending, running (its lease is checked as a claim checks
    /// it), or waiting for a time that has come; a run waiting for a later
    /// time or for a decision, or parked, is refused as `NotClaimable`.
    /// A worker lists runnable runs before it claims them; in the meantime
    /// another worker may have claimed one and left it waiting or parked,
    /// and claiming it then would replay it only to stop where it stopped.
    pub fn claim_due(
        &mut self,
        run_id: &str,
        owner: &str,
        lease_ms: i64,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<Claim, LedgerError> {
        self.claim_if(run_id, owner, lease_ms, now_ms, owner_alive, true)
    }

    /// [`Ledger::claim`], refusing a run that is not due if `due_only`.
    fn claim_if(
        &mut self,
        run_id: &str,
        owner: &str,
        lease_ms: i64,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
        due_only: bool,
    ) -> Result<Claim, LedgerError> {
        let current = self.run(run_id)?;
        if finished(&current) || (due_only && !due(&current, now_ms)) {
            return Err(not_claimable(&current));
        }

        if let (Some(holder), Some(until)) = (&current.owner, current.lease_until_ms)
            && until > now_ms
            && holder != owner
            && owner_alive(holder)
        {
            return Err(LedgerError::ClaimedElsewhere {
                run_id: run_id.to_string(),
                owner: holder.clone(),
                lease_until_ms: until,
            });
        }
        // Compare-and-set on the version read above: a concurrent claimant
        // that got there first makes this update match no row. No fsync of
        // its own: the claim is ordered before the claimant's first durable
        // commit, and nothing leaves the host before that.
        self.set_sync(Sync::Normal)?;
        let lease_until_ms = now_ms + lease_ms;
        let changed = claim_row(
            &self.conn,
            run_id,
            owner,
            (lease_until_ms, now_ms),
            current.version,
            due_only,
        )?;
        if changed == 0 {
            let found = self.run(run_id)?;
            if due_only && !due(&found, now_ms) {
                return Err(not_claimable(&found));
            }
            return Err(LedgerError::VersionConflict {
                run_id: run_id.to_string(),
                expected: current.version,
                found: found.version,
            });
        }
        Ok(Claim {
            run_id: run_id.to_string(),
            owner: owner.to_string(),
            fence: current.fence + 1,
            lease_ms,
            lease_until_ms,
        })
    }

    /// SQLite's write-ahead log of this ledger, where SQLite keeps it (next
    /// to the database file that a symlink names, for one): an fsync of it
    /// makes every transaction committed before durable.
    pub fn wal_path(&self) -> PathBuf {
        let db = self
            .conn
            .path()
            .map_or_else(|| self.path.clone(), PathBuf::from);
        let mut wal = db.into_os_string();
        wal.push("-wal");
        PathBuf::from(wal)
    }

    /// The batch's transaction: each job's own result, or the error that
    /// failed them all (the transaction could not begin, go on or commit).
    fn apply_jobs(
        &mut self,
        batch: &[(&Claim, &[WriteOp])],
        failed: &mut FailedExecutions,
    ) -> Result<Vec<Result<(), LedgerError>>, LedgerError> {
        self.set_sync(Sync::Normal)?;
        if let Some(results) = self.apply_jobs_at_once(batch, failed)? {
            return Ok(results);
        }
        let tx = WriteTx::begin(&self.conn)?;
        self.known.begin(&tx)?;
        let mut results = Vec::with_capacity(batch.len());
        for (claim, ops) in batch {
            if let Some(refusal) = failed.refusal(claim) {
                results.push(Err(refusal));
                continue;
            }
            // An outer error ended the whole transaction (a full disk, an
            // I/O error), and every job before this one with it.
            let result = tx.in_savepoint(|conn| apply_commit(conn, &self.known, claim, ops))?;
            if let Err(e) = &result {
                self.known.forget();
                failed.add(claim, e);
            }
            results.push(result);
        }
        tx.commit()?;
        self.known.committed(&self.conn);
        Ok(results)
    }

    /// The batch's transaction with no savepoint per job, if no job fails:
    /// nearly always. A savepoint per job, and the pages SQLite copies aside
    /// for each, cost about a tenth of the group committer's time. If a job
    /// fails, the whole transaction is undone and `None` returned, and the
    /// batch is applied again job by job (applying a job does nothing but
    /// write to the ledger, so nothing of the undone attempt remains).
    fn apply_jobs_at_once(
        &mut self,
        batch: &[(&Claim, &[WriteOp])],
        failed: &FailedExecutions,
    ) -> Result<Option<Vec<Result<(), LedgerError>>>, LedgerError> {
        let tx = WriteTx::begin(&self.conn)?;
        self.known.begin(&tx)?;
        let mut results = Vec::with_capacity(batch.len());
        for (claim, ops) in batch {
            match failed.refusal(claim) {
                Some(refusal) => results.push(Err(refusal)),
                None if apply_commit(&tx, &self.known, claim, ops).is_ok() => {
                    results.push(Ok(()));
                }
                // Dropped, the transaction rolls back.
                None => return Ok(None),
            }
        }
        tx.commit()?;
        self.known.committed(&self.conn);
        Ok(Some(results))
    }
}

/// The executions (a run under one claim: its id and fencing token) one of
/// whose writes failed, and how. None of their later writes is applied: a
/// run's writes may be queued in order without waiting, and one that failed
/// (a busy or full disk, a refused row) must not leave a gap in the run's
/// calls that the next ones would fill past. The execution learns of the
/// failure from its next write that waits, and stops; a resume claims the
/// run anew.
#[derive(Default)]
pub struct FailedExecutions(std::collections::HashMap<(String, i64), String>);

impl FailedExecutions {
    /// The error for a write of `claim`'s execution, if one failed before.
    pub fn refusal(&self, claim: &Claim) -> Option<LedgerError> {
        // Asked for every write, and nearly always empty: no key is built
        // then.
        if self.0.is_empty() {
            return None;
        }
        self.0
            .get(&(claim.run_id.clone(), claim.fence))
            .map(|first| refused_after_failure(&claim.run_id, first))
    }

    /// Remembers the first failure of `claim`'s execution.
    pub fn add(&mut self, claim: &Claim, error: &LedgerError) {
        self.0
            .entry((claim.run_id.clone(), claim.fence))
            .or_insert_with(|| error.to_string());
    }
}

/// The error of a write not applied because an earlier one of the same
/// execution (`first`) failed.
fn refused_after_failure(run_id: &str, first: &str) -> LedgerError {
    LedgerError::Batch(format!(
        "an earlier write of run {run_id} under this claim failed ({first}); later ones are not \
         applied, so that no call is missing before them: resume the run"
    ))
}

/// A write transaction begun and ended by statements prepared once per
/// connection (`rusqlite::Transaction` parses its `BEGIN` and `COMMIT` text
/// each time, a few µs per commit on the hot path). Dropped without
/// `commit`, it rolls back.
struct WriteTx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> WriteTx<'c> {
    fn begin(conn: &'c Connection) -> Result<Self, LedgerError> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(WriteTx { conn, open: true })
    }

    fn commit(mut self) -> Result<(), LedgerError> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }

    /// Runs `f` in a savepoint: its writes are kept if it succeeds and
    /// undone, leaving the rest of the transaction as it was, if it fails.
    /// The outer error means the transaction cannot go on (the savepoint
    /// could not be set or undone, or the error ended the transaction):
    /// nothing in it may be committed.
    fn in_savepoint(
        &self,
        f: impl FnOnce(&Connection) -> Result<(), LedgerError>,
    ) -> Result<Result<(), LedgerError>, LedgerError> {
        self.conn.prepare_cached("SAVEPOINT job")?.execute([])?;
        let result = f(self.conn);
        if let Err(e) = &result
            && (self.conn.is_autocommit()
                || self
                    .conn
                    .prepare_cached("ROLLBACK TO job")
                    .and_then(|mut undo| undo.execute([]))
                    .is_err())
        {
            return Err(LedgerError::Batch(format!(
                "a failed write could not be undone alone: {e}"
            )));
        }
        self.conn.prepare_cached("RELEASE job")?.execute([])?;
        Ok(result)
    }
}

impl std::ops::Deref for WriteTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        if self.open && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

impl WriteOp {
    /// Whether the write must be on disk before the writer goes on.
    pub fn durable(&self) -> bool {
        matches!(
            self,
            WriteOp::Started(_) | WriteOp::Finish(..) | WriteOp::Suspend { .. }
        )
    }

    /// Applies the write inside the caller's transaction or savepoint, which
    /// has checked the claim's fence. A call's row takes its attempts from
    /// `tried` (with the row, or with the call's outcome).
    fn apply(
        &self,
        conn: &Connection,
        placed: &spans::Placed,
        run_no: i64,
        claim: &Claim,
        tried: &mut Tried,
    ) -> Result<(), LedgerError> {
        match self {
            WriteOp::Call(call) | WriteOp::Started(call) => {
                insert_calls(conn, placed, run_no, claim, &[(call, tried.take(call.seq))])
            }
            WriteOp::Outcome {
                seq,
                state,
                outcome,
                now_ms,
                chain,
            } => {
                let attempts = tried.take(*seq);
                update_outcome(
                    conn,
                    placed.id_of(run_no, *seq),
                    call_key(&claim.run_id, run_no, *seq)?,
                    claim,
                    *seq,
                    *state,
                    outcome,
                    *now_ms,
                    chain,
                    attempts.as_deref(),
                )
            }
            // Kept in `tried` until its call's row takes it.
            WriteOp::Attempt(_) => Ok(()),
            // Written by `apply_commit`, before the fence check.
            WriteOp::Create(_) => Ok(()),
            WriteOp::Log(log) => {
                conn.prepare_cached(
                    "INSERT INTO logs (run_id, after_seq, level, message, at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![
                    claim.run_id,
                    log.after_seq as i64,
                    log.level,
                    log.message,
                    log.at_ms
                ])?;
                Ok(())
            }
            WriteOp::Finish(end, now_ms) => {
                let (status, output, error, exit_code) = match end {
                    RunEnd::Completed { output, exit_code } => (
                        RunStatus::Completed,
                        Some(output.as_str()),
                        None,
                        *exit_code,
                    ),
                    RunEnd::Failed { error, exit_code } => {
                        (RunStatus::Failed, None, Some(error.as_str()), *exit_code)
                    }
                    RunEnd::Parked { error } => {
                        (RunStatus::Parked, None, Some(error.as_str()), None)
                    }
                    RunEnd::Diverged { error } => {
                        (RunStatus::Diverged, None, Some(error.as_str()), None)
                    }
                };
                conn.prepare_cached(
                    "UPDATE runs SET status = ?1, output = ?2, error = ?3, updated_at = ?4, \
                     owner = NULL, lease_until = NULL, exit_code = ?6 WHERE run_id = ?5",
                )?
                .execute(params![
                    status.as_str(),
                    output,
                    error,
                    now_ms,
                    claim.run_id,
                    exit_code
                ])?;
                Ok(())
            }
            WriteOp::Counters(counters) => add_counters(conn, counters),
            WriteOp::Suspend { wake_at_ms, now_ms } => {
                conn.prepare_cached(
                    "UPDATE runs SET status = 'waiting', wake_at = ?1, updated_at = ?2, \
                     owner = NULL, lease_until = NULL WHERE run_id = ?3",
                )?
                .execute(params![wake_at_ms, now_ms, claim.run_id])?;
                Ok(())
            }
        }
    }
}

/// Call `seq` of `run_id`, or `None` if the run has no such call (an
/// unknown run is `UnknownRun`).
fn find_call(conn: &Connection, run_id: &str, seq: u64) -> Result<Option<CallRecord>, LedgerError> {
    let found = conn
        .query_row(
            &format!("SELECT {CALL_COLUMNS} FROM calls WHERE {CALL_AT}"),
            params![run_id, seq as i64],
            call_from_row,
        )
        .optional()?;
    if found.is_none() {
        conn.query_row("SELECT 1 FROM runs WHERE run_id = ?1", [run_id], |_| Ok(()))
            .optional()?
            .ok_or_else(|| LedgerError::UnknownRun(run_id.to_string()))?;
    }
    Ok(found)
}

/// Records a person's decision as a call's outcome (with who, when and its
/// chain link) and makes a parked or waiting run runnable. The decision
/// supersedes whoever may be executing the run: the fencing token moves on
/// and the claim is cleared, so a concurrent execution can write nothing
/// more (not even a stale "parked" end) and the next one starts at once.
fn settle_by_person(
    conn: &Connection,
    run_id: &str,
    mut call: CallRecord,
    state: CallState,
    outcome: &str,
    by: &str,
    now_ms: i64,
) -> Result<(), LedgerError> {
    call.state = state;
    call.outcome = Some(outcome.to_string());
    let chain = chain_for(conn, run_id, &call)?;
    conn.execute(
        &format!(
            "UPDATE calls SET state = ?3, outcome = ?4, finished_at = ?5, resolved_by = ?6, \
             resolved_at = ?5, chain = ?7 WHERE {CALL_AT}"
        ),
        params![
            run_id,
            call.seq as i64,
            state.as_str(),
            outcome,
            now_ms,
            by,
            chain
        ],
    )?;
    conn.execute(
        "UPDATE runs SET status = 'running', error = NULL, wake_at = NULL, updated_at = ?1, \
         fence = fence + 1, version = version + 1, owner = NULL, lease_until = NULL \
         WHERE run_id = ?2 AND status IN ('parked', 'waiting', 'running')",
        params![now_ms, run_id],
    )?;
    Ok(())
}

/// The chain link for a call finished outside a run (by a person), from the
/// link of the call before it.
fn chain_for(
    conn: &Connection,
    run_id: &str,
    call: &CallRecord,
) -> Result<Option<String>, LedgerError> {
    if !call.state.has_outcome() {
        return Ok(None);
    }
    let previous: Option<String> = if call.seq > 1 {
        conn.query_row(
            &format!("SELECT chain FROM calls WHERE {CALL_AT}"),
            params![run_id, call.seq as i64 - 1],
            |r| r.get(0),
        )
        .optional()?
        .flatten()
    } else {
        None
    };
    Ok(Some(super::chain::link(
        previous.as_deref().unwrap_or(""),
        call,
    )))
}

fn not_a_ledger(path: &str, e: rusqlite::Error) -> LedgerError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => LedgerError::NotALedger {
            path: path.to_string(),
            detail: "the file is not an SQLite database".to_string(),
        },
        _ => LedgerError::Sqlite(e),
    }
}

/// Checks that `claim` still holds its run; returns the run's number, which
/// its calls' keys begin with.
fn check_fence(tx: &Connection, known: &Known, claim: &Claim) -> Result<i64, LedgerError> {
    // As this connection last read it, if nothing changed the ledger since
    // (see `known`); a token that differs is read again.
    if let Some((fence, run_no)) = known.fence(&claim.run_id)
        && fence == claim.fence
    {
        return Ok(run_no);
    }
    // A read, not a write: the runs row stays clean, so a commit carries
    // only the pages of its own rows. Leases are renewed separately
    // (`renew`), by the worker's renewal loop and the journal.
    let newest: Option<(i64, i64)> = tx
        .prepare_cached("SELECT fence, run_no FROM runs WHERE run_id = ?1")?
        .query_row([&claim.run_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match newest {
        None => Err(LedgerError::UnknownRun(claim.run_id.clone())),
        Some((newest, _)) if newest != claim.fence => Err(LedgerError::Fenced {
            run_id: claim.run_id.clone(),
            held: claim.fence,
            newest,
        }),
        Some((fence, run_no)) => {
            known.read_fence(&claim.run_id, fence, run_no);
            Ok(run_no)
        }
    }
}

/// The key of call `seq` of the run numbered `run_no` (of `run_id`): never
/// one in another run's range (the journal stops a run before it gets
/// there).
fn call_key(run_id: &str, run_no: i64, seq: u64) -> Result<i64, LedgerError> {
    if seq > super::CALLS_PER_RUN_MAX || !(0..1 << 31).contains(&run_no) {
        return Err(LedgerError::KeysExhausted {
            run_id: run_id.to_string(),
            seq,
            max: super::CALLS_PER_RUN_MAX,
        });
    }
    Ok((run_no << 32) + seq as i64)
}

/// The statement that lists runnable runs (`Ledger::runnable`): at time
/// `?1`, at most `?2`.
fn runnable_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let held = "(owner IS NOT NULL AND lease_until >= ?1) AS held";
        // Due waiting runs from their index by due time: by status, SQLite
        // would read every waiting run to find the due ones.
        format!(
            "SELECT {RUN_COLUMNS} FROM (\
             SELECT * FROM (SELECT {RUN_COLUMNS}, {held} FROM runs \
             WHERE status = 'pending' ORDER BY created_at, run_id LIMIT ?2) \
             UNION ALL SELECT * FROM (SELECT {RUN_COLUMNS}, {held} FROM runs \
             WHERE status = 'running' ORDER BY held, created_at, run_id LIMIT ?2) \
             UNION ALL SELECT * FROM (SELECT {RUN_COLUMNS}, {held} \
             FROM runs INDEXED BY runs_waking WHERE status = 'waiting' AND wake_at <= ?1 \
             ORDER BY created_at, run_id LIMIT ?2)) \
             ORDER BY held, created_at, run_id LIMIT ?2"
        )
    })
}

/// Whether a run has ended for good.
fn finished(run: &RunRecord) -> bool {
    matches!(
        run.status,
        RunStatus::Completed | RunStatus::Failed | RunStatus::Diverged
    )
}

/// Whether a worker may take a run now: as [`runnable_sql`] lists them,
/// pending, running (its lease is checked apart), or waiting for a time
/// that has come.
fn due(run: &RunRecord, now_ms: i64) -> bool {
    match run.status {
        RunStatus::Pending | RunStatus::Running => true,
        RunStatus::Waiting => run.wake_at_ms.is_some_and(|at| at <= now_ms),
        _ => false,
    }
}

fn not_claimable(run: &RunRecord) -> LedgerError {
    LedgerError::NotClaimable {
        run_id: run.run_id.clone(),
        status: run.status.as_str().to_string(),
    }
}

/// The claim's compare-and-set: `run_id` gets `owner` until `lease_until`
/// if its version is still `version` and it has not ended, and, with
/// `due_only`, if it is still due (as [`due`] says): the statements that
/// suspend, park or finish a run change its status without a new version,
/// so the version alone would not see them.
fn claim_row(
    conn: &Connection,
    run_id: &str,
    owner: &str,
    (lease_until_ms, now_ms): (i64, i64),
    version: i64,
    due_only: bool,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "UPDATE runs SET owner = ?1, lease_until = ?2, fence = fence + 1, \
         version = version + 1, updated_at = ?3, \
         status = CASE WHEN status IN ('pending', 'waiting') THEN 'running' ELSE status END, \
         wake_at = NULL \
         WHERE run_id = ?4 AND version = ?5 \
         AND status <> 'completed' AND status <> 'failed' AND status <> 'diverged' \
         AND (NOT ?6 OR status IN ('pending', 'running') \
              OR (status = 'waiting' AND wake_at <= ?3))",
    )?
    .execute(params![
        owner,
        lease_until_ms,
        now_ms,
        run_id,
        version,
        due_only
    ])
}

/// The statement that reads one run (prepared once per connection).
const SELECT_RUN: &str = "SELECT run_id, module_digest, input, status, output, error, created_at, \
     updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code \
     FROM runs WHERE run_id = ?1";

const RUN_COLUMNS: &str = "run_id, module_digest, input, status, output, error, created_at, \
     updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code";

fn run_from_row(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let status: String = r.get(3)?;
    Ok(RunRecord {
        run_id: r.get(0)?,
        module_digest: r.get(1)?,
        input: r.get(2)?,
        status: RunStatus::parse(&status).ok_or_else(|| bad_value(3, &status))?,
        output: r.get(4)?,
        error: r.get(5)?,
        created_at_ms: r.get(6)?,
        updated_at_ms: r.get(7)?,
        version: r.get(8)?,
        owner: r.get(9)?,
        lease_until_ms: r.get(10)?,
        fence: r.get(11)?,
        wake_at_ms: r.get(12)?,
        world: r.get(13)?,
        step: r.get(14)?,
        exit_code: r.get(15)?,
    })
}

const CALL_COLUMNS: &str = "key, class, interface, function, operation_id, request, \
     request_hash, state, outcome, started_at, finished_at, resolved_by, chain";

fn call_from_row(r: &Row<'_>) -> rusqlite::Result<CallRecord> {
    let mut call = CallRecord {
        seq: 0,
        class: CallClass::Observe,
        interface: String::new(),
        function: String::new(),
        operation_id: String::new(),
        request: String::new(),
        request_hash: String::new(),
        state: CallState::Started,
        outcome: None,
        started_at_ms: 0,
        finished_at_ms: None,
        resolved_by: None,
        chain: None,
    };
    fill_call(r, &mut call)?;
    Ok(call)
}

/// Overwrites `call` with row `r` (of `CALL_COLUMNS`), reusing its strings'
/// buffers: a history reader refills the records of chunks the execution
/// has let go instead of allocating and freeing 100,000s of strings.
fn fill_call(r: &Row<'_>, call: &mut CallRecord) -> rusqlite::Result<()> {
    fn text(r: &Row<'_>, column: usize, into: &mut String) -> rusqlite::Result<()> {
        refill(into, r.get_ref(column)?.as_str()?);
        Ok(())
    }
    fn optional_text(
        r: &Row<'_>,
        column: usize,
        into: &mut Option<String>,
    ) -> rusqlite::Result<()> {
        match r.get_ref(column)?.as_str_or_null()? {
            None => *into = None,
            Some(value) => refill(into.get_or_insert_default(), value),
        }
        Ok(())
    }
    // Borrowed, not copied: a replay reads 100,000s of rows.
    let class = r.get_ref(1)?.as_str()?;
    call.class = CallClass::parse(class).ok_or_else(|| bad_value(1, class))?;
    let state = r.get_ref(7)?.as_str()?;
    call.state = CallState::parse(state).ok_or_else(|| bad_value(7, state))?;
    call.seq = (r.get::<_, i64>(0)? & 0xffff_ffff) as u64;
    text(r, 2, &mut call.interface)?;
    text(r, 3, &mut call.function)?;
    text(r, 4, &mut call.operation_id)?;
    text(r, 5, &mut call.request)?;
    text(r, 6, &mut call.request_hash)?;
    optional_text(r, 8, &mut call.outcome)?;
    call.started_at_ms = r.get(9)?;
    call.finished_at_ms = r.get(10)?;
    optional_text(r, 11, &mut call.resolved_by)?;
    optional_text(r, 12, &mut call.chain)?;
    Ok(())
}

fn bad_value(column: usize, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        column,
        rusqlite::types::Type::Text,
        format!("unexpected value {value:?}").into(),
    )
}

/// The run `run` names, if it exists with the same module and input; a
/// different run under the same id is refused.
fn existing_run(conn: &Connection, run: &NewRun<'_>) -> Result<Option<RunRecord>, LedgerError> {
    let found = conn
        .prepare_cached(SELECT_RUN)?
        .query_row([run.run_id], run_from_row)
        .optional()?;
    match found {
        Some(found) if found.module_digest != run.module_digest || found.input != run.input => {
            Err(LedgerError::RunExists {
                run_id: run.run_id.to_string(),
            })
        }
        found => Ok(found),
    }
}

/// Inserts a new run: pending, or running under `claim` (the first claim
/// of a run, as `claim` would take it: version and fencing token 1).
fn insert_run(
    conn: &Connection,
    run: &NewRun<'_>,
    claim: Option<&Claim>,
) -> Result<RunRecord, LedgerError> {
    let record = RunRecord::new(run, claim);
    insert_run_record(conn, &record)?;
    Ok(record)
}

fn insert_run_record(conn: &Connection, run: &RunRecord) -> Result<(), LedgerError> {
    conn.prepare_cached(
        "INSERT INTO runs (run_id, module_digest, input, status, created_at, updated_at, \
         version, owner, lease_until, fence, world, step, run_no) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
         (SELECT ifnull(max(run_no), 0) + 1 FROM runs))",
    )?
    .execute(params![
        run.run_id,
        run.module_digest,
        run.input,
        run.status.as_str(),
        run.created_at_ms,
        run.updated_at_ms,
        run.version,
        run.owner,
        run.lease_until_ms,
        run.fence,
        run.world,
        run.step
    ])?;
    Ok(())
}

/// A commit's writes: the run's row first if the commit creates it, then
/// the fence check, then the rest.
fn apply_commit(
    conn: &Connection,
    known: &Known,
    claim: &Claim,
    ops: &[WriteOp],
) -> Result<(), LedgerError> {
    if let Some(WriteOp::Create(run)) = ops.first() {
        if let Some(found) = conn
            .prepare_cached(SELECT_RUN)?
            .query_row([&run.run_id], run_from_row)
            .optional()?
        {
            // Another process started the same run id first.
            return Err(LedgerError::ClaimedElsewhere {
                run_id: found.run_id,
                owner: found.owner.unwrap_or_else(|| "another process".into()),
                lease_until_ms: found.lease_until_ms.unwrap_or(found.updated_at_ms),
            });
        }
        // Its lease runs from now, not from when the execution began.
        let now_ms = crate::clock::now_ms();
        let run = RunRecord {
            lease_until_ms: Some(claim.lease_until_ms.max(now_ms + claim.lease_ms)),
            ..(**run).clone()
        };
        insert_run_record(conn, &run)?;
    }
    let run_no = check_fence(conn, known, claim)?;
    apply_all(conn, &known.placed, run_no, claim, ops)
}

fn add_counters(conn: &Connection, counters: &crate::journal::Counters) -> Result<(), LedgerError> {
    for (name, by) in counters {
        conn.prepare_cached(
            "INSERT INTO counters (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        )?
        .execute(params![name, by])?;
    }
    Ok(())
}

/// Histories at least this long are read while they are replayed.
const STREAM_CALLS_MIN: usize = 4096;
/// Calls handed over at a time by a thread reading a history.
const STREAM_CHUNK: usize = 1024;
/// Threads reading one history.
const STREAM_READERS: usize = 2;
/// How much of the database file a history reader maps into memory.
const HISTORY_MMAP_BYTES: i64 = 1 << 30;

/// The calls of `run_id` numbered `after + 1 ..= upto`, in order.
fn calls_between(
    conn: &Connection,
    run_id: &str,
    after: usize,
    upto: usize,
    mut chunk: Vec<CallRecord>,
) -> Result<Vec<CallRecord>, Option<LedgerError>> {
    let mut stmt = conn
        .prepare_cached(&spans::calls_between_sql(CALL_COLUMNS, "TRUE"))
        .map_err(|e| Some(e.into()))?;
    let mut rows = stmt
        .query(params![run_id, after as i64, upto as i64])
        .map_err(|e| Some(e.into()))?;
    let mut filled = 0;
    while let Some(row) = rows.next().map_err(|e| Some(e.into()))? {
        match chunk.get_mut(filled) {
            Some(call) => fill_call(row, call),
            None => call_from_row(row).map(|call| chunk.push(call)),
        }
        .map_err(|e| Some(e.into()))?;
        filled += 1;
    }
    chunk.truncate(filled);
    Ok(chunk)
}

/// Buffered call rows inserted by one statement (one statement per row
/// costs about a quarter more per row).
const CALL_CHUNK: usize = 8;

/// Applies `ops`: first the writes of calls (buffered calls' and `started`
/// rows, and outcomes of `started` rows), in the order of their sequence
/// numbers, consecutive rows `CALL_CHUNK` to a statement; then the other
/// writes in order. The commit is all or nothing, and a run's calls are
/// appended in order (see [`spans`]). A call's outcome comes before the
/// next call's row: the previous call's row, which the outcome makes
/// longer, is still the last on its page then, where SQLite appends a page
/// when it is full rather than spreading rows over three. A call's attempts
/// go into its row: with the row when it is inserted here, else with its
/// outcome, else appended at the end.
fn apply_all(
    conn: &Connection,
    placed: &spans::Placed,
    run_no: i64,
    claim: &Claim,
    ops: &[WriteOp],
) -> Result<(), LedgerError> {
    let call_seq = |op: &WriteOp| match op {
        WriteOp::Call(call) | WriteOp::Started(call) => Some(call.seq),
        WriteOp::Outcome { seq, .. } => Some(*seq),
        _ => None,
    };
    let mut tried = Tried::of(ops, claim.fence);
    let mut writes: Vec<(u64, &WriteOp)> = ops
        .iter()
        .filter_map(|op| call_seq(op).map(|seq| (seq, op)))
        .collect();
    // Stable, and nearly always sorted already.
    writes.sort_by_key(|(seq, _)| *seq);
    let mut rows: Vec<(&CallRecord, Option<String>)> = Vec::new();
    for (seq, op) in writes {
        match op {
            WriteOp::Call(call) | WriteOp::Started(call) => rows.push((call, tried.take(seq))),
            _ => {
                insert_rows(conn, placed, run_no, claim, &rows)?;
                rows.clear();
                op.apply(conn, placed, run_no, claim, &mut tried)?;
            }
        }
    }
    insert_rows(conn, placed, run_no, claim, &rows)?;
    for op in ops {
        if call_seq(op).is_none() {
            op.apply(conn, placed, run_no, claim, &mut tried)?;
        }
    }
    for (seq, json) in tried.0 {
        if let Some(json) = json {
            append_attempts(conn, run_no, claim, seq, &json)?;
        }
    }
    Ok(())
}

/// Inserts call rows, `CALL_CHUNK` to a statement and the rest one each.
fn insert_rows(
    conn: &Connection,
    placed: &spans::Placed,
    run_no: i64,
    claim: &Claim,
    rows: &[(&CallRecord, Option<String>)],
) -> Result<(), LedgerError> {
    let mut chunks = rows.chunks_exact(CALL_CHUNK);
    for chunk in &mut chunks {
        insert_calls(conn, placed, run_no, claim, chunk)?;
    }
    for row in chunks.remainder() {
        insert_calls(conn, placed, run_no, claim, std::slice::from_ref(row))?;
    }
    Ok(())
}

/// The attempts among a commit's writes, as one JSON array per call, each
/// taken once by the write that stores it. A commit of buffered reads holds
/// hundreds of calls and their attempts, so neither grouping nor lookup
/// searches the whole list: the attempts are sorted by sequence number.
struct Tried(Vec<(u64, Option<String>)>);

impl Tried {
    fn of(ops: &[WriteOp], fence: i64) -> Self {
        let mut tried: Vec<&AttemptRecord> = ops
            .iter()
            .filter_map(|op| match op {
                WriteOp::Attempt(a) => Some(a),
                _ => None,
            })
            .collect();
        // Stable: each call's attempts stay in the order they were made.
        tried.sort_by_key(|a| a.seq);
        Tried(
            tried
                .chunk_by(|a, b| a.seq == b.seq)
                .map(|list| (list[0].seq, Some(attempts::to_json(list, fence))))
                .collect(),
        )
    }

    fn take(&mut self, seq: u64) -> Option<String> {
        let at = self.0.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        self.0[at].1.take()
    }
}

/// One INSERT of call rows, each with its attempts (a JSON array) if any:
/// one row (a `started` write, the rest of a chunk) or `CALL_CHUNK` of them.
fn insert_calls(
    conn: &Connection,
    placed: &spans::Placed,
    run_no: i64,
    claim: &Claim,
    calls: &[(&CallRecord, Option<String>)],
) -> Result<(), LedgerError> {
    static ONE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CHUNK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    debug_assert!(calls.len() == 1 || calls.len() == CALL_CHUNK);
    // A chunk's rows take consecutive rowids: in one span only if their
    // sequence numbers are consecutive too (a run records its calls in
    // order, so they are); otherwise each is placed on its own.
    if calls.windows(2).any(|w| w[1].0.seq != w[0].0.seq + 1) {
        for row in calls {
            insert_calls(conn, placed, run_no, claim, std::slice::from_ref(row))?;
        }
        return Ok(());
    }
    let sql = if calls.len() == CALL_CHUNK {
        &CHUNK
    } else {
        &ONE
    }
    .get_or_init(|| {
        let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
        format!(
            "INSERT INTO calls (id, key, class, interface, function, operation_id, \
             request, request_hash, state, outcome, started_at, finished_at, writer_fence, \
             chain, attempts) VALUES {}",
            vec![row; calls.len()].join(", ")
        )
    });
    let mut stmt = conn.prepare_cached(sql)?;
    let first = call_key(&claim.run_id, run_no, calls[0].0.seq)?;
    let placement = placed.place(conn, &claim.run_id, run_no, first, calls.len())?;
    let first_id = placement.id;
    let mut n = 0;
    for (at, (call, attempts)) in calls.iter().enumerate() {
        let values: [&dyn rusqlite::ToSql; 15] = [
            &(first_id + at as i64),
            &call_key(&claim.run_id, run_no, call.seq)?,
            &call.class.as_str(),
            &call.interface,
            &call.function,
            &call.operation_id,
            &call.request,
            &call.request_hash,
            &call.state.as_str(),
            &call.outcome,
            &call.started_at_ms,
            &call.finished_at_ms,
            &claim.fence,
            &call.chain,
            attempts,
        ];
        for value in values {
            n += 1;
            stmt.raw_bind_parameter(n, value)?;
        }
    }
    stmt.raw_execute()?;
    placed.inserted(placement);
    Ok(())
}

/// Records the outcome of a `started` (or `unknown`) call, with the
/// attempts that led to it: at rowid `id` if the connection knows it (see
/// [`spans::Placed`]), else found by its key.
#[allow(clippy::too_many_arguments)]
fn update_outcome(
    conn: &Connection,
    id: Option<i64>,
    key: i64,
    claim: &Claim,
    seq: u64,
    state: CallState,
    outcome: &Option<String>,
    now_ms: i64,
    chain: &Option<String>,
    attempts: Option<&str>,
) -> Result<(), LedgerError> {
    static BY_KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static BY_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let update = |at: &str| {
        format!(
            "UPDATE calls SET state = ?1, outcome = ?2, finished_at = ?3, writer_fence = ?4, \
             chain = ?6, attempts = {} \
             WHERE {at} AND state IN ('started', 'unknown')",
            attempts::append_sql(7),
        )
    };
    let values = params![
        state.as_str(),
        outcome,
        now_ms,
        claim.fence,
        key,
        chain,
        attempts
    ];
    // The row at a known rowid must still have the call's key; if it does
    // not, or the call is not awaiting an outcome, the call is looked up
    // by its key, as if the rowid were not known.
    if let Some(id) = id {
        let sql = BY_ID.get_or_init(|| update("id = ?8 AND key = ?5"));
        let mut stmt = conn.prepare_cached(sql)?;
        for (at, value) in values.iter().enumerate() {
            stmt.raw_bind_parameter(at + 1, value)?;
        }
        stmt.raw_bind_parameter(8, id)?;
        if stmt.raw_execute()? == 1 {
            return Ok(());
        }
    }
    let sql = BY_KEY.get_or_init(|| update(&spans::call_at_key(5)));
    let changed = conn.prepare_cached(sql)?.execute(values)?;
    if changed != 1 {
        return Err(LedgerError::Corrupt(format!(
            "run {}: call #{seq} is not awaiting an outcome",
            claim.run_id
        )));
    }
    Ok(())
}

/// Appends attempts (a JSON array) to a recorded call's.
fn append_attempts(
    conn: &Connection,
    run_no: i64,
    claim: &Claim,
    seq: u64,
    json: &str,
) -> Result<(), LedgerError> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "UPDATE calls SET attempts = {} WHERE {}",
            attempts::append_sql(2),
            spans::call_at_key(1)
        )
    });
    let changed = conn
        .prepare_cached(sql)?
        .execute(params![call_key(&claim.run_id, run_no, seq)?, json])?;
    if changed != 1 {
        return Err(LedgerError::Corrupt(format!(
            "run {}: an attempt names call #{seq}, which is not recorded",
            claim.run_id
        )));
    }
    Ok(())
}

impl Ledger for SqliteLedger {
    fn put_module(&mut self, digest: &str, bytes: &[u8]) -> Result<(), LedgerError> {
        let stored = self
            .conn
            .prepare_cached("SELECT 1 FROM modules WHERE digest = ?1")?
            .query_row([digest], |_| Ok(()))
            .optional()?;
        if stored.is_some() {
            return Ok(());
        }
        self.set_sync(Sync::Normal)?;
        self.conn.execute(
            "INSERT INTO modules (digest, bytes, size, created_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (digest) DO NOTHING",
            params![digest, bytes, bytes.len() as i64, crate::clock::now_ms()],
        )?;
        Ok(())
    }

    fn module(&self, digest: &str) -> Result<Vec<u8>, LedgerError> {
        self.conn
            .prepare_cached("SELECT bytes FROM modules WHERE digest = ?1")?
            .query_row([digest], |r| r.get(0))
            .optional()?
            .ok_or_else(|| LedgerError::UnknownModule(digest.to_string()))
    }

    fn create_run(&mut self, run: NewRun<'_>) -> Result<RunRecord, LedgerError> {
        self.set_sync(Sync::when(run.durable))?;
        let tx = WriteTx::begin(&self.conn)?;
        let record = match existing_run(&tx, &run)? {
            Some(found) => found,
            None => insert_run(&tx, &run, None)?,
        };
        tx.commit()?;
        Ok(record)
    }

    fn create_claimed(
        &mut self,
        run: NewRun<'_>,
        owner: &str,
        lease_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(RunRecord, Option<Claim>), LedgerError> {
        self.set_sync(Sync::when(run.durable))?;
        let tx = WriteTx::begin(&self.conn)?;
        if let Some(found) = existing_run(&tx, &run)? {
            tx.commit()?;
            if found.status.is_final() {
                return Ok((found, None));
            }
            let claim = self.claim(&found.run_id, owner, lease_ms, run.now_ms, owner_alive)?;
            return Ok((found, Some(claim)));
        }
        let claim = Claim::first(run.run_id, owner, lease_ms, run.now_ms);
        let record = insert_run(&tx, &run, Some(&claim))?;
        tx.commit()?;
        Ok((record, Some(claim)))
    }

    fn run(&self, run_id: &str) -> Result<RunRecord, LedgerError> {
        self.conn
            .prepare_cached(SELECT_RUN)?
            .query_row([run_id], run_from_row)
            .optional()?
            .ok_or_else(|| LedgerError::UnknownRun(run_id.to_string()))
    }

    fn runs(&self, status: Option<RunStatus>) -> Result<Vec<RunRecord>, LedgerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE ?1 IS NULL OR status = ?1 \
             ORDER BY created_at, run_id"
        ))?;
        let rows = stmt.query_map([status.map(RunStatus::as_str)], run_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn claim(
        &mut self,
        run_id: &str,
        owner: &str,
        lease_ms: i64,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<Claim, LedgerError> {
        self.claim_if(run_id, owner, lease_ms, now_ms, owner_alive, false)
    }

    fn release(&mut self, claim: &Claim) -> Result<(), LedgerError> {
        self.set_sync(Sync::Normal)?;
        self.conn
            .prepare_cached(
                "UPDATE runs SET owner = NULL, lease_until = NULL \
                 WHERE run_id = ?1 AND fence = ?2",
            )?
            .execute(params![claim.run_id, claim.fence])?;
        Ok(())
    }

    fn renew(&mut self, claim: &Claim, now_ms: i64) -> Result<(), LedgerError> {
        self.set_sync(Sync::Normal)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let changed = tx
            .prepare_cached(
                "UPDATE runs SET lease_until = ?3 WHERE run_id = ?1 AND fence = ?2 AND owner = ?4",
            )?
            .execute(params![
                claim.run_id,
                claim.fence,
                now_ms + claim.lease_ms,
                claim.owner
            ])?;
        if changed == 0 {
            let newest: i64 = tx
                .query_row(
                    "SELECT fence FROM runs WHERE run_id = ?1",
                    [&claim.run_id],
                    |r| r.get(0),
                )
                .optional()?
                .ok_or_else(|| LedgerError::UnknownRun(claim.run_id.clone()))?;
            return Err(LedgerError::Fenced {
                run_id: claim.run_id.clone(),
                held: claim.fence,
                newest,
            });
        }
        tx.commit()?;
        Ok(())
    }

    fn runnable(&self, now_ms: i64, limit: usize) -> Result<Vec<RunRecord>, LedgerError> {
        // Runs nobody holds first (pending, released, expired, due), oldest
        // first; then runs under a live lease, whose owner may have died.
        // Each kind is read from an index, at most `limit` of it, so that a
        // backlog of pending or waiting runs is not read and sorted whole
        // at every look. Pending and waiting runs have no owner (only a
        // claim sets one, and makes the run `running`).
        let mut stmt = self.conn.prepare_cached(runnable_sql())?;
        let rows = stmt.query_map(params![now_ms, limit as i64], run_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn calls(&self, run_id: &str) -> Result<Vec<CallRecord>, LedgerError> {
        self.calls_upto(run_id, self.last_seq(run_id)?)
    }

    /// A history of `STREAM_CALLS_MIN` calls or more is read by
    /// `STREAM_READERS` threads, each on a read-only connection of its own,
    /// in chunks of `STREAM_CHUNK` calls taken in turn: the guest replays
    /// the first chunks while the next ones are read. Each chunk is read in
    /// a read transaction of its own: recorded calls never change place,
    /// calls added meanwhile (past the `total` read first) are not read, and
    /// the only call whose row may change meanwhile is the last one (its
    /// outcome, by the run's claimant), which a resume holds the claim of.
    fn history(&self, run_id: &str) -> Result<History, LedgerError> {
        let total = self.last_seq(run_id)?;
        if total < STREAM_CALLS_MIN {
            return Ok(History::loaded(run_id, self.calls_upto(run_id, total)?));
        }
        let mut incoming = Vec::with_capacity(STREAM_READERS);
        let mut spent = Vec::with_capacity(STREAM_READERS);
        for reader in 0..STREAM_READERS {
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
            // Pages already copied into the database file are read through
            // a memory map instead of a read(2) each: a fresh connection's
            // cache is empty, and a long history is thousands of pages.
            conn.pragma_update(None, "mmap_size", HISTORY_MMAP_BYTES)?;
            let (chunks, receiver) = std::sync::mpsc::sync_channel(4);
            let (spent_chunks, freed) = std::sync::mpsc::channel::<Vec<CallRecord>>();
            let id = run_id.to_string();
            std::thread::Builder::new()
                .name("stephost-history".into())
                .spawn(move || {
                    let first = reader * STREAM_CHUNK;
                    let every = STREAM_READERS * STREAM_CHUNK;
                    // A closed channel means the execution stopped reading.
                    // Chunks the execution has let go come back here,
                    // where they were made, and are filled again.
                    let mut returned: Vec<Vec<CallRecord>> = Vec::new();
                    let read = (first..total).step_by(every).try_for_each(|after| {
                        returned.extend(freed.try_iter());
                        let reuse = returned
                            .pop()
                            .unwrap_or_else(|| Vec::with_capacity(STREAM_CHUNK));
                        let upto = (after + STREAM_CHUNK).min(total);
                        let chunk = calls_between(&conn, &id, after, upto, reuse)?;
                        chunks.send(Ok(chunk)).map_err(|_| None)
                    });
                    if let Err(Some(e)) = read {
                        let _ = chunks.send(Err(e));
                    }
                })
                .map_err(|e| {
                    LedgerError::Batch(format!("cannot start reading the history: {e}"))
                })?;
            incoming.push(receiver);
            spent.push(spent_chunks);
        }
        Ok(History::streamed(
            run_id,
            total,
            STREAM_CHUNK,
            incoming,
            spent,
        ))
    }

    fn call_attempts(&self, run_id: &str, seq: u64) -> Result<Vec<AttemptRecord>, LedgerError> {
        let json: Option<String> = self
            .conn
            .prepare_cached(&format!("SELECT attempts FROM calls WHERE {CALL_AT}"))?
            .query_row(params![run_id, seq as i64], |r| r.get(0))
            .optional()?
            .flatten();
        json.map_or(Ok(Vec::new()), |json| attempts::parse(run_id, seq, &json))
    }

    fn attempts(&self, run_id: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        let last = self.last_seq(run_id)?;
        let mut stmt = self.conn.prepare_cached(&spans::calls_between_sql(
            "c.seq, c.attempts",
            "c.attempts IS NOT NULL",
        ))?;
        let mut rows = stmt.query(params![run_id, 0, last as i64])?;
        let mut all = Vec::new();
        while let Some(row) = rows.next()? {
            let seq = row.get::<_, i64>(0)? as u64;
            let json: String = row.get(1)?;
            all.extend(attempts::parse(run_id, seq, &json)?);
        }
        Ok(all)
    }

    fn logs(&self, run_id: &str) -> Result<Vec<LogRecord>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT after_seq, level, message, at FROM logs WHERE run_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([run_id], |r| {
            Ok(LogRecord {
                after_seq: r.get::<_, i64>(0)? as u64,
                level: r.get(1)?,
                message: r.get(2)?,
                at_ms: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn commit(&mut self, claim: &Claim, ops: &[WriteOp]) -> Result<(), LedgerError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.set_sync(Sync::when(ops.iter().any(WriteOp::durable)))?;
        let tx = WriteTx::begin(&self.conn)?;
        self.known.begin(&tx)?;
        apply_commit(&tx, &self.known, claim, ops)?;
        tx.commit()?;
        self.known.committed(&self.conn);
        Ok(())
    }

    fn decide_approval(
        &mut self,
        run_id: &str,
        seq: u64,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.set_sync(Sync::Full)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let refuse = |reason: String| LedgerError::NotDecidable {
            run_id: run_id.to_string(),
            seq,
            reason,
        };
        let call = find_call(&tx, run_id, seq)?
            .ok_or_else(|| refuse("the run has no such call".into()))?;
        if call.interface != crate::imports::approvals::INTERFACE {
            return Err(refuse(format!(
                "it is a {} {} call, not an approval",
                call.interface, call.function
            )));
        }
        if call.state != CallState::Started {
            return Err(refuse(format!(
                "it was already decided ({})",
                call.resolved_by
                    .as_deref()
                    .map(|b| format!("by {b}"))
                    .unwrap_or_else(|| "expired".to_string())
            )));
        }
        let expires = crate::imports::approvals::expires_at_ms(&call);
        if now_ms >= expires {
            return Err(refuse(format!(
                "it expired at {}",
                crate::clock::format_time(expires)
            )));
        }
        settle_by_person(&tx, run_id, call, CallState::Succeeded, outcome, by, now_ms)?;
        tx.execute(
            "INSERT INTO counters (name, value) VALUES ('approvals_decided_total', 1) \
             ON CONFLICT (name) DO UPDATE SET value = value + 1",
            [],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn repin(
        &mut self,
        run_id: &str,
        from: &str,
        to: &str,
        step: Option<&str>,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(), LedgerError> {
        let current = self.run(run_id)?;
        let held = match (&current.owner, current.lease_until_ms) {
            (Some(owner), Some(until)) => until > now_ms && owner_alive(owner),
            _ => false,
        };
        if held {
            return Err(LedgerError::RepinConflict {
                run_id: run_id.to_string(),
            });
        }
        self.set_sync(Sync::Full)?;
        // Compare-and-set on the version read above.
        let changed = self.conn.execute(
            "UPDATE runs SET module_digest = ?1, updated_at = ?2, version = version + 1, \
             step = ?6 WHERE run_id = ?3 AND module_digest = ?4 AND version = ?5 \
             AND status NOT IN ('completed', 'failed')",
            params![to, now_ms, run_id, from, current.version, step],
        )?;
        if changed == 0 {
            return Err(LedgerError::RepinConflict {
                run_id: run_id.to_string(),
            });
        }
        Ok(())
    }

    fn pending_approvals(&self) -> Result<Vec<(RunRecord, CallRecord)>, LedgerError> {
        let mut stmt = self.conn.prepare(
            "SELECT r.run_id, c.seq FROM calls c JOIN runs r ON r.run_no = c.run_no \
             WHERE c.interface = ?1 AND c.state = 'started' \
             AND r.status NOT IN ('completed', 'failed') ORDER BY c.started_at, r.run_id",
        )?;
        let keys: Vec<(String, i64)> = stmt
            .query_map([crate::imports::approvals::INTERFACE], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<Result<_, _>>()?;
        let mut out = Vec::new();
        for (run_id, seq) in keys {
            let run = self.run(&run_id)?;
            let call = self.conn.query_row(
                &format!("SELECT {CALL_COLUMNS} FROM calls WHERE {CALL_AT}"),
                params![run_id, seq],
                call_from_row,
            )?;
            out.push((run, call));
        }
        Ok(out)
    }

    fn resolve_call(
        &mut self,
        run_id: &str,
        seq: u64,
        state: CallState,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.set_sync(Sync::Full)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let call = find_call(&tx, run_id, seq)?.ok_or_else(|| LedgerError::NotUnknown {
            run_id: run_id.to_string(),
            seq,
            state: "not recorded".to_string(),
        })?;
        if call.state != CallState::Unknown {
            return Err(LedgerError::NotUnknown {
                run_id: run_id.to_string(),
                seq,
                state: call.state.as_str().to_string(),
            });
        }
        settle_by_person(&tx, run_id, call, state, outcome, by, now_ms)?;
        tx.commit()?;
        Ok(())
    }

    fn add_counters(&mut self, counters: &crate::journal::Counters) -> Result<(), LedgerError> {
        if counters.is_empty() {
            return Ok(());
        }
        self.set_sync(Sync::Normal)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        add_counters(&tx, counters)?;
        tx.commit()?;
        Ok(())
    }

    fn counters(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, value FROM counters ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_fresh(ledger: &mut SqliteLedger, run_id: &str, owner: &str) -> Claim {
        ledger
            .claim(run_id, owner, 30_000, 1_000, &|_| true)
            .expect("claim")
    }

    fn new_ledger() -> (tempfile::TempDir, SqliteLedger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("l.db")).unwrap();
        (dir, ledger)
    }

    fn seed(ledger: &mut SqliteLedger) {
        ledger.put_module("d1", b"\0asm").unwrap();
        ledger.create_run(NewRun::for_test("r1", "d1", 1)).unwrap();
    }

    /// Run r1 with `n` finished observe calls.
    fn long_run(n: u64) -> (tempfile::TempDir, SqliteLedger) {
        let (dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "me");
        let ops: Vec<WriteOp> = (1..=n).map(|seq| WriteOp::Call(varied_call(seq))).collect();
        ledger.commit(&claim, &ops).unwrap();
        (dir, ledger)
    }

    /// A finished call whose optional fields are set or not, and whose
    /// strings are longer or shorter, in a pattern that does not repeat
    /// from chunk to chunk: a history reader that refills a chunk's records
    /// and kept a field of the call before would show.
    fn varied_call(seq: u64) -> CallRecord {
        let mut call = clock_call(seq);
        call.request = "r".repeat(seq as usize % 37);
        if seq.is_multiple_of(5) {
            call.resolved_by = Some(format!("person {seq}"));
        }
        if seq.is_multiple_of(7) {
            call.state = CallState::Failed;
            call.outcome = Some(format!("{{\"err\":\"{}\"}}", "e".repeat(seq as usize % 11)));
        }
        if seq.is_multiple_of(11) {
            call.finished_at_ms = None;
            call.chain = None;
        }
        call
    }

    /// A finished clock call; its values differ from call to call, so that
    /// a column written into another's place shows.
    fn clock_call(seq: u64) -> CallRecord {
        CallRecord {
            seq,
            class: CallClass::Observe,
            interface: "stephost:step/clock".into(),
            function: "now".into(),
            operation_id: format!("op{seq}"),
            request: String::new(),
            request_hash: format!("h{seq}"),
            state: CallState::Succeeded,
            outcome: Some(format!("{{\"ok\":{seq}}}")),
            started_at_ms: seq as i64,
            finished_at_ms: Some(seq as i64),
            resolved_by: None,
            chain: Some(format!("c{seq}")),
        }
    }

    #[test]
    fn a_call_key_never_reaches_into_another_runs_range() {
        assert_eq!(call_key("r", 1, 1).unwrap(), (1 << 32) + 1);
        assert_eq!(
            call_key("r", 1, super::super::CALLS_PER_RUN_MAX).unwrap(),
            (2 << 32) - 1
        );
        let past = call_key("r", 1, super::super::CALLS_PER_RUN_MAX + 1);
        assert!(
            matches!(past, Err(LedgerError::KeysExhausted { ref run_id, .. }) if run_id == "r"),
            "{past:?}"
        );
        assert!(call_key("r", 1 << 31, 1).is_err());
    }

    /// A new run of module `d1`, created at `created`, put straight into
    /// `status` with an owner and lease and a wake time.
    fn run_in_state(
        ledger: &mut SqliteLedger,
        id: &str,
        created: i64,
        status: &str,
        (owner, lease_until): (Option<&str>, Option<i64>),
        wake_at: Option<i64>,
    ) {
        ledger
            .create_run(NewRun::for_test(id, "d1", created))
            .unwrap();
        ledger
            .conn
            .execute(
                "UPDATE runs SET status = ?2, owner = ?3, lease_until = ?4, wake_at = ?5 \
                 WHERE run_id = ?1",
                params![id, status, owner, lease_until, wake_at],
            )
            .unwrap();
    }

    #[test]
    fn a_workers_claim_takes_only_a_run_that_is_due() {
        // A worker lists runnable runs, then claims them; in between,
        // another worker may have claimed one and left it waiting or
        // parked. `claim_due` refuses such a run, in its compare-and-set
        // too; `claim`, which a resume on request uses, takes it. A
        // running run whose lease lapsed or whose owner's process is gone
        // is due.
        let (_dir, mut ledger) = new_ledger();
        ledger.put_module("d1", b"\0asm").unwrap();
        let now = 1_000;
        // Only w2's process is alive.
        let alive = |owner: &str| owner == "w2";
        // (run, status, owner and lease, wake at, due)
        let runs = [
            ("pending", "pending", (None, None), None, true),
            ("released", "running", (None, None), None, true),
            (
                "expired",
                "running",
                (Some("w2"), Some(now - 1)),
                None,
                true,
            ),
            (
                "owner-gone",
                "running",
                (Some("w3"), Some(now + 1)),
                None,
                true,
            ),
            ("due", "waiting", (None, None), Some(now), true),
            ("later", "waiting", (None, None), Some(now + 1), false),
            ("decision", "waiting", (None, None), None, false),
            ("parked", "parked", (None, None), None, false),
        ];
        for (id, status, held, wake, due) in runs {
            run_in_state(&mut ledger, id, 1, status, held, wake);
            let claimed = ledger.claim_due(id, "w1", 30_000, now, &alive);
            if due {
                let claim = claimed.unwrap_or_else(|e| panic!("{id}: {e}"));
                assert_eq!(claim.fence, 1, "{id}");
                let run = ledger.run(id).unwrap();
                assert_eq!(run.status, RunStatus::Running, "{id}");
                assert_eq!(run.owner.as_deref(), Some("w1"), "{id}");
                continue;
            }
            match claimed {
                Err(LedgerError::NotClaimable { status: s, .. }) => assert_eq!(s, status, "{id}"),
                other => panic!("{id}: claimed though not due: {other:?}"),
            }
            let run = ledger.run(id).unwrap();
            assert_eq!(run.version, 0, "{id}: refused, the run is untouched");
            assert_eq!(run.owner, None, "{id}");
            // The compare-and-set checks it too: a run that began to wait
            // or was parked after the claimant read it keeps its version.
            let (lease, version) = ((now + 30_000, now), run.version);
            assert_eq!(
                claim_row(&ledger.conn, id, "w1", lease, version, true).unwrap(),
                0
            );
            ledger
                .claim(id, "w1", 30_000, now, &|_| true)
                .unwrap_or_else(|e| panic!("{id}: a plain claim: {e}"));
        }
        run_in_state(&mut ledger, "done", 1, "completed", (None, None), None);
        for claimed in [
            ledger.claim_due("done", "w1", 30_000, now, &|_| true),
            ledger.claim("done", "w1", 30_000, now, &|_| true),
        ] {
            assert!(
                matches!(claimed, Err(LedgerError::NotClaimable { .. })),
                "{claimed:?}"
            );
        }
    }

    #[test]
    fn runnable_runs_come_unheld_first_oldest_first_each_kind_from_an_index() {
        let (_dir, mut ledger) = new_ledger();
        ledger.put_module("d1", b"\0asm").unwrap();
        let now = 1_000;
        // (run, created at, status, owner, lease until, wake at)
        let runs = [
            ("pending-new", 10, "pending", None, None, None),
            ("pending-old", 5, "pending", None, None, None),
            ("released", 7, "running", None, None, None),
            ("expired", 3, "running", Some("w1"), Some(now - 1), None),
            ("held", 1, "running", Some("w2"), Some(now + 1), None),
            ("due", 8, "waiting", None, None, Some(now)),
            ("not-due", 2, "waiting", None, None, Some(now + 1)),
            ("done", 4, "completed", None, None, None),
        ];
        for (id, created, status, owner, lease, wake) in runs {
            run_in_state(&mut ledger, id, created, status, (owner, lease), wake);
        }
        let ids = |limit| -> Vec<String> {
            let found = ledger.runnable(now, limit).unwrap();
            found.into_iter().map(|r| r.run_id).collect()
        };
        let all = [
            "expired",
            "pending-old",
            "released",
            "due",
            "pending-new",
            "held",
        ];
        assert_eq!(ids(100), all);
        assert_eq!(ids(2), all[..2]);
        // No kind of run is read whole: each is searched in an index.
        let plan: Vec<String> = ledger
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", runnable_sql()))
            .unwrap()
            .query_map(params![now, 2], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let scans: Vec<&String> = plan.iter().filter(|p| p.starts_with("SCAN runs")).collect();
        assert!(scans.is_empty(), "{plan:?}");
        assert!(plan.iter().any(|p| p.contains("runs_waking")), "{plan:?}");
        // A backlog of pending and of not yet due waiting runs is not read
        // whole: the work of a look stays about that of `limit` runs.
        ledger
            .conn
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
                 INSERT INTO runs (run_id, module_digest, input, status, created_at, updated_at, \
                 version, fence, world, wake_at, run_no) \
                 SELECT 'backlog-' || i, 'd1', '{}', \
                 CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'waiting' END, 100 + i, 100 + i, 1, 0, \
                 'w', CASE WHEN i % 2 = 0 THEN NULL ELSE 1000000 END, 100 + i FROM n",
            )
            .unwrap();
        let mut stmt = ledger.conn.prepare(runnable_sql()).unwrap();
        let found = stmt.query_map(params![now, 8], |_| Ok(())).unwrap().count();
        assert_eq!(found, 8);
        let steps = stmt.get_status(rusqlite::StatementStatus::VmStep);
        assert!(steps < 2000, "{steps} steps to list 8 of 2,000 runs");
        // Nor is the statement prepared again at every look, with its own
        // time and limit.
        let prepared = stmt.get_status(rusqlite::StatementStatus::RePrepare);
        for later in [now + 1, now + 2, now + 3] {
            stmt.query_map(params![later, later - now + 8], |_| Ok(()))
                .unwrap()
                .count();
        }
        let again = stmt.get_status(rusqlite::StatementStatus::RePrepare) - prepared;
        assert_eq!(again, 0, "prepared again for {again} of 3 looks");
    }

    #[test]
    fn runs_committing_in_turn_each_read_back_their_own_calls_in_order() {
        // Calls are stored in the order they were recorded and found
        // through their run's spans (their key checked):
        // interleaved commits of two runs, one of them created after the
        // other's calls, must not mix or reorder them.
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let first = claim_fresh(&mut ledger, "r1", "me");
        ledger
            .commit(&first, &[WriteOp::Call(clock_call(1))])
            .unwrap();
        ledger.create_run(NewRun::for_test("r0", "d1", 2)).unwrap();
        let second = claim_fresh(&mut ledger, "r0", "me");
        for seq in 2..=4 {
            let mut other = clock_call(seq - 1);
            other.outcome = Some(format!("{{\"ok\":\"r0 {seq}\"}}"));
            ledger.commit(&second, &[WriteOp::Call(other)]).unwrap();
            ledger
                .commit(&first, &[WriteOp::Call(clock_call(seq))])
                .unwrap();
        }
        let mine = ledger.calls("r1").unwrap();
        assert_eq!(mine, (1..=4).map(clock_call).collect::<Vec<_>>());
        let theirs = ledger.calls("r0").unwrap();
        let seqs: Vec<u64> = theirs.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(theirs[2].outcome.as_deref(), Some("{\"ok\":\"r0 4\"}"));
        assert_eq!(ledger.last_seq("r0").unwrap(), 3);
        assert_eq!(ledger.last_seq("nobody").unwrap(), 0);
        assert!(ledger.calls("nobody").unwrap().is_empty());
        // Stored as they were committed: the two runs' rows alternate.
        let stored: Vec<(String, i64)> = ledger
            .conn
            .prepare(
                "SELECT r.run_id, c.seq FROM calls c JOIN runs r ON r.run_no = c.run_no \
                 ORDER BY c.id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let order: Vec<(&str, i64)> = stored.iter().map(|(r, s)| (r.as_str(), *s)).collect();
        assert_eq!(
            order,
            [
                ("r1", 1),
                ("r0", 1),
                ("r1", 2),
                ("r0", 2),
                ("r1", 3),
                ("r0", 3),
                ("r1", 4)
            ]
        );
    }

    /// Spans of run `run_no`, as (first seq, first rowid).
    fn spans_of(ledger: &SqliteLedger, run_no: i64) -> Vec<(i64, i64)> {
        ledger
            .conn
            .prepare("SELECT first_seq, first_id FROM call_spans WHERE run_no = ?1 ORDER BY 1")
            .unwrap()
            .query_map([run_no], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_run_writing_alone_keeps_one_span_and_one_whose_calls_alternate_a_span_each() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        ledger.create_run(NewRun::for_test("r2", "d1", 2)).unwrap();
        let one = claim_fresh(&mut ledger, "r1", "me");
        let two = claim_fresh(&mut ledger, "r2", "me");
        for seq in 1..=20 {
            ledger
                .commit(&one, &[WriteOp::Call(clock_call(seq))])
                .unwrap();
        }
        assert_eq!(spans_of(&ledger, 1), [(1, 1)]);
        for seq in 21..=24 {
            ledger
                .commit(&one, &[WriteOp::Call(clock_call(seq))])
                .unwrap();
            ledger
                .commit(&two, &[WriteOp::Call(clock_call(seq - 20))])
                .unwrap();
        }
        // r1's 21st call came after its 20th; each later one after r2's.
        assert_eq!(spans_of(&ledger, 1), [(1, 1), (22, 23), (23, 25), (24, 27)]);
        assert_eq!(spans_of(&ledger, 2), [(1, 22), (2, 24), (3, 26), (4, 28)]);
        assert_eq!(
            ledger.calls("r1").unwrap(),
            (1..=24).map(clock_call).collect::<Vec<_>>()
        );
        assert_eq!(
            ledger.calls("r2").unwrap(),
            (1..=4).map(clock_call).collect::<Vec<_>>()
        );
        assert_eq!(
            (
                ledger.last_seq("r1").unwrap(),
                ledger.last_seq("r2").unwrap()
            ),
            (24, 4)
        );
        for seq in 1..=24 {
            assert_eq!(
                find_call(&ledger.conn, "r1", seq).unwrap(),
                Some(clock_call(seq))
            );
        }
        assert_eq!(find_call(&ledger.conn, "r1", 25).unwrap(), None);
        assert_eq!(find_call(&ledger.conn, "r2", 5).unwrap(), None);
        assert_eq!(find_call(&ledger.conn, "r2", 0).unwrap(), None);
    }

    #[test]
    fn a_missing_call_where_a_runs_last_span_seems_to_end_is_corrupt_not_the_end() {
        // The end of a run's last span is found by probing rowids; a row
        // missing at a probe (here each of several places) must not pass
        // for the end of the run's calls, whose history would then be cut
        // short and written over.
        for missing in [2, 3, 5, 9, 10] {
            let (_dir, mut ledger) = new_ledger();
            seed(&mut ledger);
            ledger.create_run(NewRun::for_test("r2", "d1", 2)).unwrap();
            let one = claim_fresh(&mut ledger, "r1", "me");
            let ops: Vec<WriteOp> = (1..=10).map(|s| WriteOp::Call(clock_call(s))).collect();
            ledger.commit(&one, &ops).unwrap();
            let two = claim_fresh(&mut ledger, "r2", "me");
            ledger
                .commit(&two, &[WriteOp::Call(clock_call(1))])
                .unwrap();
            ledger
                .conn
                .execute(
                    &format!("DELETE FROM calls WHERE {CALL_AT}"),
                    params!["r1", missing],
                )
                .unwrap();
            let err = ledger.calls("r1").unwrap_err();
            assert!(matches!(err, LedgerError::Corrupt(_)), "#{missing}: {err}");
            assert!(ledger.history("r1").is_err(), "#{missing}");
            assert_eq!(ledger.calls("r2").unwrap(), [clock_call(1)]);
        }
    }

    #[test]
    fn an_older_stephost_still_running_cannot_write_a_call_row_after_the_migration() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "me");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(1))])
            .unwrap();
        // As schema v7 and older builds insert a call and record an outcome:
        // each would leave a row no span finds, or write past the spans.
        for sql in [
            "INSERT INTO calls (key, class, interface, function, operation_id, request, \
             request_hash, state, outcome, started_at, finished_at, fence, chain, attempts) \
             VALUES ((1 << 32) + 2, 'read', 'i', 'f', 'op', '{}', 'h', 'started', NULL, 1, \
             NULL, 1, NULL, NULL)",
            "UPDATE calls SET state = 'succeeded', outcome = '{}', finished_at = 2, fence = 1 \
             WHERE key = (1 << 32) + 1",
        ] {
            let err = ledger.conn.execute(sql, []).unwrap_err();
            let missing = err.to_string();
            assert!(
                missing.contains("no such column: fence")
                    || missing.contains("has no column named fence"),
                "{missing}"
            );
        }
        assert_eq!(ledger.calls("r1").unwrap(), [clock_call(1)]);
    }

    #[test]
    fn calls_committed_in_any_interleaving_are_found_read_and_counted_as_recorded() {
        // Three runs commit chunks of 1 to 20 calls in a pseudo-random order
        // (a fixed seed): every call must be found by its sequence number,
        // every range read whole and in order, and every count right.
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let runs = ["r1", "r2", "r3"];
        for run in &runs[1..] {
            ledger.create_run(NewRun::for_test(run, "d1", 2)).unwrap();
        }
        let claims: Vec<Claim> = runs
            .iter()
            .map(|r| claim_fresh(&mut ledger, r, "me"))
            .collect();
        let mut next = [1u64; 3];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for _ in 0..150 {
            let run = random(3) as usize;
            let count = 1 + random(20);
            let ops: Vec<WriteOp> = (next[run]..next[run] + count)
                .map(|seq| WriteOp::Call(clock_call(seq)))
                .collect();
            ledger.commit(&claims[run], &ops).unwrap();
            next[run] += count;
        }
        for (run, id) in runs.iter().enumerate() {
            let last = next[run] - 1;
            assert!(last > 100, "{id}: {last}");
            assert_eq!(ledger.last_seq(id).unwrap() as u64, last, "{id}");
            assert_eq!(
                ledger.calls(id).unwrap(),
                (1..=last).map(clock_call).collect::<Vec<_>>()
            );
            for seq in 1..=last {
                assert_eq!(
                    find_call(&ledger.conn, id, seq).unwrap(),
                    Some(clock_call(seq))
                );
            }
            for _ in 0..50 {
                let after = random(last);
                let upto = after + 1 + random(last - after);
                let read =
                    calls_between(&ledger.conn, id, after as usize, upto as usize, Vec::new())
                        .unwrap();
                let seqs: Vec<u64> = read.iter().map(|c| c.seq).collect();
                assert_eq!(
                    seqs,
                    (after + 1..=upto).collect::<Vec<_>>(),
                    "{id} ({after}, {upto}]"
                );
            }
        }
    }

    #[test]
    fn a_v7_ledger_gets_the_spans_of_its_interleaved_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v7.db");
        {
            let conn = old_ledger_with_two_runs(&path, 7);
            // r1's calls 1-3 alone, then alternating with r2's.
            for (id, run_no, seq) in [
                (1, 1, 1),
                (2, 1, 2),
                (3, 1, 3),
                (4, 2, 1),
                (5, 1, 4),
                (6, 2, 2),
                (7, 1, 5),
                (8, 1, 6),
            ] {
                conn.execute(
                    "INSERT INTO calls (id, key, class, interface, function, operation_id, \
                     request, request_hash, state, outcome, started_at, finished_at, fence) \
                     VALUES (?1, (?2 << 32) + ?3, 'observe', 'i', 'f', 'op', '{}', 'h', \
                     'succeeded', ?3, 1, 2, 1)",
                    params![id, run_no, seq],
                )
                .unwrap();
            }
        }
        let mut ledger = SqliteLedger::open(&path).unwrap();
        assert_eq!(spans_of(&ledger, 1), [(1, 1), (4, 5), (5, 7)]);
        assert_eq!(spans_of(&ledger, 2), [(1, 4), (2, 6)]);
        let outcomes = |ledger: &SqliteLedger, run| -> Vec<(u64, String)> {
            ledger
                .calls(run)
                .unwrap()
                .into_iter()
                .map(|c| (c.seq, c.outcome.unwrap()))
                .collect()
        };
        assert_eq!(
            outcomes(&ledger, "r1"),
            (1..=6).map(|s| (s, s.to_string())).collect::<Vec<_>>()
        );
        assert_eq!(outcomes(&ledger, "r2"), [(1, "1".into()), (2, "2".into())]);
        // The next call of r1 comes right after its last: no new span.
        let claim = claim_fresh(&mut ledger, "r1", "me");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(7))])
            .unwrap();
        assert_eq!(spans_of(&ledger, 1), [(1, 1), (4, 5), (5, 7)]);
        assert_eq!(ledger.last_seq("r1").unwrap(), 7);
    }

    #[test]
    fn a_v8_ledger_gets_its_spans_by_epoch_and_every_call_is_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v8.db");
        // Two runs' calls alternating over 2,100 rows, each call a span of
        // its own: three of v9's migrated epochs (1,024 rowids each).
        let per_run = 1050u64;
        {
            let conn = old_ledger_with_two_runs(&path, 8);
            let tx = conn.unchecked_transaction().unwrap();
            for id in 1..=2 * per_run as i64 {
                let (run_no, seq) = (2 - id % 2, (id + 1) / 2);
                tx.execute(
                    "INSERT INTO calls (id, key, class, interface, function, operation_id, \
                     request, request_hash, state, outcome, started_at, finished_at, \
                     writer_fence) VALUES (?1, (?2 << 32) + ?3, 'observe', 'i', 'f', 'op', \
                     '{}', 'h', 'succeeded', ?3, 1, 2, 1)",
                    params![id, run_no, seq],
                )
                .unwrap();
                tx.execute(
                    "INSERT INTO call_spans (run_no, first_seq, first_id) VALUES (?1, ?2, ?3)",
                    params![run_no, seq, id],
                )
                .unwrap();
            }
            tx.commit().unwrap();
        }
        let mut ledger = SqliteLedger::open(&path).unwrap();
        let epochs: Vec<(i64, i64)> = ledger
            .conn
            .prepare("SELECT first_seq, epoch FROM run_epochs WHERE run_no = 1 ORDER BY 1")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        // r1's calls are at the odd rowids: #512 at 1023, #513 at 1025.
        assert_eq!(epochs, [(1, 0), (513, 1), (1025, 2)]);
        for run in ["r1", "r2"] {
            let outcomes: Vec<String> = ledger
                .calls(run)
                .unwrap()
                .into_iter()
                .map(|c| c.outcome.unwrap())
                .collect();
            assert_eq!(
                outcomes,
                (1..=per_run).map(|s| s.to_string()).collect::<Vec<_>>()
            );
            assert_eq!(ledger.last_seq(run).unwrap(), per_run as usize);
        }
        for seq in [1, 511, 512, 513, 514, 1024, 1025, per_run] {
            let call = find_call(&ledger.conn, "r2", seq).unwrap().unwrap();
            assert_eq!(call.outcome, Some(seq.to_string()));
        }
        // The runs go on in the epochs of this build.
        let claim = claim_fresh(&mut ledger, "r1", "me");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(per_run + 1))])
            .unwrap();
        assert_eq!(ledger.last_seq("r1").unwrap(), per_run as usize + 1);
        assert_eq!(
            ledger.calls("r1").unwrap().last(),
            Some(&clock_call(per_run + 1))
        );
        assert_eq!(
            ledger
                .conn
                .query_row(
                    "SELECT count(*) FROM run_epochs WHERE run_no = 1",
                    [],
                    |r| r.get::<_, i64>(0)
                )
                .unwrap(),
            4
        );
    }

    #[test]
    fn a_v8_ledger_with_a_run_stored_out_of_order_is_refused_not_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v8.db");
        {
            let conn = old_ledger_with_two_runs(&path, 8);
            // r1's call 3 was stored before its call 2.
            for (id, seq) in [(1, 1), (2, 3), (3, 2)] {
                conn.execute(
                    "INSERT INTO calls (id, key, class, interface, function, operation_id, \
                     request, request_hash, state, started_at, writer_fence) \
                     VALUES (?1, (1 << 32) + ?2, 'observe', 'i', 'f', 'op', '{}', 'h', \
                     'succeeded', 1, 1)",
                    params![id, seq],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO call_spans (run_no, first_seq, first_id) VALUES (1, ?1, ?2)",
                    params![seq, id],
                )
                .unwrap();
            }
        }
        let err = SqliteLedger::open(&path)
            .err()
            .expect("the migration is refused");
        assert!(
            matches!(err, LedgerError::Corrupt(ref m) if m.contains("not stored in the order")),
            "{err}"
        );
        let version: i64 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 8);
    }

    #[test]
    fn every_statement_that_finds_calls_reads_their_rows_by_rowid_through_spans() {
        // Calls are stored in the order they were recorded; a statement that
        // found them any other way would read the whole table.
        let (_dir, ledger) = new_ledger();
        let statements = [
            format!("SELECT {CALL_COLUMNS} FROM calls WHERE {CALL_AT}"),
            spans::calls_between_sql(CALL_COLUMNS, "TRUE"),
            format!(
                "UPDATE calls SET outcome = ?3 WHERE {} AND state IN ('started', 'unknown')",
                spans::call_at_key(4)
            ),
            format!("DELETE FROM calls WHERE {CALL_AT}"),
        ];
        for sql in &statements {
            let mut explain = ledger
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            // Planned with its parameters unbound (NULL), as SQLite plans
            // a statement before any value is bound.
            let mut rows = explain.raw_query();
            let mut plan = Vec::new();
            while let Some(row) = rows.next().unwrap() {
                plan.push(row.get::<_, String>(3).unwrap());
            }
            assert!(
                plan.iter().any(|step| step.starts_with("SEARCH c ")
                    || step.starts_with("SEARCH calls ")
                        && step.contains("USING INTEGER PRIMARY KEY")),
                "{sql}: {plan:?}"
            );
            assert!(
                plan.iter().any(
                    |step| step.contains(" s USING PRIMARY KEY (epoch=? AND run_no=?")
                        || step.contains("call_spans USING PRIMARY KEY (epoch=? AND run_no=?")
                ),
                "{sql}: {plan:?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains(" e USING PRIMARY KEY (run_no=?")
                        || step.contains("run_epochs USING PRIMARY KEY (run_no=?")),
                "{sql}: {plan:?}"
            );
            assert!(
                !plan
                    .iter()
                    .any(|step| step.starts_with("SCAN ") || step.starts_with("USE TEMP B-TREE")),
                "{sql}: {plan:?}"
            );
        }
    }

    #[test]
    fn a_commit_that_creates_its_run_records_it_claimed_or_fails_whole_if_it_exists() {
        let (_dir, mut ledger) = new_ledger();
        ledger.put_module("d1", b"\0asm").unwrap();
        let new = NewRun::for_test("r1", "d1", 7);
        let claim = Claim::first("r1", "me", 30_000, 7);
        let create = || WriteOp::Create(Box::new(RunRecord::claimed(&new, &claim)));
        // The run's row comes before its calls and logs, which refer to it.
        let log = WriteOp::Log(LogRecord {
            after_seq: 1,
            level: "info".into(),
            message: "hi".into(),
            at_ms: 8,
        });
        let before = crate::clock::now_ms();
        ledger
            .commit(&claim, &[create(), WriteOp::Call(clock_call(1)), log])
            .unwrap();
        let run = ledger.run("r1").unwrap();
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!((run.fence, run.version), (1, 1));
        assert_eq!(run.owner.as_deref(), Some("me"));
        // The lease runs from the commit, not from the claim's making.
        assert!(run.lease_until_ms.unwrap() >= before + 30_000);
        assert_eq!(ledger.calls("r1").unwrap(), vec![clock_call(1)]);
        assert_eq!(ledger.logs("r1").unwrap().len(), 1);
        // Another process that started the same id: its first commit fails
        // as claimed elsewhere and writes nothing.
        let theirs = Claim::first("r1", "them", 30_000, 9);
        let err = ledger
            .commit(
                &theirs,
                &[
                    WriteOp::Create(Box::new(RunRecord::claimed(&new, &theirs))),
                    WriteOp::Call(clock_call(2)),
                ],
            )
            .unwrap_err();
        assert!(
            matches!(&err, LedgerError::ClaimedElsewhere { owner, .. } if owner == "me"),
            "{err}"
        );
        assert_eq!(ledger.calls("r1").unwrap().len(), 1);
        assert_eq!(ledger.run("r1").unwrap().owner.as_deref(), Some("me"));
    }

    #[test]
    fn attempts_join_their_call_row_whichever_commit_carries_them() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "me");
        let attempt = |n: u32, result: &'static str| {
            WriteOp::Attempt(AttemptRecord {
                seq: 1,
                attempt: n,
                kind: "send".into(),
                started_at_ms: 5,
                finished_at_ms: 6,
                result: result.into(),
                detail: None,
            })
        };
        let mut started = clock_call(1);
        started.class = CallClass::Write;
        started.state = CallState::Started;
        started.outcome = None;
        ledger.commit(&claim, &[WriteOp::Started(started)]).unwrap();
        // Alone (appended to the row), then with the call's outcome.
        ledger.commit(&claim, &[attempt(1, "retryable")]).unwrap();
        ledger
            .commit(
                &claim,
                &[
                    attempt(2, "ok"),
                    WriteOp::Outcome {
                        seq: 1,
                        state: CallState::Succeeded,
                        outcome: Some("{\"ok\":1}".into()),
                        now_ms: 7,
                        chain: Some("c".into()),
                    },
                ],
            )
            .unwrap();
        let results: Vec<String> = ledger
            .attempts("r1")
            .unwrap()
            .into_iter()
            .map(|a| format!("{}:{}", a.attempt, a.result))
            .collect();
        assert_eq!(results, ["1:retryable", "2:ok"]);
        assert_eq!(ledger.calls("r1").unwrap()[0].state, CallState::Succeeded);
        // An attempt for a call the ledger does not hold fails its commit,
        // which writes nothing.
        let mut stray = attempt(1, "ok");
        if let WriteOp::Attempt(a) = &mut stray {
            a.seq = 9;
        }
        let log = WriteOp::Log(LogRecord {
            after_seq: 1,
            level: "info".into(),
            message: "not kept".into(),
            at_ms: 8,
        });
        let err = ledger.commit(&claim, &[log, stray]).unwrap_err();
        assert!(matches!(err, LedgerError::Corrupt(_)), "{err}");
        assert!(ledger.logs("r1").unwrap().is_empty());
    }

    #[test]
    fn a_long_history_streams_the_same_calls_and_a_gap_in_it_is_corrupt() {
        // Enough chunks that each reader gets some back to refill.
        let n = (STREAM_CALLS_MIN + 8 * STREAM_READERS * STREAM_CHUNK + 7) as u64;
        let (_dir, ledger) = long_run(n);
        let mut history = ledger.history("r1").unwrap();
        assert_eq!(history.len() as u64, n);
        let streamed: Vec<CallRecord> = history.all().unwrap().cloned().collect();
        assert!(
            streamed == ledger.calls("r1").unwrap(),
            "streamed calls differ"
        );
        // Consumed in order, calls more than a chunk behind are let go;
        // the one before the last asked for is kept (its chain link is
        // what a live call follows).
        // The readers refill the chunks let go with later calls: each call
        // is still whole and its own.
        let expected = ledger.calls("r1").unwrap();
        let mut history = ledger.history("r1").unwrap();
        assert_eq!(expected.len() as u64, n);
        for (i, call) in expected.iter().enumerate() {
            assert_eq!(history.get(i).unwrap().unwrap(), call);
            if let Some(before) = i.checked_sub(1) {
                assert_eq!(history.arrived(before).unwrap().seq, before as u64 + 1);
            }
        }
        assert!(history.arrived(0).is_none());
        let kept = history.all().unwrap().count();
        assert!(kept <= 2 * STREAM_CHUNK, "{kept} calls kept");
        // A missing row, in a chunk read by either reader, or at the end.
        for missing in [2 * STREAM_CHUNK as u64 + 5, 3 * STREAM_CHUNK as u64, n - 1] {
            let (_dir, ledger) = long_run(n);
            ledger
                .conn
                .execute(
                    &format!("DELETE FROM calls WHERE {CALL_AT}"),
                    params!["r1", missing as i64],
                )
                .unwrap();
            let mut history = ledger.history("r1").unwrap();
            // The chunks before the gap's arrive; the gap's is refused.
            let chunk_start = (missing as usize - 1) / STREAM_CHUNK * STREAM_CHUNK;
            if let Some(before) = chunk_start.checked_sub(1) {
                assert_eq!(history.get(before).unwrap().unwrap().seq, before as u64 + 1);
            }
            let err = history.get(missing as usize - 1).unwrap_err();
            assert!(
                matches!(&err, LedgerError::Corrupt(m) if m.contains(&format!("#{missing} "))),
                "gap at #{missing}: {err}"
            );
        }
    }

    #[test]
    fn a_file_that_is_not_sqlite_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        let text = "these are my notes, not a database\n".repeat(200);
        std::fs::write(&path, &text).unwrap();
        let err = SqliteLedger::open(&path).err().expect("must be refused");
        assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn another_applications_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE customers (id INTEGER PRIMARY KEY);")
            .unwrap();
        drop(conn);
        let err = SqliteLedger::open(&path).err().expect("must be refused");
        assert!(matches!(err, LedgerError::NotALedger { .. }), "{err}");
    }

    #[test]
    fn reopening_a_ledger_keeps_its_rows_and_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        {
            let mut ledger = SqliteLedger::open(&path).unwrap();
            seed(&mut ledger);
        }
        let ledger = open_migrated(&path);
        assert_eq!(ledger.run("r1").unwrap().input, "{}");
    }

    /// Opens the ledger at `path`, which must then be at this build's
    /// schema version.
    fn open_migrated(path: &Path) -> SqliteLedger {
        let ledger = SqliteLedger::open(path).unwrap();
        let version: i64 = ledger
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, schema::current_version());
        ledger
    }

    /// A ledger at schema `version`, as the build that wrote it left it.
    fn old_ledger(path: &Path, version: usize) -> Connection {
        let conn = Connection::open(path).unwrap();
        for sql in &schema::MIGRATIONS[..version] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn
    }

    /// [`old_ledger`] with module `d1` and pending runs `r1` and `r2`,
    /// numbered 1 and 2.
    fn old_ledger_with_two_runs(path: &Path, version: usize) -> Connection {
        let conn = old_ledger(path, version);
        conn.execute_batch(
            "INSERT INTO modules VALUES ('d1', x'0061736d', 4, 1);
             INSERT INTO runs (run_id, module_digest, input, status, created_at,
                 updated_at, version, fence, world, run_no)
             VALUES ('r1', 'd1', '{}', 'pending', 1, 2, 3, 0, 'w', 1),
                    ('r2', 'd1', '{}', 'pending', 1, 2, 3, 0, 'w', 2);",
        )
        .unwrap();
        conn
    }

    #[test]
    fn a_v4_ledger_with_a_call_whose_run_is_missing_is_refused_not_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v4.db");
        let orphan = "INSERT INTO calls (run_id, seq, class, interface, function, \
             operation_id, request, request_hash, state, started_at, fence) \
             VALUES ('ghost', 1, 'read', 'i', 'f', 'op', '{}', 'h', 'started', 1, 1)";
        {
            let conn = old_ledger(&path, 4);
            // Damage: a row that foreign keys would have refused.
            conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
            conn.execute(orphan, []).unwrap();
        }
        let err = SqliteLedger::open(&path)
            .err()
            .expect("the migration is refused");
        assert!(
            matches!(err, LedgerError::Corrupt(ref m) if m.contains("whose run is missing")),
            "{err}"
        );
        let conn = Connection::open(&path).unwrap();
        let (version, calls): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT user_version FROM pragma_user_version), count(*) FROM calls",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((version, calls), (4, 1));
    }

    #[test]
    fn a_v6_ledger_keeps_its_calls_found_by_key_and_stores_new_ones_after_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v6.db");
        {
            let conn = old_ledger_with_two_runs(&path, 6);
            // Two runs whose calls were recorded interleaved; v6 stored
            // them by key, each run's together.
            for (run_no, seq) in [(2, 1), (1, 1), (2, 2), (1, 2), (1, 3)] {
                conn.execute(
                    "INSERT INTO calls (key, class, interface, function, operation_id, request, \
                     request_hash, state, outcome, started_at, finished_at, fence, chain, \
                     attempts) VALUES ((?1 << 32) + ?2, 'write', 'i', 'f', 'op' || ?1 || ?2, \
                     '{}', 'h', 'succeeded', '{\"ok\":' || ?2 || '}', 1, 2, 1, 'c', \
                     '[{\"attempt\":1,\"kind\":\"send\",\"started_at\":1,\"finished_at\":2,\
                     \"result\":\"ok\",\"detail\":null,\"fence\":1}]')",
                    params![run_no, seq],
                )
                .unwrap();
            }
        }
        let mut ledger = open_migrated(&path);
        for (run, count) in [("r1", 3), ("r2", 2)] {
            let calls = ledger.calls(run).unwrap();
            let found: Vec<(u64, String, Option<String>)> = calls
                .iter()
                .map(|c| (c.seq, c.operation_id.clone(), c.outcome.clone()))
                .collect();
            let run_no = &run[1..];
            let expected: Vec<(u64, String, Option<String>)> = (1..=count)
                .map(|seq| {
                    (
                        seq,
                        format!("op{run_no}{seq}"),
                        Some(format!("{{\"ok\":{seq}}}")),
                    )
                })
                .collect();
            assert_eq!(found, expected, "{run}");
            assert_eq!(ledger.call_attempts(run, 1).unwrap().len(), 1);
        }
        // The rows came over in key order; a call recorded now is stored
        // after them, and found by its key.
        let claim = claim_fresh(&mut ledger, "r2", "me");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(3))])
            .unwrap();
        let keys: Vec<i64> = ledger
            .conn
            .prepare("SELECT key FROM calls ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = |run: i64, seq: i64| (run << 32) + seq;
        assert_eq!(
            keys,
            [
                key(1, 1),
                key(1, 2),
                key(1, 3),
                key(2, 1),
                key(2, 2),
                key(2, 3)
            ]
        );
        assert_eq!(ledger.calls("r2").unwrap()[2], clock_call(3));
        // A call already recorded is refused, before and after the
        // migration's rows.
        for seq in [3, 1] {
            let again = ledger.commit(&claim, &[WriteOp::Call(clock_call(seq))]);
            assert!(
                matches!(again, Err(LedgerError::NotAppended { seq: s, .. }) if s == seq),
                "{again:?}"
            );
        }
        assert_eq!(ledger.calls("r2").unwrap().len(), 3);
    }

    #[test]
    fn a_v2_ledger_is_migrated_with_its_rows_checks_and_references() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        {
            let conn = old_ledger(&path, 2);
            conn.execute_batch(
                "INSERT INTO modules VALUES ('d1', x'0061736d', 4, 1);
                 INSERT INTO runs (run_id, module_digest, input, status, output, created_at,
                     updated_at, version, fence, world, exit_code)
                 VALUES ('r1', 'd1', '{}', 'completed', '7', 1, 2, 3, 4, 'w', 0);
                 INSERT INTO calls (run_id, seq, class, interface, function, operation_id,
                     request, request_hash, state, outcome, started_at, finished_at, fence, chain)
                 VALUES ('r1', 1, 'write', 'i', 'f', 'op1', '{}', 'h', 'succeeded',
                     '{\"ok\":1}', 1, 2, 4, 'c1');
                 INSERT INTO attempts VALUES ('r1', 1, 1, 'send', 1, 2, 'ok', NULL, 4);
                 INSERT INTO logs (run_id, after_seq, level, message, at)
                     VALUES ('r1', 1, 'info', 'hello', 2);",
            )
            .unwrap();
        }
        let mut ledger = open_migrated(&path);
        let run = ledger.run("r1").unwrap();
        assert_eq!(
            (run.status, run.output.as_deref(), run.exit_code, run.fence),
            (RunStatus::Completed, Some("7"), Some(0), 4)
        );
        let calls = ledger.calls("r1").unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].operation_id, "op1");
        assert_eq!(calls[0].chain.as_deref(), Some("c1"));
        // v4 moved the attempt into its call's row.
        assert_eq!(
            ledger.attempts("r1").unwrap(),
            vec![AttemptRecord {
                seq: 1,
                attempt: 1,
                kind: "send".into(),
                started_at_ms: 1,
                finished_at_ms: 2,
                result: "ok".into(),
                detail: None,
            }]
        );
        assert_eq!(ledger.logs("r1").unwrap()[0].message, "hello");
        // The rebuilt tables still refuse what they refused before.
        let bad_state = ledger.conn.execute(
            "UPDATE calls SET state = 'maybe' \
             WHERE key = (SELECT (run_no << 32) + 1 FROM runs WHERE run_id = 'r1')",
            [],
        );
        assert!(bad_state.is_err(), "a bad call state was accepted");
        let bad_status = ledger.conn.execute(
            "UPDATE runs SET status = 'sleeping' WHERE run_id = 'r1'",
            [],
        );
        assert!(bad_status.is_err(), "a bad run status was accepted");
        let orphan = ledger.conn.execute(
            "INSERT INTO logs (run_id, after_seq, level, message, at) \
             VALUES ('nobody', 1, 'info', 'orphan', 1)",
            [],
        );
        assert!(orphan.is_err(), "foreign keys are off after the migration");
        // And the ledger works as usual.
        ledger.create_run(NewRun::for_test("r2", "d1", 3)).unwrap();
        let claim = claim_fresh(&mut ledger, "r2", "me");
        assert_eq!(claim.fence, 1);
        assert_eq!(ledger.runs(None).unwrap().len(), 2);
    }

    #[test]
    fn creating_the_same_run_twice_returns_it_and_a_different_one_is_refused() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let again = ledger.create_run(NewRun::for_test("r1", "d1", 5)).unwrap();
        assert_eq!(again.created_at_ms, 1);
        let err = ledger
            .create_run(NewRun {
                input: "{\"x\":1}",
                ..NewRun::for_test("r1", "d1", 5)
            })
            .unwrap_err();
        assert!(matches!(err, LedgerError::RunExists { .. }));
    }

    #[test]
    fn buffered_calls_written_in_chunks_read_back_in_order_and_whole() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "a");
        let observe = clock_call;
        // Two full chunks, a write in between that breaks a run of calls,
        // and a tail shorter than a chunk.
        let mut ops: Vec<WriteOp> = (1..=10).map(|s| WriteOp::Call(observe(s))).collect();
        let mut write = observe(11);
        write.class = CallClass::Write;
        write.state = CallState::Started;
        write.outcome = None;
        write.finished_at_ms = None;
        write.chain = None;
        ops.push(WriteOp::Started(write.clone()));
        ops.extend((12..=23).map(|s| WriteOp::Call(observe(s))));
        ledger.commit(&claim, &ops).unwrap();
        let mut expected: Vec<CallRecord> = (1..=23).map(observe).collect();
        expected[10] = write;
        assert_eq!(ledger.calls("r1").unwrap(), expected);
        // A chunk with a duplicate row fails as a whole, and so does the commit.
        let again: Vec<WriteOp> = (20..=27).map(|s| WriteOp::Call(observe(s))).collect();
        assert!(ledger.commit(&claim, &again).is_err());
        assert_eq!(ledger.calls("r1").unwrap().len(), 23);
    }

    #[test]
    fn a_new_run_is_created_claimed_and_an_existing_one_claimed_as_usual() {
        let (_dir, mut ledger) = new_ledger();
        ledger.put_module("d1", b"\0asm").unwrap();
        let new_run = |now_ms| NewRun::for_test("r1", "d1", now_ms);
        let (run, claim) = ledger
            .create_claimed(new_run(10), "a", 30_000, &|_| true)
            .unwrap();
        let claim = claim.expect("a claim");
        assert_eq!((claim.fence, claim.lease_until_ms), (1, 30_010));
        // What the ledger holds is what was returned, and what a claim of a
        // pending run would have written.
        assert_eq!(ledger.run("r1").unwrap(), run);
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!(
            (run.owner.as_deref(), run.version, run.fence),
            (Some("a"), 1, 1)
        );
        // The same run again, while its owner lives: refused.
        let err = ledger
            .create_claimed(new_run(20), "b", 30_000, &|_| true)
            .unwrap_err();
        assert!(matches!(err, LedgerError::ClaimedElsewhere { .. }), "{err}");
        // Its owner gone: taken over with the next fencing token.
        let (_, taken) = ledger
            .create_claimed(new_run(30), "b", 30_000, &|_| false)
            .unwrap();
        assert_eq!(taken.expect("a claim").fence, 2);
        // Another run under the same id is refused.
        let mut other = new_run(40);
        other.input = "{\"x\":1}";
        let err = ledger
            .create_claimed(other, "b", 30_000, &|_| true)
            .unwrap_err();
        assert!(matches!(err, LedgerError::RunExists { .. }), "{err}");
    }

    /// `err` is `Fenced`: a write with token `held` refused, `newest` the
    /// run's token.
    fn assert_fenced(err: &LedgerError, held: i64, newest: i64) {
        assert!(
            matches!(err, LedgerError::Fenced { held: h, newest: n, .. } if (*h, *n) == (held, newest)),
            "{err}"
        );
    }

    #[test]
    fn what_a_connection_remembers_of_its_writes_is_forgotten_once_anything_else_writes() {
        let (dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let first = claim_fresh(&mut ledger, "r1", "a");
        ledger
            .commit(&first, &[WriteOp::Call(clock_call(1))])
            .unwrap();
        // Another connection takes the run over: the first claim is stale,
        // though this connection read its token a moment ago.
        let mut other = SqliteLedger::open(&dir.path().join("l.db")).unwrap();
        let second = other.claim("r1", "b", 30_000, 2_000, &|_| false).unwrap();
        let err = ledger
            .commit(&first, &[WriteOp::Call(clock_call(2))])
            .unwrap_err();
        assert_fenced(&err, 1, 2);
        ledger
            .commit(&second, &[WriteOp::Call(clock_call(2))])
            .unwrap();
        // This connection takes it over itself, outside a commit.
        let third = ledger.claim("r1", "c", 30_000, 3_000, &|_| false).unwrap();
        let err = ledger
            .commit(&second, &[WriteOp::Call(clock_call(3))])
            .unwrap_err();
        assert_fenced(&err, 2, 3);
        ledger
            .commit(&third, &[WriteOp::Call(clock_call(3))])
            .unwrap();
        // Another connection appends the run's next call: this one, which
        // knew the run's last call as #3, must not record #4 again.
        other
            .commit(&third, &[WriteOp::Call(clock_call(4))])
            .unwrap();
        let err = ledger
            .commit(&third, &[WriteOp::Call(clock_call(4))])
            .unwrap_err();
        assert!(
            matches!(err, LedgerError::NotAppended { seq: 4, .. }),
            "{err}"
        );
        ledger
            .commit(&third, &[WriteOp::Call(clock_call(5))])
            .unwrap();
        assert_eq!(
            ledger.calls("r1").unwrap(),
            (1..=5).map(clock_call).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_connection_keeps_what_it_knows_across_its_own_commits_only() {
        let (dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "a");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(1))])
            .unwrap();
        let forgotten = ledger.known.forgotten();
        for seq in 2..=4 {
            ledger
                .commit(&claim, &[WriteOp::Call(clock_call(seq))])
                .unwrap();
        }
        assert_eq!(ledger.known.forgotten(), forgotten, "its own commits");
        // Another connection's commit is seen at the next transaction.
        let mut other = SqliteLedger::open(&dir.path().join("l.db")).unwrap();
        other
            .commit(&claim, &[WriteOp::Call(clock_call(5))])
            .unwrap();
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(6))])
            .unwrap();
        assert_eq!(ledger.known.forgotten(), forgotten + 1, "another's commit");
        ledger
            .commit(&claim, &[WriteOp::Call(clock_call(7))])
            .unwrap();
        assert_eq!(ledger.known.forgotten(), forgotten + 1);
        assert_eq!(
            ledger.calls("r1").unwrap(),
            (1..=7).map(clock_call).collect::<Vec<_>>()
        );
    }

    /// A ledger with runs r1, r2 and r3, each claimed.
    fn three_claimed_runs() -> (tempfile::TempDir, SqliteLedger, [Claim; 3]) {
        let (dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        ledger.create_run(NewRun::for_test("r2", "d1", 2)).unwrap();
        ledger.create_run(NewRun::for_test("r3", "d1", 3)).unwrap();
        let claims = ["r1", "r2", "r3"].map(|run| claim_fresh(&mut ledger, run, "me"));
        (dir, ledger, claims)
    }

    /// An outcome for call `seq`, which a run never made.
    fn outcome_of_a_call_never_made(seq: u64) -> WriteOp {
        WriteOp::Outcome {
            seq,
            state: CallState::Succeeded,
            outcome: Some("{}".into()),
            now_ms: 1,
            chain: None,
        }
    }

    /// The calls table holds `rows` rows, at rowids 1 to `rows`.
    fn assert_dense(ledger: &SqliteLedger, rows: i64) {
        let found: (i64, i64) = ledger
            .conn
            .query_row("SELECT count(*), max(id) FROM calls", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(found, (rows, rows), "rowids are dense");
    }

    #[test]
    fn outcomes_land_on_their_calls_rows_whether_or_not_the_connection_remembers_them() {
        // Three runs (more than the tests' connection remembers: see
        // `RUNS_KNOWN_MAX`) each record ten calls in one commit (a chunk of
        // eight and two), then their outcomes, run after run.
        let (_dir, mut ledger, claims) = three_claimed_runs();
        let started = |seq: u64| {
            let mut call = clock_call(seq);
            call.state = CallState::Started;
            call.outcome = None;
            call.finished_at_ms = None;
            call.chain = None;
            WriteOp::Call(call)
        };
        for claim in &claims {
            let ops: Vec<WriteOp> = (1..=10).map(started).collect();
            ledger.commit(claim, &ops).unwrap();
        }
        for seq in 1..=10 {
            for claim in &claims {
                let outcome = WriteOp::Outcome {
                    seq,
                    state: CallState::Succeeded,
                    outcome: Some(format!("{{\"ok\":{seq}}}")),
                    now_ms: seq as i64,
                    chain: Some(format!("c{seq}")),
                };
                ledger.commit(claim, &[outcome]).unwrap();
            }
        }
        for run in ["r1", "r2", "r3"] {
            assert_eq!(
                ledger.calls(run).unwrap(),
                (1..=10).map(clock_call).collect::<Vec<_>>()
            );
        }
        // A commit that fails after its call's row was placed (an outcome
        // for a call never made) is undone whole: the next one takes the
        // same rowid, as nothing it remembered of the undone one is kept.
        let failing = [started(11), outcome_of_a_call_never_made(15)];
        assert!(ledger.commit(&claims[0], &failing).is_err());
        ledger.commit(&claims[0], &[started(11)]).unwrap();
        assert_eq!(ledger.last_seq("r1").unwrap(), 11);
        assert_dense(&ledger, 31);
    }

    #[test]
    fn a_batch_undone_and_applied_again_job_by_job_leaves_no_gap_among_its_rows() {
        let (_dir, mut ledger, [one, two, three]) = three_claimed_runs();
        // r2's job records its call, then fails (an outcome for a call it
        // never made): the batch is undone and applied again, each job in a
        // savepoint, and r2's undone row must not leave a hole in the table.
        let failing = [
            WriteOp::Call(clock_call(1)),
            outcome_of_a_call_never_made(5),
        ];
        let calls = |seq: u64| [WriteOp::Call(clock_call(seq))];
        let (c1, c3, c4) = (calls(1), calls(1), calls(2));
        let batch: [(&Claim, &[WriteOp]); 4] =
            [(&one, &c1), (&two, &failing), (&three, &c3), (&one, &c4)];
        let (results, _) = ledger.apply_batch(&batch, &mut FailedExecutions::default());
        let failed: Vec<bool> = results.iter().map(Result::is_err).collect();
        assert_eq!(failed, [false, true, false, false]);
        ledger.commit(&three, &calls(2)).unwrap();
        assert_eq!(
            ledger.calls("r1").unwrap(),
            (1..=2).map(clock_call).collect::<Vec<_>>()
        );
        assert!(ledger.calls("r2").unwrap().is_empty());
        assert_eq!(
            ledger.calls("r3").unwrap(),
            (1..=2).map(clock_call).collect::<Vec<_>>()
        );
        assert_dense(&ledger, 4);
    }

    #[test]
    fn a_stale_fencing_token_writes_nothing() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let old = claim_fresh(&mut ledger, "r1", "a");
        // The first owner is considered dead, so b takes over.
        let new = ledger.claim("r1", "b", 30_000, 2_000, &|_| false).unwrap();
        assert_eq!(new.fence, old.fence + 1);
        let call = CallRecord {
            seq: 1,
            class: CallClass::Write,
            interface: "i".into(),
            function: "f".into(),
            operation_id: "op".into(),
            request: "{}".into(),
            request_hash: "h".into(),
            state: CallState::Started,
            outcome: None,
            started_at_ms: 3,
            finished_at_ms: None,
            resolved_by: None,
            chain: None,
        };
        let err = ledger.record_started(&old, &call).unwrap_err();
        assert_fenced(&err, 1, 2);
        assert!(ledger.calls("r1").unwrap().is_empty());
        ledger.record_started(&new, &call).unwrap();
        assert_eq!(ledger.calls("r1").unwrap(), vec![call]);
    }

    #[test]
    fn a_persons_decision_supersedes_a_concurrent_execution() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        let claim = claim_fresh(&mut ledger, "r1", "a");
        let call = CallRecord {
            seq: 1,
            class: CallClass::Write,
            interface: "i".into(),
            function: "f".into(),
            operation_id: "op".into(),
            request: "{}".into(),
            request_hash: "h".into(),
            state: CallState::Unknown,
            outcome: None,
            started_at_ms: 3,
            finished_at_ms: None,
            resolved_by: None,
            chain: None,
        };
        ledger.record_started(&claim, &call).unwrap();
        ledger
            .resolve_call(
                "r1",
                1,
                CallState::Succeeded,
                "{\"ok\":\"{}\"}",
                "alice",
                10,
            )
            .unwrap();
        // The execution that was running cannot record a stale end.
        let end = RunEnd::Parked {
            error: "unknown".into(),
        };
        let err = ledger.finish_run(&claim, &end, 11).unwrap_err();
        assert!(matches!(err, LedgerError::Fenced { .. }), "{err}");
        let run = ledger.run("r1").unwrap();
        assert_eq!(run.status, RunStatus::Running);
        assert!(run.owner.is_none());
        let resolved = &ledger.calls("r1").unwrap()[0];
        assert_eq!(resolved.resolved_by.as_deref(), Some("alice"));
        assert!(resolved.chain.is_some());
    }

    #[test]
    fn a_call_number_past_32_bits_names_no_call_of_another_run() {
        // Run r1 is number 1, r2 number 2: call #2^32 + 1 of r1 has the
        // key of r2's call #1, which must stay out of reach.
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        ledger.create_run(NewRun::for_test("r2", "d1", 2)).unwrap();
        let claim = claim_fresh(&mut ledger, "r2", "a");
        let call = CallRecord {
            state: CallState::Unknown,
            outcome: None,
            finished_at_ms: None,
            chain: None,
            ..clock_call(1)
        };
        ledger.record_started(&claim, &call).unwrap();
        for seq in [(1 << 32) + 1, u64::MAX, 0] {
            let err = ledger
                .resolve_call("r1", seq, CallState::Succeeded, "{\"ok\":1}", "alice", 10)
                .unwrap_err();
            assert!(
                matches!(err, LedgerError::NotUnknown { ref state, .. } if state == "not recorded"),
                "{err}"
            );
            assert!(ledger.call_attempts("r1", seq).unwrap().is_empty());
        }
        let theirs = &ledger.calls("r2").unwrap()[0];
        assert_eq!(
            (theirs.state, theirs.resolved_by.as_deref()),
            (CallState::Unknown, None)
        );
        assert!(ledger.calls("r1").unwrap().is_empty());
    }

    #[test]
    fn a_live_lease_of_another_owner_refuses_the_claim() {
        let (_dir, mut ledger) = new_ledger();
        seed(&mut ledger);
        claim_fresh(&mut ledger, "r1", "a");
        let err = ledger
            .claim("r1", "b", 30_000, 2_000, &|_| true)
            .unwrap_err();
        assert!(matches!(err, LedgerError::ClaimedElsewhere { .. }), "{err}");
        // Once the lease has expired the claim succeeds.
        let claim = ledger.claim("r1", "b", 30_000, 40_000, &|_| true).unwrap();
        assert_eq!(claim.fence, 2);
    }
}

//! Figures 8–10: the ledger on PostgreSQL, each beside PostgreSQL's own
//! floor on the same server in the same run. The server is a throwaway
//! cluster the bench starts in its folder (on the disk it measures), or the
//! one `STEPHOST_BENCH_POSTGRES` names (a URL whose user may create
//! schemas; each figure gets a schema of its own).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use stephost_core::lifecycle::{self, ClaimMode};
use stephost_core::store::Opener;
use stephost_core::store::PoolOptions;
use stephost_ledger::Ledger;
use stephost_ledger_postgres::throwaway::Cluster;
use stephost_runtime::runner::Host;

use crate::report::{self, Row};
use crate::{Args, Bench, Res, WHAT, mean_us, median_by, now_ns, progress, us, wait_completed};

/// The environment variable naming a server to measure instead of a
/// throwaway cluster.
pub const SERVER_VAR: &str = "STEPHOST_BENCH_POSTGRES";

/// Commits before a floor is measured, and commits measured.
const FLOOR_WARMUP: usize = 300;
const FLOOR_COMMITS: usize = 500;
/// Figure 8: runs of this many writes between its floors.
const PG_WRITE_RUNS: usize = 3;
const PG_WRITE_RUN_WRITES: u64 = 500;
/// Figure 9: runs, their writes, and the worker processes sharing them.
const PG_GROUP_RUNS: usize = 64;
const PG_GROUP_WRITES: u64 = 200;
const PG_GROUP_WORKERS: usize = 2;
/// How far ahead of their submission figure 9's runs are told to start:
/// time for two worker processes to start, claim and start 64 runs.
const PG_GROUP_LEAD: Duration = Duration::from_millis(3000);
/// Figure 10: pending runs, and claims measured among them.
const PG_PENDING: i64 = 100_000;
const PG_CLAIMS: usize = 300;

/// Figure 14 on PostgreSQL: children of one parent, and worker processes.
const PG_CHILDREN: u64 = 1_000;
const PG_CHILDREN_WORKERS: usize = 4;

/// The server the figures run on.
struct Server {
    url: String,
    _cluster: Option<Cluster>,
    next: u32,
}

impl Server {
    fn start(bench: &Bench) -> Res<Server> {
        if let Ok(url) = std::env::var(SERVER_VAR)
            && !url.is_empty()
        {
            return Ok(Server {
                url,
                _cluster: None,
                next: 0,
            });
        }
        let cluster = Cluster::start_in(&bench.dir)?;
        Ok(Server {
            url: cluster.url(),
            _cluster: Some(cluster),
            next: 0,
        })
    }

    /// A URL of a new, empty schema.
    fn fresh(&mut self) -> Res<String> {
        self.next += 1;
        let schema = format!("bench_{}_{}", std::process::id(), self.next);
        psql(&self.url, &format!("CREATE SCHEMA {schema}"))?;
        let separator = if self.url.contains('?') { '&' } else { '?' };
        Ok(format!(
            "{}{separator}options=-c%20search_path%3D{schema}",
            self.url
        ))
    }
}

fn psql(url: &str, sql: &str) -> Res<String> {
    let out = Command::new("psql")
        .arg(url)
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()?;
    if !out.status.success() {
        return Err(format!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A client of the server's own, for floors, driven on a runtime of its
/// own.
struct Raw {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Raw {
    fn connect(url: &str) -> Res<Raw> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok::<_, tokio_postgres::Error>(client)
        })?;
        Ok(Raw { runtime, client })
    }

    /// PostgreSQL's floor: mean µs of a single-row `INSERT` committed on
    /// its own (`synchronous_commit = on`: its WAL flushed), prepared once.
    fn insert_floor(&self) -> Res<f64> {
        self.runtime.block_on(async {
            self.client
                .batch_execute(
                    "DROP TABLE IF EXISTS floor; \
                     CREATE TABLE floor (id bigserial PRIMARY KEY, v text NOT NULL)",
                )
                .await?;
            let insert = self
                .client
                .prepare("INSERT INTO floor (v) VALUES ($1)")
                .await?;
            for i in 0..FLOOR_WARMUP {
                self.client.execute(&insert, &[&format!("row {i}")]).await?;
            }
            let t = Instant::now();
            for i in 0..FLOOR_COMMITS {
                self.client.execute(&insert, &[&format!("row {i}")]).await?;
            }
            Ok(us(t.elapsed()) / FLOOR_COMMITS as f64)
        })
    }

    /// Mean µs of one primary-key lookup of a run (as a claim reads a run's
    /// row), over `ids`.
    fn lookup_floor(&self, ids: &[String]) -> Res<f64> {
        self.runtime.block_on(async {
            let lookup = self
                .client
                .prepare(
                    "SELECT run_id, module_digest, input, status, output, error, created_at, \
                     updated_at, version, owner, lease_until, fence, wake_at, world, step, \
                     exit_code FROM runs WHERE run_id = $1",
                )
                .await?;
            for id in ids.iter().take(50) {
                self.client.query_one(&lookup, &[id]).await?;
            }
            let t = Instant::now();
            for id in ids {
                self.client.query_one(&lookup, &[id]).await?;
            }
            Ok(us(t.elapsed()) / ids.len() as f64)
        })
    }
}

impl Bench {
    fn pg_host(&self, url: &str, options: PoolOptions) -> Res<Host> {
        let pool = Ledger::parse(url)?.open(options)?;
        Ok(Host::open(pool, self.options())?)
    }

    /// Figures 8 to 10, on a server of their own.
    pub(crate) fn postgres(&mut self, args: &Args) -> Res<()> {
        let mut server = match Server::start(self) {
            Ok(server) => server,
            Err(e) => {
                self.note(format!(
                    "8-10 (PostgreSQL) not measured: no server ({e}); install PostgreSQL or \
                     name one in {SERVER_VAR}"
                ));
                return Ok(());
            }
        };
        let (single_us, floor_us) = self.pg_write_effect(&mut server)?;
        if args.wants(9) {
            self.pg_two_workers(&mut server, args, single_us)?;
            let url = server.fresh()?;
            let mut host = self.pg_host(&url, PoolOptions::default())?;
            self.users_start(report::PG_USERS_START, &Ledger::parse(&url)?, &mut host)?;
        }
        if args.wants(11) {
            let url = server.fresh()?;
            self.pg_submit_to_end(args, &url, floor_us)?;
        }
        if args.wants(10) {
            self.pg_claim(&mut server)?;
        }
        if args.wants(14) {
            self.pg_children(&mut server, args)?;
        }
        Ok(())
    }

    /// Figure 14 on PostgreSQL: a parent of `PG_CHILDREN` children of one
    /// write each, joined, run by `PG_CHILDREN_WORKERS` `stephost worker`
    /// processes sharing the database.
    fn pg_children(&mut self, server: &mut Server, args: &Args) -> Res<()> {
        let Some(cli) = args.cli_path() else {
            self.note(
                "14 PostgreSQL not measured: no `stephost` binary (build it, or give --cli)".into(),
            );
            return Ok(());
        };
        let url = server.fresh()?;
        let mut host = self.pg_host(&url, PoolOptions::default())?;
        let step = self.dir.join("pg-children-step.wasm");
        std::fs::write(&step, &self.module)?;
        let config = self.dir.join("pg-children.toml");
        std::fs::write(
            &config,
            format!(
                "{}\n[steps.bench]\nmodule = {}\n",
                crate::config_text(&self.gate),
                serde_json::Value::String(step.display().to_string())
            ),
        )?;
        let cache = self.dir.join("pg-children-cache");
        let worker = || -> Res<std::process::Child> {
            Ok(Command::new(&cli)
                .env("STEPHOST_LEDGER", &url)
                .env("STEPHOST_CONFIG", &config)
                .env("STEPHOST_CACHE_DIR", &cache)
                .args(["worker", "--concurrency", "32"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?)
        };
        // The workers' component cache, warmed by one run first.
        let warmed = host.submit(&self.module, WHAT, r#"{"mode":"none"}"#, Some("warm"))?;
        let mut warm = worker()?;
        let ready = wait_completed(&host, &[warmed.run_id]);
        let _ = Command::new("kill")
            .args(["-TERM", &warm.id().to_string()])
            .status();
        warm.wait()?;
        ready?;
        progress(&format!(
            "14 PostgreSQL: a parent of {PG_CHILDREN} children, {PG_CHILDREN_WORKERS} worker processes"
        ));
        let input = json!({"mode": "children", "count": PG_CHILDREN}).to_string();
        let parent = host.submit(&self.module, WHAT, &input, Some("parent"))?;
        let t = Instant::now();
        let mut workers = (0..PG_CHILDREN_WORKERS)
            .map(|_| worker())
            .collect::<Res<Vec<_>>>()?;
        let ended = wait_completed(&host, std::slice::from_ref(&parent.run_id));
        let took = t.elapsed().as_secs_f64();
        for w in &mut workers {
            let _ = Command::new("kill")
                .args(["-TERM", &w.id().to_string()])
                .status();
            w.wait()?;
        }
        ended?;
        self.rows.push(Row::new(
            &format!(
                "14 PostgreSQL: {PG_CHILDREN} children of 1 write, joined, {PG_CHILDREN_WORKERS} workers"
            ),
            took * 1e3,
            "ms",
        ));
        self.note(format!(
            "14 PostgreSQL: a parent step starts {PG_CHILDREN} child runs of one `noop.write` \
             each and joins them; {PG_CHILDREN_WORKERS} `stephost worker --concurrency 32` \
             processes on the same database run the parent and the children; from the workers' \
             start to the parent's end: {:.0} ms ({:.0} children/s)",
            took * 1e3,
            PG_CHILDREN as f64 / took
        ));
        Ok(())
    }

    /// Figure 8: as figure 1, on PostgreSQL, beside its floor.
    fn pg_write_effect(&mut self, server: &mut Server) -> Res<(f64, f64)> {
        let url = server.fresh()?;
        let raw = Raw::connect(&url)?;
        let mut host = self.pg_host(&url, PoolOptions::default())?;
        self.run(&mut host, json!({"mode": "none"}))?;
        self.run(&mut host, json!({"mode": "write", "count": 500}))?;
        let none_us = mean_us(&self.repeat(&mut host, json!({"mode": "none"}), 20)?);
        let before = raw.insert_floor()?;
        progress(&format!(
            "8 PostgreSQL write effect: {PG_WRITE_RUNS} runs of {PG_WRITE_RUN_WRITES} writes \
             (floor before: {before:.0} µs)"
        ));
        let input = json!({"mode": "write", "count": PG_WRITE_RUN_WRITES});
        let per_write: Vec<f64> = self
            .repeat(&mut host, input, PG_WRITE_RUNS)?
            .into_iter()
            .map(|took| (us(took) - none_us) / PG_WRITE_RUN_WRITES as f64)
            .collect();
        let after = raw.insert_floor()?;
        let floor = (before + after) / 2.0;
        self.rows.push(Row::new(
            "floor (PostgreSQL, around 8: mean of before, after)",
            floor,
            "µs/commit",
        ));
        let median = median_by(per_write.clone(), |v| *v);
        self.rows
            .push(Row::new(report::PG_WRITE_EFFECT, median, "µs/write").over_floor(floor));
        self.note(format!(
            "8: as 1, on PostgreSQL (a throwaway cluster in the bench's folder unless \
             {SERVER_VAR} names a server; fsync on): {PG_WRITE_RUNS} runs of \
             {PG_WRITE_RUN_WRITES} writes between two floors (a single-row INSERT committed on \
             its own, synchronous_commit on, prepared once; {FLOOR_COMMITS} after \
             {FLOOR_WARMUP}): {before:.0} µs before, {after:.0} µs after; a run's µs per write = \
             (its wall time - a `none` run's, {none_us:.0} µs) / {PG_WRITE_RUN_WRITES}: {}; the \
             median shown",
            per_write
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok((median, floor))
    }

    /// Figure 9: 64 runs started together, executed by two `stephost
    /// worker` processes sharing the database.
    fn pg_two_workers(&mut self, server: &mut Server, args: &Args, single_us: f64) -> Res<()> {
        let Some(cli) = args.cli_path() else {
            self.note("9 not measured: no `stephost` binary (build it, or give --cli)".into());
            return Ok(());
        };
        let url = server.fresh()?;
        let mut host = self.pg_host(&url, PoolOptions::default())?;
        let config = self.dir.join("pg-bench.toml");
        std::fs::write(&config, crate::config_text(&self.gate))?;
        // The workers' compiled-component cache, warmed by one run first.
        let cache = self.dir.join("pg-cache");
        let worker = |exit_when_idle: bool| -> Res<std::process::Child> {
            let mut command = Command::new(&cli);
            command
                .env("STEPHOST_LEDGER", &url)
                .env("STEPHOST_CONFIG", &config)
                .env("STEPHOST_CACHE_DIR", &cache)
                .args(["worker", "--concurrency", "32", "--lease-ms", "30000"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if exit_when_idle {
                command.arg("--exit-when-idle");
            }
            Ok(command.spawn()?)
        };
        host.submit(&self.module, WHAT, r#"{"mode":"none"}"#, None)?;
        let status = worker(true)?.wait()?;
        if !status.success() {
            return Err(format!("9: the warming worker exited with {status}").into());
        }
        let start_at = now_ns() + PG_GROUP_LEAD.as_nanos() as u64;
        let input = json!({
            "mode": "write",
            "count": PG_GROUP_WRITES,
            "stamps": true,
            "start_at_ns": start_at,
        })
        .to_string();
        progress(&format!(
            "9 PostgreSQL: {PG_GROUP_RUNS} runs of {PG_GROUP_WRITES} writes, \
             {PG_GROUP_WORKERS} worker processes"
        ));
        let ids = (0..PG_GROUP_RUNS)
            .map(|_| Ok(host.submit(&self.module, WHAT, &input, None)?.run_id))
            .collect::<Res<Vec<_>>>()?;
        // The runs sleep past 2 s, so each becomes a durable timer and
        // leaves memory: a worker that exits when idle could leave before
        // they wake. The workers run until every run has completed, then
        // are told to stop.
        let mut workers = (0..PG_GROUP_WORKERS)
            .map(|_| worker(false))
            .collect::<Res<Vec<_>>>()?;
        let ended = wait_completed(&host, &ids);
        for w in &mut workers {
            let _ = Command::new("kill")
                .args(["-TERM", &w.id().to_string()])
                .status();
            let status = w.wait()?;
            if !status.success() {
                return Err(format!("9: a worker exited with {status}").into());
            }
        }
        ended?;
        let mut first_ns = u64::MAX;
        let mut last_ms = 0i64;
        let mut late = 0;
        for id in &ids {
            let run = host.store().run(id)?;
            let output: serde_json::Value =
                serde_json::from_str(run.output.as_deref().ok_or("9: a run has no output")?)?;
            let first = output["first_ns"].as_u64().ok_or("9: no first_ns")?;
            if output["arrived_ns"].as_u64().unwrap_or(0) > start_at + 50_000_000 {
                late += 1;
            }
            first_ns = first_ns.min(first);
            last_ms = last_ms.max(run.updated_at_ms);
        }
        let window_s = ((last_ms as f64) * 1e6 - first_ns as f64).max(1e6) / 1e9;
        let rate = (PG_GROUP_RUNS as u64 * PG_GROUP_WRITES) as f64 / window_s;
        let single = 1e6 / single_us;
        self.rows.push(
            Row::new(report::PG_TWO_WORKERS, rate, "writes/s").with_ratio(rate / single, single_us),
        );
        self.note(format!(
            "9: {PG_GROUP_RUNS} runs of {PG_GROUP_WRITES} writes submitted, told to start \
             together {} ms later, executed by {PG_GROUP_WORKERS} `stephost worker \
             --concurrency 32` processes on the same database (their component cache warmed \
             by a worker run before); writes/s over the window from the earliest of the runs' \
             clock reads before their writes to the last run's end: {rate:.0} writes/s in \
             {:.0} ms ({late} runs arrived more than 50 ms late); ratio = that rate / figure \
             8's single-run rate ({single:.0} writes/s)",
            PG_GROUP_LEAD.as_millis(),
            window_s * 1e3
        ));
        Ok(())
    }

    /// Figure 10: claiming the next due run among 100,000 pending ones.
    fn pg_claim(&mut self, server: &mut Server) -> Res<()> {
        let url = server.fresh()?;
        let mut host = self.pg_host(&url, PoolOptions::default())?;
        let seed = host
            .submit(&self.module, WHAT, r#"{"mode":"none"}"#, None)?
            .run_id;
        progress(&format!(
            "10 PostgreSQL: {PG_PENDING} pending runs, {PG_CLAIMS} claims"
        ));
        // Copies of a submitted run, each due a millisecond after the last.
        psql(
            &url,
            &format!(
                "INSERT INTO runs (run_id, module_digest, input, status, output, error, \
                 created_at, updated_at, version, owner, lease_until, fence, wake_at, due_at, \
                 world, step, exit_code) SELECT 'pending-' || g, module_digest, input, status, \
                 output, error, created_at + g, updated_at, version, owner, lease_until, fence, \
                 wake_at, due_at + g, world, step, exit_code FROM runs, \
                 generate_series(1, {PG_PENDING}) g WHERE run_id = '{seed}'; ANALYZE runs"
            ),
        )?;
        let store = host.store();
        let owner = "bench-claimer";
        let mut times = Vec::with_capacity(PG_CLAIMS);
        for _ in 0..PG_CLAIMS {
            let t = Instant::now();
            let now = stephost_core::clock::now_ms();
            let listed = store.due_runs(8)?;
            let run = listed
                .iter()
                .find(|r| {
                    lifecycle::check_claimable(r, owner, now, ClaimMode::Due, &|_| true).is_ok()
                })
                .ok_or("10: no claimable run listed")?;
            lifecycle::claim_read(store, run, owner, 600_000, now, ClaimMode::Due, &|_| true)?;
            times.push(t.elapsed());
        }
        let claim = mean_us(&times);
        let ids: Vec<String> = (1..=PG_CLAIMS as i64 * 2)
            .map(|i| format!("pending-{}", i * (PG_PENDING / (PG_CLAIMS as i64 * 2))))
            .collect();
        let lookup = Raw::connect(&url)?.lookup_floor(&ids)?;
        self.rows.push(Row::new(
            "floor (PostgreSQL, 10: a primary-key lookup)",
            lookup,
            "µs/lookup",
        ));
        self.rows
            .push(Row::new(report::PG_CLAIM, claim, "µs/claim").over_floor(lookup));
        self.note(format!(
            "10: {PG_PENDING} pending runs (copies of a submitted one, each due 1 ms after the \
             last); a claim = listing the 8 earliest due runs through the store and claiming \
             the first claimable one (compare-and-set on its version), as a worker does: mean \
             of {PG_CLAIMS}, {claim:.0} µs; the floor, one primary-key lookup of a run's row \
             on a client of the bench's own (prepared, mean of {}): {lookup:.0} µs",
            ids.len()
        ));
        Ok(())
    }
}

//! Figure 11: `stephost serve` on an SQLite ledger, measured over HTTP on
//! 127.0.0.1 as a client sees it: how fast runs are submitted through the
//! API (the server's worker executing them meanwhile), how long the
//! console's page of a long run takes (its row and log, then its first 200
//! calls), for a run of 10,000 calls, and how long a run takes from its
//! submission to its end (also with the server on PostgreSQL).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::report::{self, Row};
use crate::{Args, Bench, Res, config_text, progress};

/// Runs submitted, by this many clients at once.
const SUBMITS: usize = 1_000;
const SUBMIT_CLIENTS: usize = 4;
/// The long run's calls, and the times its page is loaded.
const TIMELINE_CALLS: u64 = 10_000;
const TIMELINE_LOADS: usize = 200;
/// Calls on the console's first page of a run.
const PAGE_CALLS: usize = 200;
/// One-write runs submitted one at a time, timed to their end.
const ENDS: usize = 200;

/// Where submit → completed is measured: its rows' tag, the p50 row (which
/// has a target) and what that target allows above a floor, in ms.
struct Ends {
    tag: &'static str,
    p50: &'static str,
    allowance_ms: f64,
}

const SQLITE_ENDS: &Ends = &Ends {
    tag: "11",
    p50: report::SUBMIT_WAIT_P50,
    allowance_ms: 5.0,
};

const PG_ENDS: &Ends = &Ends {
    tag: "11 PostgreSQL",
    p50: report::PG_SUBMIT_WAIT_P50,
    allowance_ms: 10.0,
};

struct Served {
    child: Child,
    base: String,
    agent: ureq::Agent,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Stores `module` on the server: its digest.
    fn upload(&self, module: &[u8]) -> Res<String> {
        let stored = self.json("POST", "/api/modules", Some(module.to_vec()))?;
        Ok(stored["module_digest"]
            .as_str()
            .ok_or("no digest")?
            .to_string())
    }

    fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Res<(u16, String)> {
        let builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        let mut response = match body {
            Some(bytes) => self.agent.run(
                builder
                    .header("Content-Type", "application/json")
                    .body(bytes)?,
            )?,
            None => self.agent.run(builder.body(())?)?,
        };
        let status = response.status().as_u16();
        Ok((status, response.body_mut().read_to_string()?))
    }

    fn json(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Res<Value> {
        let (status, text) = self.request(method, path, body)?;
        if !(200..300).contains(&status) {
            return Err(format!("{method} {path}: HTTP {status}: {text}").into());
        }
        Ok(serde_json::from_str(&text)?)
    }
}

/// The 50th and 99th percentiles of `ms`.
fn p50_p99(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
    (at(0.50), at(0.99))
}

/// Runs of figure 15, one at a time.
const PROMISES: usize = 200;

/// The operator's key figure 15's server signs with: the bench derives the
/// promises' tokens under it, as the server does.
const PROMISE_KEY: &str = "the bench's operator key, 32 bytes or more";

impl Bench {
    /// `stephost serve` (concurrency 4) on `ledger`, its configuration and
    /// cache in `dir`, on a port of its own on 127.0.0.1.
    fn serve(&self, cli: &std::path::Path, dir: &std::path::Path, ledger: &str) -> Res<Served> {
        self.serve_with(cli, dir, ledger, None)
    }

    /// [`Bench::serve`], signing with `key` if given.
    fn serve_with(
        &self,
        cli: &std::path::Path,
        dir: &std::path::Path,
        ledger: &str,
        key: Option<&str>,
    ) -> Res<Served> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("stephost.toml"), config_text(&self.gate))?;
        let mut command = Command::new(cli);
        command
            .arg("--config")
            .arg(dir.join("stephost.toml"))
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(["serve", "--listen", "127.0.0.1:0", "--concurrency", "4"])
            .env("STEPHOST_LEDGER", ledger)
            .env_remove("STEPHOST_DB")
            .env_remove("STEPHOST_API_TOKENS")
            .env_remove("STEPHOST_API_TOKENS_FILE")
            .env_remove("STEPHOST_CHAIN_KEY_FILE")
            .env_remove("STEPHOST_CHAIN_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(key) = key {
            command.env("STEPHOST_CHAIN_KEY", key);
        }
        let mut child = command.spawn()?;
        let mut lines = BufReader::new(child.stderr.take().ok_or("no stderr")?).lines();
        let addr = loop {
            let line = lines
                .next()
                .ok_or("stephost serve stopped before it listened")??;
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split('/').next().unwrap_or_default().to_string();
            }
        };
        // Keep reading what the server prints, so it never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Ok(Served {
            child,
            base: format!("http://{addr}"),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(120)))
                .build()
                .into(),
        })
    }

    /// Figure 11's submit → completed on PostgreSQL: `stephost serve` on
    /// `url`, beside PostgreSQL's commit floor `floor_us`.
    pub(crate) fn pg_submit_to_end(&mut self, args: &Args, url: &str, floor_us: f64) -> Res<()> {
        let Some(cli) = args.cli_path() else {
            return Ok(());
        };
        let served = self.serve(&cli, &self.dir.join("serve-pg"), url)?;
        let digest = served.upload(&self.module)?;
        self.submit_to_end(&served, &digest, PG_ENDS, floor_us)
    }

    /// Submit → run completed, for one-write runs one at a time once the
    /// server is idle: answered by `POST /api/runs?wait`, and submitted
    /// plainly then read until completed (every 0.2 ms), beside a floor.
    fn submit_to_end(&mut self, served: &Served, digest: &str, ends: &Ends, floor: f64) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(300);
        for status in ["pending", "running"] {
            while !served.json("GET", &format!("/api/runs?status={status}&limit=1"), None)?["runs"]
                .as_array()
                .is_none_or(Vec::is_empty)
            {
                if Instant::now() > deadline {
                    return Err(
                        format!("{}: the submitted runs did not end in 300 s", ends.tag).into(),
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let tag = ends.tag;
        progress(&format!(
            "{tag}: {ENDS} one-write runs, each submitted and timed to its end"
        ));
        let body = |id: String| {
            json!({"module_digest": digest, "run_id": id,
                   "input": {"mode": "write", "count": 1}})
            .to_string()
            .into_bytes()
        };
        let (mut waited, mut polled) = (Vec::new(), Vec::new());
        for i in 0..ENDS {
            let t = Instant::now();
            let id = format!("e{i}");
            let mut run = served.json("POST", "/api/runs?wait=10000", Some(body(id.clone())))?;
            // A server without `wait` (another build, in an A/B) answers
            // at once: the run is read until it ends, as for the others.
            while matches!(run["status"].as_str(), Some("pending" | "running")) {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(format!("{tag}: run {id} did not complete in 10 s").into());
                }
                std::thread::sleep(Duration::from_micros(200));
                run = served.json("GET", &format!("/api/runs/{id}"), None)?["run"].clone();
            }
            waited.push(t.elapsed().as_secs_f64() * 1e3);
            if run["status"] != "completed" {
                return Err(format!("{tag}: a run waited for ended {}", run["status"]).into());
            }
            let id = format!("p{i}");
            let t = Instant::now();
            served.json("POST", "/api/runs", Some(body(id.clone())))?;
            while served.json("GET", &format!("/api/runs/{id}"), None)?["run"]["status"]
                != "completed"
            {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(format!("{tag}: run {id} did not complete in 10 s").into());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            polled.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (w50, w99) = p50_p99(waited);
        let (p50, p99) = p50_p99(polled);
        progress(&format!(
            "{tag}: ?wait p50 {w50:.2} ms, p99 {w99:.2} ms; submitted then read p50 \
             {p50:.2} ms, p99 {p99:.2} ms (floor {floor:.0} µs)"
        ));
        let allowed_ms = ends.allowance_ms + floor / 1e3;
        self.rows
            .push(Row::new(ends.p50, w50, "ms").with_ratio(w50 / allowed_ms, floor));
        for (what, value) in [
            ("POST /api/runs?wait, one write, p99", w99),
            ("submit, then read until completed, p50", p50),
            ("submit, then read until completed, p99", p99),
        ] {
            self.rows
                .push(Row::new(&format!("{tag} {what}"), value, "ms"));
        }
        self.note(format!(
            "{tag} submit → completed: {ENDS} runs of one write, one at a time on an idle \
             server (its worker's poll: the default, 5,000 ms), each answered by POST \
             /api/runs?wait=10000 (the round trip; read until completed if the server answers \
             before), and {ENDS} more each submitted by POST /api/runs and read by GET \
             /api/runs/ID every 0.2 ms until completed; p50 and p99; the ?wait p50's ratio is \
             over {} ms plus the floor ({floor:.0} µs)",
            ends.allowance_ms
        ));
        Ok(())
    }

    /// Figure 15: a promise's completion (`POST /api/promises/TOKEN`) to the
    /// end of its run, whose next calls are one write and its end, one run
    /// at a time on an idle server, beside a floor.
    pub(crate) fn promises(&mut self, args: &Args) -> Res<()> {
        let Some(cli) = args.cli_path() else {
            self.note(
                "15: skipped, no `stephost` binary (build it: cargo build -p stephost)".into(),
            );
            return Ok(());
        };
        let dir = self.dir.join("serve-promises");
        let ledger = format!("sqlite:{}", dir.join("ledger.db").display());
        let served = self.serve_with(&cli, &dir, &ledger, Some(PROMISE_KEY))?;
        let digest = served.upload(&self.module)?;
        let signer = stephost_core::chain::Signer::keyed(PROMISE_KEY.as_bytes())?;
        progress(&format!(
            "15: {PROMISES} runs waiting for a promise, each completed and timed to its end"
        ));
        let mut ended = Vec::with_capacity(PROMISES);
        for i in 0..PROMISES {
            let id = format!("w{i}");
            let body = json!({"module_digest": digest, "run_id": id, "input": {"mode": "promise"}});
            let run = served.json(
                "POST",
                "/api/runs?wait=10000",
                Some(body.to_string().into_bytes()),
            )?;
            if run["status"] != "waiting" {
                return Err(format!("15: run {id} is {}, not waiting", run["status"]).into());
            }
            let token = stephost_core::promises::token(&signer, &id, 1).ok_or("no key")?;
            let t = Instant::now();
            served.json(
                "POST",
                &format!("/api/promises/{token}"),
                Some(b"{\"resolve\": 1}".to_vec()),
            )?;
            while served.json("GET", &format!("/api/runs/{id}"), None)?["run"]["status"]
                != "completed"
            {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(format!("15: run {id} did not complete in 10 s").into());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            ended.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (p50, p99) = p50_p99(ended);
        let floor = self.floor("15")?;
        progress(&format!(
            "15: promise completed → run ended p50 {p50:.2} ms, p99 {p99:.2} ms (floor {floor:.0} µs)"
        ));
        let allowed_ms = 5.0 + floor / 1e3;
        self.rows
            .push(Row::new(report::PROMISE_P50, p50, "ms").with_ratio(p50 / allowed_ms, floor));
        self.rows.push(Row::new(
            "15 promise completed → the run's next call and end, p99",
            p99,
            "ms",
        ));
        self.note(format!(
            "15: `stephost serve` (SQLite, --concurrency 4, an operator key) on 127.0.0.1: \
             {PROMISES} runs, one at a time, each submitted with POST /api/runs?wait (answered \
             once it waits for its promise), then completed by POST /api/promises/TOKEN (no \
             bearer token) and read by GET /api/runs/ID every 0.2 ms until completed: the \
             completion's commit, the worker's wake-up and claim, the replay of the promise's \
             two calls, one write (fsync'd) and the end; p50 and p99; the p50's ratio is over 5 \
             ms plus the floor ({floor:.0} µs)"
        ));
        Ok(())
    }

    pub(crate) fn server(&mut self, args: &Args) -> Res<()> {
        let Some(cli) = args.cli_path() else {
            self.note(
                "11: skipped, no `stephost` binary (build it: cargo build -p stephost)".into(),
            );
            return Ok(());
        };
        let dir = self.dir.join("serve");
        let ledger = format!("sqlite:{}", dir.join("ledger.db").display());
        let served = self.serve(&cli, &dir, &ledger)?;
        let digest = served.upload(&self.module)?;

        // The console's page of a run of 10,000 calls.
        progress("11: recording a run of 10,000 calls through the server");
        let long = json!({"module_digest": digest, "run_id": "long",
                          "input": {"mode": "observe", "count": TIMELINE_CALLS}});
        served.json("POST", "/api/runs", Some(long.to_string().into_bytes()))?;
        let deadline = Instant::now() + Duration::from_secs(300);
        while served.json("GET", "/api/runs/long", None)?["run"]["status"] != "completed" {
            if Instant::now() > deadline {
                return Err("11: the run of 10,000 calls did not complete in 300 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut loads = Vec::with_capacity(TIMELINE_LOADS);
        for _ in 0..TIMELINE_LOADS {
            let t = Instant::now();
            served.json("GET", "/api/runs/long", None)?;
            let page = served.json(
                "GET",
                &format!("/api/runs/long/calls?from_seq=1&limit={PAGE_CALLS}"),
                None,
            )?;
            loads.push(t.elapsed().as_secs_f64() * 1e3);
            if page["calls"].as_array().map_or(0, Vec::len) != PAGE_CALLS {
                return Err("11: the timeline page did not hold 200 calls".into());
            }
        }
        loads.sort_by(f64::total_cmp);
        let at = |q: f64| loads[((loads.len() as f64 * q) as usize).min(loads.len() - 1)];
        let (p50, p99) = (at(0.50), at(0.99));
        progress(&format!(
            "11: timeline page p50 {p50:.1} ms, p99 {p99:.1} ms"
        ));
        self.rows.push(Row::new(report::TIMELINE_P50, p50, "ms"));
        self.rows.push(Row::new(
            "11 timeline page, 10,000-call run, p99",
            p99,
            "ms",
        ));

        // Submissions over the API, several clients at once.
        progress("11: submitting 1,000 runs over the API");
        let body = |i: usize| {
            json!({"module_digest": digest, "run_id": format!("s{i}"), "input": {"mode": "none"}})
                .to_string()
                .into_bytes()
        };
        let t = Instant::now();
        let failed = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..SUBMIT_CLIENTS)
                .map(|c| {
                    let served = &served;
                    scope.spawn(move || {
                        (c..SUBMITS)
                            .step_by(SUBMIT_CLIENTS)
                            .filter(|&i| {
                                !matches!(
                                    served.request("POST", "/api/runs", Some(body(i))),
                                    Ok((201, _))
                                )
                            })
                            .count()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(SUBMITS))
                .sum::<usize>()
        });
        let rate = SUBMITS as f64 / t.elapsed().as_secs_f64();
        if failed > 0 {
            return Err(format!("11: {failed} of {SUBMITS} submissions failed").into());
        }
        progress(&format!("11: {rate:.0} submissions/s"));
        self.rows
            .push(Row::new("11 API submit, 4 clients", rate, "runs/s"));
        let floor = self.floor("11")?;
        self.submit_to_end(&served, &digest, SQLITE_ENDS, floor)?;
        self.note(format!(
            "11: `stephost serve` (SQLite, --concurrency 4) on 127.0.0.1; submissions: {SUBMITS} \
             POST /api/runs of a stored module by {SUBMIT_CLIENTS} clients at once, each one \
             durable (fsync'd) before its answer, the server's worker executing them meanwhile; \
             timeline page: GET /api/runs/ID then GET /api/runs/ID/calls?limit={PAGE_CALLS} of a \
             run of {TIMELINE_CALLS} calls, {TIMELINE_LOADS} times, p50 and p99"
        ));
        Ok(())
    }
}

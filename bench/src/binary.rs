//! Figures 1 and 5 through the `stephost` binary, as users start it: a
//! write through `stephost run` (a process per run: it opens the ledger,
//! loads the step from the compiled-component cache, runs, closes), and 64
//! runs submitted with `stephost submit` and taken by one `stephost worker
//! --concurrency 64 --exit-when-idle`, over the process's whole life.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::floor::floor_us;
use crate::report::{self, Row};
use crate::{Bench, GROUP_RUNS, Res, USERS_WRITES, config_text, median_by, progress, us};

/// Writes of each `stephost run` of the write figure.
const RUN_WRITES: u64 = 2_000;
/// Rounds of the write figure (a run of none and one of `RUN_WRITES`).
const RUN_ROUNDS: usize = 3;

/// `stephost` with the bench's configuration, a ledger and a cache of its
/// own, and no `STEPHOST_*` of the caller's environment.
struct Binary {
    cli: PathBuf,
    dir: PathBuf,
}

impl Binary {
    /// Runs `stephost ARGS`; its wall time and stderr. Fails unless it
    /// exits 0.
    fn run(&self, args: &[&str]) -> Res<(Duration, String)> {
        let t = Instant::now();
        let out = Command::new(&self.cli)
            .current_dir(&self.dir)
            .env_remove("STEPHOST_DB")
            .env_remove("STEPHOST_LEDGER")
            .env_remove("STEPHOST_LOG_FORMAT")
            .env("STEPHOST_CONFIG", self.dir.join("stephost.toml"))
            .env("STEPHOST_CACHE_DIR", self.dir.join("cache"))
            .arg("--db")
            .arg(self.dir.join("ledger.db"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()?;
        let took = t.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(format!(
                "stephost {} failed ({}): {stderr}",
                args.join(" "),
                out.status
            )
            .into());
        }
        Ok((took, stderr))
    }
}

/// The counts a worker reports on exit: `N commits in T transactions and F
/// fsyncs`.
fn commit_counts(stderr: &str) -> Option<(u64, u64, u64)> {
    let at = stderr.find(" commits in ")?;
    let start = stderr[..at].rfind(|c: char| !c.is_ascii_digit())? + 1;
    let words: Vec<&str> = stderr[start..].split_whitespace().take(8).collect();
    match words.as_slice() {
        [
            c,
            "commits",
            "in",
            t,
            "transactions",
            "and",
            f,
            "fsyncs",
            ..,
        ] => Some((c.parse().ok()?, t.parse().ok()?, f.parse().ok()?)),
        _ => None,
    }
}

impl Bench {
    /// Figure 1 (`write`) and figure 5 as users start runs (`users`)
    /// through the binary `cli`.
    pub(crate) fn through_binary(
        &mut self,
        cli: &Path,
        guest: &Path,
        write: bool,
        users: bool,
    ) -> Res<()> {
        let dir = self.dir.join("binary");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("stephost.toml"),
            config_text(&self.dir.join("gate")),
        )?;
        // Absolute: the processes run in the figure's folder.
        let binary = Binary {
            cli: std::fs::canonicalize(cli)?,
            dir,
        };
        let guest = std::fs::canonicalize(guest)?.display().to_string();
        let input = |count: u64| format!(r#"{{"mode":"write","count":{count}}}"#);
        // The component compiled into the cache, the ledger made.
        binary.run(&["run", &guest, "--input", r#"{"mode":"none"}"#])?;
        if write {
            progress(&format!(
                "1 through `stephost run`: {RUN_ROUNDS} rounds of a run of 0 writes and one of {RUN_WRITES}"
            ));
            let before = floor_us(&self.dir, "before 1 binary")?;
            let per_write = (0..RUN_ROUNDS)
                .map(|_| -> Res<f64> {
                    let (none, _) = binary.run(&["run", &guest, "--input", &input(0)])?;
                    let (writes, _) =
                        binary.run(&["run", &guest, "--input", &input(RUN_WRITES)])?;
                    Ok((us(writes) - us(none)) / RUN_WRITES as f64)
                })
                .collect::<Res<Vec<_>>>()?;
            let after = floor_us(&self.dir, "after 1 binary")?;
            self.push_floor("around 1 binary", before, after);
            let floor = (before + after) / 2.0;
            let median = median_by(per_write.clone(), |v| *v);
            self.rows
                .push(Row::new(report::WRITE_EFFECT_BINARY, median, "µs/write").over_floor(floor));
            self.note(format!(
                "1 through `stephost run`: {RUN_ROUNDS} rounds of two processes `{} run \
                 bench_guest.wasm`, one of 0 writes and one of {RUN_WRITES} (the component in \
                 the compiled-component cache, the ledger made before); µs a write = the \
                 difference of their wall times / {RUN_WRITES}: {} µs; the median shown, over \
                 the mean of a floor just before ({before:.0} µs) and one just after \
                 ({after:.0} µs). Each process opens the ledger and closes it: its WAL starts \
                 empty and grows with the run",
                cli.display(),
                per_write
                    .iter()
                    .map(|v| format!("{v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if users {
            progress(&format!(
                "5 through `stephost worker`: {GROUP_RUNS} runs of {USERS_WRITES} writes submitted by `stephost submit`"
            ));
            for _ in 0..GROUP_RUNS {
                binary.run(&["submit", &guest, "--input", &input(USERS_WRITES)])?;
            }
            let concurrency = GROUP_RUNS.to_string();
            let (took, stderr) =
                binary.run(&["worker", "--concurrency", &concurrency, "--exit-when-idle"])?;
            let (commits, transactions, fsyncs) = commit_counts(&stderr)
                .ok_or_else(|| format!("no commit counts in the worker's report: {stderr}"))?;
            let writes = (GROUP_RUNS as u64 * USERS_WRITES) as f64;
            let rate = writes / took.as_secs_f64();
            progress(&format!(
                "5 through `stephost worker`: {rate:.0} writes/s, {:.3} fsyncs a write",
                fsyncs as f64 / writes
            ));
            self.rows
                .push(Row::new(report::USERS_START_BINARY, rate, "writes/s"));
            self.rows.push(Row::new(
                report::USERS_START_BINARY_FSYNCS,
                fsyncs as f64 / writes,
                "fsyncs",
            ));
            self.note(format!(
                "5 through `stephost worker`: {GROUP_RUNS} runs of {USERS_WRITES} writes, each \
                 submitted by a `stephost submit` process, then one `{} worker --concurrency \
                 {GROUP_RUNS} --exit-when-idle` process timed from its spawn to its exit \
                 ({:.2} s: start-up, the component loaded from the cache, every run, the exit); \
                 it reported {commits} commits in {transactions} transactions and {fsyncs} \
                 fsyncs",
                cli.display(),
                took.as_secs_f64()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::commit_counts;

    #[test]
    fn a_workers_commit_counts_are_read_from_its_report() {
        let line =
            "stephost worker: 64 completed; 6464 commits in 416 transactions and 250 fsyncs\n";
        assert_eq!(commit_counts(line), Some((6464, 416, 250)));
        assert_eq!(commit_counts("no counts"), None);
    }
}

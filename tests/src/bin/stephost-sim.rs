//! `stephost-sim`: runs the fault-injection harness
//! ([`stephost_tests::sim`]) for chosen seeds or random ones, against the
//! `stephost-crash` binary beside it, on the ledger `STEPHOST_TEST_LEDGER`
//! names (`sqlite` or `postgres`), or else on the one each seed draws.
//!
//! ```text
//! stephost-sim --seed N [--break RULE] [--keep]
//! stephost-sim --seeds FIRST..LAST --plan  # print what the seeds draw, run nothing
//! stephost-sim --seeds FIRST..LAST
//! stephost-sim --random --minutes M      # failing seeds are appended to
//!                                        # tests/sim-regressions.txt
//! ```
//! Exit 0 when every seed held every invariant, 1 when one broke, 2 for
//! bad arguments.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use stephost_tests::sim::{self, Options};

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "stephost-sim: {why}\nusage: stephost-sim (--seed N | --seeds FIRST..LAST | --random \
         --minutes M) [--break RULE] [--keep] [--plan]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds: Option<Vec<u64>> = None;
    let mut minutes: Option<u64> = None;
    let mut breaks = None;
    let mut keep = false;
    let mut plan_only = false;
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seed" => match value.parse() {
                Ok(seed) => seeds = Some(vec![seed]),
                Err(_) => return usage(&format!("--seed takes a number, not {value:?}")),
            },
            "--seeds" => {
                let range = value
                    .split_once("..")
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
                match range {
                    Some((first, last)) if first <= last => seeds = Some((first..=last).collect()),
                    _ => return usage(&format!("--seeds takes FIRST..LAST, not {value:?}")),
                }
            }
            "--random" => {
                i += 1;
                continue;
            }
            "--minutes" => match value.parse() {
                Ok(m) => minutes = Some(m),
                Err(_) => return usage(&format!("--minutes takes a number, not {value:?}")),
            },
            "--break" => breaks = Some(value),
            "--keep" => {
                keep = true;
                i += 1;
                continue;
            }
            "--plan" => {
                plan_only = true;
                i += 1;
                continue;
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
        i += 2;
    }
    if seeds.is_none() && minutes.is_none() {
        return usage("name the seeds, or --random --minutes M");
    }
    if plan_only {
        for seed in seeds.unwrap_or_default() {
            print!("{}", sim::plan::Plan::draw(seed));
        }
        return ExitCode::SUCCESS;
    }
    let bin = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("stephost-crash")))
        .filter(|bin| bin.exists());
    let Some(bin) = bin else {
        return usage(
            "no stephost-crash binary beside this one: build both with `cargo build -p \
             stephost-tests --bins`",
        );
    };
    let until = minutes.map(|m| Instant::now() + Duration::from_secs(m * 60));
    let mut random = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut fixed = seeds.unwrap_or_default().into_iter();
    let mut failed = 0;
    let mut ran = 0;
    loop {
        let seed = match until {
            Some(until) if Instant::now() >= until => break,
            Some(_) => {
                random = sim::rng::Rng::new(random).next_u64();
                random % 1_000_000_000
            }
            None => match fixed.next() {
                Some(seed) => seed,
                None => break,
            },
        };
        // The backend `STEPHOST_TEST_LEDGER` names, or the seed's.
        let ledger = std::env::var("STEPHOST_TEST_LEDGER")
            .is_ok_and(|v| !v.is_empty())
            .then(stephost_tests::test_backend);
        let report = sim::run(&Options {
            seed,
            bin: bin.clone(),
            breaks: breaks.clone(),
            keep,
            ledger,
            woken_within: sim::WOKEN_WITHIN,
        });
        ran += 1;
        print!("{report}");
        if report.broken.is_empty() {
            println!("seed {seed}: every invariant held");
        } else {
            failed += 1;
            println!(
                "seed {seed}: {} invariant(s) broken; run it again with\n  {}",
                report.broken.len(),
                report.rerun(breaks.as_deref())
            );
            if until.is_some() {
                keep_as_regression(seed);
            }
        }
    }
    println!("{ran} seed(s), {failed} with a broken invariant");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Appends `seed` to the regression seeds the end-to-end suite runs.
fn keep_as_regression(seed: u64) {
    let path = stephost_tests::repo_root().join("tests/sim-regressions.txt");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{seed}"));
    match appended {
        Ok(()) => println!("seed {seed} kept in {}", path.display()),
        Err(e) => eprintln!(
            "stephost-sim: could not keep seed {seed} in {}: {e}",
            path.display()
        ),
    }
}

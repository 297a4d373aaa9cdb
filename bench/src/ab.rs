//! `--ab OTHER_BENCH`: this build's suite against another build's, in turn.
//!
//! Each round runs the other build's `stephost-bench` as a child process
//! (`--guest G --cli C --out TMP.json --dir D [--only LIST]`), then this
//! build's suite in-process, each in a fresh scratch folder. Both write
//! the same JSON (`{"figures": [{"figure", "value", "unit", "ratio", ...}]}`):
//! figures are matched by name, and each side's median over the rounds is
//! compared.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::report::{self, fmt, higher_is_better, is_floor, print_grid, target_of, yes_no};
use crate::{Args, Res, progress, suite};

/// Rounds when `--ab-rounds` is not given.
pub const ROUNDS: usize = 2;
/// How far worse than the other build a figure may be and still pass.
const WITHIN: f64 = 1.1;
/// Lines of the other bench's stderr kept for an error message.
const STDERR_TAIL: usize = 30;

/// The other build.
#[derive(Debug)]
pub struct Other {
    /// Its `stephost-bench`.
    pub bench: PathBuf,
    /// Its `stephost` (else its bench's default: next to it).
    pub cli: Option<PathBuf>,
    /// Its bench guest (else this build's).
    pub guest: Option<PathBuf>,
    pub rounds: usize,
}

/// Runs the A/B and prints its table; returns the results to write (the
/// A/B under `"ab"`, every round's results of each side under `"this"`
/// and `"other"`).
pub fn run(args: &Args, other: &Other, module: &[u8]) -> Res<Value> {
    if !other.bench.is_file() {
        return Err(format!("--ab: no bench at {}", other.bench.display()).into());
    }
    let scratch = args.scratch();
    std::fs::create_dir_all(&scratch)?;
    let outs = tempfile::Builder::new()
        .prefix("bench-ab-")
        .tempdir_in(&scratch)?;
    let mut this_rounds = Vec::new();
    let mut other_rounds = Vec::new();
    for round in 1..=other.rounds {
        let n = other.rounds;
        println!(
            "\n=== round {round} of {n}: other build ({}) ===\n",
            other.bench.display()
        );
        let out = outs.path().join(format!("other-{round}.json"));
        other_rounds.push(run_other(args, other, &out)?);
        println!("\n=== round {round} of {n}: this build ===\n");
        this_rounds.push(suite(args, module)?);
    }
    let table = compare(&this_rounds, &other_rounds);
    println!(
        "\n=== A/B: this build against {}, medians of {} rounds each ===\n",
        other.bench.display(),
        other.rounds
    );
    print_table(&table);
    Ok(json!({
        "suite": "stephost-bench --ab",
        "ab": {
            "other": {
                "bench": other.bench.display().to_string(),
                "cli": other.cli.as_ref().map(|p| p.display().to_string()),
                "guest": other.guest.as_ref().unwrap_or(&args.guest).display().to_string(),
            },
            "rounds": other.rounds,
            "change": "this / other - 1, signed so that + is better and - worse (higher is \
                       better for calls/s, writes/s and runs/s, lower for the other units)",
            "within_10pct": "rates: this >= other / 1.1; others: this <= other * 1.1; \
                             floors and the RSS per pending run (judged by its own target) \
                             not judged",
            "rows": table.rows.iter().map(AbRow::to_json).collect::<Vec<_>>(),
            "only_this": table.only_this,
            "only_other": table.only_other,
        },
        "this": this_rounds,
        "other": other_rounds,
    }))
}

/// Runs the other build's suite once; prints its table and returns its
/// results.
fn run_other(args: &Args, other: &Other, out: &std::path::Path) -> Res<Value> {
    let mut cmd = Command::new(&other.bench);
    cmd.arg("--guest")
        .arg(other.guest.as_ref().unwrap_or(&args.guest))
        .arg("--out")
        .arg(out)
        // Both sides' ledgers on the same disk (its default is its own
        // workspace's `target/`, wherever that was built).
        .arg("--dir")
        .arg(args.scratch());
    if let Some(cli) = &other.cli {
        cmd.arg("--cli").arg(cli);
    }
    if !args.only.is_empty() {
        let only: Vec<String> = args.only.iter().map(u32::to_string).collect();
        cmd.arg("--only").arg(only.join(","));
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", other.bench.display()))?;
    // Its progress lines are passed on; the rest of its stderr (a worker's
    // messages) is kept for an error message only.
    let stderr = child.stderr.take().ok_or("the other bench's stderr")?;
    let forwarder = std::thread::spawn(move || {
        let mut tail = std::collections::VecDeque::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("[bench] ") {
                progress(&format!("(other) {rest}"));
            }
            if tail.len() == STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        tail.into_iter().collect::<Vec<_>>().join("\n")
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .ok_or("the other bench's stdout")?
        .read_to_string(&mut stdout)?;
    let status = child.wait()?;
    let tail = forwarder.join().unwrap_or_default();
    print!("{stdout}");
    if !status.success() {
        return Err(format!(
            "the other bench ({}) failed ({status}); the end of its stderr:\n{tail}",
            other.bench.display()
        )
        .into());
    }
    let text = std::fs::read_to_string(out)
        .map_err(|e| format!("the other bench wrote no {}: {e}", out.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// One figure of both builds.
#[derive(Debug)]
struct AbRow {
    figure: String,
    unit: String,
    /// Each side's values by round, and their median.
    this_values: Vec<f64>,
    other_values: Vec<f64>,
    this: f64,
    other: f64,
    /// Each side's median ratio, where the figure has one.
    this_ratio: Option<f64>,
    other_ratio: Option<f64>,
    /// The other build's unit, if it differs (then not judged).
    other_unit: Option<String>,
}

impl AbRow {
    fn higher_is_better(&self) -> bool {
        higher_is_better(&self.unit)
    }

    /// this / other - 1, signed so that + is better.
    fn change(&self) -> f64 {
        let change = self.this / self.other - 1.0;
        if self.higher_is_better() {
            change
        } else {
            -change
        }
    }

    /// The change in percent, or `-` if it has none (the other is 0).
    fn change_text(&self) -> String {
        finite(self.change() * 100.0).map_or("-".into(), |c| format!("{c:+.1}%"))
    }

    /// Whether this build is within 10% of the other. Not judged: floors
    /// (the disk, not the build), figure 7's pending run (about 0 bytes, a
    /// page of RSS either way is noise; its own target judges it), and
    /// rows whose units differ.
    fn within(&self) -> Option<bool> {
        if is_floor(&self.figure) || self.figure == report::RSS_PENDING || self.other_unit.is_some()
        {
            return None;
        }
        Some(if self.higher_is_better() {
            self.this >= self.other / WITHIN
        } else {
            self.this <= self.other * WITHIN
        })
    }

    /// The figure's own target, and whether each side's medians meet it.
    fn target(&self) -> Option<(&'static str, bool, bool)> {
        let (text, met) = target_of(&self.figure)?;
        Some((
            text,
            met(self.this, self.this_ratio),
            met(self.other, self.other_ratio),
        ))
    }

    fn to_json(&self) -> Value {
        let target = self.target();
        json!({
            "figure": self.figure,
            "unit": self.unit,
            "other_unit": self.other_unit,
            "this": self.this,
            "other": self.other,
            "this_values": self.this_values,
            "other_values": self.other_values,
            "change_pct": finite(self.change() * 100.0),
            "better": if self.higher_is_better() { "higher" } else { "lower" },
            "within_10pct": self.within(),
            "this_ratio": self.this_ratio,
            "other_ratio": self.other_ratio,
            "target": target.map(|t| t.0),
            "this_met": target.map(|t| t.1),
            "other_met": target.map(|t| t.2),
        })
    }
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

#[derive(Debug)]
struct Table {
    rows: Vec<AbRow>,
    /// Figures of one side only.
    only_this: Vec<String>,
    only_other: Vec<String>,
}

/// A side's figures over its rounds, by name, in the order first seen.
struct Side {
    order: Vec<String>,
    /// Unit, values and ratios by round.
    figures: HashMap<String, (String, Vec<f64>, Vec<f64>)>,
}

impl Side {
    fn of(rounds: &[Value]) -> Side {
        let mut side = Side {
            order: Vec::new(),
            figures: HashMap::new(),
        };
        for results in rounds {
            let Some(figures) = results["figures"].as_array() else {
                continue;
            };
            for f in figures {
                let (Some(name), Some(value)) = (f["figure"].as_str(), f["value"].as_f64()) else {
                    continue;
                };
                let entry = side.figures.entry(name.to_string()).or_insert_with(|| {
                    side.order.push(name.to_string());
                    (
                        f["unit"].as_str().unwrap_or("").to_string(),
                        Vec::new(),
                        Vec::new(),
                    )
                });
                entry.1.push(value);
                if let Some(ratio) = f["ratio"].as_f64() {
                    entry.2.push(ratio);
                }
            }
        }
        side
    }
}

/// The median of `values` (of an even count, the mean of the middle two).
fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Matches the two sides' figures by name, in this build's order.
fn compare(this_rounds: &[Value], other_rounds: &[Value]) -> Table {
    let this = Side::of(this_rounds);
    let other = Side::of(other_rounds);
    let mut rows = Vec::new();
    let mut only_this = Vec::new();
    for name in &this.order {
        let (unit, values, ratios) = &this.figures[name];
        let Some((other_unit, other_values, other_ratios)) = other.figures.get(name) else {
            only_this.push(name.clone());
            continue;
        };
        let (Some(this_median), Some(other_median)) = (median(values), median(other_values)) else {
            continue;
        };
        rows.push(AbRow {
            figure: name.clone(),
            unit: unit.clone(),
            this_values: values.clone(),
            other_values: other_values.clone(),
            this: this_median,
            other: other_median,
            this_ratio: median(ratios),
            other_ratio: median(other_ratios),
            other_unit: (other_unit != unit).then(|| other_unit.clone()),
        });
    }
    let only_other = other
        .order
        .into_iter()
        .filter(|name| !this.figures.contains_key(name))
        .collect();
    Table {
        rows,
        only_this,
        only_other,
    }
}

fn print_table(table: &Table) {
    let header = [
        "figure",
        "unit",
        "this",
        "other",
        "change",
        "within 10%",
        "ratio this",
        "ratio other",
        "target",
        "met this",
        "met other",
    ];
    let cells: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|r| {
            let target = r.target();
            vec![
                r.figure.clone(),
                match &r.other_unit {
                    Some(other) => format!("{} (other: {other})", r.unit),
                    None => r.unit.clone(),
                },
                fmt(r.this),
                fmt(r.other),
                r.change_text(),
                if is_floor(&r.figure) {
                    "(floor)".to_string()
                } else {
                    yes_no(r.within())
                },
                r.this_ratio.map_or("-".into(), fmt),
                r.other_ratio.map_or("-".into(), fmt),
                target.map_or("-", |t| t.0).to_string(),
                yes_no(target.map(|t| t.1)),
                yes_no(target.map(|t| t.2)),
            ]
        })
        .collect();
    print_grid(&header, &cells, &[2, 3, 4, 6, 7]);
    println!();
    println!(
        "- change = this / other - 1, signed so that + is better and - worse: for calls/s, \
         writes/s and runs/s higher is better, for the other units (µs, ms, KiB, bytes) lower."
    );
    println!(
        "- within 10%: rates this >= other / 1.1, others this <= other x 1.1; floors (the disk, \
         not the build) are shown, not judged, nor is {} (its own target judges it).",
        report::RSS_PENDING
    );
    println!(
        "- ratio: for {}, µs per write over the mean of its floors, held to its target on both \
         sides; for 5 group commit, the speed-up over a single run (no target).",
        report::WRITE_EFFECT
    );
    let worse: Vec<String> = table
        .rows
        .iter()
        .filter(|r| r.within() == Some(false))
        .map(|r| format!("{} ({})", r.figure, r.change_text()))
        .collect();
    let missed: Vec<&str> = table
        .rows
        .iter()
        .filter(|r| r.target().is_some_and(|t| !t.1))
        .map(|r| r.figure.as_str())
        .collect();
    println!(
        "- more than 10% worse than the other build: {}",
        if worse.is_empty() {
            "none".to_string()
        } else {
            worse.join("; ")
        }
    );
    if !missed.is_empty() {
        println!("- this build misses the target of: {}", missed.join("; "));
    }
    if !table.only_this.is_empty() {
        println!("- only in this build: {}", table.only_this.join("; "));
    }
    if !table.only_other.is_empty() {
        println!("- only in the other build: {}", table.only_other.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(figures: &[(&str, f64, &str, Option<f64>)]) -> Value {
        json!({
            "figures": figures
                .iter()
                .map(|(name, value, unit, ratio)| json!({
                    "figure": name, "value": value, "unit": unit, "ratio": ratio,
                    "floor_us": null, "target": null, "met": null,
                }))
                .collect::<Vec<_>>()
        })
    }

    #[test]
    fn figures_are_matched_by_name_and_judged_on_their_medians() {
        let this = [
            results(&[
                ("floor (start)", 200.0, "µs/commit", None),
                ("1 write effect", 260.0, "µs/write", Some(1.30)),
                ("3 replay", 900_000.0, "calls/s", None),
                ("4 run of a no-op step, whole", 50.0, "µs/run", Some(0.2)),
                ("new figure", 1.0, "ms", None),
            ]),
            results(&[
                ("floor (start)", 100.0, "µs/commit", None),
                ("1 write effect", 280.0, "µs/write", Some(1.36)),
                ("3 replay", 1_100_000.0, "calls/s", None),
                ("4 run of a no-op step, whole", 70.0, "µs/run", Some(0.3)),
                ("new figure", 1.0, "ms", None),
            ]),
        ];
        let other = [
            results(&[
                ("1 write effect", 250.0, "µs/write", Some(1.2)),
                ("3 replay", 1_200_000.0, "calls/s", None),
                ("4 run of a no-op step, whole", 40.0, "µs/run", None),
                ("floor (start)", 150.0, "µs/commit", None),
                ("old figure", 1.0, "ms", None),
            ]),
            results(&[
                ("1 write effect", 250.0, "µs/write", Some(1.2)),
                ("3 replay", 1_000_000.0, "calls/s", None),
                ("4 run of a no-op step, whole", 60.0, "µs/run", None),
                ("floor (start)", 150.0, "µs/commit", None),
            ]),
        ];
        let table = compare(&this, &other);
        let names: Vec<&str> = table.rows.iter().map(|r| r.figure.as_str()).collect();
        // This build's order.
        assert_eq!(
            names,
            [
                "floor (start)",
                "1 write effect",
                "3 replay",
                "4 run of a no-op step, whole"
            ]
        );
        assert_eq!(table.only_this, ["new figure"]);
        assert_eq!(table.only_other, ["old figure"]);

        let floor = &table.rows[0];
        assert_eq!((floor.this, floor.other), (150.0, 150.0));
        assert_eq!(floor.within(), None);

        // Lower is better: 270 against 250 is 8% worse, within 10%.
        let write = &table.rows[1];
        assert_eq!(write.this, 270.0);
        assert!((write.change() + 0.08).abs() < 1e-9);
        assert_eq!(write.within(), Some(true));
        // Its ratio: 1.33 meets ≤ 1.35, as the other's 1.2 does.
        assert!((write.this_ratio.unwrap() - 1.33).abs() < 1e-9);
        let (text, this_met, other_met) = write.target().unwrap();
        assert_eq!(text, "≤ 1.35× floor");
        assert!(this_met && other_met);

        // Higher is better: 1.0 M against 1.1 M is 9.1% worse, within 10%.
        let replay = &table.rows[2];
        assert!(replay.change() < 0.0);
        assert_eq!(replay.within(), Some(true));
        assert!(replay.target().is_none());

        // 60 µs against 50: 20% worse.
        let whole = &table.rows[3];
        assert!((whole.change() + 0.2).abs() < 1e-9);
        assert_eq!(whole.within(), Some(false));
        assert_eq!(whole.other_ratio, None);
        let json = whole.to_json();
        assert_eq!(json["within_10pct"], false);
        assert_eq!(json["better"], "lower");
    }

    #[test]
    fn a_rate_is_better_higher() {
        let row = |this: f64, other: f64| AbRow {
            figure: "5 group commit".into(),
            unit: "writes/s".into(),
            this_values: vec![this],
            other_values: vec![other],
            this,
            other,
            this_ratio: None,
            other_ratio: None,
            other_unit: None,
        };
        assert!(row(110.0, 100.0).change() > 0.0);
        assert_eq!(row(91.0, 100.0).within(), Some(true));
        assert_eq!(row(90.0, 100.0).within(), Some(false));
        let mut pending = row(0.4, 0.0);
        pending.figure = report::RSS_PENDING.into();
        pending.unit = "bytes".into();
        assert_eq!(pending.within(), None);
        let mut other_unit = row(100.0, 100.0);
        other_unit.other_unit = Some("runs/s".into());
        assert_eq!(other_unit.within(), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }
}

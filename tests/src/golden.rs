//! Golden files: what the CLI and the API print, kept under `tests/golden/`
//! and compared whole, so that a change to a message, a help text or a JSON
//! shape shows up as a diff in review instead of passing unnoticed.
//!
//! A test passes its output through [`normalize`] (what legitimately varies
//! between two runs of the same test becomes a placeholder) and hands it to
//! [`check`]. When the change is meant, re-bless and review the diff:
//!
//! ```text
//! STEPHOST_BLESS=1 cargo test -p stephost-tests --test e2e -- golden bad_input
//! STEPHOST_BLESS=1 STEPHOST_TEST_LEDGER=postgres cargo test -p stephost-tests --test e2e -- golden bad_input
//! git diff tests/golden
//! ```
//!
//! The same golden file serves both backends: the CLI and the API print
//! the same on SQLite and PostgreSQL, except where a file's name says
//! which backend it is for.

use std::path::{Path, PathBuf};

/// Set to `1` to (re)write the golden files instead of comparing with them.
pub const BLESS_VAR: &str = "STEPHOST_BLESS";

/// The folder of the golden files, `tests/golden`.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// Whether this test process writes golden files instead of checking them.
pub fn blessing() -> bool {
    std::env::var(BLESS_VAR).as_deref() == Ok("1")
}

/// Compares `actual` with the golden file `tests/golden/NAME` and fails
/// with a diff if they differ; with `STEPHOST_BLESS=1`, writes `actual` to
/// it instead.
#[track_caller]
pub fn check(name: &str, actual: &str) {
    let path = root().join(name);
    let expected = std::fs::read_to_string(&path).ok();
    if blessing() {
        if expected.as_deref() != Some(actual) {
            std::fs::create_dir_all(path.parent().expect("a golden file is in a folder"))
                .expect("create the golden folder");
            std::fs::write(&path, actual).expect("write the golden file");
            eprintln!("blessed {}", path.display());
        }
        return;
    }
    let Some(expected) = expected else {
        panic!(
            "there is no golden file {} yet; write it with {BLESS_VAR}=1 (see {})\n\
             what the test got:\n{actual}",
            path.display(),
            HOW
        );
    };
    if expected != actual {
        panic!(
            "the output differs from the golden file {} (- golden, + now):\n{}\n\
             If the change is meant, re-bless with {BLESS_VAR}=1 and review the diff \
             (see {HOW}).",
            path.display(),
            diff(&expected, actual)
        );
    }
}

/// Where re-blessing is explained.
const HOW: &str = "tests/src/golden.rs, or tests/golden/README.md";

/// The golden files under `tests/golden/FOLDER`, by name: a test that
/// checks one file per item (one per command, say) compares this with
/// what it checked, so that a file left over from an item that is gone
/// fails too (and is deleted when blessing).
#[track_caller]
pub fn check_no_others(folder: &str, checked: &[String]) {
    let dir = root().join(folder);
    let mut extra: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| !checked.contains(name))
                .collect()
        })
        .unwrap_or_default();
    extra.sort();
    if blessing() {
        for name in &extra {
            std::fs::remove_file(dir.join(name)).expect("delete a golden file left over");
            eprintln!("deleted {}", dir.join(name).display());
        }
        return;
    }
    assert!(
        extra.is_empty(),
        "golden files in {} that no test checks any more: {extra:?}; delete them, or \
         re-bless with {BLESS_VAR}=1",
        dir.display()
    );
}

/// What varies between two runs of the same test, replaced by a placeholder.
/// This is the one place that decides it; its rules, in order:
///
/// 1. **Known values**: each `(value, placeholder)` in `known`, longest value
///    first: what the test itself knows varies, such as the sandbox folder
///    (`<sandbox>`), the ledger URL (`<ledger>`, so a message reads the same on
///    SQLite and PostgreSQL), the repository's folder (`<repo>`, in the guests'
///    paths), a server's or receiver's address (`<addr>`, `<receiver>`).
///    [`crate::Sandbox::known`] gives a sandbox's.
/// 2. **Times**: a word (a run of ASCII letters, digits and `_`) of exactly 13
///    decimal digits is a time in milliseconds since the epoch (years 2001 to
///    2286) and becomes `<ms>`, and so does the number a JSON key ending in
///    `_ms` has (a time, or a duration such as `duration_ms`, also in JSON
///    held in a string); one of exactly 19 digits is a time in nanoseconds (a
///    clock reading) and becomes `<ns>`.
/// 3. **Digests and random bytes**: a word of 16 or more lowercase
///    hexadecimal digits (a sha256, a chain link, a module digest — which
///    depends on the guest's build: its dependencies' paths are in it —, a
///    step's random bytes) becomes `<hex:N>`, N numbering the distinct values
///    in the order they first appear, so that a value repeated elsewhere (an
///    operation id in a receipt, a seal's head and the last call's chain link)
///    stays visibly the same value. Times are checked first, so a 13- or
///    19-digit number is a time, never a digest.
/// 4. **Offsets into a WebAssembly binary**, which move with every build of a
///    guest: the decimal number after `range `, `..`, `bound = ` or
///    `offset ` becomes `<offset>`.
/// 5. **Timings in metrics**: the value of a Prometheus sample of a metric
///    measured in seconds (`NAME_seconds`, `NAME_seconds_sum`,
///    `NAME_seconds_bucket`) becomes `<timing>`; counts, including
///    `NAME_seconds_count`, stay.
///
/// Anything else is kept exactly: ids the test chooses, statuses, messages,
/// counts, key order and layout. An output whose every value is fixed (the
/// frozen ledger's) is compared without it.
pub fn normalize(text: &str, known: &[(&str, &str)]) -> String {
    // 1. Known values, the longest first (a ledger URL holds the sandbox's
    // folder).
    let mut known: Vec<&(&str, &str)> = known.iter().filter(|(v, _)| !v.is_empty()).collect();
    known.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    let mut text = text.to_string();
    for (value, placeholder) in known {
        text = text.replace(value, placeholder);
    }

    // 2–4. Word by word.
    let mut out = String::with_capacity(text.len());
    let mut digests: Vec<String> = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(is_word_char) {
        out.push_str(&rest[..start]);
        let word_len = rest[start..]
            .find(|c: char| !is_word_char(c))
            .unwrap_or(rest.len() - start);
        let word = &rest[start..start + word_len];
        let decimal = word.bytes().all(|b| b.is_ascii_digit());
        let hex = word.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let a_ms_value = ["_ms\": ", "_ms\":", "_ms\\\":"]
            .iter()
            .any(|before| out.ends_with(before));
        if decimal && (word.len() == 13 || a_ms_value) {
            out.push_str("<ms>");
        } else if decimal && word.len() == 19 {
            out.push_str("<ns>");
        } else if hex && word.len() >= 16 {
            let n = match digests.iter().position(|d| d == word) {
                Some(i) => i + 1,
                None => {
                    digests.push(word.to_string());
                    digests.len()
                }
            };
            out.push_str(&format!("<hex:{n}>"));
        } else if decimal
            && ["range ", "..", "bound = ", "offset "]
                .iter()
                .any(|before| out.ends_with(before))
        {
            out.push_str("<offset>");
        } else {
            out.push_str(word);
        }
        rest = &rest[start + word_len..];
    }
    out.push_str(rest);

    // 5. Timings in metrics.
    let ends_with_newline = out.ends_with('\n');
    let mut lines: Vec<String> = out.lines().map(metric_timing).collect();
    if ends_with_newline {
        lines.push(String::new());
    }
    lines.join("\n")
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A Prometheus sample line of a metric in seconds with its value replaced.
fn metric_timing(line: &str) -> String {
    if line.starts_with('#') {
        return line.to_string();
    }
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let timed = ["_seconds", "_seconds_sum", "_seconds_bucket"]
        .iter()
        .any(|suffix| name.ends_with(suffix));
    match line.rsplit_once(' ') {
        Some((sample, _)) if timed && !name.is_empty() => format!("{sample} <timing>"),
        _ => line.to_string(),
    }
}

/// A JSON value as the golden files keep it: pretty-printed (keys sorted),
/// with a final newline.
pub fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).expect("a JSON value prints") + "\n"
}

/// A line diff of `old` and `new` with three lines of context around each
/// change: `-` for lines only in `old`, `+` for lines only in `new`.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // The longest common subsequence, by dynamic programming (golden files
    // are a few hundred lines at most).
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (' ' | '-' | '+', old line number, line).
    let mut script: Vec<(char, usize, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            script.push((' ', i, j, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            script.push(('-', i, j, a[i]));
            i += 1;
        } else {
            script.push(('+', i, j, b[j]));
            j += 1;
        }
    }
    if old.ends_with('\n') != new.ends_with('\n') {
        script.push((
            '!',
            a.len(),
            b.len(),
            "(the files differ in their final newline)",
        ));
    }
    const CONTEXT: usize = 3;
    const LINES_MAX: usize = 400;
    let changed: Vec<usize> = (0..script.len()).filter(|&k| script[k].0 != ' ').collect();
    let near = |k: usize| {
        changed
            .iter()
            .any(|&c| k + CONTEXT >= c && k <= c + CONTEXT)
    };
    let mut out = String::new();
    let mut shown = 0;
    let mut last: Option<usize> = None;
    for (k, (sign, old_no, new_no, line)) in script.iter().enumerate() {
        if !near(k) {
            continue;
        }
        if last.is_none_or(|l| l + 1 != k) {
            out.push_str(&format!(
                "@@ golden line {}, now line {} @@\n",
                old_no + 1,
                new_no + 1
            ));
        }
        last = Some(k);
        if shown == LINES_MAX {
            out.push_str("… (diff cut short)\n");
            break;
        }
        out.push_str(&format!("{sign}{line}\n"));
        shown += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_digests_and_known_values_become_placeholders() {
        let text = "run r in /tmp/x at 1796358104275 (clock 1796358104277383094): \
                    op b67a6c2e4d5b13a4f39ab2489017490d5d90e28001325fb22eb2a8e21f3fb44d, \
                    receipt R-b67a6c2e4d5b, again \
                    b67a6c2e4d5b13a4f39ab2489017490d5d90e28001325fb22eb2a8e21f3fb44d, \
                    nonce dd8d98e3f04a2361, 67108864 bytes, section range 2131..232239 \
                    (bound = 100000), {\"duration_ms\": 4, \"fence\": 2}, \
                    \"{\\\"took_ms\\\":12}\"";
        assert_eq!(
            normalize(text, &[("/tmp/x", "<sandbox>")]),
            "run r in <sandbox> at <ms> (clock <ns>): op <hex:1>, receipt R-b67a6c2e4d5b, \
             again <hex:1>, nonce <hex:2>, 67108864 bytes, section range <offset>..<offset> \
             (bound = <offset>), {\"duration_ms\": <ms>, \"fence\": 2}, \
             \"{\\\"took_ms\\\":<ms>}\""
        );
    }

    #[test]
    fn metrics_in_seconds_lose_their_values_and_counts_keep_them() {
        let text = "# TYPE a_seconds histogram\na_seconds_bucket{le=\"0.005\"} 3\n\
                    a_seconds_sum 0.0123\na_seconds_count 3\nb_total 7\nc_age_seconds 1.5\n";
        assert_eq!(
            normalize(text, &[]),
            "# TYPE a_seconds histogram\na_seconds_bucket{le=\"0.005\"} <timing>\n\
             a_seconds_sum <timing>\na_seconds_count 3\nb_total 7\nc_age_seconds <timing>\n"
        );
    }

    #[test]
    fn a_diff_shows_the_changed_lines_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            diff(old, new),
            "@@ golden line 2, now line 2 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }
}

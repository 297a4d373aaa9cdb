//! A WASI command program, not a stephost step: it knows nothing of the
//! step world. It reads its stdin, reads the wall clock, writes a JSON line
//! to stdout and a line to stderr. Input `exit=N` makes it exit with code N;
//! input `text` makes it print plain text instead of JSON.

use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("cannot read stdin: {e}");
        std::process::exit(2);
    }
    if let Some(code) = input.strip_prefix("exit=") {
        eprintln!("exiting with {code} as asked");
        std::process::exit(code.trim().parse().unwrap_or(1));
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    eprintln!("guest_command: {} bytes in", input.len());
    let mut out = std::io::stdout().lock();
    let written = if input == "text" {
        writeln!(out, "plain text at {now_ms}")
    } else {
        let escaped: String = input
            .chars()
            .flat_map(|c| match c {
                '"' => vec!['\\', '"'],
                '\\' => vec!['\\', '\\'],
                '\n' => vec!['\\', 'n'],
                c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
                c => vec![c],
            })
            .collect();
        writeln!(out, "{{\"echo\":\"{escaped}\",\"now_ms\":{now_ms}}}")
    };
    if written.is_err() {
        std::process::exit(2);
    }
}

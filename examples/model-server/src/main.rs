//! `model-server [--listen 127.0.0.1:0] [--script FILE] [--key KEY] [--hold-ms N]`:
//! serves the scripted model APIs until interrupted, printing its address on stdout
//! and every request on stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use model_server::{Config, ModelServer, Script};

/// A scripted model server: OpenAI Chat Completions (POST /v1/chat/completions),
/// OpenAI Responses (POST /v1/responses) and Anthropic Messages (POST /v1/messages),
/// whole or streamed. Turn k of the script answers a conversation that already holds
/// k-1 assistant turns. GET /requests reports what it received; POST /reset forgets
/// it. Stop it with Ctrl-C.
#[derive(Parser)]
#[command(name = "model-server", version)]
struct Args {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The script (JSON); default: the built-in refund agent script
    /// (see --print-script).
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// The API key requests must carry (OpenAI `Authorization: Bearer KEY`,
    /// Anthropic `x-api-key: KEY`); unset: any key, or none, is accepted.
    #[arg(
        long,
        env = "MODEL_SERVER_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    key: Option<String>,
    /// Hold every model response this many milliseconds (the request counts as in
    /// flight meanwhile), so that overlapping requests show in max_in_flight.
    #[arg(long, value_name = "N", default_value_t = 0)]
    hold_ms: u64,
    /// Streams: write the SSE bytes in pieces of N bytes (splitting events, even
    /// inside a UTF-8 character; a large N puts several events in one write)
    /// instead of one write per event.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    sse_write_bytes: Option<u64>,
    /// Streams: pause N milliseconds between two writes.
    #[arg(long, value_name = "N", default_value_t = 0)]
    sse_gap_ms: u64,
    /// Print the script (the built-in one unless --script is given) and exit.
    #[arg(long)]
    print_script: bool,
    /// Print only the address line: no start summary, no requests.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (script, origin) = match &args.script {
        Some(path) => {
            let loaded = std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|text| Script::from_json(&text));
            match loaded {
                Ok(s) => (s, path.display().to_string()),
                Err(e) => {
                    eprintln!("model-server: bad script {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
        }
        None => (Script::default_refund(), "built-in".to_string()),
    };
    if args.print_script {
        println!(
            "{}",
            serde_json::to_string_pretty(&script).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let quiet = args.quiet;
    let turns = script.turns.len();
    let description = script.description.clone().unwrap_or_default();
    let config = Config {
        listen: args.listen,
        script,
        key: args.key,
        hold: Duration::from_millis(args.hold_ms),
        sse_write_bytes: args.sse_write_bytes.map(|n| n as usize),
        sse_gap: Duration::from_millis(args.sse_gap_ms),
        log: !quiet,
    };
    let key = if config.key.is_some() {
        "checked"
    } else {
        "not checked"
    };
    let server = match ModelServer::start_with(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("model-server: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    // The one line on stdout: scripts and tests read the address from it.
    println!("model-server: listening on {}", server.url());
    if !quiet {
        eprintln!(
            "model-server: script {origin} ({turns} turns{}); API key {key}; GET /requests reports; Ctrl-C stops",
            if description.is_empty() {
                String::new()
            } else {
                format!(": {description}")
            }
        );
    }
    loop {
        std::thread::park();
    }
}

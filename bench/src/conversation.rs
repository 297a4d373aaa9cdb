//! Figure 12: a model conversation, against the scripted model server on
//! 127.0.0.1 (`examples/model-server`).
//!
//! - How big a long conversation leaves the ledger: `TURNS` turns, each
//!   adding a user message of `USER_BYTES` and an answer of `ANSWER_BYTES`,
//!   every turn re-sending the whole conversation (what an agent does). The
//!   ledger's growth (its file after a checkpoint, over the same ledger
//!   before the run) over the transcript's bytes (every message's text,
//!   once).
//! - What a durable model answer costs: the µs per turn of `models.chat`
//!   (its answer committed, one fsync, before the step sees it) and of the
//!   same exchange made as a buffered `http` read (its outcome rides on the
//!   next commit), the same server answering both.
//! - How fast the conversation replays, against the same conversation made
//!   through the `http` read (an equal run without model calls); neither
//!   replay touches the network.

use std::path::Path;
use std::time::Instant;

use model_server::{Config as ServerConfig, ModelServer, Script};
use serde_json::{Value, json};
use stephost_runtime::config::Config;
use stephost_runtime::replay::ReplayVerdict;

use crate::report::Row;
use crate::{Bench, Res, WHAT, completed, host_options, median_us, open_host, progress};

pub const TURNS: u64 = 100;
const USER_BYTES: usize = 1_000;
const ANSWER_BYTES: usize = 1_000;
/// Rounds of each timed run (the median is the figure).
const ROUNDS: usize = 3;

/// The ledger's growth over the transcript's bytes (a target: ≤ 3).
pub const LEDGER_RATIO: &str = "12 conversation ledger / transcript";

fn script() -> Res<Script> {
    let turns: Vec<Value> = (0..TURNS)
        .map(|turn| {
            let mut text = format!("Answer {turn}: ");
            while text.len() < ANSWER_BYTES {
                text.push_str("the parcel left the depot and will arrive tomorrow. ");
            }
            text.truncate(ANSWER_BYTES);
            json!({ "text": text })
        })
        .collect();
    Ok(Script::from_json(&json!({ "turns": turns }).to_string())?)
}

fn config_text(url: &str) -> String {
    format!(
        r#"
[limits]
calls_max = 1000000

[models.bench]
api = "openai-chat"
url = "{url}"
model = "bench-1"
max_tokens = 1024

[effects."chat.read"]
kind = "http"
class = "read"
url = "{url}/v1/chat/completions"
"#
    )
}

/// The file's bytes with its WAL checkpointed into it.
fn ledger_bytes(db: &Path) -> Res<u64> {
    rusqlite::Connection::open(db)?.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let wal = std::fs::metadata(Path::new(&wal)).map_or(0, |m| m.len());
    Ok(std::fs::metadata(db)?.len() + wal)
}

impl Bench {
    pub(crate) fn conversation(&mut self) -> Res<()> {
        let server = ModelServer::start_with(ServerConfig {
            script: script()?,
            ..ServerConfig::default()
        })?;
        let config = Config::parse(&config_text(&server.url()))?;
        config.effects()?;
        let converse =
            |mode: &str| json!({"mode": mode, "count": TURNS, "pad": USER_BYTES}).to_string();

        // The ledger's size: a fresh one, before and after one conversation.
        progress(&format!("12 conversation: {TURNS} turns, ledger size"));
        let db = self.dir.join("conversation.db");
        let mut host = open_host(&db, host_options(&config))?;
        host.run(
            &self.module,
            WHAT,
            &json!({"mode": "none"}).to_string(),
            None,
        )?;
        let before = ledger_bytes(&db)?;
        let report = host.run(&self.module, WHAT, &converse("converse"), None)?;
        let output = completed(&report)?;
        let after = ledger_bytes(&db)?;
        let transcript = output["transcript_bytes"].as_u64().unwrap_or(0).max(1);
        let ratio = (after - before) as f64 / transcript as f64;
        self.rows.push(Row::new(LEDGER_RATIO, ratio, "×"));
        self.note(format!(
            "12: {TURNS} turns of a {USER_BYTES}-byte user message and a {ANSWER_BYTES}-byte answer, \
             every turn sending the whole conversation (the last request {} KB); transcript {} KB, \
             ledger grew {} KB (its file after a checkpoint, {} KB before the run)",
            (TURNS as usize * (USER_BYTES + ANSWER_BYTES)) / 1000,
            transcript / 1000,
            (after - before) / 1000,
            before / 1000
        ));

        // A durable model turn against the same exchange as a buffered read.
        let mut times = |mode: &str| -> Res<(f64, String)> {
            let mut rounds = Vec::new();
            let mut run_id = String::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                let report = host.run(&self.module, WHAT, &converse(mode), None)?;
                rounds.push(t.elapsed());
                completed(&report)?;
                run_id = report.run_id;
            }
            Ok((median_us(&rounds) / TURNS as f64, run_id))
        };
        progress("12 conversation: durable model turns and buffered reads");
        let (durable, _) = times("converse")?;
        let (buffered, http_run) = times("converse-http")?;
        let floor = self.floor("around 12")?;
        self.rows.push(Row::new(
            "12 model turn (durable answer)",
            durable,
            "µs/turn",
        ));
        self.rows.push(Row::new(
            "12 the same exchange as a buffered http read",
            buffered,
            "µs/turn",
        ));
        self.note(format!(
            "12: a durable model answer costs {:.0} µs a turn more than the same exchange as a \
             buffered read ({:.2}× the floor of {floor:.0} µs: its fsync, the host's reading \
             of the neutral request and writing of the provider's, and reading the answer as a \
             stream of a few hundred server-sent events, where the read asks for it whole), of \
             {durable:.0} µs a turn in all against the local scripted server (median of {ROUNDS} runs of {TURNS} turns; \
             a real provider answers in seconds)",
            durable - buffered,
            (durable - buffered) / floor
        ));

        // Replay: the conversation, and the same conversation made through
        // an http read (an equal run without model calls).
        progress("12 conversation: replays");
        let replay = |run_id: &str| -> Res<f64> {
            let mut rounds = Vec::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                let replayed = host.replay(run_id, None)?;
                rounds.push(t.elapsed());
                match replayed.verdict {
                    ReplayVerdict::Consistent { calls, .. } if calls == TURNS => {}
                    other => return Err(format!("replay of run {run_id}: {other:?}").into()),
                }
            }
            Ok(median_us(&rounds) / TURNS as f64)
        };
        let conversation = replay(&report.run_id)?;
        let equal = replay(&http_run)?;
        self.rows.push(Row::new(
            "12 replay of the conversation",
            conversation,
            "µs/turn",
        ));
        self.rows.push(Row::new(
            "12 replay of it made as http reads",
            equal,
            "µs/turn",
        ));
        self.note(format!(
            "12: the conversation replays at {:.2}× the time of the same conversation made through \
             an http read effect (median of {ROUNDS} `Host::replay` calls each; both rebuild and \
             compare every turn's whole request); no replay asked the model",
            conversation / equal,
        ));
        let asked = server.report()["requests_total"].as_u64().unwrap_or(0);
        let expected = (1 + 2 * ROUNDS as u64) * TURNS;
        if asked != expected {
            return Err(format!(
                "12: the model server was asked {asked} times, not {expected}: a replay or a \
                 resumed turn asked it"
            )
            .into());
        }
        drop(host);
        let _ = std::fs::remove_file(&db);
        Ok(())
    }
}

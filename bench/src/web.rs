//! Figure 13: a step's own HTTP request (`wasi:http`, journaled) against an
//! `effects.call` of an `http` effect to the same receiver (the demo
//! supplier on 127.0.0.1): µs per write, each a POST /orders recorded
//! `started` durably before it leaves, its outcome riding on the next
//! commit.

use std::time::Instant;

use serde_json::json;
use stephost_runtime::config::Config;
use supplier_receiver::Receiver;

use crate::report::Row;
use crate::{Bench, Res, WHAT, completed, host_options, median_us, open_host, progress};

const WRITES: u64 = 200;
/// Rounds of each timed run (the median is the figure).
const ROUNDS: usize = 5;

fn config_text(url: &str) -> String {
    format!(
        r#"
[limits]
calls_max = 1000000

[effects."orders.post"]
kind = "http"
class = "write"
method = "POST"
url = "{url}/orders"
idempotent = true

[http."{url}"]
idempotent = true
"#
    )
}

impl Bench {
    pub(crate) fn web(&mut self) -> Res<()> {
        let receiver = Receiver::start()?;
        let url = receiver.url();
        let config = Config::parse(&config_text(&url))?;
        let db = self.dir.join("web.db");
        let mut host = open_host(&db, host_options(&config))?;
        progress(&format!(
            "13 wasi:http against effects.call: {ROUNDS} × {WRITES} writes each"
        ));
        let mut times = |mode: &str| -> Res<f64> {
            let input = json!({"mode": mode, "count": WRITES, "url": url}).to_string();
            // Warm: the component compiled, the ledger's WAL past its start.
            completed(&host.run(&self.module, WHAT, &input, None)?)?;
            let mut rounds = Vec::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                let report = host.run(&self.module, WHAT, &input, None)?;
                rounds.push(t.elapsed());
                completed(&report)?;
            }
            Ok(median_us(&rounds) / WRITES as f64)
        };
        // Interleaved, so both see the same disk.
        let effect = times("http-effect")?;
        let own = times("wasi-http")?;
        let placed = receiver.business_effects() as u64;
        let expected = 2 * (ROUNDS as u64 + 1) * WRITES;
        if placed != expected {
            return Err(format!("13: the receiver placed {placed} orders, not {expected}").into());
        }
        self.rows.push(Row::new(
            "13 write by a step's own HTTP client (wasi:http)",
            own,
            "µs/write",
        ));
        self.rows.push(Row::new(
            "13 the same write by effects.call",
            effect,
            "µs/write",
        ));
        self.note(format!(
            "13: a POST by the step's own client (wstd over wasi:http) costs {:.2}× the same POST \
             by effects.call of an http effect ({own:.0} against {effect:.0} µs a write; median \
             of {ROUNDS} runs of {WRITES} writes to the demo supplier on 127.0.0.1, each write \
             durable before it is sent)",
            own / effect
        ));
        Ok(())
    }
}

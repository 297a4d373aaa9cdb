//! Webhook notifications: a run parked (a call's outcome is unknown), an
//! approval waiting, a run failed or diverged.
//!
//! Each look finds the events, owes each webhook a notice for each event
//! it takes (in the ledger, under a delivery id derived from the event, so
//! an event is owed once whoever sees it first), then sends the notices
//! due. A notice is marked delivered only on a 2xx answer; otherwise it is
//! sent again with a doubling wait, up to the webhook's attempts. A notice
//! owed when the server dies is still owed when it (or another server on
//! the ledger) starts: delivery is at least once, and receivers
//! deduplicate by the `Stephost-Delivery` header.
//!
//! Each body is signed: `Stephost-Signature: sha256=HEX`, the HMAC-SHA256
//! of the body's bytes under the webhook's secret.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use stephost_core::mac::MacKey;
use stephost_core::notices::{self, Notice, NoticeAttempt, NoticeEvent, NoticeState};
use stephost_core::store::RunQuery;
use stephost_core::{CallState, RunStatus, Store, StoreResult, approvals};
use stephost_host::config::Webhook;

/// Notices sent per look, at most (each taken on its own, so that its
/// hold covers its own attempt only).
const SEND_PER_LOOK_MAX: usize = 32;

/// A webhook with its agent and key.
struct Target {
    hook: Webhook,
    key: MacKey,
    agent: ureq::Agent,
}

pub struct Notifier {
    targets: Vec<Target>,
    /// Delivery ids owed by this process already (owing one again is a
    /// no-op, but a write).
    owed: HashSet<String>,
    /// Failed and diverged runs changed after this time are looked at.
    since_ms: i64,
    /// How long a taken notice is held (see [`HOLD_MARGIN_MS`]).
    hold_ms: i64,
}

/// Runs changed this long before the last look are looked at again.
const OVERLAP_MS: i64 = 60_000;

/// A taken notice is held from other servers for the longest attempt's
/// time limit and this much more.
const HOLD_MARGIN_MS: i64 = 5_000;

impl Notifier {
    pub fn new(webhooks: Vec<Webhook>, lookback_ms: i64) -> Self {
        let targets: Vec<Target> = webhooks
            .into_iter()
            .map(|hook| Target {
                key: MacKey::new(&hook.secret),
                agent: ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_millis(hook.config.timeout_ms)))
                    .max_redirects(0)
                    .build()
                    .into(),
                hook,
            })
            .collect();
        let hold_ms = targets
            .iter()
            .map(|t| t.hook.config.timeout_ms.min(i64::MAX as u64 / 2) as i64)
            .max()
            .unwrap_or(0)
            + HOLD_MARGIN_MS;
        Notifier {
            hold_ms,
            targets,
            owed: HashSet::new(),
            since_ms: stephost_core::clock::now_ms().saturating_sub(lookback_ms),
        }
    }

    /// Looks and sends every `every` until `shutdown`.
    pub fn run(
        mut self,
        pool: Arc<dyn stephost_core::Pool>,
        every: Duration,
        shutdown: &AtomicBool,
    ) {
        if self.targets.is_empty() {
            return;
        }
        let mut store: Option<Box<dyn Store>> = None;
        while !shutdown.load(Ordering::Relaxed) {
            let result = match &store {
                Some(s) => self.look(s.as_ref(), shutdown),
                None => pool.store().map(|s| store = Some(s)),
            };
            if let Err(e) = result {
                eprintln!("stephost serve: notifications: {e}; trying again");
            }
            std::thread::sleep(every);
        }
    }

    /// One look: owe what is new, send what is due (until `shutdown`).
    pub fn look(&mut self, store: &dyn Store, shutdown: &AtomicBool) -> StoreResult<()> {
        let now = stephost_core::clock::now_ms();
        let found = self.events(store)?;
        let new: Vec<Notice> = found
            .into_iter()
            .filter(|n| !self.owed.contains(&n.delivery_id))
            .collect();
        store.owe_notices(&new)?;
        self.owed.extend(new.into_iter().map(|n| n.delivery_id));
        self.since_ms = now - OVERLAP_MS;
        let names: Vec<String> = self
            .targets
            .iter()
            .map(|t| t.hook.config.name.clone())
            .collect();
        for _ in 0..SEND_PER_LOOK_MAX {
            if shutdown.load(Ordering::Relaxed) {
                break;
            }
            let now = stephost_core::clock::now_ms();
            let Some(notice) = store
                .take_notices(&names, now, now + self.hold_ms, 1)?
                .pop()
            else {
                break;
            };
            let attempt = self.send(&notice);
            // Not recorded if this attempt outlived its hold and another
            // server took the notice over: its answer stands.
            store.notice_tried(&notice.delivery_id, notice.next_at_ms, &attempt)?;
        }
        Ok(())
    }

    /// The notices the ledger's current state calls for.
    fn events(&self, store: &dyn Store) -> StoreResult<Vec<Notice>> {
        let now = stephost_core::clock::now_ms();
        let mut bodies = Vec::new();
        for open in store.open_calls(CallState::Unknown, None)? {
            bodies.push((
                NoticeEvent::Parked,
                open.run.run_id.clone(),
                Some(open.call.seq),
                about(
                    &open.run,
                    json!({
                        "seq": open.call.seq,
                        "call": stephost_host::service::call_name(&open.call),
                        "operation_id": open.call.operation_id,
                    }),
                ),
            ));
        }
        for open in store.open_calls(CallState::Started, Some(approvals::INTERFACE))? {
            let request: serde_json::Value =
                serde_json::from_str(&open.call.request).unwrap_or_default();
            bodies.push((
                NoticeEvent::Approval,
                open.run.run_id.clone(),
                Some(open.call.seq),
                about(
                    &open.run,
                    json!({
                        "seq": open.call.seq,
                        "subject": request["subject"],
                        "details_sha256": request["details_sha256"],
                        "expires_at_ms": approvals::expires_at_ms(&open.call),
                    }),
                ),
            ));
        }
        for (status, event) in [
            (RunStatus::Failed, NoticeEvent::Failed),
            (RunStatus::Diverged, NoticeEvent::Diverged),
        ] {
            let runs = store.runs(&RunQuery {
                status: Some(status),
                updated_after_ms: Some(self.since_ms),
                ..RunQuery::default()
            })?;
            for run in runs {
                bodies.push((event, run.run_id.clone(), None, about(&run, json!({}))));
            }
        }
        let mut owed = Vec::new();
        for target in &self.targets {
            let name = &target.hook.config.name;
            for (event, run_id, seq, body) in &bodies {
                if !target.hook.events.contains(event) {
                    continue;
                }
                let delivery_id = notices::delivery_id(name, *event, run_id, *seq);
                let mut body = body.clone();
                body["delivery_id"] = json!(delivery_id);
                body["event"] = json!(event.as_str());
                body["webhook"] = json!(name);
                body["at_ms"] = json!(now);
                owed.push(Notice {
                    delivery_id,
                    webhook: name.clone(),
                    event: *event,
                    run_id: run_id.clone(),
                    body: body.to_string(),
                    created_at_ms: now,
                    state: NoticeState::Owed,
                    next_at_ms: now,
                    attempts: 0,
                    delivered_at_ms: None,
                    last_error: None,
                });
            }
        }
        Ok(owed)
    }

    /// One delivery attempt.
    fn send(&self, notice: &Notice) -> NoticeAttempt {
        let Some(target) = self
            .targets
            .iter()
            .find(|t| t.hook.config.name == notice.webhook)
        else {
            return NoticeAttempt::Abandoned {
                error: format!(
                    "no webhook named {:?} is configured any more",
                    notice.webhook
                ),
            };
        };
        let config = &target.hook.config;
        let signature = format!(
            "sha256={}",
            hex::encode(target.key.mac(notice.body.as_bytes()))
        );
        let result = ureq::http::Request::post(&config.url)
            .header("Content-Type", "application/json")
            .header("Stephost-Delivery", &notice.delivery_id)
            .header("Stephost-Event", notice.event.as_str())
            .header("Stephost-Signature", signature)
            .body(notice.body.clone())
            .map_err(|e| e.to_string())
            .and_then(|request| target.agent.run(request).map_err(|e| e.to_string()));
        let error = match result {
            Ok(response) if response.status().is_success() => {
                return NoticeAttempt::Delivered {
                    at_ms: stephost_core::clock::now_ms(),
                };
            }
            Ok(response) => format!(
                "{} answered HTTP {}",
                config.url,
                response.status().as_u16()
            ),
            Err(e) => format!("{}: {e}", config.url),
        };
        let attempts = notice.attempts + 1;
        if attempts >= config.attempts_max {
            return NoticeAttempt::Abandoned { error };
        }
        NoticeAttempt::Retry {
            next_at_ms: notices::next_attempt_at(
                stephost_core::clock::now_ms(),
                attempts,
                config.backoff_first_ms,
                config.backoff_max_ms,
            ),
            error,
        }
    }
}

/// A notice's body: what it says of the call (`fields`), and of its run.
fn about(run: &stephost_core::RunRecord, fields: serde_json::Value) -> serde_json::Value {
    let mut body = json!({
        "run_id": run.run_id,
        "status": run.status.as_str(),
        "error": run.error,
        "module_digest": run.module_digest,
        "step": run.step,
    });
    if let (Some(body), serde_json::Value::Object(fields)) = (body.as_object_mut(), fields) {
        body.extend(fields);
    }
    body
}

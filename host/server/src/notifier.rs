//! Webhook notifications: a run parked (a call's outcome is unknown), an
//! approval waiting, a run failed or diverged.
//!
//! Each look reads the runs changed since the last look (a page at a time,
//! at most `notify_page_runs_max`; on start, those changed within
//! `notify_lookback_ms`) and, of a parked or waiting run not seen at its
//! version, its last call alone; owes each webhook a notice for each event
//! it takes (in the ledger, under a delivery id derived from the event, so
//! an event is owed once whoever sees it first), then sends the notices
//! due. Nothing is read of the runs that did not change. A notice is marked delivered only on a 2xx answer; otherwise it is
//! sent again with a doubling wait, up to the webhook's attempts. A notice
//! owed when the server dies is still owed when it (or another server on
//! the ledger) starts: delivery is at least once, and receivers
//! deduplicate by the `Stephost-Delivery` header.
//!
//! Each attempt is signed: `Stephost-Timestamp: SECONDS` (Unix time of the
//! attempt) and `Stephost-Signature: sha256=HEX`, the HMAC-SHA256 under the
//! webhook's secret of `SECONDS.DELIVERY_ID.BODY` ([`signed_text`]): the
//! deduplication header and the time are covered with the body, so a
//! receiver can refuse a replayed old request. An attempt's error, which
//! readers of the API see, names the webhook, never its URL (which may hold
//! a secret).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use stephost_core::mac::MacKey;
use stephost_core::notices::{self, Notice, NoticeAttempt, NoticeEvent, NoticeState};
use stephost_core::store::RunQuery;
use stephost_core::{CallState, Outbox, RunRecord, RunStatus, StoreResult, Views, approvals};
use stephost_runtime::config::Webhook;

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
    /// Runs whose notices this process owed, at the version it saw, and
    /// when they changed (owing them again is a no-op, but a write); those
    /// that changed before the looks reach are forgotten, and all once
    /// there are [`SEEN_RUNS_MAX`].
    seen: HashMap<String, (i64, i64)>,
    /// Runs changed after this time are looked at.
    since_ms: i64,
    /// The look under way over the runs changed since `since_ms`, when it
    /// takes more than one page.
    scan: Option<Scan>,
    /// Runs read in one look, at most.
    page_runs_max: usize,
    /// How long a taken notice is held (see [`HOLD_MARGIN_MS`]).
    hold_ms: i64,
}

/// A look over the changed runs, a page at a time.
struct Scan {
    started_ms: i64,
    /// The last run of the page before.
    after: Option<String>,
}

/// Runs the notifier remembers having owed notices for, at most.
pub const SEEN_RUNS_MAX: usize = 100_000;

/// Runs changed this long before the last look are looked at again.
const OVERLAP_MS: i64 = 60_000;

/// A taken notice is held from other servers for the longest attempt's
/// time limit and this much more.
const HOLD_MARGIN_MS: i64 = 5_000;

impl Notifier {
    pub fn new(webhooks: Vec<Webhook>, lookback_ms: i64, page_runs_max: usize) -> Self {
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
            seen: HashMap::new(),
            since_ms: stephost_core::clock::now_ms().saturating_sub(lookback_ms),
            scan: None,
            page_runs_max: page_runs_max.max(1),
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
        let mut roles: Option<(Box<dyn Views>, Box<dyn Outbox>)> = None;
        while !shutdown.load(Ordering::Relaxed) {
            let result = match &roles {
                Some((views, outbox)) => self.look(views.as_ref(), outbox.as_ref(), shutdown),
                None => pool
                    .views()
                    .and_then(|views| Ok((views, pool.outbox()?)))
                    .map(|r| roles = Some(r)),
            };
            if let Err(e) = result {
                stephost_runtime::logs::warn(
                    "serve",
                    None,
                    format_args!("notifications: {e}; trying again"),
                );
            }
            std::thread::sleep(every);
        }
    }

    /// One look: owe what is new, send what is due (until `shutdown`).
    pub fn look(
        &mut self,
        views: &dyn Views,
        outbox: &dyn Outbox,
        shutdown: &AtomicBool,
    ) -> StoreResult<()> {
        self.owe(views, outbox)?;
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
            let Some(notice) = outbox
                .take_notices(&names, now, now + self.hold_ms, 1)?
                .pop()
            else {
                break;
            };
            let attempt = self.send(&notice);
            // Not recorded if this attempt outlived its hold and another
            // server took the notice over: its answer stands.
            outbox.notice_tried(&notice.delivery_id, notice.next_at_ms, &attempt)?;
        }
        Ok(())
    }

    /// Reads a page of the runs changed since the last look and owes the
    /// notices their events call for.
    fn owe(&mut self, store: &dyn Views, outbox: &dyn Outbox) -> StoreResult<()> {
        let now = stephost_core::clock::now_ms();
        let scan = self.scan.get_or_insert(Scan {
            started_ms: now,
            after: None,
        });
        let page = store.runs(&RunQuery {
            updated_after_ms: Some(self.since_ms),
            after_run_id: scan.after.clone(),
            limit: Some(self.page_runs_max),
            ..RunQuery::default()
        })?;
        let last_page = page.len() < self.page_runs_max;
        let mut bodies = Vec::new();
        let mut owed_for = Vec::new();
        for run in &page {
            if self.seen.get(&run.run_id).map(|s| s.0) == Some(run.version) {
                continue;
            }
            if let Some(event) = event_of(store, run)? {
                bodies.push(event);
                owed_for.push((run.run_id.clone(), (run.version, run.updated_at_ms)));
            }
        }
        outbox.owe_notices(&self.notices(bodies, now))?;
        if self.seen.len() + owed_for.len() > SEEN_RUNS_MAX {
            self.seen.clear();
        }
        self.seen.extend(owed_for);
        match last_page {
            false => {
                let after = page.last().map(|r| r.run_id.clone());
                if let Some(scan) = self.scan.as_mut() {
                    scan.after = after;
                }
            }
            true => {
                let started = self.scan.take().map_or(now, |s| s.started_ms);
                self.since_ms = started - OVERLAP_MS;
                let since = self.since_ms;
                self.seen.retain(|_, (_, at)| *at > since);
            }
        }
        Ok(())
    }

    /// The notices owed to each webhook for `events`.
    fn notices(&self, events: Vec<Event>, now: i64) -> Vec<Notice> {
        let mut owed = Vec::new();
        for target in &self.targets {
            let name = &target.hook.config.name;
            for (event, run_id, seq, body) in &events {
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
        owed
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
        let at_s = stephost_core::clock::now_ms() / 1_000;
        let signature = format!(
            "sha256={}",
            hex::encode(
                target
                    .key
                    .mac(signed_text(at_s, &notice.delivery_id, &notice.body).as_bytes())
            )
        );
        let result = ureq::http::Request::post(&config.url)
            .header("Content-Type", "application/json")
            .header("Stephost-Delivery", &notice.delivery_id)
            .header("Stephost-Event", notice.event.as_str())
            .header("Stephost-Timestamp", at_s.to_string())
            .header("Stephost-Signature", signature)
            .body(notice.body.clone())
            .map_err(|e| redact(&e.to_string(), &config.url))
            .and_then(|request| {
                target
                    .agent
                    .run(request)
                    .map_err(|e| attempt_error(&e, &config.url))
            });
        let error = match result {
            Ok(response) if response.status().is_success() => {
                return NoticeAttempt::Delivered {
                    at_ms: stephost_core::clock::now_ms(),
                };
            }
            Ok(response) => format!(
                "webhook {:?} answered HTTP {}",
                config.name,
                response.status().as_u16()
            ),
            Err(e) => format!("webhook {:?}: {e}", config.name),
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

/// An event a run calls for: its kind, run id, call and body.
type Event = (NoticeEvent, String, Option<u64>, serde_json::Value);

/// The event `run`'s state calls for, if any: a parked run's unknown call,
/// a waiting run's approval (its last call, read alone), a failed or
/// diverged run.
fn event_of(store: &dyn Views, run: &RunRecord) -> StoreResult<Option<Event>> {
    let id = run.run_id.clone();
    Ok(match run.status {
        RunStatus::Parked => match store.last_call(&run.run_id)? {
            Some(call) if call.state == CallState::Unknown => Some((
                NoticeEvent::Parked,
                id,
                Some(call.seq),
                about(
                    run,
                    json!({
                        "seq": call.seq,
                        "call": stephost_runtime::service::call_name(&call),
                        "operation_id": call.operation_id,
                    }),
                ),
            )),
            // Parked at a model call over its budget: nothing recorded.
            _ => run
                .error
                .as_deref()
                .filter(|_| stephost_core::lifecycle::parked_over_budget(run))
                .map(|error| {
                    (
                        NoticeEvent::Parked,
                        id,
                        None,
                        about(run, json!({ "budget": error })),
                    )
                }),
        },
        RunStatus::Waiting => match store.last_call(&run.run_id)? {
            Some(call)
                if call.state == CallState::Started && call.interface == approvals::INTERFACE =>
            {
                let request: serde_json::Value =
                    serde_json::from_str(&call.request).unwrap_or_default();
                Some((
                    NoticeEvent::Approval,
                    id,
                    Some(call.seq),
                    about(
                        run,
                        json!({
                            "seq": call.seq,
                            "subject": request["subject"],
                            "details_sha256": request["details_sha256"],
                            "expires_at_ms": approvals::expires_at_ms(&call),
                        }),
                    ),
                ))
            }
            _ => None,
        },
        RunStatus::Failed => Some((NoticeEvent::Failed, id, None, about(run, json!({})))),
        RunStatus::Diverged => Some((NoticeEvent::Diverged, id, None, about(run, json!({})))),
        _ => None,
    })
}

/// What an attempt's signature covers: the attempt's Unix time in seconds,
/// the delivery id and the body, joined by `.`.
pub fn signed_text(at_s: i64, delivery_id: &str, body: &str) -> String {
    format!("{at_s}.{delivery_id}.{body}")
}

/// A failed request's error, without the webhook's URL.
fn attempt_error(e: &ureq::Error, url: &str) -> String {
    match e {
        ureq::Error::BadUri(_) => "its url is not a valid URI".to_string(),
        other => redact(&other.to_string(), url),
    }
}

/// `text` without `url` or the parts of it that may hold a secret: the
/// user and password, the path and the query.
fn redact(text: &str, url: &str) -> String {
    let mut text = text.replace(url, "(its url)");
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && !userinfo.is_empty()
    {
        text = text.replace(userinfo, "…");
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    for secret in [tail, path, query] {
        if secret.len() >= 4 {
            text = text.replace(secret, "…");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_error_holds_no_part_of_the_url_that_may_be_secret() {
        let url = "https://user:pw-123@hooks.example/services/T0/SECRETPATH?token=SECRETQUERY";
        let said = redact(
            &format!("failed to reach {url}; path services/T0/SECRETPATH, token=SECRETQUERY"),
            url,
        );
        for secret in ["SECRETPATH", "SECRETQUERY", "pw-123"] {
            assert!(!said.contains(secret), "{said}");
        }
    }
}

//! One call of an effect going through the journal: every attempt under
//! the effect's retry policy (the one retry owner), a write in doubt asked
//! about at its receiver, and a call found in flight reconciled. Live I/O
//! happens only here, which the journal invokes from its one durable
//! wrapper; nothing else reaches a handler.

use stephost_core::CallClass;
use stephost_core::journal::{
    Attempts, CallErrorKind, LiveCall, OpContext, Outcome, Performed, Reconciled,
};

use crate::handler::{
    Effect, Failure, Lookup, RESPONSE_TOO_LARGE, Request, SPENT, Spend, check_receipt,
    payload_sha256,
};

/// One `effects.call` going through the journal.
pub struct EffectCall<'a> {
    pub effect: &'a Effect,
    pub name: &'a str,
    pub body: &'a str,
    /// Largest response recorded, in bytes.
    pub payload_bytes_max: usize,
    /// Wait between attempts; tests pass a no-op.
    pub sleep: &'a dyn Fn(std::time::Duration),
    /// What is left of the execution's `wall_ms_max`: retries stop there
    /// too, whatever the effect's own deadline.
    pub wall_left: std::time::Duration,
    /// What the call uses besides its effect.
    pub services: &'a crate::services::Services,
    /// What its attempts have cost (a model call's).
    pub spend: Spend,
    /// When the call must be over (set as its first attempt starts).
    pub deadline: Option<std::time::Instant>,
    /// A write sent again after an execution that may have sent it ended
    /// ([`LiveCall::reconcile`] said perform it again): its first attempt
    /// here is already a resend, so an error answer does not say it did
    /// not happen.
    pub resent: bool,
}

/// What asking the receiver about an operation established.
enum Answer {
    /// A receipt for this operation: it happened.
    Receipt(String),
    /// The receiver says it has no record of the operation (yet).
    NotFound,
    /// Nothing either way (no lookup, the lookup failed, or its answer
    /// proves nothing), and why.
    CannotTell(String),
}

impl EffectCall<'_> {
    /// After a write that may have acted failed and will not be sent again:
    /// asks the receiver. A receipt makes it a success; anything else
    /// leaves it `unknown` (the journal parks the run) rather than a guess.
    /// "No record" is no proof either: asked right after a timeout, a
    /// receiver that got the request and has not committed it yet says the
    /// same as one that never got it.
    fn settle(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>, last: &str) -> Performed {
        let reason = match self.ask(op, attempts) {
            Answer::Receipt(receipt) => {
                return Outcome::Ok(serde_json::Value::String(receipt)).into();
            }
            Answer::NotFound if stephost_core::crash::broken("not-found-as-failed") => {
                return Outcome::error(
                    CallErrorKind::Exhausted,
                    format!("the receiver has no record of the operation; last failure: {last}"),
                )
                .into();
            }
            Answer::NotFound => "the receiver has no record of the operation yet, which does \
                                 not prove it never will (it may not have committed it)"
                .to_string(),
            Answer::CannotTell(reason) => reason,
        };
        Performed::Unknown(format!("{last}; {reason}"))
    }

    /// Asks the receiver about the operation, again under the effect's
    /// retry policy while the lookup fails for a reason that may pass.
    fn ask(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Answer {
        let first = std::time::Instant::now();
        let mut started = stephost_core::clock::now_ms();
        let mut lookup = self.effect.handler.lookup(&self.request(op));
        let mut n = 1;
        while let Err(Failure::Retryable { message, .. }) = &lookup {
            let pause = self.effect.retry.backoff(n + 1, 0.5);
            if n >= self.effect.retry.attempts_max.max(1)
                || first.elapsed().saturating_add(pause) > self.wall_left
            {
                break;
            }
            attempts.record("lookup", started, "error", Some(message));
            n += 1;
            (self.sleep)(pause);
            started = stephost_core::clock::now_ms();
            lookup = self.effect.handler.lookup(&self.request(op));
        }
        match lookup {
            Ok(Lookup::Found(receipt)) => {
                match check_receipt(
                    &receipt,
                    &self.effect.receipt_pointer,
                    op.operation_id,
                    &self.effect.handler.payload_sha256(self.body),
                ) {
                    Ok(()) => {
                        attempts.record("lookup", started, "found", None);
                        Answer::Receipt(receipt)
                    }
                    Err(reason) => {
                        attempts.record("lookup", started, "foreign_receipt", Some(&reason));
                        Answer::CannotTell(reason)
                    }
                }
            }
            Ok(Lookup::NotFound) => {
                attempts.record("lookup", started, "not_found", None);
                Answer::NotFound
            }
            Ok(Lookup::Unsupported) => {
                Answer::CannotTell("the receiver offers no lookup".to_string())
            }
            Err(failure) => {
                attempts.record("lookup", started, "error", Some(failure.message()));
                Answer::CannotTell(format!("the lookup failed: {}", failure.message()))
            }
        }
    }

    fn request<'r>(&'r self, op: &'r OpContext<'_>) -> Request<'r> {
        Request {
            run_id: op.run_id,
            seq: op.seq,
            effect: self.name,
            class: op.class,
            operation_id: op.operation_id,
            fence: op.fence,
            body: self.body,
            services: self.services,
            redacted: self.effect.redaction.is_some(),
            trace: op.trace,
            spend: &self.spend,
            deadline: self.deadline,
            control: None,
        }
    }

    /// Every attempt of the call, under its effect's retry policy.
    fn attempt(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Performed {
        let policy = &self.effect.retry;
        let first = std::time::Instant::now();
        self.deadline =
            Some(first + std::time::Duration::from_millis(policy.deadline_ms).min(self.wall_left));
        let attempts_max = policy.attempts_max.max(1);
        let mut n = 1;
        let mut ambiguous = self.resent;
        loop {
            if !attempts.may_send() {
                // Not recorded: the execution stops (Attempts::may_send).
                return Performed::Unknown(String::new());
            }
            let started = stephost_core::clock::now_ms();
            let another;
            let mut request = self.request(op);
            request.control = attempts.control();
            if n > 1 && stephost_core::crash::broken("resend-with-another-key") {
                another = format!("{}-attempt-{n}", op.operation_id);
                request.operation_id = &another;
            }
            let result = self.effect.handler.perform(&request);
            match &result {
                Ok(reply) => attempts.record("send", started, "ok", reply.detail.as_deref()),
                Err(f) => attempts.record("send", started, f.label(), Some(f.message())),
            }
            // A failed attempt may have waited long (a handler waits for
            // capacity, a reply comes late): not held any more, the call is
            // left for the run's next owner rather than recorded failed.
            if result.is_err() && !attempts.may_send() {
                return Performed::Unknown(String::new());
            }
            match result {
                Ok(reply) if reply.body.len() > self.payload_bytes_max => {
                    // The receiver acted: the call succeeded even though its
                    // response is too large to record in full (what it cost
                    // is kept beside its size). A write's answer is kept
                    // without its body where the handler can say so.
                    if op.class == CallClass::Write
                        && let Some(answer) = self
                            .effect
                            .handler
                            .answer_without_body(&reply.body)
                            .filter(|a| a.len() <= self.payload_bytes_max)
                    {
                        return Outcome::Ok(serde_json::Value::String(answer)).into();
                    }
                    let mut summary = serde_json::json!({
                        RESPONSE_TOO_LARGE: reply.body.len(),
                        "stephost_response_sha256": payload_sha256(&reply.body),
                    });
                    if let Some(spent) = self.spend.spent() {
                        summary[SPENT] = serde_json::json!(spent);
                    }
                    return Outcome::Ok(serde_json::Value::String(summary.to_string())).into();
                }
                // A resend answered with an error after an attempt that may
                // have acted: the receiver is asked what happened.
                Ok(reply) if reply.refusal && ambiguous && op.class == CallClass::Write => {
                    return self.settle(
                        op,
                        attempts,
                        "a resend, after an attempt that may have acted, was answered with an \
                         error status",
                    );
                }
                Ok(reply) => {
                    if reply.duplicate {
                        attempts.count("idempotency_key_hit_total");
                    }
                    return Outcome::Ok(serde_json::Value::String(reply.body)).into();
                }
                Err(Failure::Rejected(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Rejected, m).into();
                }
                // After an attempt that may have acted, a refusal that is not
                // declared final does not say the operation did not happen.
                Err(Failure::Refused(m)) if op.class == CallClass::Write && ambiguous => {
                    return self.settle(op, attempts, &m);
                }
                Err(Failure::Refused(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Rejected, m).into();
                }
                Err(Failure::Invalid(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Invalid, m).into();
                }
                Err(Failure::Retryable {
                    message,
                    retry_after,
                    maybe_received,
                }) => {
                    let write = op.class == CallClass::Write;
                    let idempotent = self.effect.handler.idempotent();
                    ambiguous |= maybe_received;
                    // A write the receiver may have acted on is resent only
                    // where the receiver deduplicates; otherwise ask it.
                    if write && maybe_received && !idempotent {
                        return self.settle(op, attempts, &message);
                    }
                    let deadline =
                        std::time::Duration::from_millis(policy.deadline_ms).min(self.wall_left);
                    let mut pause = policy.backoff(
                        n + 1,
                        (stephost_core::clock::now_ns() % 1000) as f64 / 1000.0,
                    );
                    // A receiver's hint is followed up to the deadline, never
                    // past it; no sum of durations can overflow.
                    if let Some(hint) = retry_after {
                        pause = pause.max(hint.min(deadline));
                    }
                    let elapsed = first.elapsed();
                    if n >= attempts_max || elapsed.saturating_add(pause) > deadline {
                        attempts.count("retry_exhausted_total");
                        if write && ambiguous {
                            // "Exhausted" would claim it did not happen.
                            return self.settle(op, attempts, &message);
                        }
                        return Outcome::error(
                            CallErrorKind::Exhausted,
                            format!("{n} attempt(s) failed; last: {message}"),
                        )
                        .into();
                    }
                    n += 1;
                    attempts.count("activity_retry_total");
                    (self.sleep)(pause);
                }
            }
        }
    }
}

impl LiveCall for EffectCall<'_> {
    fn perform(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Performed {
        let performed = self.attempt(op, attempts);
        // A failed call still records what its attempts may have cost.
        match (performed, self.spend.spent()) {
            (Performed::Done(Outcome::Err(mut error)), Some(spent)) => {
                error.spent = Some(spent);
                Performed::Done(Outcome::Err(error))
            }
            (performed, _) => performed,
        }
    }

    fn reconciles_writes(&self) -> bool {
        true
    }

    fn resend_is_harmless(&self) -> bool {
        self.effect.handler.idempotent()
    }

    fn reconcile(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Reconciled {
        attempts.count("reconciliation_total");
        // The class recorded with the call decides, not today's configuration.
        if op.class != CallClass::Write {
            return Reconciled::PerformAgain;
        }
        let idempotent = self.effect.handler.idempotent();
        match self.ask(op, attempts) {
            Answer::Receipt(receipt) => {
                Reconciled::Outcome(Outcome::Ok(serde_json::Value::String(receipt)))
            }
            // A receiver that deduplicates may be sent the request again with
            // the same operation id: it acts at most once.
            Answer::NotFound | Answer::CannotTell(_) if idempotent => {
                self.resent = true;
                Reconciled::PerformAgain
            }
            Answer::NotFound => Reconciled::Unknown(
                "the receiver has no record of the operation but does not deduplicate, so \
                 resending could act twice"
                    .to_string(),
            ),
            Answer::CannotTell(reason) => {
                Reconciled::Unknown(format!("{reason}, and the receiver does not deduplicate"))
            }
        }
    }
}

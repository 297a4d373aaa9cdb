//! The tamper-evident record of a run: a chain over its calls, and a seal
//! over its row.
//!
//! Each finished call carries a link over the link before it, its run id,
//! seq, class, interface, function, operation id, request hash (itself
//! checked against the stored request), state, outcome and who decided it,
//! so changing, dropping, reordering or moving any recorded call (into
//! another run included) breaks every link after it. Timestamps are not
//! covered: they are not part of what a replay feeds back.
//!
//! The run's row carries a seal: keyed digests of its input, its module,
//! its end (status when finished, output, error, exit code) and its calls
//! (how many are linked, and the last link), rewritten by every write that
//! changes them at rest (an execution's end, a person's decision, a repin).
//! So an edited row, or calls dropped from the end, are detected too, and
//! `verify` names which part changed.
//!
//! Every run is sealed when it is recorded, so a row without a seal was
//! stripped of it: it does not verify.
//!
//! With a key ([`Signer::keyed`]) links are HMAC-SHA256s (`k3:`) and so are
//! seals (`k2:`): without the key nobody can make a record that verifies.
//! Without one they are plain SHA-256 (`h3:`, `h2:`): evidence against
//! accidents, not against someone who can write the ledger, and `verify`
//! says it is unsigned. Links of the earlier formats are still checked:
//! `k2:`/`h2:` (not covering the run id) and bare hex (not covering who
//! decided either).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::mac::{MacKey, ct_eq};
use crate::records::{CallRecord, CallState, RunRecord};

/// The prefix of a link made with a key.
pub const SIGNED: &str = "k3:";
/// The prefix of a link made without.
pub const PLAIN: &str = "h3:";
/// The prefixes of a seal's digests (and of links of the second format,
/// which did not cover the run id), with a key and without.
const SIGNED_V2: &str = "k2:";
const PLAIN_V2: &str = "h2:";

/// Whether a link or seal digest was made with a key.
fn is_signed(digest: &str) -> bool {
    digest.starts_with(SIGNED) || digest.starts_with(SIGNED_V2)
}

/// The fewest bytes a chain key may have.
pub const KEY_BYTES_MIN: usize = 32;

/// Makes links and seals: with the operator's key, or plain.
#[derive(Clone, Default)]
pub struct Signer {
    key: Option<Arc<MacKey>>,
}

impl Signer {
    /// The operator's key, when there is one (redaction hashes values with
    /// it too, apart from the links).
    pub fn mac_key(&self) -> Option<&MacKey> {
        self.key.as_deref()
    }
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_keyed() {
            "Signer(keyed)"
        } else {
            "Signer(plain)"
        })
    }
}

/// The end of a run's chain: the last linked call and its link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub link: String,
}

/// A run's seal, as stored in its row (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The calls linked when it was made.
    pub calls: u64,
    /// The last of their links.
    pub head: String,
    pub input: String,
    pub module: String,
    pub end: String,
    /// Over `calls` and `head`.
    pub chain: String,
}

/// Why a run's record does not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The call where the chain breaks, if it is a call.
    pub seq: Option<u64>,
    pub reason: String,
    /// Nothing is known to be changed: the record is signed and no key was
    /// given to check it with.
    pub needs_key: bool,
}

/// Why a signed record cannot be checked without the key.
const NEEDS_KEY: &str =
    "set the chain key (STEPHOST_CHAIN_KEY_FILE or STEPHOST_CHAIN_KEY) to check it";

/// What checking a run's record found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub links: usize,
    /// Every link and the seal were made with the key checked against.
    pub signed: bool,
}

impl Broken {
    /// A break in the run's row (not at a call).
    fn row(reason: impl Into<String>) -> Self {
        Broken {
            seq: None,
            reason: reason.into(),
            needs_key: false,
        }
    }

    fn at(seq: u64, reason: impl Into<String>) -> Self {
        Broken {
            seq: Some(seq),
            reason: reason.into(),
            needs_key: false,
        }
    }
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "call #{seq}: {}", self.reason),
            None => write!(f, "its row: {}", self.reason),
        }
    }
}

impl Signer {
    /// Links and seals are HMACs under `key` (at least [`KEY_BYTES_MIN`]).
    pub fn keyed(key: &[u8]) -> Result<Self, String> {
        if key.len() < KEY_BYTES_MIN {
            return Err(format!(
                "the chain key has {} bytes; it needs at least {KEY_BYTES_MIN} (for example \
                 `head -c 32 /dev/urandom | base64`)",
                key.len()
            ));
        }
        Ok(Signer {
            key: Some(Arc::new(MacKey::new(key))),
        })
    }

    /// Plain SHA-256 links and seals.
    pub fn plain() -> Self {
        Signer::default()
    }

    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// The prefix of this signer's links.
    fn link_prefix(&self) -> &'static str {
        if self.is_keyed() { SIGNED } else { PLAIN }
    }

    /// The prefix of this signer's seal digests (and second-format links).
    fn seal_prefix(&self) -> &'static str {
        if self.is_keyed() { SIGNED_V2 } else { PLAIN_V2 }
    }

    fn hasher(&self, domain: &[u8]) -> Sha256 {
        let mut h = match &self.key {
            Some(key) => key.start(),
            None => Sha256::new(),
        };
        h.update(domain);
        h
    }

    fn finish_into(&self, out: &mut String, prefix: &str, h: Sha256) {
        let digest: [u8; 32] = match &self.key {
            Some(key) => key.finish(h),
            None => h.finalize().into(),
        };
        out.clear();
        out.push_str(prefix);
        crate::ids::push_hex(out, &digest);
    }

    fn digest(&self, domain: &[u8], fields: &[&[u8]]) -> String {
        let mut h = self.hasher(domain);
        feed(&mut h, fields);
        let mut out = String::new();
        self.finish_into(&mut out, self.seal_prefix(), h);
        out
    }

    /// The link of `call` of run `run_id`, finished with `state`, `outcome`
    /// and (for a person's decision) `resolved_by`, following `previous`,
    /// into `out`.
    pub fn link_into(
        &self,
        out: &mut String,
        run_id: &str,
        previous: &str,
        finished: &Finished<'_>,
    ) {
        let mut h = self.hasher(b"stephost/chain/v3");
        feed(&mut h, &[run_id.as_bytes()]);
        feed_link(
            &mut h,
            previous,
            finished.call,
            finished.state,
            finished.outcome,
        );
        feed(&mut h, &[finished.resolved_by.unwrap_or("").as_bytes()]);
        self.finish_into(out, self.link_prefix(), h);
    }

    /// [`Signer::link_into`], returned.
    pub fn link(&self, run_id: &str, previous: &str, finished: &Finished<'_>) -> String {
        let mut out = String::new();
        self.link_into(&mut out, run_id, previous, finished);
        out
    }

    /// A link of the second format, which did not cover the run id.
    fn link_v2(&self, previous: &str, call: &CallRecord) -> String {
        let mut h = self.hasher(b"stephost/chain/v2");
        feed_link(&mut h, previous, call, call.state, call.outcome.as_deref());
        feed(
            &mut h,
            &[call.resolved_by.as_deref().unwrap_or("").as_bytes()],
        );
        let mut out = String::new();
        self.finish_into(&mut out, self.seal_prefix(), h);
        out
    }

    /// The seal of `run`'s row with its chain ending at `head`.
    pub fn seal(&self, run: &RunRecord, head: &Head) -> String {
        serde_json::to_string(&self.seal_parts(run, head)).expect("a seal serializes")
    }

    /// [`Signer::seal`], as its parts.
    fn seal_parts(&self, run: &RunRecord, head: &Head) -> Seal {
        // A run's own budget is sealed with its input (a run without one
        // seals as before budgets were kept).
        let budget = run.budget.to_column();
        let mut input: Vec<&[u8]> = vec![run.run_id.as_bytes(), run.input.as_bytes()];
        input.extend(budget.as_deref().map(str::as_bytes));
        // A child's parent and root are sealed with its input (a root seals
        // as before children were kept).
        let parent = run.parent.as_ref().map(|p| {
            format!(
                "parent:{}#{}#{}#{}",
                p.run_id,
                p.seq,
                p.join_set,
                run.root_run_id.as_deref().unwrap_or("")
            )
        });
        input.extend(parent.as_deref().map(str::as_bytes));
        // A fork's source is sealed with its input (a run that is no fork
        // seals as before forks were kept).
        let fork = run.fork.as_ref().map(|f| {
            format!(
                "fork:{}#{}#{}#{}",
                f.run_id,
                f.seq,
                f.link.as_deref().unwrap_or(""),
                f.operations
            )
        });
        input.extend(fork.as_deref().map(str::as_bytes));
        Seal {
            calls: head.seq,
            head: head.link.clone(),
            input: self.digest(b"stephost/seal/input", &input),
            module: self.digest(
                b"stephost/seal/module",
                &[
                    run.run_id.as_bytes(),
                    run.module_digest.as_bytes(),
                    run.world.as_bytes(),
                    run.step.as_deref().unwrap_or("").as_bytes(),
                ],
            ),
            end: self.end_digest(run),
            chain: self.digest(
                b"stephost/seal/chain",
                &[
                    run.run_id.as_bytes(),
                    &head.seq.to_le_bytes(),
                    head.link.as_bytes(),
                ],
            ),
        }
    }

    /// A finished run's end: status, output, error and exit code. An
    /// unfinished run's status moves without a seal (claims, releases), so
    /// it is sealed as "open" with what it has.
    fn end_digest(&self, run: &RunRecord) -> String {
        let status = if run.status.is_finished() {
            run.status.as_str()
        } else {
            "open"
        };
        let exit = run.exit_code.map(|c| c.to_string()).unwrap_or_default();
        self.digest(
            b"stephost/seal/end",
            &[
                run.run_id.as_bytes(),
                status.as_bytes(),
                run.output.as_deref().unwrap_or("").as_bytes(),
                run.error.as_deref().unwrap_or("").as_bytes(),
                exit.as_bytes(),
            ],
        )
    }

    /// The seal of `run` after its module changed, keeping the chain head
    /// its current seal names; `None` if it has none.
    pub fn reseal(&self, run: &RunRecord) -> Option<String> {
        let head = run
            .seal
            .as_deref()
            .and_then(|s| serde_json::from_str::<Seal>(s).ok())
            .map(|s| Head {
                seq: s.calls,
                link: s.head,
            })?;
        Some(self.seal(run, &head))
    }

    /// Checks a run's row against its seal, and its calls (in order)
    /// against their links and the seal's head.
    pub fn verify(&self, calls: &[CallRecord], run: &RunRecord) -> Result<Verified, Broken> {
        let sealed = self.check_row(run)?;
        let (verified, head) = self.check_chain(&run.run_id, calls)?;
        // The sealed head must be in the chain: calls dropped from the end
        // leave it pointing past the last call.
        let linked = calls
            .get((sealed.seq as usize).wrapping_sub(1))
            .and_then(|c| c.chain.as_deref());
        if sealed.seq > 0 && linked.is_none_or(|l| !ct_eq(l.as_bytes(), sealed.link.as_bytes())) {
            return Err(Broken::row(format!(
                "the run was sealed with {} linked call(s) and its chain now ends at #{}: calls \
                 were dropped or changed",
                sealed.seq, head.seq
            )));
        }
        // A run at rest has nothing after its seal; a running one may.
        if !matches!(
            run.status,
            crate::records::RunStatus::Running | crate::records::RunStatus::Pending
        ) && head.seq != sealed.seq
        {
            return Err(Broken::row(format!(
                "calls #{}..#{} were added after the run was sealed",
                sealed.seq + 1,
                head.seq
            )));
        }
        Ok(verified)
    }

    /// Checks the calls (in order) of run `run_id` against their links,
    /// not against the run's seal (see [`Signer::verify`]).
    pub fn verify_chain(&self, run_id: &str, calls: &[CallRecord]) -> Result<Verified, Broken> {
        self.check_chain(run_id, calls)
            .map(|(verified, _)| verified)
    }

    /// [`Signer::verify_chain`], and the chain's head.
    fn check_chain(&self, run_id: &str, calls: &[CallRecord]) -> Result<(Verified, Head), Broken> {
        let mut previous = String::new();
        let mut links = 0;
        let mut signed = true;
        let mut head = Head::default();
        for (index, call) in calls.iter().enumerate() {
            if call.seq != index as u64 + 1 {
                return Err(Broken::at(
                    call.seq,
                    format!("call #{} stands where #{} belongs", call.seq, index + 1),
                ));
            }
            // The hash is of the request as kept (a redacted one with its
            // markers), and the link covers the hash: every byte kept is
            // covered.
            if crate::ids::request_hash(&call.interface, &call.function, &call.request)
                != call.request_hash
            {
                return Err(Broken::at(call.seq, "its request does not match its hash"));
            }
            match &call.chain {
                Some(found) => {
                    previous = self.check_link(run_id, &previous, call)?;
                    signed &= is_signed(found);
                    head = Head {
                        seq: call.seq,
                        link: previous.clone(),
                    };
                    links += 1;
                }
                // Only a call still in flight, waiting or unknown has no
                // link, and nothing can follow it.
                None if call.state.has_outcome() => {
                    return Err(Broken::at(call.seq, "a finished call has no chain link"));
                }
                None if index + 1 != calls.len() => {
                    return Err(Broken::at(
                        call.seq,
                        "an unfinished call is followed by other calls",
                    ));
                }
                None => {}
            }
        }
        let verified = Verified {
            links,
            signed: signed && self.is_keyed(),
        };
        Ok((verified, head))
    }

    /// Checks the link `call` of run `run_id` carries, following
    /// `previous`; the link, which the next call follows. A signed link
    /// without the key, or a plain one with it, is refused.
    pub fn check_link(
        &self,
        run_id: &str,
        previous: &str,
        call: &CallRecord,
    ) -> Result<String, Broken> {
        let found = call.chain.as_deref().unwrap_or("");
        let expected = if is_signed(found) {
            if !self.is_keyed() {
                return Err(Broken {
                    needs_key: true,
                    ..Broken::at(call.seq, format!("its link is signed; {NEEDS_KEY}"))
                });
            }
            self.expected_link(run_id, previous, call, found)
        } else if self.is_keyed() {
            return Err(Broken::at(
                call.seq,
                "its link is not signed with the chain key: it was recorded without the key, or \
                 forged",
            ));
        } else {
            self.expected_link(run_id, previous, call, found)
        };
        if !ct_eq(found.as_bytes(), expected.as_bytes()) {
            return Err(Broken::at(
                call.seq,
                "its chain link does not match its content and the calls before it",
            ));
        }
        Ok(expected)
    }

    /// The link `call` should carry, in the format `found` is in.
    fn expected_link(
        &self,
        run_id: &str,
        previous: &str,
        call: &CallRecord,
        found: &str,
    ) -> String {
        if found.starts_with(SIGNED) || found.starts_with(PLAIN) {
            self.link(run_id, previous, &Finished::recorded(call))
        } else if found.starts_with(SIGNED_V2) || found.starts_with(PLAIN_V2) {
            self.link_v2(previous, call)
        } else {
            link_v1(previous, call)
        }
    }

    /// Checks a run's row against its seal (not its calls: see
    /// [`Signer::verify`]); the head of the chain the seal names. A row
    /// without a seal does not verify: every run is sealed when recorded.
    pub fn check_row(&self, run: &RunRecord) -> Result<Head, Broken> {
        let Some(seal) = run.seal.as_deref() else {
            return Err(Broken::row(
                "the run's row has no seal: every run is sealed when it is recorded, so the \
                 seal was removed (or the run was recorded before seals, and nothing vouches \
                 for its row)",
            ));
        };
        let found: Seal =
            serde_json::from_str(seal).map_err(|_| Broken::row("the run's seal is not a seal"))?;
        if is_signed(&found.chain) && !self.is_keyed() {
            return Err(Broken {
                needs_key: true,
                ..Broken::row(format!("the run's seal is signed; {NEEDS_KEY}"))
            });
        }
        if self.is_keyed() && !is_signed(&found.chain) {
            return Err(Broken::row(
                "the run's seal is not signed with the chain key: it was made without the key, \
                 or forged",
            ));
        }
        let sealed_head = Head {
            seq: found.calls,
            link: found.head.clone(),
        };
        let expected = self.seal_parts(run, &sealed_head);
        let same = |a: &str, b: &str| ct_eq(a.as_bytes(), b.as_bytes());
        if !same(&found.chain, &expected.chain) {
            return Err(Broken::row(
                "the run's seal does not match the calls it names: the seal was changed",
            ));
        }
        if !same(&found.input, &expected.input) {
            return Err(Broken::row(
                "the run's input or budget was changed after it was sealed",
            ));
        }
        if !same(&found.module, &expected.module) {
            return Err(Broken::row(
                "the run's module (digest, world or step) was changed after it was sealed",
            ));
        }
        if !same(&found.end, &expected.end) {
            return Err(Broken::row(
                "the run's end (status, output, error or exit code) was changed after it was \
                 sealed",
            ));
        }
        Ok(sealed_head)
    }

    /// What an execution checks the run's recorded calls against as it
    /// replays them, with a key (`None` without: a plain chain anyone can
    /// redo, so checking it on every resume would stop no one).
    pub fn replay_check(&self, run: &RunRecord) -> Option<Result<ReplayCheck, Broken>> {
        if !self.is_keyed() {
            return None;
        }
        Some(self.check_row(run).map(|sealed| ReplayCheck {
            signer: self.clone(),
            sealed,
        }))
    }
}

/// A call and how it finished, as its link covers it.
#[derive(Debug, Clone, Copy)]
pub struct Finished<'a> {
    pub call: &'a CallRecord,
    pub state: CallState,
    pub outcome: Option<&'a str>,
    /// Who decided, for a person's decision.
    pub resolved_by: Option<&'a str>,
}

impl<'a> Finished<'a> {
    /// `call` as it is recorded.
    pub fn recorded(call: &'a CallRecord) -> Self {
        Finished {
            call,
            state: call.state,
            outcome: call.outcome.as_deref(),
            resolved_by: call.resolved_by.as_deref(),
        }
    }
}

/// Checks, with a key, each recorded call an execution replays before it
/// extends the chain or seals the run (see [`Signer::replay_check`]): an
/// edit made to the ledger between two executions is refused, never signed.
#[derive(Debug, Clone)]
pub struct ReplayCheck {
    signer: Signer,
    /// The head the run's seal names.
    sealed: Head,
}

impl ReplayCheck {
    /// Calls the seal names that the history must hold.
    pub fn sealed_calls(&self) -> u64 {
        self.sealed.seq
    }

    /// Checks finished call `call` of run `run_id`, replayed after the
    /// call whose link is `previous`.
    pub fn replayed(&self, run_id: &str, previous: &str, call: &CallRecord) -> Result<(), Broken> {
        let link = self.signer.check_link(run_id, previous, call)?;
        if call.seq == self.sealed.seq && !ct_eq(link.as_bytes(), self.sealed.link.as_bytes()) {
            return Err(Broken::at(
                call.seq,
                "its link is not the one the run's seal names: calls were changed",
            ));
        }
        Ok(())
    }
}

use crate::ids::feed_fields as feed;

/// The fields every link covers, in order (who decided follows in v2).
fn feed_link(
    h: &mut Sha256,
    previous: &str,
    call: &CallRecord,
    state: CallState,
    outcome: Option<&str>,
) {
    feed(
        h,
        &[
            previous.as_bytes(),
            &call.seq.to_le_bytes(),
            call.class.as_str().as_bytes(),
            call.interface.as_bytes(),
            call.function.as_bytes(),
            call.operation_id.as_bytes(),
            call.request_hash.as_bytes(),
            state.as_str().as_bytes(),
            outcome.unwrap_or("").as_bytes(),
        ],
    );
}

/// A link of the first format: plain SHA-256, not covering who decided.
fn link_v1(previous: &str, call: &CallRecord) -> String {
    let mut h = Sha256::new();
    h.update(b"stephost/chain/v1");
    feed_link(&mut h, previous, call, call.state, call.outcome.as_deref());
    let mut out = String::new();
    crate::ids::to_hex_into(&mut out, &h.finalize());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{CallClass, NewRun, RunStatus};

    fn run() -> RunRecord {
        let mut run = NewRun {
            run_id: "r",
            module_digest: "m",
            step: Some("step@1"),
            world: "w",
            input: r#"{"n":1}"#,
            now_ms: 1,
            budget: Default::default(),
        }
        .record(None);
        run.status = RunStatus::Completed;
        run.output = Some(r#"{"ok":true}"#.into());
        run
    }

    /// `n` finished calls linked by `signer`, and the run sealed over them.
    fn recorded(signer: &Signer, n: u64) -> (RunRecord, Vec<CallRecord>) {
        let mut calls = Vec::new();
        let mut head = Head::default();
        for seq in 1..=n {
            let request = format!("{{\"seq\":{seq}}}");
            let mut call = CallRecord {
                seq,
                class: CallClass::Write,
                interface: "i".into(),
                function: "f".into(),
                operation_id: format!("op-{seq}"),
                request_hash: crate::ids::request_hash("i", "f", &request),
                request,
                state: CallState::Succeeded,
                outcome: Some(r#"{"ok":"done"}"#.into()),
                started_at_ms: 1,
                finished_at_ms: Some(2),
                fence: 1,
                resolved_by: None,
                chain: None,
            };
            let link = signer.link("r", &head.link, &Finished::recorded(&call));
            call.chain = Some(link.clone());
            head = Head { seq, link };
            calls.push(call);
        }
        let mut run = run();
        run.seal = Some(signer.seal(&run, &head));
        (run, calls)
    }

    fn key() -> Signer {
        Signer::keyed(&[7u8; 32]).unwrap()
    }

    #[test]
    fn a_signed_record_verifies_only_with_its_key() {
        let (run, calls) = recorded(&key(), 3);
        let checked = key().verify(&calls, &run).unwrap();
        assert_eq!((checked.links, checked.signed), (3, true));
        assert!(Signer::plain().verify(&calls, &run).is_err());
        let other = Signer::keyed(&[8u8; 32]).unwrap();
        assert!(other.verify(&calls, &run).is_err());
        // A plain record passes for unsigned, never for signed.
        let (run, calls) = recorded(&Signer::plain(), 3);
        assert!(!Signer::plain().verify(&calls, &run).unwrap().signed);
        assert!(key().verify(&calls, &run).is_err());
    }

    #[test]
    fn verify_names_the_part_of_the_row_that_changed() {
        let signer = key();
        let broken = |edit: &dyn Fn(&mut RunRecord)| {
            let (mut run, calls) = recorded(&signer, 2);
            edit(&mut run);
            signer.verify(&calls, &run).unwrap_err().reason
        };
        assert!(broken(&|r| r.input = "{}".into()).contains("input"));
        assert!(
            broken(&|r| r.budget.model_tokens_max = Some(1_000_000)).contains("budget"),
            "a run's budget raised behind the host's back"
        );
        assert!(broken(&|r| r.module_digest = "m2".into()).contains("module"));
        assert!(broken(&|r| r.output = Some("{}".into())).contains("end"));
        assert!(broken(&|r| r.status = RunStatus::Failed).contains("end"));
        let (run, mut calls) = recorded(&signer, 3);
        calls.pop();
        assert!(
            signer
                .verify(&calls, &run)
                .unwrap_err()
                .reason
                .contains("dropped")
        );
    }

    #[test]
    fn a_row_stripped_of_its_seal_does_not_verify_with_a_key_or_without() {
        for signer in [key(), Signer::plain()] {
            let (mut run, mut calls) = recorded(&signer, 3);
            run.seal = None;
            run.output = Some(r#"{"forged":true}"#.into());
            calls.pop();
            let broken = signer.verify(&calls, &run).unwrap_err();
            assert!(broken.reason.contains("no seal"), "{broken}");
            assert!(signer.check_row(&run).is_err());
        }
    }

    #[test]
    fn calls_moved_from_another_run_break_their_links() {
        let signer = key();
        let (run, calls) = recorded(&signer, 2);
        let mut other = run.clone();
        other.run_id = "other".into();
        other.seal = Some(signer.seal(
            &other,
            &Head {
                seq: 2,
                link: calls[1].chain.clone().unwrap(),
            },
        ));
        let broken = signer.verify(&calls, &other).unwrap_err();
        assert_eq!(broken.seq, Some(1), "{broken}");
    }

    #[test]
    fn links_of_the_second_format_still_verify() {
        let signer = key();
        let (mut run, mut calls) = recorded(&signer, 2);
        let mut previous = String::new();
        for call in &mut calls {
            call.chain = Some(signer.link_v2(&previous, call));
            previous = call.chain.clone().unwrap();
        }
        run.seal = Some(signer.seal(
            &run,
            &Head {
                seq: 2,
                link: previous,
            },
        ));
        assert_eq!(signer.verify(&calls, &run).unwrap().links, 2);
    }

    #[test]
    fn a_replay_check_refuses_an_edited_call_and_a_moved_seal_head() {
        let signer = key();
        let (run, mut calls) = recorded(&signer, 3);
        let check = signer.replay_check(&run).unwrap().unwrap();
        assert_eq!(check.sealed_calls(), 3);
        let mut previous = String::new();
        for call in &calls {
            check.replayed("r", &previous, call).unwrap();
            previous = call.chain.clone().unwrap();
        }
        calls[1].outcome = Some(r#"{"ok":"edited"}"#.into());
        let link_1 = calls[0].chain.clone().unwrap();
        assert!(check.replayed("r", &link_1, &calls[1]).is_err());
        assert!(Signer::plain().replay_check(&run).is_none());
    }

    #[test]
    fn keys_shorter_than_the_minimum_are_refused() {
        assert!(Signer::keyed(&[1u8; KEY_BYTES_MIN - 1]).is_err());
    }
}

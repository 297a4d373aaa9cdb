//! The tamper-evident record of a run: a chain over its calls, and a seal
//! over its row.
//!
//! Each finished call carries a link over the link before it, its seq,
//! class, interface, function, operation id, request hash (itself checked
//! against the stored request), state, outcome and who decided it, so
//! changing, dropping or reordering any recorded call breaks every link
//! after it. Timestamps are not covered: they are not part of what a replay
//! feeds back.
//!
//! The run's row carries a seal: keyed digests of its input, its module,
//! its end (status when finished, output, error, exit code) and its calls
//! (how many are linked, and the last link), rewritten by every write that
//! changes them at rest (an execution's end, a person's decision, a repin).
//! So an edited row, or calls dropped from the end, are detected too, and
//! `verify` names which part changed.
//!
//! With a key ([`Signer::keyed`]) links and seals are HMAC-SHA256s
//! (`k2:`): without the key nobody can make a chain that verifies. Without
//! one they are plain SHA-256 (`h2:`): evidence against accidents, not
//! against someone who can write the ledger, and `verify` says it is
//! unsigned. Links of the first format (bare hex, no prefix) are still
//! checked; they do not cover who decided.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::mac::{MacKey, ct_eq};
use crate::records::{CallRecord, CallState, RunRecord};

/// The prefix of a link or seal digest made with a key.
pub const SIGNED: &str = "k2:";
/// The prefix of one made without.
pub const PLAIN: &str = "h2:";

/// The fewest bytes a chain key may have.
pub const KEY_BYTES_MIN: usize = 32;

/// Makes links and seals: with the operator's key, or plain.
#[derive(Clone, Default)]
pub struct Signer {
    key: Option<Arc<MacKey>>,
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
    /// The run's row carries a seal, and it was checked.
    pub sealed: bool,
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

    fn prefix(&self) -> &'static str {
        if self.is_keyed() { SIGNED } else { PLAIN }
    }

    fn hasher(&self, domain: &[u8]) -> Sha256 {
        let mut h = match &self.key {
            Some(key) => key.start(),
            None => Sha256::new(),
        };
        h.update(domain);
        h
    }

    fn finish_into(&self, out: &mut String, h: Sha256) {
        let digest: [u8; 32] = match &self.key {
            Some(key) => key.finish(h),
            None => h.finalize().into(),
        };
        out.clear();
        out.push_str(self.prefix());
        crate::ids::push_hex(out, &digest);
    }

    fn digest(&self, domain: &[u8], fields: &[&[u8]]) -> String {
        let mut h = self.hasher(domain);
        feed(&mut h, fields);
        let mut out = String::new();
        self.finish_into(&mut out, h);
        out
    }

    /// The link of `call` finished with `state`, `outcome` and (for a
    /// person's decision) `resolved_by`, following `previous`, into `out`.
    pub fn link_into(
        &self,
        out: &mut String,
        previous: &str,
        call: &CallRecord,
        state: CallState,
        outcome: Option<&str>,
        resolved_by: Option<&str>,
    ) {
        let mut h = self.hasher(b"stephost/chain/v2");
        feed_link(&mut h, previous, call, state, outcome);
        feed(&mut h, &[resolved_by.unwrap_or("").as_bytes()]);
        self.finish_into(out, h);
    }

    /// [`Signer::link_into`], returned.
    pub fn link(
        &self,
        previous: &str,
        call: &CallRecord,
        state: CallState,
        outcome: Option<&str>,
        resolved_by: Option<&str>,
    ) -> String {
        let mut out = String::new();
        self.link_into(&mut out, previous, call, state, outcome, resolved_by);
        out
    }

    /// The seal of `run`'s row with its chain ending at `head`.
    pub fn seal(&self, run: &RunRecord, head: &Head) -> String {
        serde_json::to_string(&self.seal_parts(run, head)).expect("a seal serializes")
    }

    /// [`Signer::seal`], as its parts.
    fn seal_parts(&self, run: &RunRecord, head: &Head) -> Seal {
        Seal {
            calls: head.seq,
            head: head.link.clone(),
            input: self.digest(
                b"stephost/seal/input",
                &[run.run_id.as_bytes(), run.input.as_bytes()],
            ),
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

    /// Checks a run's calls (in order) and, when `run` is given, its seal.
    pub fn verify(
        &self,
        calls: &[CallRecord],
        run: Option<&RunRecord>,
    ) -> Result<Verified, Broken> {
        let mut previous = String::new();
        let mut links = 0;
        let mut signed = true;
        let mut head = Head::default();
        for (index, call) in calls.iter().enumerate() {
            let broken = |reason: String| Broken {
                seq: Some(call.seq),
                reason,
                needs_key: false,
            };
            if call.seq != index as u64 + 1 {
                return Err(broken(format!(
                    "call #{} stands where #{} belongs",
                    call.seq,
                    index + 1
                )));
            }
            if crate::ids::request_hash(&call.interface, &call.function, &call.request)
                != call.request_hash
            {
                return Err(broken("its request does not match its hash".into()));
            }
            match &call.chain {
                Some(found) => {
                    let expected = self.expected_link(&previous, call, found)?;
                    if !ct_eq(found.as_bytes(), expected.as_bytes()) {
                        return Err(broken(
                            "its chain link does not match its content and the calls before it"
                                .into(),
                        ));
                    }
                    signed &= found.starts_with(SIGNED);
                    previous = expected;
                    head = Head {
                        seq: call.seq,
                        link: previous.clone(),
                    };
                    links += 1;
                }
                // Only a call still in flight, waiting or unknown has no
                // link, and nothing can follow it.
                None if call.state.has_outcome() => {
                    return Err(broken("a finished call has no chain link".into()));
                }
                None if index + 1 != calls.len() => {
                    return Err(broken(
                        "an unfinished call is followed by other calls".into(),
                    ));
                }
                None => {}
            }
        }
        let Some(seal) = run.and_then(|r| r.seal.as_deref()) else {
            return Ok(Verified {
                links,
                signed: signed && self.is_keyed() && links > 0,
                sealed: false,
            });
        };
        let run = run.expect("a seal comes with its run");
        self.check_seal(run, seal, &head, calls)?;
        Ok(Verified {
            links,
            signed: signed && self.is_keyed() && seal.contains(SIGNED),
            sealed: true,
        })
    }

    /// The link `call` should carry, in the format `found` is in; a
    /// signed link without the key, or a plain one with it, is refused.
    fn expected_link(
        &self,
        previous: &str,
        call: &CallRecord,
        found: &str,
    ) -> Result<String, Broken> {
        let broken = |reason: String| Broken {
            seq: Some(call.seq),
            reason,
            needs_key: false,
        };
        let outcome = call.outcome.as_deref();
        if found.starts_with(SIGNED) {
            if !self.is_keyed() {
                return Err(Broken {
                    needs_key: true,
                    ..broken(format!("its link is signed; {NEEDS_KEY}"))
                });
            }
            return Ok(self.link(
                previous,
                call,
                call.state,
                outcome,
                call.resolved_by.as_deref(),
            ));
        }
        if self.is_keyed() {
            return Err(broken(
                "its link is not signed with the chain key: it was recorded without the key, \
                 or forged"
                    .into(),
            ));
        }
        if found.starts_with(PLAIN) {
            return Ok(self.link(
                previous,
                call,
                call.state,
                outcome,
                call.resolved_by.as_deref(),
            ));
        }
        Ok(link_v1(previous, call))
    }

    fn check_seal(
        &self,
        run: &RunRecord,
        seal: &str,
        head: &Head,
        calls: &[CallRecord],
    ) -> Result<(), Broken> {
        let broken = |reason: String| Broken {
            seq: None,
            reason,
            needs_key: false,
        };
        let found: Seal = serde_json::from_str(seal)
            .map_err(|_| broken("the run's seal is not a seal".into()))?;
        if found.chain.starts_with(SIGNED) && !self.is_keyed() {
            return Err(Broken {
                needs_key: true,
                ..broken(format!("the run's seal is signed; {NEEDS_KEY}"))
            });
        }
        if self.is_keyed() && !found.chain.starts_with(SIGNED) {
            return Err(broken(
                "the run's seal is not signed with the chain key: it was made without the key, \
                 or forged"
                    .into(),
            ));
        }
        let sealed_head = Head {
            seq: found.calls,
            link: found.head.clone(),
        };
        let expected = self.seal_parts(run, &sealed_head);
        let same = |a: &str, b: &str| ct_eq(a.as_bytes(), b.as_bytes());
        if !same(&found.chain, &expected.chain) {
            return Err(broken(
                "the run's seal does not match the calls it names: the seal was changed".into(),
            ));
        }
        if !same(&found.input, &expected.input) {
            return Err(broken(
                "the run's input was changed after it was sealed".into(),
            ));
        }
        if !same(&found.module, &expected.module) {
            return Err(broken(
                "the run's module (digest, world or step) was changed after it was sealed".into(),
            ));
        }
        if !same(&found.end, &expected.end) {
            return Err(broken(
                "the run's end (status, output, error or exit code) was changed after it was \
                 sealed"
                    .into(),
            ));
        }
        // The sealed head must be in the chain: calls dropped from the end
        // leave it pointing past the last call.
        let linked = calls
            .iter()
            .find(|c| c.seq == found.calls)
            .and_then(|c| c.chain.as_deref());
        if found.calls > 0 && linked.is_none_or(|l| !same(l, &found.head)) {
            return Err(broken(format!(
                "the run was sealed with {} linked call(s) and its chain now ends at #{}: calls \
                 were dropped or changed",
                found.calls, head.seq
            )));
        }
        // A run at rest has nothing after its seal; a running one may.
        if !matches!(
            run.status,
            crate::records::RunStatus::Running | crate::records::RunStatus::Pending
        ) && head.seq != found.calls
        {
            return Err(broken(format!(
                "calls #{}..#{} were added after the run was sealed",
                found.calls + 1,
                head.seq
            )));
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
            let link = signer.link(&head.link, &call, call.state, call.outcome.as_deref(), None);
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
        let checked = key().verify(&calls, Some(&run)).unwrap();
        assert_eq!(
            (checked.links, checked.signed, checked.sealed),
            (3, true, true)
        );
        assert!(Signer::plain().verify(&calls, Some(&run)).is_err());
        let other = Signer::keyed(&[8u8; 32]).unwrap();
        assert!(other.verify(&calls, Some(&run)).is_err());
        // A plain record passes for unsigned, never for signed.
        let (run, calls) = recorded(&Signer::plain(), 3);
        assert!(!Signer::plain().verify(&calls, Some(&run)).unwrap().signed);
        assert!(key().verify(&calls, Some(&run)).is_err());
    }

    #[test]
    fn verify_names_the_part_of_the_row_that_changed() {
        let signer = key();
        let broken = |edit: &dyn Fn(&mut RunRecord)| {
            let (mut run, calls) = recorded(&signer, 2);
            edit(&mut run);
            signer.verify(&calls, Some(&run)).unwrap_err().reason
        };
        assert!(broken(&|r| r.input = "{}".into()).contains("input"));
        assert!(broken(&|r| r.module_digest = "m2".into()).contains("module"));
        assert!(broken(&|r| r.output = Some("{}".into())).contains("end"));
        assert!(broken(&|r| r.status = RunStatus::Failed).contains("end"));
        let (run, mut calls) = recorded(&signer, 3);
        calls.pop();
        assert!(
            signer
                .verify(&calls, Some(&run))
                .unwrap_err()
                .reason
                .contains("dropped")
        );
    }

    #[test]
    fn keys_shorter_than_the_minimum_are_refused() {
        assert!(Signer::keyed(&[1u8; KEY_BYTES_MIN - 1]).is_err());
    }
}

//! Identities derived by hashing: module digests, operation ids, request
//! hashes and run ids. Every field is length-prefixed so that no two
//! different inputs hash alike.

use sha2::{Digest, Sha256};

/// A string filled by `fill`.
fn filled(fill: impl FnOnce(&mut String)) -> String {
    let mut out = String::new();
    fill(&mut out);
    out
}

fn hash_fields(domain: &str, fields: &[&[u8]]) -> String {
    filled(|out| hash_fields_into(out, domain, fields))
}

/// [`hash_fields`] into `out`'s buffer.
fn hash_fields_into(out: &mut String, domain: &str, fields: &[&[u8]]) {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    for field in fields {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    to_hex_into(out, &h.finalize());
}

/// Lowercase hex, as `hex::encode` spells it, by table: three hashes are
/// spelled for every recorded call, and `hex::encode` goes through an
/// iterator of `char`s.
pub fn to_hex(bytes: &[u8]) -> String {
    filled(|out| to_hex_into(out, bytes))
}

/// [`to_hex`] into `out`'s buffer.
pub fn to_hex_into(out: &mut String, bytes: &[u8]) {
    out.clear();
    push_hex(out, bytes);
}

/// Appends `bytes` to `out` as lowercase hex.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
}

/// Feeds `fields` to `h`, each with its length first, so that no two
/// lists of fields hash alike.
pub fn feed_fields(h: &mut sha2::Sha256, fields: &[&[u8]]) {
    use sha2::Digest;
    for field in fields {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
}

/// The content address of a module: hex sha256 of its bytes.
pub fn module_digest(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

/// The stable identity of a write: derived from the business key when the
/// guest names one, else from the call's sequence number.
pub fn operation_id(run_id: &str, effect: &str, seq: u64, key: Option<&str>) -> String {
    filled(|out| operation_id_into(out, run_id, effect, seq, key))
}

/// [`operation_id`] into `out`'s buffer.
pub fn operation_id_into(
    out: &mut String,
    run_id: &str,
    effect: &str,
    seq: u64,
    key: Option<&str>,
) {
    match key {
        Some(key) => hash_fields_into(
            out,
            "stephost/op/key/v1",
            &[run_id.as_bytes(), effect.as_bytes(), key.as_bytes()],
        ),
        None => hash_fields_into(
            out,
            "stephost/op/seq/v1",
            &[run_id.as_bytes(), &seq.to_le_bytes()],
        ),
    }
}

/// What divergence detection compares: the call's interface, function and request.
pub fn request_hash(interface: &str, function: &str, request: &str) -> String {
    filled(|out| request_hash_into(out, interface, function, request))
}

/// [`request_hash`] into `out`'s buffer.
pub fn request_hash_into(out: &mut String, interface: &str, function: &str, request: &str) {
    RequestHasher::new(interface, function).hash_into(out, request);
}

/// [`request_hash`] with its interface and function taken in once: a step
/// calls the same function again and again, and they fill the hash's
/// first block (SHA-256 compresses it once, not at every call).
#[derive(Clone)]
pub struct RequestHasher {
    prefix: Sha256,
}

impl RequestHasher {
    pub fn new(interface: &str, function: &str) -> Self {
        let mut prefix = Sha256::new();
        prefix.update("stephost/request/v1".as_bytes());
        for field in [interface.as_bytes(), function.as_bytes()] {
            prefix.update((field.len() as u64).to_le_bytes());
            prefix.update(field);
        }
        RequestHasher { prefix }
    }

    /// The request hash of `request`, into `out`'s buffer.
    pub fn hash_into(&self, out: &mut String, request: &str) {
        let mut h = self.prefix.clone();
        h.update((request.len() as u64).to_le_bytes());
        h.update(request.as_bytes());
        to_hex_into(out, &h.finalize());
    }
}

/// A fresh run id: `run-` and 20 hex digits from the clock, the process id
/// and a process-wide counter.
/// The longest run id a caller may choose, in bytes.
pub const RUN_ID_BYTES_MAX: usize = 128;

/// Checks a run id a caller chose: 1 to [`RUN_ID_BYTES_MAX`] bytes of
/// ASCII letters, digits and `- _ . : @ + =`, starting with a letter or a
/// digit, so that it is safe in a URL path, a header, a file name and on a
/// terminal.
pub fn check_run_id(run_id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:@+=".contains(c);
    if run_id.is_empty() || run_id.len() > RUN_ID_BYTES_MAX {
        return Err(format!(
            "a run id has 1 to {RUN_ID_BYTES_MAX} bytes; this one has {}",
            run_id.len()
        ));
    }
    if !run_id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("a run id starts with an ASCII letter or digit".into());
    }
    if let Some(bad) = run_id.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "a run id holds only ASCII letters, digits and - _ . : @ + =; this one holds {:?}",
            bad
        ));
    }
    Ok(())
}

/// The run id of the child started by the call with operation id
/// `operation_id`: a pure function of it, so an execution that resumes,
/// replays or upgrades the parent makes the same id (with a business key,
/// whatever the call's place in the run).
pub fn child_run_id(operation_id: &str) -> String {
    format!(
        "c-{}",
        &hash_fields("stephost/child/v1", &[operation_id.as_bytes()])[..32]
    )
}

/// The run id of the child started by run `run_id`'s call with operation
/// id `operation_id`, where the run's operation ids derive from run
/// `operations`' id: [`child_run_id`] for a run's own, and for a fork
/// (whose operation ids are its source's) one made with the fork's id too,
/// so the fork's children are its own, not its source's.
pub fn child_run_id_in(run_id: &str, operations: &str, operation_id: &str) -> String {
    if run_id == operations {
        return child_run_id(operation_id);
    }
    format!(
        "c-{}",
        &hash_fields(
            "stephost/child/fork/v1",
            &[run_id.as_bytes(), operation_id.as_bytes()]
        )[..32]
    )
}

pub fn new_run_id() -> String {
    format!("run-{}", &unique("stephost/run-id/v1")[..20])
}

/// A hex sha256 no other call makes: of the time, this process and a
/// counter, under `domain` (new run ids, new trace ids).
pub fn unique(domain: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    hash_fields(
        domain,
        &[
            &nanos.to_le_bytes(),
            &std::process::id().to_le_bytes(),
            &n.to_le_bytes(),
        ],
    )
}

/// A seed for the guest's `wasi:random/insecure-seed`, fixed per run so that
/// replay sees the same value (Rust's `HashMap` seeds itself from it).
pub fn insecure_seed(run_id: &str) -> u128 {
    let h = Sha256::digest(format!("stephost/insecure-seed/v1/{run_id}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&h[..16]);
    u128::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_short_printable_and_safe_in_paths() {
        assert!(check_run_id("order-1").is_ok());
        assert!(check_run_id(&new_run_id()).is_ok());
        assert!(check_run_id("a@b:c.d+e=f_g").is_ok());
        for bad in [
            "",
            "a/b",
            "a b",
            "x\u{1b}[31m",
            "é",
            "../x",
            "a?b",
            "..",
            "-x",
        ] {
            assert!(check_run_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_run_id(&"x".repeat(RUN_ID_BYTES_MAX)).is_ok());
        assert!(check_run_id(&"x".repeat(RUN_ID_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn operation_ids_are_stable_and_keyed_ids_ignore_the_sequence_number() {
        assert_eq!(
            operation_id("r", "e", 1, None),
            operation_id("r", "e", 1, None)
        );
        assert_ne!(
            operation_id("r", "e", 1, None),
            operation_id("r", "e", 2, None)
        );
        assert_ne!(
            operation_id("r1", "e", 1, None),
            operation_id("r2", "e", 1, None)
        );
        assert_eq!(
            operation_id("r", "e", 1, Some("k")),
            operation_id("r", "e", 9, Some("k"))
        );
        assert_ne!(
            operation_id("r", "e", 1, Some("k")),
            operation_id("r", "f", 1, Some("k"))
        );
        assert_eq!(operation_id("r", "e", 1, None).len(), 64);
    }

    #[test]
    fn a_request_hasher_kept_from_call_to_call_hashes_as_the_fields_do() {
        let long = "a.function.name.long.enough.to.fill.the.first.block.alone";
        for (interface, function) in [("stephost:step/effects", "noop.read"), ("i", long)] {
            let hasher = RequestHasher::new(interface, function);
            let mut out = "stale text from another call".repeat(9);
            for request in ["", "{}", "{\"i\":1}", &"x".repeat(300)] {
                hasher.hash_into(&mut out, request);
                let fields = [
                    interface.as_bytes(),
                    function.as_bytes(),
                    request.as_bytes(),
                ];
                assert_eq!(out, hash_fields("stephost/request/v1", &fields));
                assert_eq!(out, request_hash(interface, function, request));
            }
        }
        // As recorded by earlier builds (sha256 of the length-prefixed
        // fields, computed apart from this code): it must not change.
        assert_eq!(
            request_hash("stephost:step/effects", "noop.read", "{}"),
            "d34a24b9a2c2169d7471daea98a23f986577d20ffd46161cf605945494b0ea9f"
        );
    }

    #[test]
    fn fields_are_length_prefixed_so_boundaries_cannot_be_shifted() {
        assert_ne!(request_hash("ab", "c", "d"), request_hash("a", "bc", "d"));
        assert_ne!(
            operation_id("r", "ab", 0, Some("c")),
            operation_id("r", "a", 0, Some("bc"))
        );
    }

    #[test]
    fn hex_is_spelled_as_the_hex_crate_spells_it() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(to_hex(&bytes), hex::encode(&bytes));
        assert_eq!(to_hex(&[]), "");
    }

    #[test]
    fn run_ids_differ_within_one_process() {
        assert_ne!(new_run_id(), new_run_id());
    }
}

//! PostgreSQL's errors in the ledger's storage-neutral words.

use stephost_core::StoreError;
use tokio_postgres::error::SqlState;

/// SQLSTATE codes the ledger's own functions raise (migrations/).
pub const NO_SUCH_RUN: &str = "SH001";
pub const FENCED: &str = "SH002";
pub const NOT_APPENDED: &str = "SH003";
pub const CALL_NOT_RECORDED: &str = "SH004";
/// A commit that begins something for a cancelled run (DETAIL: who and why, as JSON).
pub const CANCELLED: &str = "SH005";

/// An error with no more specific meaning: the database could not be
/// reached or did not do what was asked; trying again may succeed.
pub fn error(e: tokio_postgres::Error) -> StoreError {
    // A text PostgreSQL cannot hold (a NUL character): no stored value can
    // be it, and trying again will not help.
    if matches!(
        e.code(),
        Some(&SqlState::CHARACTER_NOT_IN_REPERTOIRE | &SqlState::UNTRANSLATABLE_CHARACTER)
    ) {
        return StoreError::Config(format!(
            "a value holds a character the ledger cannot store (a NUL byte): {}",
            describe(&e)
        ));
    }
    StoreError::Unavailable(describe(&e))
}

/// `e` with the server's message, if it sent one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "PostgreSQL: {} ({}){}",
            db.message(),
            db.code().code(),
            db.detail().map(|d| format!(": {d}")).unwrap_or_default()
        ),
        None => match std::error::Error::source(e) {
            Some(source) => format!("PostgreSQL: {e}: {source}"),
            None => format!("PostgreSQL: {e}"),
        },
    }
}

/// The SQLSTATE of `e`, if the server sent one.
pub fn code(e: &tokio_postgres::Error) -> Option<&str> {
    e.code().map(SqlState::code)
}

/// The DETAIL the server sent with `e`.
pub fn detail(e: &tokio_postgres::Error) -> Option<&str> {
    e.as_db_error().and_then(|db| db.detail())
}

/// Whether `e` says the transaction was aborted by an earlier error (the
/// rest of a pipeline after the statement that failed).
pub fn is_aborted(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION)
}

/// Whether `e` is a deadlock or serialization failure: the transaction may
/// be tried again as it was.
pub fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    )
}

/// Whether `e` is a unique-key violation.
pub fn is_duplicate(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// A URL with its password left out, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_left_out_of_messages() {
        assert_eq!(
            redact("postgres://ops:s3cret@db.internal:5432/stephost"),
            "postgres://ops@db.internal:5432/stephost"
        );
        assert_eq!(
            redact("postgres://db.internal/stephost"),
            "postgres://db.internal/stephost"
        );
        assert_eq!(redact("host=/tmp user=x"), "host=/tmp user=x");
    }
}

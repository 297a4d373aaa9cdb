//! The driver's errors in storage-neutral words.

use rusqlite::ErrorCode;
use stephost_core::StoreError;

/// A driver error in storage-neutral words.
pub fn error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            StoreError::Corrupt(e.to_string())
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

pub fn not_a_ledger(location: &str, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotALedger {
            location: location.to_string(),
            detail: "not an SQLite database".into(),
        },
        _ => StoreError::Unavailable(format!("cannot open {location}: {e}")),
    }
}

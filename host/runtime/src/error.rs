//! The library's errors and the CLI's stable exit codes.

use stephost_core::StoreError;

/// Exit codes of the `stephost` binary. Stable: scripts depend on them.
pub mod exit {
    /// Success: the run completed, or the replay matched.
    pub const OK: i32 = 0;
    /// A host problem: ledger I/O, engine setup. Retry, or see the message.
    pub const INTERNAL: i32 = 1;
    /// Bad usage or bad input: unknown flag, bad JSON, not a step module,
    /// unknown run id, not a ledger, invalid configuration.
    pub const BAD_INPUT: i32 = 2;
    /// The step failed: it returned an error, trapped, or hit a limit.
    pub const STEP_FAILED: i32 = 3;
    /// The step made different calls than the recording (replay or resume).
    pub const DIVERGED: i32 = 4;
    /// The run is parked: a call's outcome is unknown and needs a person.
    pub const PARKED: i32 = 5;
    /// Another live process holds the run's claim, or took it over (fenced).
    pub const CLAIMED: i32 = 6;
    /// The run waits for a timer or a person's approval; a worker (or
    /// `stephost resume`) continues it once due or decided.
    pub const WAITING: i32 = 7;
    /// The run was cancelled (`stephost cancel`, or its parent's end).
    pub const CANCELLED: i32 = 8;
}

/// The step worlds, as messages name them.
const WORLDS: &str = "stephost:step/step@0.3.0 (or @0.2.0, @0.1.0)";

/// A module that cannot be a step, or an engine that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(
        "{what} is not a WebAssembly module ({detail}); pass a .wasm component built for {WORLDS}"
    )]
    NotWasm { what: String, detail: String },
    #[error(
        "{what} is a core WebAssembly module that neither exports `_start` (a WASI command) \
         nor carries the component type of {WORLDS} (as `wit-bindgen` emits it); build it \
         for wasm32-wasip2, or as a WASI program with a `main`, or link the bindings' \
         component-type object into it"
    )]
    CoreModule { what: String },
    #[error("{what} is a core module that could not be adapted to a component: {detail}")]
    Adapt { what: String, detail: String },
    #[error("{what} is not a valid component: {detail}")]
    Malformed { what: String, detail: String },
    #[error(
        "{what} is a component for another world: {detail}. A step must target {WORLDS}: \
         export `run: func(input: string) -> result<string, string>` and import only \
         stephost:step and WASI interfaces"
    )]
    WrongWorld { what: String, detail: String },
    #[error("engine setup failed: {0}")]
    Engine(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("configuration {path} is invalid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A ledger error (a record that does not verify is
    /// [`HostError::Integrity`] instead).
    #[error(transparent)]
    Ledger(StoreError),
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    BadInput(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "ledger write failed during the run: {0}; the run is left resumable, retry with `stephost resume`"
    )]
    LedgerWrite(String),
    #[error(
        "reading the run's recorded calls failed: {0}; the run is left as it was, retry with `stephost resume`"
    )]
    LedgerRead(String),
    #[error("{0}")]
    Fenced(String),
    #[error("{0}")]
    VersionMismatch(String),
    /// Stored bytes do not match the digest they are kept under, or a run's
    /// record does not verify against the chain key.
    #[error("{0}")]
    Integrity(String),
    /// A fork that cannot be made from the call it names (see the message).
    #[error("{0}")]
    ForkRefused(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for HostError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Integrity { .. } => HostError::Integrity(e.to_string()),
            other => HostError::Ledger(other),
        }
    }
}

impl HostError {
    /// The error a run that stopped with [`Stop::LedgerRead`] ends in, as if
    /// its calls had been read before it started.
    ///
    /// [`Stop::LedgerRead`]: stephost_core::journal::Stop::LedgerRead
    pub fn reading_calls(message: String, corrupt: bool) -> Self {
        if corrupt {
            StoreError::Corrupt(message).into()
        } else {
            HostError::LedgerRead(message)
        }
    }
}

impl HostError {
    pub fn exit_code(&self) -> i32 {
        match self {
            HostError::Ledger(
                StoreError::ClaimedElsewhere { .. }
                | StoreError::Fenced { .. }
                | StoreError::VersionConflict { .. }
                | StoreError::CallConflict { .. }
                | StoreError::RepinConflict { .. },
            )
            | HostError::Fenced(_) => exit::CLAIMED,
            HostError::Ledger(
                StoreError::NotALedger { .. }
                | StoreError::TooNew { .. }
                | StoreError::OldFormat { .. }
                | StoreError::Config(_)
                | StoreError::UnknownRun(_)
                | StoreError::UnknownModule(_)
                | StoreError::UnknownSchedule(_)
                | StoreError::ScheduleExists(_)
                | StoreError::NotUnknown { .. }
                | StoreError::NotDecidable { .. }
                | StoreError::NotClaimable { .. }
                | StoreError::Ended { .. }
                | StoreError::RunExists { .. }
                | StoreError::Cancelled { .. },
            ) => exit::BAD_INPUT,
            HostError::Ledger(_)
            | HostError::LedgerWrite(_)
            | HostError::LedgerRead(_)
            | HostError::Internal(_) => exit::INTERNAL,
            HostError::Module(ModuleError::Engine(_)) => exit::INTERNAL,
            HostError::VersionMismatch(_) | HostError::Integrity(_) => exit::DIVERGED,
            HostError::Module(_)
            | HostError::Config(_)
            | HostError::BadInput(_)
            | HostError::ForkRefused(_)
            | HostError::Read { .. } => exit::BAD_INPUT,
        }
    }
}

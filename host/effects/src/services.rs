//! What the effects take from the host that runs them, through one small
//! trait ([`Host`]: its log and its randomness, set once for the process
//! with [`set_host`]), and what a live call uses besides its effect
//! ([`Services`]: where a model's answer streams to, the ledger's shared
//! flow state).

use std::sync::Arc;

/// How serious a line for the host's log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// What the effects need from the host: where their lines go (an MCP
/// server's stderr, a flow state that cannot be kept) and randomness (a
/// call's slot holder). The runtime implements it; tests may use
/// [`Stderr`].
pub trait Host: Send + Sync + 'static {
    /// A line for the host's log, from `source` (`mcp NAME`, `model NAME`).
    fn line(&self, level: Level, source: &str, message: &str);

    /// A random number from the host's trusted source.
    fn random_u64(&self) -> u64;
}

/// A host that writes its lines to stderr as they are and draws numbers
/// from the clock's nanoseconds: what the effects use until the process
/// sets its own ([`set_host`]).
#[derive(Debug, Default)]
pub struct Stderr;

impl Host for Stderr {
    fn line(&self, level: Level, source: &str, message: &str) {
        let level = match level {
            Level::Info => "info",
            Level::Warn => "warn",
        };
        eprintln!("{source} {level}: {message}");
    }

    fn random_u64(&self) -> u64 {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // splitmix64: consecutive readings do not look alike.
        let mut z = ns.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Where what a live model call is doing goes while it does it: its answer
/// as it streams in (at most a few times a second, each time the text that
/// came since the time before), or what it waits for before it is sent.
/// Nothing of it is recorded.
#[derive(Clone)]
pub struct StreamSink(pub Arc<StreamFn>);

/// What a model call is doing.
#[derive(Debug, Clone, Copy)]
pub enum ModelProgress<'a> {
    /// Its answer's text that came in since the call's last `Text`:
    /// `text`, which begins `offset` characters (Unicode scalar values)
    /// into the answer. An attempt's first has offset 0, so a listener
    /// that missed the ones before sees that it did; a new attempt starts
    /// again from 0.
    Text { offset: usize, text: &'a str },
    /// Why it is not sent yet.
    Waiting(&'a str),
}

/// A stream sink's function: run id, sequence number, progress.
pub type StreamFn = dyn Fn(&str, u64, ModelProgress<'_>) + Send + Sync;

impl std::fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamSink(..)")
    }
}

/// What live calls use besides their effect.
#[derive(Clone, Default)]
pub struct Services {
    /// Where models' answers go while they stream in, and what a model call
    /// waits for (`stephost serve`'s event stream).
    pub stream_sink: Option<StreamSink>,
    /// Models' flow state, shared by every process on the ledger (filled
    /// in from the ledger's pool by the runtime).
    pub flows: Option<Arc<dyn stephost_core::flow::Flows>>,
}

impl Services {
    /// None of them.
    pub const NONE: Services = Services {
        stream_sink: None,
        flows: None,
    };
}

static HOST: std::sync::OnceLock<Box<dyn Host>> = std::sync::OnceLock::new();

/// Sets the host the effects of this process log to and draw randomness
/// from: once, at start-up (a second call is ignored).
pub fn set_host(host: impl Host) {
    let _ = HOST.set(Box::new(host));
}

/// The host set for this process, or [`Stderr`].
pub fn host() -> &'static dyn Host {
    match HOST.get() {
        Some(host) => host.as_ref(),
        None => &Stderr,
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("stream_sink", &self.stream_sink.is_some())
            .field("flows", &self.flows.is_some())
            .finish()
    }
}

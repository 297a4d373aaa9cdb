//! What the effects take from this process (`stephost_effects::Host`): its
//! log lines ([`crate::logs`]) and its randomness ([`crate::randomness`]).

/// This process, as the effects see it.
#[derive(Debug, Clone, Copy, Default)]
pub struct EffectsHost;

impl stephost_effects::Host for EffectsHost {
    fn line(&self, level: stephost_effects::Level, source: &str, message: &str) {
        let level = match level {
            stephost_effects::Level::Info => crate::logs::Level::Info,
            stephost_effects::Level::Warn => crate::logs::Level::Warn,
        };
        crate::logs::line(level, source, None, message);
    }

    fn random_u64(&self) -> u64 {
        crate::randomness::os_u64()
    }
}

/// Makes this process the effects' host (once; later calls change nothing).
pub fn install() {
    stephost_effects::set_host(EffectsHost);
}

//! The retry policy of an effect. The host is the one retry owner: it retries
//! retryable failures with backoff; nothing else retries.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub multiplier: f64,
    /// Fraction of each backoff drawn at random (0 to 1), to spread retries.
    pub jitter: f64,
    /// No new attempt starts after this much time since the first one.
    pub deadline_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
            multiplier: 2.0,
            jitter: 0.2,
            deadline_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `next` (2 for the first retry); `entropy` in
    /// [0, 1) picks the jitter.
    pub fn backoff(&self, next: u32, entropy: f64) -> Duration {
        let exp = self.multiplier.max(1.0).powi(next.saturating_sub(2) as i32);
        let base = (self.initial_backoff_ms as f64 * exp).min(self.max_backoff_ms as f64);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let ms = base * (1.0 - jitter * entropy);
        Duration::from_millis(ms.max(0.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_the_multiplier_and_stops_at_the_maximum() {
        let p = RetryPolicy {
            initial_backoff_ms: 50,
            max_backoff_ms: 300,
            multiplier: 2.0,
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let ms: Vec<u128> = (2..7).map(|n| p.backoff(n, 0.5).as_millis()).collect();
        assert_eq!(ms, vec![50, 100, 200, 300, 300]);
    }

    #[test]
    fn jitter_only_shortens_the_pause() {
        let p = RetryPolicy {
            jitter: 0.5,
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff(2, 0.0).as_millis(), 100);
        assert_eq!(p.backoff(2, 0.99).as_millis(), 50);
    }
}

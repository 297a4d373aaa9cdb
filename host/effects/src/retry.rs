//! The retry policy of an effect. The host is the one retry owner: it retries
//! retryable failures with backoff; nothing else retries.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (`max_attempts` is read too).
    #[serde(alias = "max_attempts")]
    pub attempts_max: u32,
    /// The pause before the first retry (`initial_backoff_ms` is read too).
    #[serde(alias = "initial_backoff_ms")]
    pub backoff_first_ms: u64,
    /// The longest pause between attempts (`max_backoff_ms` is read too).
    #[serde(alias = "max_backoff_ms")]
    pub backoff_max_ms: u64,
    pub multiplier: f64,
    /// Fraction of each backoff drawn at random (0 to 1), to spread retries.
    pub jitter: f64,
    /// No new attempt starts after this much time since the first one.
    pub deadline_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts_max: 3,
            backoff_first_ms: 100,
            backoff_max_ms: 5_000,
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
        let base = (self.backoff_first_ms as f64 * exp).min(self.backoff_max_ms as f64);
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
            backoff_first_ms: 50,
            backoff_max_ms: 300,
            multiplier: 2.0,
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let ms: Vec<u128> = (2..7).map(|n| p.backoff(n, 0.5).as_millis()).collect();
        assert_eq!(ms, vec![50, 100, 200, 300, 300]);
    }

    #[test]
    fn the_earlier_names_of_the_settings_are_read_too() {
        #[derive(Deserialize)]
        struct Wrapper {
            retry: RetryPolicy,
        }
        let old: Wrapper = toml::from_str(
            "retry = { max_attempts = 7, initial_backoff_ms = 20, max_backoff_ms = 90 }",
        )
        .unwrap();
        let new: Wrapper = toml::from_str(
            "retry = { attempts_max = 7, backoff_first_ms = 20, backoff_max_ms = 90 }",
        )
        .unwrap();
        assert_eq!(old.retry, new.retry);
        assert_eq!(new.retry.attempts_max, 7);
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

//! A map that keeps at most a fixed number of entries, dropping the one
//! used longest ago to make room: the caches of a long-lived process
//! (compiled modules, hashed module bytes) stay bounded whatever callers
//! send it.

use std::collections::HashMap;
use std::hash::Hash;

pub struct Bounded<K, V> {
    entries: HashMap<K, (V, u64)>,
    max: usize,
    /// Counts uses: an entry's is when it was last used.
    clock: u64,
}

impl<K: Hash + Eq + Clone, V> Bounded<K, V> {
    /// A map of at most `max` entries (at least one).
    pub fn new(max: usize) -> Self {
        Bounded {
            entries: HashMap::new(),
            max: max.max(1),
            clock: 0,
        }
    }

    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.clock += 1;
        let now = self.clock;
        self.entries.get_mut(key).map(|(value, used)| {
            *used = now;
            &*value
        })
    }

    /// Keeps `value` under `key`, dropping the entry used longest ago if
    /// the map is full.
    pub fn insert(&mut self, key: K, value: V) {
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, self.clock));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_used_longest_ago_makes_room() {
        let mut map = Bounded::new(2);
        map.insert("a", 1);
        map.insert("b", 2);
        assert_eq!(map.get(&"a"), Some(&1));
        map.insert("c", 3);
        assert_eq!(map.len(), 2);
        assert_eq!(map.get(&"b"), None, "b was used longest ago");
        assert_eq!(map.get(&"a"), Some(&1));
        assert_eq!(map.get(&"c"), Some(&3));
        // Replacing a kept entry drops nothing.
        map.insert("c", 4);
        assert_eq!(map.len(), 2);
        assert_eq!(map.get(&"a"), Some(&1));
        assert_eq!(map.get(&"c"), Some(&4));
        for i in 0..1000 {
            map.insert(if i % 2 == 0 { "x" } else { "y" }, i);
        }
        assert_eq!(map.len(), 2);
    }
}

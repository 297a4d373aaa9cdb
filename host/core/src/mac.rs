//! HMAC-SHA256 (RFC 2104), for what stephost signs with a key of the
//! operator's: chain links and run seals, and compiled components kept on
//! disk.

use sha2::{Digest, Sha256};

const BLOCK: usize = 64;

/// A key, prepared once: its inner and outer pads.
#[derive(Clone)]
pub struct MacKey {
    inner: Sha256,
    outer: Sha256,
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    pub fn new(key: &[u8]) -> Self {
        let mut block = [0u8; BLOCK];
        if key.len() > BLOCK {
            block[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let pad = |byte: u8| {
            let mut h = Sha256::new();
            h.update(block.map(|b| b ^ byte));
            h
        };
        MacKey {
            inner: pad(0x36),
            outer: pad(0x5c),
        }
    }

    /// A hasher whose [`MacKey::finish`] gives the HMAC of what was fed.
    pub fn start(&self) -> Sha256 {
        self.inner.clone()
    }

    pub fn finish(&self, inner: Sha256) -> [u8; 32] {
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }

    /// The HMAC of `bytes`.
    pub fn mac(&self, bytes: &[u8]) -> [u8; 32] {
        let mut h = self.start();
        h.update(bytes);
        self.finish(h)
    }
}

/// Compares two byte strings in time that depends on their lengths only.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rfc_4231() {
        // Test case 2 and test case 6 (a key longer than a block).
        let mac = MacKey::new(b"Jefe").mac(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let long = MacKey::new(&[0xaa; 131])
            .mac(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(
            hex::encode(long),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn compares_without_shortcuts_but_correctly() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}

//! The compiled-component cache on disk: a file per module digest and
//! engine, so that only the first process to load a module compiles it.
//!
//! Loading compiled code runs it without wasmtime's validation, so a file is
//! trusted only if it proves it was written here for this module: beside
//! each file is an HMAC-SHA256 (`.mac`), under a key kept in the cache
//! folder, of the module digest, the engine's compatibility key and the
//! compiled bytes.
//! The folder is created readable by its owner only (0700), the key and the
//! files 0600. A file that fails the check (swapped, damaged, written by
//! another engine) is compiled over; it never runs.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use stephost_core::mac::{MacKey, ct_eq};

/// The key file in the cache folder.
const KEY_FILE: &str = "key";
const KEY_BYTES: usize = 32;

/// A cache folder with its key.
pub struct DiskCache {
    dir: PathBuf,
    key: MacKey,
    /// Names the engine's compiled-code format.
    engine_key: String,
}

impl DiskCache {
    /// Opens (creating it if absent) the cache in `dir`; `None` when the
    /// folder or its key cannot be made or read, and then nothing is cached.
    pub fn open(dir: &Path, engine_key: &str) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .ok()?;
        // A folder made before (or by hand) is made private too, and
        // trusted only if it is ours: whoever owns it could swap a file in.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        if let Err(why) = check_private(dir, true).and_then(|()| {
            let key = dir.join(KEY_FILE);
            match std::fs::symlink_metadata(&key) {
                Ok(_) => check_private(&key, false),
                Err(_) => Ok(()),
            }
        }) {
            crate::logs::warn(
                "stephost",
                None,
                format_args!(
                    "not using the compiled-component cache {}: {why}; point \
                     STEPHOST_CACHE_DIR at a folder of this user's",
                    dir.display()
                ),
            );
            return None;
        }
        let key = read_or_create_key(&dir.join(KEY_FILE))?;
        Some(DiskCache {
            dir: dir.to_path_buf(),
            key: MacKey::new(&key),
            engine_key: engine_key.to_string(),
        })
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The HMAC of compiled code for `digest`, read from `compiled`.
    fn mac(&self, digest: &str, mut compiled: impl std::io::Read) -> std::io::Result<[u8; 32]> {
        use sha2::Digest;
        let mut h = self.key.start();
        stephost_core::ids::feed_fields(&mut h, &[digest.as_bytes(), self.engine_key.as_bytes()]);
        // In chunks: a whole file read into fresh memory costs its page
        // faults on every load.
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match compiled.read(&mut chunk) {
                Ok(0) => return Ok(self.key.finish(h)),
                Ok(n) => h.update(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn mac_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join(format!("{digest}-{}.cwasm.mac", self.engine_key))
    }

    /// The file of compiled code kept for module `digest`, if there is one
    /// and its HMAC checks out. It is then loaded by its path, mapped rather
    /// than copied (a load costs about 2 ms less than from memory); the
    /// folder is its owner's only, so nobody else can swap it in between.
    pub fn get(&self, digest: &str) -> Option<PathBuf> {
        let path = self.path(digest);
        let mac = std::fs::read(self.mac_path(digest)).ok()?;
        let computed = self.mac(digest, std::fs::File::open(&path).ok()?).ok()?;
        ct_eq(&mac, &computed).then_some(path)
    }

    /// Keeps `compiled` for module `digest` (best effort: a cache that
    /// cannot be written costs a compile next time).
    pub fn put(&self, digest: &str, compiled: &[u8]) {
        let _ = self.mac(digest, compiled).and_then(|mac| {
            write_private(&self.path(digest), compiled)?;
            write_private(&self.mac_path(digest), &mac)
        });
    }
}

/// Checks that `path` is a folder (or a file) of this user's that nobody
/// else can write or read: not a symbolic link, owned by this process's
/// user, with no permission for group or others.
fn check_private(path: &Path, folder: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    if meta.is_dir() != folder {
        return Err(format!(
            "{} is not a {}",
            path.display(),
            if folder { "folder" } else { "file" }
        ));
    }
    // SAFETY: geteuid(2) takes no arguments, reads no memory of ours and
    // cannot fail.
    #[allow(unsafe_code)]
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} is owned by uid {}, not by this user (uid {me})",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} can be used by others (mode {:o})",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

fn read_or_create_key(path: &Path) -> Option<Vec<u8>> {
    if let Ok(key) = std::fs::read(path) {
        return (key.len() == KEY_BYTES).then_some(key);
    }
    let key = crate::randomness::os_bytes(KEY_BYTES);
    // Two processes may race to make it: the first one's key stays.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    write_new_private(&tmp, &key).ok()?;
    match std::fs::hard_link(&tmp, path) {
        Ok(()) => {
            let _ = std::fs::remove_file(&tmp);
            Some(key)
        }
        Err(_) => {
            let _ = std::fs::remove_file(&tmp);
            std::fs::read(path).ok().filter(|k| k.len() == KEY_BYTES)
        }
    }
}

fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

/// Writes `path` through a temporary file (mode 0600) renamed over it.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    write_new_private(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_is_read_back_only_for_its_own_module_and_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let cache = DiskCache::open(&root, "engine").unwrap();
        cache.put("aaaa", b"compiled a");
        cache.put("bbbb", b"compiled b");
        assert_eq!(cache.get("aaaa"), Some(cache.path("aaaa")));
        // Swapped: b's file and MAC under a's name.
        std::fs::copy(cache.path("bbbb"), cache.path("aaaa")).unwrap();
        assert_eq!(cache.get("aaaa"), None);
        std::fs::copy(cache.mac_path("bbbb"), cache.mac_path("aaaa")).unwrap();
        assert_eq!(cache.get("aaaa"), None);
        // Changed in place.
        cache.put("aaaa", b"compiled a");
        let mut bytes = std::fs::read(cache.path("aaaa")).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(cache.path("aaaa"), bytes).unwrap();
        assert_eq!(cache.get("aaaa"), None);
        // Another process with the same folder shares the key.
        let again = DiskCache::open(&root, "engine").unwrap();
        assert_eq!(again.get("bbbb"), Some(cache.path("bbbb")));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join(KEY_FILE)), 0o600);
        assert_eq!(mode(&cache.path("bbbb")), 0o600);
    }

    #[test]
    fn a_folder_that_is_not_this_users_own_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        assert!(DiskCache::open(&real, "engine").is_some());
        // A link to it: whoever controls the link chooses the folder.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(DiskCache::open(&link, "engine").is_none());
        // A key others can read is no key.
        std::fs::set_permissions(real.join(KEY_FILE), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        assert!(DiskCache::open(&real, "engine").is_none());
        // A folder owned by someone else (only root can make one here).
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        if std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).is_ok() {
            assert!(DiskCache::open(&theirs, "engine").is_none());
        }
    }
}

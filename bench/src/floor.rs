//! The floor every figure is compared with: one small `INSERT` per
//! transaction, WAL, `synchronous = FULL` (one fsync a commit), on the
//! bench's disk.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rusqlite::Connection;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Commits made before a fresh floor is measured (more than the measured
/// ones, so that these reuse the WAL's blocks), and in each warm-up round
/// of a long-lived one.
pub const FLOOR_WARMUP: usize = 600;
/// Commits a fresh floor measures.
pub const FLOOR_COMMITS: usize = 500;

/// A floor's database, which commits on demand.
pub struct Floor {
    conn: Connection,
    /// Its WAL file.
    wal: PathBuf,
    made: usize,
}

impl Floor {
    /// A fresh database `floor-{tag}.db` in `dir`, with its table.
    fn create(dir: &Path, tag: &str) -> Res<Self> {
        let path = dir.join(format!("floor-{}.db", tag.replace(' ', "-")));
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
        let conn = Connection::open(&path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
        let mut wal = path.into_os_string();
        wal.push("-wal");
        Ok(Floor {
            conn,
            wal: wal.into(),
            made: 0,
        })
    }

    /// A floor that lives as long as a figure measured beside it: warmed
    /// (by `warm`) until its WAL has passed its first checkpoint and started
    /// over, so that its commits overwrite the log, as a long-lived
    /// ledger's do, however many it makes.
    pub fn long_lived(
        dir: &Path,
        tag: &str,
        warm: impl FnOnce(&Path, &mut dyn FnMut() -> Res<()>) -> Res<()>,
    ) -> Res<Self> {
        let mut floor = Floor::create(dir, tag)?;
        let wal = floor.wal.clone();
        warm(&wal, &mut || floor.commits(FLOOR_WARMUP))?;
        Ok(floor)
    }

    /// Makes `n` commits. Its three statements are prepared once and kept,
    /// as the ledger's are: the floor is a transaction's cost, not parsing
    /// SQL (until 5ced2a9, each commit parsed all three: a few µs of CPU
    /// that every ratio was measured against).
    pub fn commits(&mut self, n: usize) -> Res<()> {
        for _ in 0..n {
            self.made += 1;
            self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            self.conn
                .prepare_cached("INSERT INTO t (v) VALUES (?1)")?
                .execute([format!("row {}", self.made)])?;
            self.conn.prepare_cached("COMMIT")?.execute([])?;
        }
        Ok(())
    }

    /// Mean µs per commit of `n` commits.
    pub fn us_per_commit(&mut self, n: usize) -> Res<f64> {
        let t = Instant::now();
        self.commits(n)?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
    }
}

/// The floor in a fresh database in `dir`: mean µs per commit in the
/// steady state.
///
/// The warm-up grows the WAL file, then a checkpoint restarts it, so the
/// measured commits overwrite WAL blocks that exist instead of extending
/// the file: extending it costs a metadata write with every fsync (about
/// twice the time on this machine class), which a long-lived ledger pays only
/// until its WAL reaches its steady size.
pub fn floor_us(dir: &Path, tag: &str) -> Res<f64> {
    let mut floor = Floor::create(dir, tag)?;
    floor.commits(FLOOR_WARMUP)?;
    floor
        .conn
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))?;
    floor.us_per_commit(FLOOR_COMMITS)
}

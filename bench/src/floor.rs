//! The floor every figure is compared with: one small `INSERT` per
//! transaction, WAL, `synchronous = FULL` (one fsync a commit), on the
//! bench's disk.

use std::path::Path;
use std::time::Instant;

use rusqlite::Connection;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Commits made before a floor is measured (more than the measured ones,
/// so that these reuse the WAL's blocks).
pub const FLOOR_WARMUP: usize = 600;
/// Commits a floor measures.
pub const FLOOR_COMMITS: usize = 500;

/// A floor's database, which commits on demand.
struct Floor {
    conn: Connection,
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
        Ok(Floor { conn, made: 0 })
    }

    /// Makes `n` commits. Its three statements are prepared once and kept,
    /// as the ledger's are: the floor is a transaction's cost, not parsing
    /// SQL.
    fn commits(&mut self, n: usize) -> Res<()> {
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
    fn us_per_commit(&mut self, n: usize) -> Res<f64> {
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

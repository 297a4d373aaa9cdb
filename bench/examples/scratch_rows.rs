use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap();
    let conn = rusqlite::Connection::open(&path)?;
    conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
    let full = "SELECT key, class, interface, function, operation_id, request, request_hash, state, outcome, started_at, finished_at, resolved_by, chain FROM calls WHERE key > 0 ORDER BY key";
    let lean = "SELECT key, class, interface, function, operation_id, request, request_hash, state, outcome, chain FROM calls WHERE key > 0 ORDER BY key";
    for round in 0..3 {
        for (name, sql, alloc) in [
            ("full-alloc", full, true),
            ("full-ref", full, false),
            ("lean-alloc", lean, true),
            (
                "count",
                "SELECT key FROM calls WHERE key > 0 ORDER BY key",
                false,
            ),
        ] {
            let mut st = conn.prepare(sql)?;
            let t = Instant::now();
            let mut rows = st.query([])?;
            let mut n = 0usize;
            let mut bytes = 0usize;
            let mut keep: Vec<Vec<String>> = Vec::new();
            while let Some(r) = rows.next()? {
                n += 1;
                let cols = r.as_ref().column_count();
                if alloc {
                    let mut v = Vec::with_capacity(cols);
                    for c in 1..cols {
                        match r.get_ref(c)? {
                            rusqlite::types::ValueRef::Text(t) => {
                                v.push(std::str::from_utf8(t)?.to_string())
                            }
                            _ => {}
                        }
                    }
                    keep.push(v);
                } else {
                    for c in 1..cols {
                        if let rusqlite::types::ValueRef::Text(t) = r.get_ref(c)? {
                            bytes += std::str::from_utf8(t)?.len();
                        }
                    }
                }
            }
            let e = t.elapsed();
            drop(keep);
            println!(
                "{round} {name}: {:.3} µs/row ({n} rows, {bytes})",
                e.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
    Ok(())
}

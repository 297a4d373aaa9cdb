//! The pool's connections: opened on demand up to a bound, kept idle for
//! the next caller, each with the statements it has prepared.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use stephost_core::StoreResult;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::errors::{describe, error};

/// Most connections one pool has open for its stores and writers at once
/// (the group committer and the listener have one more each).
pub const CONNECTIONS_MAX: usize = 8;

/// One connection and the statements prepared on it.
pub struct PgConn {
    pub client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl PgConn {
    /// Opens a connection, driven by a task on the current runtime.
    pub async fn connect(config: &Config) -> StoreResult<PgConn> {
        let (client, connection) = config.connect(NoTls).await.map_err(|e| {
            stephost_core::StoreError::Unavailable(format!(
                "cannot connect to the ledger: {}",
                describe(&e)
            ))
        })?;
        tokio::spawn(async move {
            // Ends when the client is dropped or the server goes away; the
            // client's next request then fails as closed.
            let _ = connection.await;
        });
        // A durable commit is on disk when answered whatever the server,
        // database or role default says (commits that need not be durable
        // turn it off for themselves).
        client
            .batch_execute("SET synchronous_commit TO on")
            .await
            .map_err(|e| {
                stephost_core::StoreError::Unavailable(format!(
                    "cannot set up a ledger connection: {}",
                    describe(&e)
                ))
            })?;
        Ok(PgConn {
            client,
            statements: HashMap::new(),
        })
    }

    /// `sql`, prepared on this connection once.
    pub async fn statement(&mut self, sql: &'static str) -> StoreResult<Statement> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await.map_err(error)?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }
}

/// Connections to one database.
pub struct Conns {
    pub config: Config,
    idle: Mutex<Vec<PgConn>>,
    permits: Arc<Semaphore>,
}

impl Conns {
    pub fn new(config: Config, max: usize) -> Arc<Self> {
        Arc::new(Conns {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max)),
        })
    }

    /// A connection: an idle one, or a new one if fewer than the bound are
    /// open; else the next one given back.
    pub async fn get(self: &Arc<Self>) -> StoreResult<Lease> {
        let permit = self.permits.clone().acquire_owned().await.map_err(|_| {
            stephost_core::StoreError::Unavailable("the ledger's pool is closed".into())
        })?;
        let idle = loop {
            let next = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match next {
                Some(conn) if conn.client.is_closed() => continue,
                other => break other,
            }
        };
        let conn = match idle {
            Some(conn) => conn,
            None => PgConn::connect(&self.config).await?,
        };
        Ok(Lease {
            conn: Some(conn),
            conns: self.clone(),
            _permit: permit,
        })
    }
}

/// A connection taken from [`Conns`], given back when dropped (unless it
/// was closed).
pub struct Lease {
    conn: Option<PgConn>,
    conns: Arc<Conns>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for Lease {
    type Target = PgConn;
    fn deref(&self) -> &PgConn {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && !conn.client.is_closed()
        {
            self.conns
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn a_connection_commits_synchronously_whatever_the_servers_default() {
        let url = crate::throwaway::TestServer::shared().fresh_ledger();
        let mut config = Config::from_str(&url).unwrap();
        config.options("-c synchronous_commit=off");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let setting: String = runtime.block_on(async {
            let conn = PgConn::connect(&config).await.unwrap();
            let row = conn
                .client
                .query_one("SHOW synchronous_commit", &[])
                .await
                .unwrap();
            row.get(0)
        });
        assert_eq!(setting, "on");
    }
}

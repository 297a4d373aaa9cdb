//! The pool's connections: opened on demand up to a bound, kept idle for
//! the next caller, each with the statements it has prepared.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use stephost_core::{StoreError, StoreResult};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, Connection, Socket, Statement};

use crate::errors::{describe, error};
use crate::tls::{self, MakeTls, Mode};

/// Most connections one pool has open for its stores and writers at once
/// (the group committer and the listener have one more each).
pub const CONNECTIONS_MAX: usize = 8;

/// The server a pool connects to, and how (its TLS).
#[derive(Clone)]
pub struct Server {
    pub config: Config,
    tls: MakeTls,
    mode: Mode,
}

impl Server {
    /// The server a ledger URL names, its TLS keys (`sslmode`,
    /// `sslrootcert`, `sslcert`, `sslkey`, `sslsni`: [`tls`]) checked and
    /// their files read; `location` names the URL in messages.
    pub fn from_url(url: &str, location: &str) -> StoreResult<Server> {
        let refused = |why: String| {
            StoreError::Config(format!("ledger URL {location} cannot be used: {why}"))
        };
        let (rest, settings) = tls::split(url).map_err(refused)?;
        let mut config = Config::from_str(&rest).map_err(|e| {
            StoreError::Config(format!(
                "ledger URL {location} is not a PostgreSQL URL ({e}); use \
                 postgres://USER@HOST:PORT/DATABASE"
            ))
        })?;
        let mode = settings.mode.unwrap_or(match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => Mode::Disable,
            tokio_postgres::config::SslMode::Require => Mode::Require,
            _ => Mode::Prefer,
        });
        if mode.insists()
            && config
                .get_hosts()
                .iter()
                .any(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)))
        {
            return Err(refused(
                "TLS is not spoken over a Unix socket, and the URL asks for it (sslmode); \
                 connect to the server by host name or address, or drop sslmode"
                    .into(),
            ));
        }
        config.ssl_mode(mode.driver());
        if config.get_application_name().is_none() {
            config.application_name("stephost");
        }
        let tls = MakeTls::new(&settings, mode).map_err(refused)?;
        Ok(Server { config, tls, mode })
    }

    /// A new connection and the task-to-be that drives it.
    pub async fn connect(&self) -> StoreResult<(Client, Connection<Socket, tls::Stream>)> {
        self.config.connect(self.tls.clone()).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot connect to the ledger: {}{}",
                describe(&e),
                self.hint(&e)
            ))
        })
    }

    /// What to change when the server refused a connection for want of TLS
    /// or of a client certificate.
    fn hint(&self, e: &tokio_postgres::Error) -> &'static str {
        let refusal = e.as_db_error().filter(|db| {
            db.code() == &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        });
        let says = |words: &str| refusal.is_some_and(|db| db.message().contains(words));
        if says("client certificate") {
            return "; name the client certificate and its key with sslcert=PATH and \
                    sslkey=PATH in the ledger URL";
        }
        match self.mode {
            _ if !says("no encryption") => "",
            Mode::Disable => {
                "; the server takes this connection only over TLS: drop sslmode=disable, or \
                 better, set sslmode=verify-full and sslrootcert in the ledger URL"
            }
            _ => {
                "; the server takes this connection only over TLS, and did not offer it: \
                 check its ssl setting"
            }
        }
    }
}

/// One connection and the statements prepared on it.
pub struct PgConn {
    pub client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl PgConn {
    /// Opens a connection, driven by a task on the current runtime.
    pub async fn connect(server: &Server) -> StoreResult<PgConn> {
        let (client, connection) = server.connect().await?;
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
                StoreError::Unavailable(format!(
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
    pub server: Server,
    idle: Mutex<Vec<PgConn>>,
    permits: Arc<Semaphore>,
}

impl Conns {
    pub fn new(server: Server, max: usize) -> Arc<Self> {
        Arc::new(Conns {
            server,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max)),
        })
    }

    /// A connection: an idle one, or a new one if fewer than the bound are
    /// open; else the next one given back.
    pub async fn get(self: &Arc<Self>) -> StoreResult<Lease> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("the ledger's pool is closed".into()))?;
        let idle = loop {
            let next = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match next {
                Some(conn) if conn.client.is_closed() => continue,
                other => break other,
            }
        };
        let conn = match idle {
            Some(conn) => conn,
            None => PgConn::connect(&self.server).await?,
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

    #[test]
    fn tls_over_a_unix_socket_is_refused_and_plain_text_there_is_not() {
        let refused = Server::from_url("postgres://u@%2Frun%2Fpg/x?sslmode=require", "L")
            .err()
            .expect("TLS over a Unix socket");
        assert!(refused.to_string().contains("Unix socket"), "{refused}");
        Server::from_url("postgres://u@%2Frun%2Fpg/x", "L").expect("prefer, plain there");
    }

    #[test]
    fn a_connection_commits_synchronously_whatever_the_servers_default() {
        let url = crate::throwaway::TestServer::shared().fresh_ledger();
        let mut server = Server::from_url(&url, "test").unwrap();
        server.config.options("-c synchronous_commit=off");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let setting: String = runtime.block_on(async {
            let conn = PgConn::connect(&server).await.unwrap();
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

//! A threaded server: one thread accepts, one thread per connection reads its
//! requests in turn and hands each to the [`Service`]. Stopping it (or dropping
//! it) stops accepting, shuts the open connections down and joins every thread.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::message::{ReadError, Request, Response, read_request, write_response};

/// How long a connection may sit idle between requests before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a server does with the requests it reads.
pub trait Service: Send + Sync + 'static {
    /// Answers `req` on `conn`; whether the connection can carry another request.
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool;

    /// The answer to a request that could not be read (`status` is a 4xx or a
    /// 5xx); the connection is closed after it.
    fn reject(&self, status: u16, message: &str) -> Response {
        Response::error(status, message)
    }

    /// A line about a connection: a request refused, a connection lost
    /// mid-request.
    fn log(&self, _line: fmt::Arguments<'_>) {}
}

/// The connection a request came on.
pub struct Conn<'a> {
    stream: &'a mut TcpStream,
    stopping: &'a AtomicBool,
}

impl Conn<'_> {
    /// Whether the server is stopping (a response then closes its connection).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Writes `resp` whole; whether the connection can carry another request:
    /// the client asked to keep it (`keep_alive`), the write went out and the
    /// server is not stopping.
    pub fn reply(&mut self, resp: &Response, keep_alive: bool) -> bool {
        let keep_alive = keep_alive && !self.stopping();
        write_response(self.stream, resp, keep_alive).is_ok() && keep_alive
    }

    /// The socket, for a response written another way (a stream, a cut body).
    pub fn stream(&mut self) -> &mut TcpStream {
        self.stream
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    service: Arc<dyn Service>,
    /// Names the threads: `NAME-accept`, `NAME-conn-N`.
    name: String,
    max_body_bytes: usize,
    stopping: AtomicBool,
    next_conn: AtomicU64,
    /// Clones of open connections, so that stopping can shut them down.
    conns: Mutex<HashMap<u64, TcpStream>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking connection thread must not take the server's state with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// Serves `service` on `listener`, refusing request bodies over
    /// `max_body_bytes` (413); `name` names its threads.
    pub fn start(
        listener: TcpListener,
        name: &str,
        max_body_bytes: usize,
        service: Arc<dyn Service>,
    ) -> io::Result<Server> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            service,
            name: name.to_string(),
            max_body_bytes,
            stopping: AtomicBool::new(false),
            next_conn: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            workers: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(Server {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://HOST:PORT` (a wildcard listen address becomes loopback).
    pub fn url(&self) -> String {
        format!("http://{}", connect_addr(self.addr))
    }

    /// Stops the server: no new connections, open ones are shut down, threads
    /// joined (a request being answered finishes first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept(); it sees `stopping` and returns.
        let _ = TcpStream::connect_timeout(&connect_addr(self.addr), Duration::from_secs(1));
        let _ = accept.join();
        for conn in lock(&self.shared.conns).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        let workers = std::mem::take(&mut *lock(&self.shared.workers));
        for worker in workers {
            let _ = worker.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where a client reaches `addr`: loopback for a wildcard address.
fn connect_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok((s, _)) => s,
            Err(_) => {
                // e.g. out of file descriptors: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        lock(&shared.conns).insert(id, clone);
        let worker_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-conn-{id}", shared.name))
            .spawn(move || {
                serve_connection(&worker_shared, stream);
                lock(&worker_shared.conns).remove(&id);
            });
        let mut workers = lock(&shared.workers);
        workers.retain(|w| !w.is_finished());
        match spawned {
            Ok(handle) => workers.push(handle),
            Err(_) => {
                lock(&shared.conns).remove(&id);
            }
        }
    }
}

fn serve_connection(shared: &Shared, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let service = &shared.service;
    loop {
        match read_request(&mut reader, &mut writer, shared.max_body_bytes) {
            Ok(req) => {
                let mut conn = Conn {
                    stream: &mut writer,
                    stopping: &shared.stopping,
                };
                if !service.serve(req, &mut conn) {
                    break;
                }
            }
            Err(ReadError::Reject(status, message)) => {
                service.log(format_args!("malformed request -> {status} {message}"));
                let _ = write_response(&mut writer, &service.reject(status, message), false);
                break;
            }
            Err(ReadError::Io(e)) => {
                service.log(format_args!("connection failed mid-request: {e}"));
                break;
            }
            Err(ReadError::Closed) => break,
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

//! The `mcp` effect kind: a tool of an MCP server, one `tools/call` per
//! attempt, or the server's `tools/list` as a recorded read.
//!
//! Servers are declared once (`[mcp.NAME]`: a program over stdio, or a URL
//! over streamable HTTP) and started when a run first calls one of their
//! tools; every run of the process shares the connection, which is closed
//! (and a program stopped, its whole process group) when the process lets go
//! of its effects. Starting a server and its `initialize` are bounded by
//! `start_timeout_ms`, each request by `timeout_ms`; a server that answers
//! with a protocol version the client does not speak is left at once. A
//! server found dead before a request (its program exited, its connection
//! closed) is started again first, so nothing is sent into a dead
//! connection. A program's stderr goes to the host's log a line at a time
//! (`mcp NAME`), each cut at `stderr_line_bytes_max`.
//!
//! Each connection is driven by a thread of its own with a single-threaded
//! tokio runtime: a call is handed over a channel and waited for with a
//! plain blocking receive, so it works from any thread the journal calls
//! from, and the client's tasks never share the worker's runtime.
//!
//! A write carries its operation id, run id and fencing token in the
//! request's `_meta` (`dev.stephost/operation_id`, `dev.stephost/run_id`,
//! `dev.stephost/fence`), so a server can deduplicate and refuse a stale
//! writer. A call whose reply was lost (the server died, the call timed out)
//! may have acted: a write is then sent again only to a server declared
//! `idempotent`, and otherwise parked as `unknown` for a person. A tool
//! call is a write unless its effect configures a read, or its server is
//! trusted with its tools' annotations (`trust_annotations`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    Implementation, JsonObject, ProtocolVersion, RequestMetaObject, Tool,
};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};

use crate::handler::{Failure, Handler, Reply, Request};
use crate::section::{Secrets, default_timeout_ms, resolve_env};
use serde::Deserialize;
use stephost_core::CallClass;

/// Where the `_meta` keys of a call live.
pub const META_PREFIX: &str = "dev.stephost/";

/// How a server is reached.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A program speaking MCP on its stdin and stdout.
    Stdio {
        program: String,
        args: Vec<String>,
        /// The whole environment it gets (the variables the configuration
        /// names, read when it is started).
        env: Vec<String>,
        dir: Option<std::path::PathBuf>,
    },
    /// A server's streamable HTTP endpoint.
    Http {
        url: String,
        /// Sent with every request, already resolved (never recorded).
        headers: Vec<(String, String)>,
    },
}

/// What a server said it is when the connection was made: recorded with
/// each call, so that a replay against another version can be told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub version: String,
    pub protocol_version: String,
}

impl Identity {
    fn describe(&self) -> String {
        format!(
            "MCP server {} {} (protocol {})",
            self.name, self.version, self.protocol_version
        )
    }

    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "version": self.version,
            "protocol_version": self.protocol_version,
        })
    }
}

/// Why a request to a server got no answer, or what it answered instead.
#[derive(Debug)]
enum Lost {
    /// The server answered with a JSON-RPC error.
    Rpc { code: i32, message: String },
    /// No answer in time; the server was told to cancel.
    Timeout,
    /// The connection ended with the request sent: it may have acted.
    Closed(String),
    /// The request never left (no connection could be made).
    NotSent(String),
    /// No connection could be made for the request (a server over HTTP
    /// that is down): it never left.
    Unreachable(String),
    /// An answer this client does not drive (a task, a request for input).
    Unsupported(String),
}

/// How long a server may take, and how long a line of its log may be.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Longest wait for a program to start (or an endpoint to be reached)
    /// and answer `initialize` (`start_timeout_ms`).
    pub start: Duration,
    /// Longest wait for the answer to each request (`timeout_ms`).
    pub request: Duration,
    /// Longest line of a program's stderr passed to the host's log
    /// (`stderr_line_bytes_max`); the rest of a longer one is dropped.
    pub stderr_line_bytes_max: usize,
}

/// A declared server, connected on first use.
pub struct McpServer {
    name: String,
    transport: Transport,
    bounds: Bounds,
    /// Its tools' `readOnlyHint` decides the class of a call no class is
    /// configured for (`trust_annotations`); otherwise such a call is a
    /// write.
    trust_annotations: bool,
    connection: Mutex<Option<Arc<Connection>>>,
}

impl McpServer {
    pub fn new(name: &str, transport: Transport, bounds: Bounds, trust_annotations: bool) -> Self {
        McpServer {
            name: name.to_string(),
            transport,
            bounds,
            trust_annotations,
            connection: Mutex::new(None),
        }
    }

    /// The live connection, made (again) if there is none or it ended:
    /// checked before every request, so that a server that died while idle
    /// is started again before anything is sent rather than sent a request
    /// it cannot get.
    fn connected(&self) -> Result<Arc<Connection>, Lost> {
        let mut slot = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref().map(|c| (c, c.ended())) {
            Some((connection, None)) => return Ok(connection.clone()),
            Some((_, Some(why))) => crate::services::host().line(
                crate::services::Level::Warn,
                &format!("mcp {}", self.name),
                &format!("{why}; starting it again before the next request"),
            ),
            None => {}
        }
        // The old connection, if any, is stopped outside the lock's reach of
        // callers: dropping it waits for its thread.
        let old = slot.take();
        drop(old);
        let connection = Arc::new(Connection::open(&self.name, &self.transport, self.bounds)?);
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn call(&self, tool: &str, arguments: JsonObject, meta: JsonObject) -> Result<Called, Lost> {
        let connection = self.connected()?;
        let timeout = self.bounds.request;
        connection
            .ask(|reply| Job::Call {
                tool: tool.to_string(),
                arguments,
                meta,
                timeout,
                reply,
            })
            .map(|result| Called {
                result,
                identity: connection.identity.clone(),
            })
    }

    /// The server's tools, as first listed on its connection. A list that
    /// failed is not kept: the next asks again.
    fn tools(&self) -> Result<(Arc<Vec<Tool>>, Identity), Lost> {
        let connection = self.connected()?;
        if let Some(tools) = connection.tools.get() {
            return Ok((tools.clone(), connection.identity.clone()));
        }
        let timeout = self.bounds.request;
        let listed = connection.ask(|reply| Job::List { timeout, reply })?;
        let tools = connection.tools.get_or_init(|| Arc::new(listed));
        Ok((tools.clone(), connection.identity.clone()))
    }
}

struct Called {
    result: CallToolResult,
    identity: Identity,
}

/// One request for a connection's thread.
enum Job {
    Call {
        tool: String,
        arguments: JsonObject,
        meta: JsonObject,
        timeout: Duration,
        reply: SyncSender<Result<CallToolResult, Lost>>,
    },
    List {
        timeout: Duration,
        reply: SyncSender<Result<Vec<Tool>, Lost>>,
    },
}

/// A connection to a server, driven by a thread of its own.
struct Connection {
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    identity: Identity,
    /// The connection ended (the server died, or the network went): the
    /// next call makes a new one.
    closed: Arc<AtomicBool>,
    /// The client's side of the connection, to see whether it has closed.
    peer: rmcp::Peer<RoleClient>,
    /// The program's process id, for a server over stdio.
    pid: Option<u32>,
    /// The tools listed on this connection (for their annotations).
    tools: OnceLock<Arc<Vec<Tool>>>,
}

type Client = RunningService<RoleClient, ClientConfig>;

/// How long a closing connection waits for a program to exit before its
/// process group is killed (stdin closed, then SIGTERM, then SIGKILL).
const CLOSE_WAIT: Duration = Duration::from_secs(8);

impl Connection {
    /// Starts the server (or reaches it) and makes the `initialize`
    /// handshake, within `bounds.start`.
    fn open(name: &str, transport: &Transport, bounds: Bounds) -> Result<Self, Lost> {
        let start_timeout = bounds.start;
        let (jobs, mut inbox) = tokio::sync::mpsc::unbounded_channel::<Job>();
        type Ready = (Identity, rmcp::Peer<RoleClient>, Option<u32>);
        let (ready, connected) = sync_channel::<Result<Ready, String>>(1);
        let closed = Arc::new(AtomicBool::new(false));
        let transport = transport.clone();
        let server = name.to_string();
        let seen_closed = closed.clone();
        let thread = std::thread::Builder::new()
            .name(format!("mcp:{name}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready.send(Err(format!("cannot start its runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let connecting = tokio::time::timeout(
                        start_timeout,
                        connect(&server, &transport, bounds.stderr_line_bytes_max),
                    )
                    .await;
                    let (mut client, pid) = match connecting {
                        Ok(Ok(connected)) => connected,
                        Ok(Err(e)) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                        Err(_) => {
                            let _ = ready.send(Err(format!(
                                "it did not start within {} ms (start_timeout_ms): no answer to \
                                 initialize yet; raise start_timeout_ms for a server slow to \
                                 start, such as one npx or uvx fetches first",
                                start_timeout.as_millis()
                            )));
                            return;
                        }
                    };
                    let peer = client.peer().clone();
                    let _ = ready.send(Ok((identity(&client), peer.clone(), pid)));
                    let mut calls = tokio::task::JoinSet::new();
                    while let Some(job) = inbox.recv().await {
                        let peer = peer.clone();
                        let seen_closed = seen_closed.clone();
                        // Calls run side by side on the one connection.
                        calls.spawn(async move {
                            match job {
                                Job::Call {
                                    tool,
                                    arguments,
                                    meta,
                                    timeout,
                                    reply,
                                } => {
                                    let mut params =
                                        CallToolRequestParams::new(tool).with_arguments(arguments);
                                    params.meta = Some(RequestMetaObject::from(meta));
                                    // Dropping the call on its timeout tells
                                    // the server to cancel it.
                                    let answer = match tokio::time::timeout(
                                        timeout,
                                        peer.call_tool_once(params),
                                    )
                                    .await
                                    {
                                        Err(_) => Err(Lost::Timeout),
                                        Ok(Err(e)) => Err(lost(e)),
                                        Ok(Ok(CallToolResponse::Complete(result))) => Ok(result),
                                        Ok(Ok(_)) => Err(Lost::Unsupported(
                                            "the server answered with a task or a request for \
                                             input, which stephost does not drive"
                                                .to_string(),
                                        )),
                                    };
                                    if peer.is_transport_closed() {
                                        seen_closed.store(true, Ordering::Release);
                                    }
                                    let _ = reply.send(answer);
                                }
                                Job::List { timeout, reply } => {
                                    let answer =
                                        match tokio::time::timeout(timeout, peer.list_all_tools())
                                            .await
                                        {
                                            Err(_) => Err(Lost::Timeout),
                                            Ok(result) => result.map_err(lost),
                                        };
                                    let _ = reply.send(answer);
                                }
                            }
                        });
                        // Finished calls are let go of as new ones come.
                        while calls.try_join_next().is_some() {}
                    }
                    calls.abort_all();
                    let _ = client.close_with_timeout(CLOSE_WAIT).await;
                });
            })
            .map_err(|e| {
                Lost::NotSent(format!("cannot start a thread for MCP server {name}: {e}"))
            })?;
        let waited = start_timeout + Duration::from_secs(1);
        let (identity, peer, pid) = match connected.recv_timeout(waited) {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(Lost::NotSent(format!(
                    "cannot connect to MCP server {name}: {e}"
                )));
            }
            Err(_) => {
                return Err(Lost::NotSent(format!(
                    "MCP server {name} did not finish connecting within {} ms \
                     (start_timeout_ms, and a second)",
                    waited.as_millis()
                )));
            }
        };
        Ok(Connection {
            jobs: Some(jobs),
            thread: Some(thread),
            identity,
            closed,
            peer,
            pid,
            tools: OnceLock::new(),
        })
    }

    /// Why this connection can no longer carry a request, if it cannot: a
    /// call saw it close, the client's side has closed (the server's end
    /// of the pipe or stream is gone), or the program has exited. A program
    /// found exited has closed its end too, so nothing sent now could reach
    /// it.
    fn ended(&self) -> Option<String> {
        if self.closed.load(Ordering::Acquire) || self.peer.is_transport_closed() {
            return Some("the connection to the server had closed".to_string());
        }
        let pid = self.pid?;
        exited(pid).then(|| format!("the server's program (pid {pid}) had exited"))
    }

    /// Hands the job `job` makes to the thread and waits for its answer; a
    /// connection found closed is made again at the next call.
    fn ask<T>(&self, job: impl FnOnce(SyncSender<Result<T, Lost>>) -> Job) -> Result<T, Lost> {
        let (reply, answer) = sync_channel(1);
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job(reply)).ok())
            .ok_or_else(|| Lost::NotSent("the MCP client's thread ended".to_string()))?;
        let answer = answer
            .recv()
            .map_err(|_| Lost::Closed("the MCP client's thread ended".to_string()))?;
        if matches!(answer, Err(Lost::Closed(_))) {
            self.closed.store(true, Ordering::Release);
        }
        answer
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The thread closes the client (and stops a program) once its inbox
        // is closed.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("stephost", env!("CARGO_PKG_VERSION")),
    )
    // The handshake every server of these years answers: what is recorded
    // does not depend on which the client prefers.
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Starts (or reaches) the server and makes the handshake; the process id
/// of a program.
async fn connect(
    name: &str,
    transport: &Transport,
    stderr_line_bytes_max: usize,
) -> Result<(Client, Option<u32>), String> {
    let mut pid = None;
    let client = match transport {
        Transport::Stdio {
            program,
            args,
            env,
            dir,
        } => {
            use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
            // A path is the configuration folder's (made absolute: the
            // program starts in that folder), a bare name is looked up on
            // the host's PATH.
            let program = match dir {
                Some(dir) if program.contains('/') => std::path::absolute(dir.join(program))
                    .map_err(|e| format!("cannot resolve {program}: {e}"))?,
                _ => std::path::PathBuf::from(program),
            };
            let mut command = tokio::process::Command::new(&program);
            command.args(args).env_clear();
            for name in env {
                if let Some(value) = std::env::var_os(name) {
                    command.env(name, value);
                }
            }
            if let Some(dir) = dir {
                command.current_dir(dir);
            }
            let mut wrapped = CommandWrap::from(command);
            // Its whole process group is stopped with it.
            wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            let (child, stderr) = rmcp::transport::TokioChildProcess::builder(wrapped)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
            pid = child.id();
            // Its log goes to the host's, a line at a time (read as it
            // comes: a full pipe would stall the server).
            if let Some(stderr) = stderr {
                let source = format!("mcp {name}");
                tokio::spawn(log_lines(stderr, source, stderr_line_bytes_max));
            }
            client_config()
                .serve(child)
                .await
                .map_err(|e| e.to_string())?
        }
        Transport::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            install_tls_provider();
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let name = ureq::http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| format!("header {name:?}: {e}"))?;
                let value = ureq::http::HeaderValue::from_str(value)
                    .map_err(|e| format!("the value of header {name}: {e}"))?;
                custom.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .reinit_on_expired_session(false)
                    .custom_headers(custom),
            );
            client_config()
                .serve(transport)
                .await
                .map_err(|e| e.to_string())?
        }
    };
    // A server that answered with a protocol version this client does not
    // speak is left at once (the specification's SHOULD): nothing is sent
    // to it.
    if let Err(refused) = check_protocol_version(&client) {
        let mut client = client;
        let _ = client.close_with_timeout(CLOSE_WAIT).await;
        return Err(refused);
    }
    // A list is always asked of the server, never answered from a cache.
    client
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    Ok((client, pid))
}

/// Whether child process `pid` has exited, without reaping it (the
/// process's owner still waits for it); one already reaped has too.
fn exited(pid: libc::id_t) -> bool {
    // SAFETY: waitid(2) writes one siginfo_t, which we own and which
    // outlives the call; WNOWAIT leaves the child waitable, WNOHANG keeps
    // the call from blocking.
    #[allow(unsafe_code)]
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let found = libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        // -1: no such child (reaped already); 0 with no pid: still running.
        found != 0 || info.si_pid() != 0
    }
}

/// The protocol versions this client speaks: those of the `initialize`
/// handshake that `rmcp` knows, oldest first.
fn supported_versions() -> impl Iterator<Item = &'static ProtocolVersion> {
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .filter(|v| v.has_initialize())
}

/// Whether the version the server answered `initialize` with is one this
/// client speaks; if not, why the connection is left.
fn check_protocol_version(client: &Client) -> Result<(), String> {
    let answered = client
        .peer()
        .peer_info()
        .map(|info| info.protocol_version.clone());
    match answered {
        Some(version) if supported_versions().any(|v| *v == version) => Ok(()),
        answered => {
            let supported: Vec<&str> = supported_versions().map(ProtocolVersion::as_str).collect();
            let answered = answered.map_or_else(
                || "no protocol version".to_string(),
                |v| format!("protocol version {:?}", v.as_str()),
            );
            Err(format!(
                "it answered initialize with {answered}, which stephost does not speak (it \
                 speaks {}); the connection was closed and nothing sent: use a server that \
                 speaks one of these",
                supported.join(", ")
            ))
        }
    }
}

/// Passes what a program prints on stderr to the host's log, a line at a
/// time, holding at most `line_bytes_max` bytes of a line: a longer one is
/// logged cut, with a marker, and the rest of it is read and dropped.
async fn log_lines(
    stderr: impl tokio::io::AsyncRead + Unpin,
    source: String,
    line_bytes_max: usize,
) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    // The line being read was logged cut: drop the rest of it.
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf().await {
            Ok(chunk) if !chunk.is_empty() => chunk,
            _ => break,
        };
        let end = chunk.iter().position(|b| *b == b'\n');
        let part = &chunk[..end.unwrap_or(chunk.len())];
        if !cut {
            let room = line_bytes_max - line.len();
            if part.len() > room {
                line.extend_from_slice(&part[..room]);
                log_line(&source, &line, Some(line_bytes_max));
                line.clear();
                cut = true;
            } else {
                line.extend_from_slice(part);
            }
        }
        let read = end.map_or(chunk.len(), |at| at + 1);
        reader.consume(read);
        if end.is_some() {
            if !cut {
                log_line(&source, &line, None);
            }
            line.clear();
            cut = false;
        }
    }
    if !line.is_empty() {
        log_line(&source, &line, None);
    }
}

/// One line of a program's stderr in the host's log, without control
/// characters; `cut_at` when it was longer than that.
fn log_line(source: &str, line: &[u8], cut_at: Option<usize>) {
    let text: String = String::from_utf8_lossy(line)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let host = crate::services::host();
    match cut_at {
        None => host.line(crate::services::Level::Info, source, &text),
        Some(max) => host.line(
            crate::services::Level::Info,
            source,
            &format!("{text} [line cut at {max} bytes (stderr_line_bytes_max); the rest dropped]"),
        ),
    }
}

/// TLS for servers over `https://`, with the same provider as the rest of
/// the host's HTTP.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn identity(client: &Client) -> Identity {
    let info = client.peer().peer_info();
    let server = info.as_ref().and_then(|i| i.server_info.clone());
    Identity {
        name: server.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
        version: server
            .as_ref()
            .map(|s| s.version.clone())
            .unwrap_or_default(),
        protocol_version: info
            .map(|i| i.protocol_version.to_string())
            .unwrap_or_default(),
    }
}

/// Whether `error` is the HTTP client's failure to connect (refused, no
/// such host, a failed TLS handshake): then no request left.
fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut cause = Some(error);
    while let Some(e) = cause {
        // The client's error is that variant's payload, not its source.
        if let Some(StreamableHttpError::Client(client)) =
            e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return client.is_connect();
        }
        cause = e.source();
    }
    false
}

fn lost(e: ServiceError) -> Lost {
    match e {
        ServiceError::McpError(data) => Lost::Rpc {
            code: data.code.0,
            message: data.message.to_string(),
        },
        ServiceError::Timeout { .. } => Lost::Timeout,
        ServiceError::TransportClosed => Lost::Closed("the connection closed".to_string()),
        ServiceError::TransportSend(e) if never_connected(&e) => Lost::Unreachable(e.to_string()),
        ServiceError::TransportSend(e) => Lost::Closed(e.to_string()),
        other => Lost::Unsupported(other.to_string()),
    }
}

/// What the effect does with its server.
#[derive(Debug, Clone)]
pub enum Operation {
    /// `tools/call` of this tool, the request's JSON object its arguments.
    Call { tool: String },
    /// `tools/list`: the server's identity and tools.
    List,
}

/// An `mcp` effect.
pub struct McpEffect {
    server: Arc<McpServer>,
    operation: Operation,
    /// The server deduplicates writes by `dev.stephost/operation_id`.
    idempotent: bool,
    /// The configured class; `None`: the tool's annotations decide when
    /// the server is trusted with them, else a call is a write.
    configured: Option<CallClass>,
}

impl McpEffect {
    pub fn new(
        server: Arc<McpServer>,
        operation: Operation,
        idempotent: bool,
        configured: Option<CallClass>,
    ) -> Self {
        McpEffect {
            server,
            operation,
            idempotent,
            configured,
        }
    }

    fn failure(&self, lost: Lost) -> Failure {
        let server = &self.server.name;
        match lost {
            // Invalid request, unknown method or bad params: the request is
            // at fault, not the moment.
            Lost::Rpc { code, message } if matches!(code, -32700 | -32600 | -32601 | -32602) => {
                Failure::Invalid(format!(
                    "MCP server {server} refused the request ({code}): {message}"
                ))
            }
            // An internal error may come after the tool acted.
            Lost::Rpc {
                code: -32603,
                message,
            } => Failure::retryable(format!(
                "MCP server {server} failed internally (-32603): {message}"
            )),
            Lost::Rpc { code, message } => Failure::Refused(format!(
                "MCP server {server} refused the call ({code}): {message}"
            )),
            Lost::Timeout => Failure::retryable(format!(
                "MCP server {server} did not answer within {} ms (timeout_ms)",
                self.server.bounds.request.as_millis()
            )),
            Lost::Closed(why) => Failure::retryable(format!(
                "the connection to MCP server {server} ended before its answer: {why}"
            )),
            Lost::NotSent(why) => Failure::not_received(why),
            Lost::Unreachable(why) => Failure::not_received(format!(
                "cannot connect to MCP server {server}, so nothing was sent: {why}"
            )),
            Lost::Unsupported(why) => Failure::Rejected(format!("MCP server {server}: {why}")),
        }
    }
}

/// The text of a tool's error result, for the step's error message.
fn error_text(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if texts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_else(|| "(no message)".to_string())
    } else {
        texts.join("\n")
    }
}

impl Handler for McpEffect {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        match &self.operation {
            Operation::List => {
                let (tools, identity) = self.server.tools().map_err(|l| self.failure(l))?;
                let body = json!({ "server": identity.json(), "tools": &*tools });
                Ok(Reply::new(body.to_string()))
            }
            Operation::Call { tool } => {
                let arguments = match serde_json::from_str::<Value>(request.body) {
                    Ok(Value::Object(arguments)) => arguments,
                    _ => {
                        return Err(Failure::Invalid(format!(
                            "the arguments of MCP tool {tool} must be a JSON object"
                        )));
                    }
                };
                let mut meta = JsonObject::new();
                meta.insert(
                    format!("{META_PREFIX}operation_id"),
                    request.operation_id.into(),
                );
                meta.insert(format!("{META_PREFIX}run_id"), request.run_id.into());
                // Trace context as MCP carries it: in `_meta`, by its W3C names.
                if let Some((traceparent, tracestate)) = request.trace_context() {
                    meta.insert("traceparent".into(), traceparent.into());
                    if let Some(state) = tracestate {
                        meta.insert("tracestate".into(), state.into());
                    }
                }
                if request.class == CallClass::Write {
                    meta.insert(format!("{META_PREFIX}fence"), request.fence.into());
                }
                let called = self
                    .server
                    .call(tool, arguments, meta)
                    .map_err(|l| self.failure(l))?;
                if called.result.is_error == Some(true) {
                    return Err(Failure::Rejected(format!(
                        "MCP tool {tool} failed: {}",
                        error_text(&called.result)
                    )));
                }
                let body = serde_json::to_string(&called.result)
                    .map_err(|e| Failure::Rejected(format!("MCP tool {tool}'s result: {e}")))?;
                let mut reply = Reply::new(body);
                reply.detail = Some(called.identity.describe());
                Ok(reply)
            }
        }
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    fn declares_class(&self) -> bool {
        self.configured.is_none()
            && self.server.trust_annotations
            && matches!(self.operation, Operation::Call { .. })
    }

    fn declared_class(&self) -> Option<CallClass> {
        let (None, Operation::Call { tool }, true) = (
            self.configured,
            &self.operation,
            self.server.trust_annotations,
        ) else {
            return self.configured;
        };
        // A hint is a read only when the server says so; a server that
        // cannot be asked, or a tool it does not list, is a write.
        let read_only = self.server.tools().ok().is_some_and(|(tools, _)| {
            tools.iter().any(|t| {
                t.name == tool.as_str()
                    && t.annotations
                        .as_ref()
                        .and_then(|a| a.read_only_hint)
                        .unwrap_or(false)
            })
        });
        Some(if read_only {
            CallClass::Read
        } else {
            CallClass::Write
        })
    }
}

/// The servers of a configuration, by name.
pub type Servers = BTreeMap<String, Arc<McpServer>>;

/// An MCP server (`[mcp.NAME]`): a program over stdio (`command`) or a
/// streamable HTTP endpoint (`url`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program, found on the host's `PATH` unless a path; it runs in
    /// the configuration's folder.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables of the host's environment the program gets, by name (it
    /// gets no others).
    #[serde(default)]
    pub env: Vec<String>,
    /// The server's streamable HTTP endpoint (`http://` or `https://`).
    pub url: Option<String>,
    /// Sent with every HTTP request; values may name environment variables
    /// as `${NAME}`, read when the configuration is loaded and never
    /// recorded.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for the answer to each request.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest wait for the program to start (or the endpoint to be
    /// reached) and answer `initialize`; generous, since a server that npx
    /// or uvx fetches first may take many seconds.
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// The tools' `readOnlyHint` decides the class of a call whose effect
    /// configures none. Off by default: annotations are the server's word,
    /// and a wrong one would let a write be retried as a read.
    #[serde(default)]
    pub trust_annotations: bool,
    /// Longest line of the program's stderr passed to the host's log; the
    /// rest of a longer one is dropped, with a marker.
    #[serde(default = "default_stderr_line_bytes_max")]
    pub stderr_line_bytes_max: usize,
}

fn default_start_timeout_ms() -> u64 {
    120_000
}

fn default_stderr_line_bytes_max() -> usize {
    4_096
}

/// The declared MCP servers (`[mcp.NAME]`), none connected yet.
pub fn servers(
    mcp: &BTreeMap<String, McpServerConfig>,
    secrets: &Secrets,
    base_dir: &std::path::Path,
) -> Result<Servers, String> {
    let mut servers = Servers::new();
    for (name, config) in mcp {
        let what = format!("mcp.\"{name}\"");
        let transport = match (&config.command, &config.url) {
            (Some(program), None) => {
                if !config.headers.is_empty() {
                    return Err(format!(
                        "{what}.headers are for a server over HTTP (url); a program gets \
                         variables by name in env"
                    ));
                }
                Transport::Stdio {
                    program: program.clone(),
                    args: config.args.clone(),
                    env: config.env.clone(),
                    dir: Some(base_dir.to_path_buf()).filter(|d| !d.as_os_str().is_empty()),
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!(
                        "{what}.url {url:?} is not an http:// or https:// URL"
                    ));
                }
                if !config.args.is_empty() || !config.env.is_empty() {
                    return Err(format!(
                        "{what}: args and env are for a program (command), not a server \
                         over HTTP"
                    ));
                }
                let headers = config
                    .headers
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), resolve_env(v, &what, secrets)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                Transport::Http {
                    url: url.clone(),
                    headers,
                }
            }
            _ => {
                return Err(format!(
                    "{what} needs exactly one of command (a program over stdio) and url (a \
                     server over streamable HTTP)"
                ));
            }
        };
        let bounds = Bounds {
            start: Duration::from_millis(config.start_timeout_ms),
            request: Duration::from_millis(config.timeout_ms),
            stderr_line_bytes_max: config.stderr_line_bytes_max,
        };
        let server = McpServer::new(name, transport, bounds, config.trust_annotations);
        servers.insert(name.clone(), std::sync::Arc::new(server));
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_seen_exited_once_it_ends_and_is_left_for_its_owner_to_reap() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        assert!(!exited(child.id()));
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !exited(child.id()) {
            assert!(std::time::Instant::now() < deadline, "never seen exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Not reaped by the look: its owner still gets its status.
        let status = child.wait().unwrap();
        assert!(!status.success());
        // Once reaped, it is no child of ours: exited too.
        assert!(exited(child.id()));
    }
}

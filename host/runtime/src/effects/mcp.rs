//! The `mcp` effect kind: a tool of an MCP server, one `tools/call` per
//! attempt, or the server's `tools/list` as a recorded read.
//!
//! Servers are declared once (`[mcp.NAME]`: a program over stdio, or a URL
//! over streamable HTTP) and started when a run first calls one of their
//! tools; every run of the process shares the connection, which is closed
//! (and a program stopped, its whole process group) when the process lets go
//! of its effects. A server that dies is started again at the next call. A
//! program's stderr goes to the host's log a line at a time (`mcp NAME`).
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
//! `idempotent`, and otherwise parked as `unknown` for a person.

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

use super::{Failure, Handler, Reply, Request};
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
    /// An answer this client does not drive (a task, a request for input).
    Unsupported(String),
}

/// A declared server, connected on first use.
pub struct McpServer {
    name: String,
    transport: Transport,
    /// Longest wait for the connection and for each request.
    timeout: Duration,
    connection: Mutex<Option<Arc<Connection>>>,
}

impl McpServer {
    pub fn new(name: &str, transport: Transport, timeout: Duration) -> Self {
        McpServer {
            name: name.to_string(),
            transport,
            timeout,
            connection: Mutex::new(None),
        }
    }

    /// The live connection, made (again) if there is none or it ended.
    fn connected(&self) -> Result<Arc<Connection>, Lost> {
        let mut slot = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(connection) = slot.as_ref().filter(|c| !c.closed.load(Ordering::Acquire)) {
            return Ok(connection.clone());
        }
        // The old connection, if any, is stopped outside the lock's reach of
        // callers: dropping it waits for its thread.
        let old = slot.take();
        drop(old);
        let connection = Arc::new(Connection::open(&self.name, &self.transport, self.timeout)?);
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn call(&self, tool: &str, arguments: JsonObject, meta: JsonObject) -> Result<Called, Lost> {
        let connection = self.connected()?;
        let timeout = self.timeout;
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

    /// The server's tools, as listed when its connection was made.
    fn tools(&self) -> Result<(Arc<Vec<Tool>>, Identity), Lost> {
        let connection = self.connected()?;
        if let Some(tools) = connection.tools.get() {
            return Ok((tools.clone(), connection.identity.clone()));
        }
        let timeout = self.timeout;
        let listed = connection.ask(|reply| Job::List { timeout, reply });
        let tools = connection
            .tools
            .get_or_init(|| Arc::new(listed.unwrap_or_default()));
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
    /// The tools listed on this connection (for their annotations).
    tools: OnceLock<Arc<Vec<Tool>>>,
}

type Client = RunningService<RoleClient, ClientConfig>;

/// How long a closing connection waits for a program to exit before its
/// process group is killed (stdin closed, then SIGTERM, then SIGKILL).
const CLOSE_WAIT: Duration = Duration::from_secs(8);

impl Connection {
    fn open(name: &str, transport: &Transport, timeout: Duration) -> Result<Self, Lost> {
        let (jobs, mut inbox) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let (ready, connected) = sync_channel::<Result<Identity, String>>(1);
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
                    let connecting =
                        tokio::time::timeout(timeout, connect(&server, &transport)).await;
                    let mut client = match connecting {
                        Ok(Ok(client)) => client,
                        Ok(Err(e)) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                        Err(_) => {
                            let _ = ready.send(Err(format!(
                                "no answer to initialize within {} ms",
                                timeout.as_millis()
                            )));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(identity(&client)));
                    let peer = client.peer().clone();
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
        let waited = timeout + Duration::from_secs(1);
        let identity = match connected.recv_timeout(waited) {
            Ok(Ok(identity)) => identity,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(Lost::NotSent(format!(
                    "cannot connect to MCP server {name}: {e}"
                )));
            }
            Err(_) => {
                return Err(Lost::NotSent(format!(
                    "MCP server {name} did not finish connecting within {} ms",
                    waited.as_millis()
                )));
            }
        };
        Ok(Connection {
            jobs: Some(jobs),
            thread: Some(thread),
            identity,
            closed,
            tools: OnceLock::new(),
        })
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

async fn connect(name: &str, transport: &Transport) -> Result<Client, String> {
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
            // Its log goes to the host's, a line at a time (read as it
            // comes: a full pipe would stall the server).
            if let Some(stderr) = stderr {
                let source = format!("mcp {name}");
                tokio::spawn(async move {
                    use tokio::io::AsyncBufReadExt;
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let line: String = line.chars().filter(|c| !c.is_control()).collect();
                        crate::logs::info(&source, None, line);
                    }
                });
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
    // A list is always asked of the server, never answered from a cache.
    client
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    Ok(client)
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

fn lost(e: ServiceError) -> Lost {
    match e {
        ServiceError::McpError(data) => Lost::Rpc {
            code: data.code.0,
            message: data.message.to_string(),
        },
        ServiceError::Timeout { .. } => Lost::Timeout,
        ServiceError::TransportClosed => Lost::Closed("the connection closed".to_string()),
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
    /// The configured class; `None`: the tool's annotations decide.
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
                self.server.timeout.as_millis()
            )),
            Lost::Closed(why) => Failure::retryable(format!(
                "the connection to MCP server {server} ended before its answer: {why}"
            )),
            Lost::NotSent(why) => Failure::not_received(why),
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
        self.configured.is_none() && matches!(self.operation, Operation::Call { .. })
    }

    fn declared_class(&self) -> Option<CallClass> {
        let (None, Operation::Call { tool }) = (self.configured, &self.operation) else {
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

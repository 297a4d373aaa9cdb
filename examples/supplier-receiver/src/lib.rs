//! A small, real HTTP/1.1 server that plays a supplier's order API for stephost's
//! end-to-end tests and README demo.
//!
//! - `GET /inventory/{sku}` → `200 {"sku", "on_hand"}` from a stock table,
//!   with a session cookie (`Set-Cookie: `[`SESSION_COOKIE`]).
//! - `POST /orders` with `Idempotency-Key` → `201` and a receipt for a new key, `200` with
//!   the same receipt and `Idempotent-Replayed: true` for a repeat with the same body,
//!   `422` for a repeat with another body, `409` for a stale `Stephost-Fence`.
//! - `GET /orders/{operation_id}` → `200` and the receipt, or `404`.
//!
//! For the refund agent example (`examples/agent-refund`) it also plays a shop's
//! customer orders and refunds:
//!
//! - `GET /customer-orders/{order_id}` → `200 {"order_id", "amount_cents",
//!   "refunded_cents", "currency"}` from a table of customer orders, or `404`.
//! - `POST /refunds` with `Idempotency-Key` and `{"order_id", "amount_cents", ...}` →
//!   `201` and a receipt; deduplicated and fenced like `POST /orders`; `422` for an
//!   unknown order or more than is left to refund.
//! - `GET /refunds/{operation_id}` → `200` and the receipt, or `404`.
//!
//! Tests start it on `127.0.0.1:0` with [`Receiver::start`], queue one-shot [`Fault`]s
//! for the next `POST /orders` requests, and read its counters. Dropping the
//! [`Receiver`] stops it.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use receiver_http::{Conn, Request, Response, Server, Service, percent_decode};

/// The session cookie every inventory answer sets.
pub const SESSION_COOKIE: &str = "supplier_session=3f9a1c7e5b";

/// `on_hand` for a sku that is not in the stock table, unless configured otherwise.
pub const DEFAULT_ON_HAND: i64 = 3;
/// The customer orders a receiver knows unless configured otherwise:
/// `(order id, amount in cents)`.
pub const DEFAULT_CUSTOMER_ORDERS: &[(&str, i64)] = &[("A-1001", 4999), ("A-1002", 25000)];
/// Largest request body accepted (larger ones get `413`).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How to start a [`Receiver`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on; port 0 picks a free one.
    pub listen: String,
    /// `on_hand` per sku for `GET /inventory/{sku}`.
    pub stock: HashMap<String, i64>,
    /// `on_hand` for any sku not in `stock`.
    pub default_on_hand: i64,
    /// Customer orders by id, with their amount in cents, for
    /// `GET /customer-orders/{order_id}` and `POST /refunds`.
    pub customer_orders: HashMap<String, i64>,
    /// Persist created orders as JSON lines (fsync'd) and reload them on start.
    /// `None` keeps state in memory only.
    pub state_file: Option<PathBuf>,
    /// Print every request and its outcome on stderr.
    pub log: bool,
    /// Answer a repeated `Idempotency-Key` with the first order's receipt
    /// (the default); `false` plays a receiver that ignores the key and
    /// creates an order for every request it commits.
    pub deduplicate: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:0".into(),
            stock: HashMap::new(),
            default_on_hand: DEFAULT_ON_HAND,
            customer_orders: DEFAULT_CUSTOMER_ORDERS
                .iter()
                .map(|&(id, cents)| (id.to_string(), cents))
                .collect(),
            state_file: None,
            log: false,
            deduplicate: true,
        }
    }
}

/// A one-shot misbehaviour for the next `POST /orders` request. Queued faults apply to
/// consecutive `POST /orders` requests in order; after the queue is empty the receiver
/// behaves normally. Other endpoints never consume a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status (and a `Retry-After` header when given) and an error
    /// body; no business effect, no idempotency or fence bookkeeping.
    Status {
        status: u16,
        retry_after_s: Option<u64>,
    },
    /// Process the request normally (creating the order if the key is new), then close
    /// the connection without writing any response: the client loses the reply.
    CommitThenDrop,
    /// Close the connection without processing the request or writing a response:
    /// the request is lost before it takes effect.
    DropBeforeCommit,
    /// Process the request normally, then wait this long before replying.
    Delay(Duration),
    /// Wait this long, then process the request normally and reply: a
    /// lookup meanwhile finds no order yet (a receiver that commits late).
    CommitLate(Duration),
    /// Process the request normally, then reply `201` with a body that is
    /// not JSON (an HTML page from a proxy in front of the receiver).
    CommitNotJson,
}

/// A misbehaviour of one `GET /orders/{operation_id}` (a lookup), queued
/// with [`Receiver::push_lookup_fault`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupFault {
    /// Look the order up, then wait this long before answering (a slow
    /// lookup the client may give up on).
    Slow(Duration),
    /// Answer `200` with the receipt of another operation (an order the
    /// receiver holds, or a made-up one): a receipt that proves nothing
    /// about the operation asked for.
    OtherReceipt,
    /// Answer `200` with a body that is not JSON.
    NotJson,
}

/// What [`Fault::CommitNotJson`] and [`LookupFault::NotJson`] answer.
pub const NOT_JSON: &str = "<html><body>OK</body></html>";

impl Fault {
    /// `Fault::Status` without `Retry-After`.
    pub fn status(status: u16) -> Fault {
        Fault::Status {
            status,
            retry_after_s: None,
        }
    }

    /// `Fault::Status` with `Retry-After: secs`.
    pub fn retry_after(status: u16, secs: u64) -> Fault {
        Fault::Status {
            status,
            retry_after_s: Some(secs),
        }
    }
}

/// An order the receiver created (one business effect). This is also the line format
/// of the state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// `ORD-<n>`, n counting from 1.
    pub order_id: String,
    /// The `Idempotency-Key` it was created with.
    pub operation_id: String,
    /// sha256 (hex) of the request body bytes.
    pub payload_sha256: String,
    /// The request body as received.
    pub body: String,
    /// `sku` from the body (`null` when absent).
    pub sku: Value,
    /// `quantity` from the body (`null` when absent).
    pub quantity: Value,
    /// `Stephost-Run-Id` of the creating request, if any.
    pub run_id: Option<String>,
    /// `Stephost-Fence` of the creating request, if any.
    pub fence: Option<u64>,
}

impl Order {
    /// The receipt returned by `POST /orders` and `GET /orders/{operation_id}`.
    pub fn receipt(&self) -> Value {
        json!({
            "order_id": self.order_id,
            "operation_id": self.operation_id,
            "payload_sha256": self.payload_sha256,
            "quantity": self.quantity,
            "sku": self.sku,
        })
    }

    /// The body parsed as JSON (it was valid JSON when the order was created).
    pub fn body_json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// A refund the receiver made (one business effect of `POST /refunds`). Refunds are
/// kept in memory only, also with a state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refund {
    /// `RF-<n>`, n counting from 1.
    pub refund_id: String,
    /// The `Idempotency-Key` it was made with.
    pub operation_id: String,
    /// sha256 (hex) of the request body bytes.
    pub payload_sha256: String,
    /// The customer order refunded.
    pub order_id: String,
    /// The amount refunded, in cents.
    pub amount_cents: i64,
    /// The request body as received.
    pub body: String,
    /// `Stephost-Run-Id` of the creating request, if any.
    pub run_id: Option<String>,
    /// `Stephost-Fence` of the creating request, if any.
    pub fence: Option<u64>,
}

impl Refund {
    /// The receipt returned by `POST /refunds` and `GET /refunds/{operation_id}`.
    pub fn receipt(&self) -> Value {
        json!({
            "refund_id": self.refund_id,
            "operation_id": self.operation_id,
            "payload_sha256": self.payload_sha256,
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
        })
    }
}

/// One request as the receiver saw it (every endpoint, including faulted ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub method: String,
    /// The request target as sent (path and query).
    pub path: String,
    /// Header names lowercased, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status answered; `None` while in progress or when the connection was
    /// dropped without a response.
    pub status: Option<u16>,
}

impl SeenRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct State {
    stock: HashMap<String, i64>,
    default_on_hand: i64,
    orders: Vec<Order>,
    by_key: HashMap<String, usize>,
    /// Whether a repeated key is answered with its first order.
    deduplicate: bool,
    /// Highest `Stephost-Fence` seen per `Stephost-Run-Id`.
    fences: HashMap<String, u64>,
    faults: VecDeque<Fault>,
    lookup_faults: VecDeque<LookupFault>,
    customer_orders: HashMap<String, i64>,
    refunds: Vec<Refund>,
    refund_by_key: HashMap<String, usize>,
    refund_requests_received: usize,
    customer_order_reads: usize,
    /// What every lookup answers instead of the truth, when set.
    lookup_answer: Option<(u16, Vec<u8>)>,
    requests: Vec<SeenRequest>,
    requests_received: usize,
    lookups: usize,
    idempotent_replays: usize,
    inventory_reads: usize,
    state_file: Option<File>,
}

struct Shared {
    state: Mutex<State>,
    log: bool,
}

/// What to do with the connection after handling a request.
enum Outcome {
    Reply(Response),
    Drop,
}

/// A running receiver. Dropping it (or calling [`Receiver::stop`]) stops accepting,
/// closes open connections and joins its threads.
pub struct Receiver {
    shared: Arc<Shared>,
    server: Server,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking connection thread must not take the test's view of the state with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Receiver {
    /// Starts on `127.0.0.1:0` with the default stock (every sku has 3).
    pub fn start() -> io::Result<Receiver> {
        Receiver::start_with(Config::default())
    }

    /// Starts on `addr` with this stock table (skus not in it have 3).
    pub fn start_on(addr: &str, stock: HashMap<String, i64>) -> io::Result<Receiver> {
        Receiver::start_with(Config {
            listen: addr.into(),
            stock,
            ..Config::default()
        })
    }

    /// Starts with a full configuration.
    pub fn start_with(config: Config) -> io::Result<Receiver> {
        let mut state = State {
            stock: config.stock,
            default_on_hand: config.default_on_hand,
            customer_orders: config.customer_orders,
            deduplicate: config.deduplicate,
            ..State::default()
        };
        if let Some(path) = &config.state_file {
            load_state(&mut state, path)?;
            state.state_file = Some(OpenOptions::new().create(true).append(true).open(path)?);
        }
        let listener = TcpListener::bind(&config.listen)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            log: config.log,
        });
        let server = Server::start(
            listener,
            "supplier-receiver",
            MAX_BODY_BYTES,
            shared.clone(),
        )?;
        Ok(Receiver { shared, server })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// `http://HOST:PORT` (a wildcard listen address becomes loopback).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Queues a fault for the next `POST /orders` request not yet claimed by an
    /// earlier fault.
    pub fn push_fault(&self, fault: Fault) {
        lock(&self.shared.state).faults.push_back(fault);
    }

    /// Makes every `GET /orders/{operation_id}` answer `status` with `body`
    /// (sent as `application/json`, empty for none) whatever the truth, as a
    /// misbehaving receiver would; `None` restores true answers.
    pub fn set_lookup_answer(&self, answer: Option<(u16, &str)>) {
        lock(&self.shared.state).lookup_answer =
            answer.map(|(status, body)| (status, body.as_bytes().to_vec()));
    }

    /// Faults queued and not yet applied.
    pub fn pending_faults(&self) -> usize {
        lock(&self.shared.state).faults.len()
    }

    /// Queues a misbehaviour for the next lookup (`GET /orders/{id}`) not
    /// yet claimed by an earlier one.
    pub fn push_lookup_fault(&self, fault: LookupFault) {
        lock(&self.shared.state).lookup_faults.push_back(fault);
    }

    /// Lookup misbehaviours queued and not yet applied.
    pub fn pending_lookup_faults(&self) -> usize {
        lock(&self.shared.state).lookup_faults.len()
    }

    /// Sets the `on_hand` of one sku.
    pub fn set_stock(&self, sku: &str, on_hand: i64) {
        lock(&self.shared.state)
            .stock
            .insert(sku.to_string(), on_hand);
    }

    /// Every `POST /orders` request received: faulted, rejected and duplicate ones too.
    pub fn requests_received(&self) -> usize {
        lock(&self.shared.state).requests_received
    }

    /// Orders actually created.
    pub fn business_effects(&self) -> usize {
        lock(&self.shared.state).orders.len()
    }

    /// The created orders, oldest first.
    pub fn orders(&self) -> Vec<Order> {
        lock(&self.shared.state).orders.clone()
    }

    /// The order created with this operation id (`Idempotency-Key`), if any.
    pub fn order(&self, operation_id: &str) -> Option<Order> {
        let state = lock(&self.shared.state);
        state
            .by_key
            .get(operation_id)
            .map(|&i| state.orders[i].clone())
    }

    /// `GET /orders/{operation_id}` requests received (found or not).
    pub fn lookups(&self) -> usize {
        lock(&self.shared.state).lookups
    }

    /// `POST /orders` requests answered `200` with `Idempotent-Replayed: true`.
    pub fn idempotent_replays(&self) -> usize {
        lock(&self.shared.state).idempotent_replays
    }

    /// `GET /inventory/{sku}` requests received.
    pub fn inventory_reads(&self) -> usize {
        lock(&self.shared.state).inventory_reads
    }

    /// Every `POST /refunds` request received: rejected and duplicate ones too.
    pub fn refund_requests_received(&self) -> usize {
        lock(&self.shared.state).refund_requests_received
    }

    /// The refunds made, oldest first.
    pub fn refunds(&self) -> Vec<Refund> {
        lock(&self.shared.state).refunds.clone()
    }

    /// `GET /customer-orders/{order_id}` requests received (found or not).
    pub fn customer_order_reads(&self) -> usize {
        lock(&self.shared.state).customer_order_reads
    }

    /// Every request received, on every endpoint, oldest first.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.shared.state).requests.clone()
    }

    /// The most recent `POST /orders` request.
    pub fn last_order_request(&self) -> Option<SeenRequest> {
        lock(&self.shared.state)
            .requests
            .iter()
            .rev()
            .find(|r| r.method == "POST" && path_of(&r.path) == "/orders")
            .cloned()
    }

    /// Stops the server: no new connections, open ones are shut down, threads joined.
    /// A request being delayed by [`Fault::Delay`] finishes its sleep first.
    pub fn stop(self) {
        self.server.stop();
    }
}

fn load_state(state: &mut State, path: &PathBuf) -> io::Result<()> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let order: Order = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}:{}: not an order: {e}", path.display(), i + 1),
            )
        })?;
        if let (Some(run), Some(fence)) = (&order.run_id, order.fence) {
            let max = state.fences.entry(run.clone()).or_insert(fence);
            *max = (*max).max(fence);
        }
        state
            .by_key
            .insert(order.operation_id.clone(), state.orders.len());
        state.orders.push(order);
    }
    Ok(())
}

impl Service for Shared {
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool {
        let keep_alive = req.keep_alive();
        match self.handle(req) {
            Outcome::Reply(resp) => conn.reply(&resp, keep_alive),
            Outcome::Drop => false,
        }
    }

    fn log(&self, line: std::fmt::Arguments<'_>) {
        self.log_line(line);
    }
}

/// The path part of a request target (no query, no fragment).
fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Shared {
    fn log_line(&self, args: std::fmt::Arguments<'_>) {
        if self.log {
            eprintln!("supplier-receiver: {args}");
        }
    }

    fn handle(&self, req: Request) -> Outcome {
        let seen = SeenRequest {
            method: req.method.clone(),
            path: req.target.clone(),
            headers: req.headers.clone(),
            body: req.body.clone(),
            status: None,
        };
        let path = path_of(&req.target).to_string();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let post_order = matches!(segments.as_slice(), ["orders"]) && req.method == "POST";

        let (index, fault) = {
            let mut state = lock(&self.state);
            state.requests.push(seen);
            let index = state.requests.len() - 1;
            let fault = if post_order {
                state.requests_received += 1;
                state.faults.pop_front()
            } else {
                None
            };
            (index, fault)
        };

        let outcome = match (segments.as_slice(), req.method.as_str()) {
            (["inventory", sku], "GET") => Outcome::Reply(self.inventory(sku)),
            (["orders", id], "GET") => Outcome::Reply(self.faulty_lookup(id)),
            (["orders"], "POST") => self.post_order(&req, fault),
            (["customer-orders", id], "GET") => Outcome::Reply(self.customer_order(id)),
            (["refunds", id], "GET") => Outcome::Reply(self.refund_lookup(id)),
            (["refunds"], "POST") => Outcome::Reply(self.place_refund(&req)),
            (["inventory", _] | ["orders", _] | ["customer-orders", _] | ["refunds", _], _) => {
                Outcome::Reply(
                    Response::error(405, "method not allowed").with_header("Allow", "GET"),
                )
            }
            (["orders"] | ["refunds"], _) => Outcome::Reply(
                Response::error(405, "method not allowed").with_header("Allow", "POST"),
            ),
            _ => Outcome::Reply(Response::error(404, "no such endpoint")),
        };

        let status = match &outcome {
            Outcome::Reply(resp) => Some(resp.status),
            Outcome::Drop => None,
        };
        if let Some(seen) = lock(&self.state).requests.get_mut(index) {
            seen.status = status;
        }
        let summary = match &outcome {
            Outcome::Reply(resp) => {
                format!("{} {}", resp.status, String::from_utf8_lossy(&resp.body))
            }
            Outcome::Drop => "connection dropped without a response".into(),
        };
        if post_order || (matches!(segments.as_slice(), ["refunds"]) && req.method == "POST") {
            let h = |name: &str| req.header(name).unwrap_or("-").to_string();
            self.log_line(format_args!(
                "POST {path} Idempotency-Key={} Stephost-Run-Id={} Stephost-Fence={} Stephost-Payload-Sha256={} body={} -> {summary}",
                h("idempotency-key"),
                h("stephost-run-id"),
                h("stephost-fence"),
                h("stephost-payload-sha256"),
                String::from_utf8_lossy(&req.body),
            ));
        } else {
            self.log_line(format_args!("{} {} -> {summary}", req.method, req.target));
        }
        outcome
    }

    fn inventory(&self, sku: &str) -> Response {
        let Some(sku) = percent_decode(sku).filter(|s| !s.is_empty()) else {
            return Response::error(404, "no such sku");
        };
        let mut state = lock(&self.state);
        state.inventory_reads += 1;
        let on_hand = state
            .stock
            .get(&sku)
            .copied()
            .unwrap_or(state.default_on_hand);
        let mut response = Response::json(200, &json!({ "sku": sku, "on_hand": on_hand }));
        // A session cookie, as many APIs hand out: a credential a client
        // should never keep in a record.
        response
            .headers
            .push(("Set-Cookie".into(), format!("{SESSION_COOKIE}; HttpOnly")));
        response
    }

    fn faulty_lookup(&self, id: &str) -> Response {
        let fault = lock(&self.state).lookup_faults.pop_front();
        match fault {
            None => self.lookup(id),
            Some(LookupFault::Slow(delay)) => {
                let response = self.lookup(id);
                std::thread::sleep(delay);
                response
            }
            Some(LookupFault::OtherReceipt) => {
                let mut state = lock(&self.state);
                state.lookups += 1;
                let asked = percent_decode(id).unwrap_or_default();
                let other = state
                    .orders
                    .iter()
                    .find(|o| o.operation_id != asked)
                    .map(Order::receipt)
                    .unwrap_or_else(
                        || json!({"order_id": "ORD-0", "operation_id": format!("{asked}-other")}),
                    );
                Response::json(200, &other)
            }
            Some(LookupFault::NotJson) => {
                lock(&self.state).lookups += 1;
                Response {
                    status: 200,
                    headers: vec![("Content-Type".into(), "text/html".into())],
                    body: NOT_JSON.as_bytes().to_vec(),
                }
            }
        }
    }

    fn lookup(&self, id: &str) -> Response {
        let mut state = lock(&self.state);
        state.lookups += 1;
        if let Some((status, body)) = &state.lookup_answer {
            return Response {
                status: *status,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: body.clone(),
            };
        }
        let found = percent_decode(id)
            .and_then(|id| state.by_key.get(&id).copied())
            .map(|i| state.orders[i].receipt());
        match found {
            Some(receipt) => Response::json(200, &receipt),
            None => Response::error(404, "no order with this operation id"),
        }
    }

    fn post_order(&self, req: &Request, fault: Option<Fault>) -> Outcome {
        match fault {
            Some(Fault::Status {
                status,
                retry_after_s,
            }) => {
                let mut resp = Response::error(status, "injected fault");
                if let Some(secs) = retry_after_s {
                    resp = resp.with_header("Retry-After", secs.to_string());
                }
                Outcome::Reply(resp)
            }
            Some(Fault::DropBeforeCommit) => Outcome::Drop,
            Some(Fault::CommitThenDrop) => {
                let _ = self.place_order(req);
                Outcome::Drop
            }
            Some(Fault::Delay(delay)) => {
                let resp = self.place_order(req);
                std::thread::sleep(delay);
                Outcome::Reply(resp)
            }
            Some(Fault::CommitLate(delay)) => {
                std::thread::sleep(delay);
                Outcome::Reply(self.place_order(req))
            }
            Some(Fault::CommitNotJson) => {
                let mut resp = self.place_order(req);
                if resp.status < 300 {
                    resp.headers = vec![("Content-Type".into(), "text/html".into())];
                    resp.body = NOT_JSON.as_bytes().to_vec();
                }
                Outcome::Reply(resp)
            }
            None => Outcome::Reply(self.place_order(req)),
        }
    }

    /// The business logic of `POST /orders`, atomic under the state lock.
    fn place_order(&self, req: &Request) -> Response {
        let WriteRequest {
            key,
            body,
            run_id,
            fence,
            payload_sha256,
        } = match WriteRequest::of(req) {
            Ok(w) => w,
            Err(resp) => return resp,
        };

        let mut state = lock(&self.state);
        if let Err(resp) = state.check_fence(&run_id, fence) {
            return resp;
        }
        if let Some(&i) = state.by_key.get(key).filter(|_| state.deduplicate) {
            let order = &state.orders[i];
            if order.payload_sha256 != payload_sha256 {
                return Response::error(422, "idempotency key reused with a different payload");
            }
            let receipt = order.receipt();
            state.idempotent_replays += 1;
            return Response::json(200, &receipt).with_header("Idempotent-Replayed", "true");
        }

        let order = Order {
            order_id: format!("ORD-{}", state.orders.len() + 1),
            operation_id: key.to_string(),
            payload_sha256,
            body: String::from_utf8_lossy(&req.body).into_owned(),
            sku: body.get("sku").cloned().unwrap_or(Value::Null),
            quantity: body.get("quantity").cloned().unwrap_or(Value::Null),
            run_id,
            fence,
        };
        if let Some(file) = &mut state.state_file {
            let mut line = serde_json::to_string(&order).unwrap_or_default();
            line.push('\n');
            if let Err(e) = file
                .write_all(line.as_bytes())
                .and_then(|()| file.sync_data())
            {
                return Response::error(500, &format!("could not persist the order: {e}"));
            }
        }
        let receipt = order.receipt();
        let index = state.orders.len();
        state
            .by_key
            .entry(order.operation_id.clone())
            .or_insert(index);
        state.orders.push(order);
        Response::json(201, &receipt)
    }

    fn customer_order(&self, id: &str) -> Response {
        let mut state = lock(&self.state);
        state.customer_order_reads += 1;
        let Some((id, amount)) = percent_decode(id)
            .and_then(|id| state.customer_orders.get(&id).map(|&cents| (id, cents)))
        else {
            return Response::error(404, "no such customer order");
        };
        let refunded = state.refunded_cents(&id);
        Response::json(
            200,
            &json!({
                "order_id": id,
                "amount_cents": amount,
                "refunded_cents": refunded,
                "currency": "USD",
            }),
        )
    }

    fn refund_lookup(&self, id: &str) -> Response {
        let state = lock(&self.state);
        let found = percent_decode(id)
            .and_then(|id| state.refund_by_key.get(&id).copied())
            .map(|i| state.refunds[i].receipt());
        match found {
            Some(receipt) => Response::json(200, &receipt),
            None => Response::error(404, "no refund with this operation id"),
        }
    }

    /// The business logic of `POST /refunds`, atomic under the state lock.
    fn place_refund(&self, req: &Request) -> Response {
        lock(&self.state).refund_requests_received += 1;
        let WriteRequest {
            key,
            body,
            run_id,
            fence,
            payload_sha256,
        } = match WriteRequest::of(req) {
            Ok(w) => w,
            Err(resp) => return resp,
        };
        let mut state = lock(&self.state);
        if let Err(resp) = state.check_fence(&run_id, fence) {
            return resp;
        }
        if let Some(&i) = state.refund_by_key.get(key) {
            let refund = &state.refunds[i];
            if refund.payload_sha256 != payload_sha256 {
                return Response::error(422, "idempotency key reused with a different payload");
            }
            let receipt = refund.receipt();
            state.idempotent_replays += 1;
            return Response::json(200, &receipt).with_header("Idempotent-Replayed", "true");
        }
        let (Some(order_id), Some(amount_cents)) = (
            body.get("order_id").and_then(Value::as_str),
            body.get("amount_cents").and_then(Value::as_i64),
        ) else {
            return Response::error(
                400,
                "a refund needs `order_id` (a string) and `amount_cents` (an integer)",
            );
        };
        let Some(&total) = state.customer_orders.get(order_id) else {
            return Response::error(422, &format!("no customer order {order_id}"));
        };
        let left = total - state.refunded_cents(order_id);
        if amount_cents <= 0 || amount_cents > left {
            return Response::error(
                422,
                &format!(
                    "cannot refund {amount_cents} cents of order {order_id}: {left} cents are left to refund"
                ),
            );
        }
        let refund = Refund {
            refund_id: format!("RF-{}", state.refunds.len() + 1),
            operation_id: key.to_string(),
            payload_sha256,
            order_id: order_id.to_string(),
            amount_cents,
            body: String::from_utf8_lossy(&req.body).into_owned(),
            run_id,
            fence,
        };
        let receipt = refund.receipt();
        let index = state.refunds.len();
        state
            .refund_by_key
            .insert(refund.operation_id.clone(), index);
        state.refunds.push(refund);
        Response::json(201, &receipt)
    }
}

/// What every write (`POST /orders`, `POST /refunds`) carries, checked.
struct WriteRequest<'a> {
    key: &'a str,
    body: Value,
    run_id: Option<String>,
    fence: Option<u64>,
    payload_sha256: String,
}

impl<'a> WriteRequest<'a> {
    /// The key, the JSON body and the fence of a write, or the `400` it gets.
    fn of(req: &'a Request) -> Result<Self, Response> {
        let Some(key) = req.header("idempotency-key").filter(|k| !k.is_empty()) else {
            return Err(Response::error(400, "missing Idempotency-Key header"));
        };
        let body: Value = serde_json::from_slice(&req.body)
            .map_err(|e| Response::error(400, &format!("body is not JSON: {e}")))?;
        let fence = match req.header("stephost-fence").map(str::parse::<u64>) {
            None => None,
            Some(Ok(f)) => Some(f),
            Some(Err(_)) => {
                return Err(Response::error(
                    400,
                    "Stephost-Fence is not an unsigned integer",
                ));
            }
        };
        Ok(WriteRequest {
            key,
            body,
            run_id: req.header("stephost-run-id").map(str::to_string),
            fence,
            payload_sha256: sha256_hex(&req.body),
        })
    }
}

impl State {
    /// Refuses a fence lower than the highest seen for its run (and remembers
    /// the highest).
    fn check_fence(&mut self, run_id: &Option<String>, fence: Option<u64>) -> Result<(), Response> {
        if let (Some(run), Some(fence)) = (run_id, fence) {
            let highest = self.fences.entry(run.clone()).or_insert(fence);
            if fence < *highest {
                return Err(Response::error(409, "stale fencing token"));
            }
            *highest = fence;
        }
        Ok(())
    }

    /// Cents refunded so far on a customer order.
    fn refunded_cents(&self, order_id: &str) -> i64 {
        self.refunds
            .iter()
            .filter(|r| r.order_id == order_id)
            .map(|r| r.amount_cents)
            .sum()
    }
}

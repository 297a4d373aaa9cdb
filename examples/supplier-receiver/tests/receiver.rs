//! The receiver over real sockets, driven by ureq 3 (the client stephost uses) and by a
//! raw `TcpStream` where the wire format itself is the point.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use supplier_receiver::{Config, Fault, Receiver};

fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build(),
    )
}

struct Reply {
    status: u16,
    replayed: bool,
    retry_after: Option<String>,
    json: Value,
}

fn reply(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut resp = resp.expect("request failed");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    Reply {
        status,
        replayed,
        retry_after,
        json: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

fn post(
    agent: &ureq::Agent,
    base: &str,
    key: &str,
    body: &str,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    agent
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", key)
        .header("Stephost-Run-Id", "run-1")
        .header("Stephost-Fence", "1")
        .content_type("application/json")
        .send(body)
}

fn post_fenced(agent: &ureq::Agent, rx: &Receiver, key: &str, run: &str, fence: u64) -> Reply {
    reply(
        agent
            .post(format!("{}/orders", rx.url()))
            .header("Idempotency-Key", key)
            .header("Stephost-Run-Id", run)
            .header("Stephost-Fence", fence.to_string())
            .send(r#"{"sku":"A","quantity":1}"#),
    )
}

fn get(agent: &ureq::Agent, url: String) -> Reply {
    reply(agent.get(url).call())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

const BODY: &str = r#"{"sku":"WIDGET-7","quantity":7}"#;

#[test]
fn inventory_comes_from_the_stock_table() {
    let rx = Receiver::start_on("127.0.0.1:0", HashMap::from([("WIDGET-7".into(), 10)])).unwrap();
    let agent = agent();
    let r = get(&agent, format!("{}/inventory/WIDGET-7", rx.url()));
    assert_eq!(r.status, 200);
    assert_eq!(r.json, json!({"sku": "WIDGET-7", "on_hand": 10}));
    let r = get(&agent, format!("{}/inventory/OTHER%2D1", rx.url()));
    assert_eq!(r.json, json!({"sku": "OTHER-1", "on_hand": 3}));
    rx.set_stock("OTHER-1", 0);
    let r = get(&agent, format!("{}/inventory/OTHER-1", rx.url()));
    assert_eq!(r.json["on_hand"], 0);
    assert_eq!(rx.inventory_reads(), 3);
    assert_eq!(rx.requests_received(), 0);
    assert_eq!(get(&agent, format!("{}/nope", rx.url())).status, 404);
}

#[test]
fn same_key_same_body_is_one_order_and_the_same_receipt() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    let first = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!(first.status, 201);
    assert!(!first.replayed);
    assert_eq!(
        first.json,
        json!({
            "order_id": "ORD-1",
            "operation_id": "op-1",
            "payload_sha256": sha256_hex(BODY.as_bytes()),
            "quantity": 7,
            "sku": "WIDGET-7",
        })
    );
    let second = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!(second.status, 200);
    assert!(second.replayed);
    assert_eq!(second.json, first.json);

    assert_eq!(rx.requests_received(), 2);
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.idempotent_replays(), 1);
    let orders = rx.orders();
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].operation_id, "op-1");
    assert_eq!(orders[0].body, BODY);
    assert_eq!(orders[0].run_id.as_deref(), Some("run-1"));
    assert_eq!(orders[0].fence, Some(1));
    assert_eq!(orders[0].receipt(), first.json);

    // Another key is another order.
    let third = reply(post(&agent, &rx.url(), "op-2", BODY));
    assert_eq!(
        (third.status, third.json["order_id"].clone()),
        (201, json!("ORD-2"))
    );
    assert_eq!(rx.business_effects(), 2);
}

#[test]
fn same_key_other_body_is_422() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    assert_eq!(reply(post(&agent, &rx.url(), "op-1", BODY)).status, 201);
    let r = reply(post(
        &agent,
        &rx.url(),
        "op-1",
        r#"{"sku":"WIDGET-7","quantity":8}"#,
    ));
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json,
        json!({"error": "idempotency key reused with a different payload"})
    );
    // Byte-exact comparison: the same JSON value spelled differently is another payload.
    let r = reply(post(
        &agent,
        &rx.url(),
        "op-1",
        r#"{"quantity":7,"sku":"WIDGET-7"}"#,
    ));
    assert_eq!(r.status, 422);
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.idempotent_replays(), 0);
    assert_eq!(rx.requests_received(), 3);
}

#[test]
fn lookup_by_operation_id() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    let missing = get(&agent, format!("{}/orders/op-1", rx.url()));
    assert_eq!(missing.status, 404);
    let created = reply(post(&agent, &rx.url(), "op-1", BODY));
    let found = get(&agent, format!("{}/orders/op-1", rx.url()));
    assert_eq!(found.status, 200);
    assert_eq!(found.json, created.json);
    assert_eq!(rx.lookups(), 2);
    assert_eq!(rx.requests_received(), 1);
    assert_eq!(rx.order("op-1").unwrap().order_id, "ORD-1");
    assert!(rx.order("op-2").is_none());
}

#[test]
fn bad_requests_are_400_without_effect() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    let no_key = reply(agent.post(format!("{}/orders", rx.url())).send(BODY));
    assert_eq!(no_key.status, 400);
    assert_eq!(
        reply(post(&agent, &rx.url(), "op-1", "not json")).status,
        400
    );
    let bad_fence = reply(
        agent
            .post(format!("{}/orders", rx.url()))
            .header("Idempotency-Key", "op-2")
            .header("Stephost-Run-Id", "r")
            .header("Stephost-Fence", "x")
            .send(BODY),
    );
    assert_eq!(bad_fence.status, 400);
    assert_eq!(rx.business_effects(), 0);
    assert_eq!(rx.requests_received(), 3);
    assert_eq!(
        rx.requests().iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![Some(400); 3]
    );
}

#[test]
fn stale_fence_is_409_without_effect() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    assert_eq!(post_fenced(&agent, &rx, "op-1", "run-a", 2).status, 201);
    let stale = post_fenced(&agent, &rx, "op-2", "run-a", 1);
    assert_eq!(stale.status, 409);
    assert_eq!(stale.json, json!({"error": "stale fencing token"}));
    // A zombie resending a committed key is refused too, not replayed.
    assert_eq!(post_fenced(&agent, &rx, "op-1", "run-a", 1).status, 409);
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.idempotent_replays(), 0);
    // Same fence and higher fences are fine; fences are per run id.
    assert_eq!(post_fenced(&agent, &rx, "op-2", "run-a", 2).status, 201);
    assert_eq!(post_fenced(&agent, &rx, "op-3", "run-a", 5).status, 201);
    assert_eq!(post_fenced(&agent, &rx, "op-4", "run-a", 4).status, 409);
    assert_eq!(post_fenced(&agent, &rx, "op-5", "run-b", 1).status, 201);
    assert_eq!(rx.business_effects(), 4);
    assert_eq!(rx.requests_received(), 7);
}

#[test]
fn commit_then_drop_creates_the_order_but_loses_the_reply() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    rx.push_fault(Fault::CommitThenDrop);
    let lost = post(&agent, &rx.url(), "op-1", BODY);
    assert!(lost.is_err(), "expected a connection error, got {lost:?}");
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.requests_received(), 1);
    assert_eq!(rx.requests()[0].status, None);
    assert_eq!(rx.pending_faults(), 0);

    // Reconciliation: the lookup finds it, a resend is deduplicated.
    assert_eq!(get(&agent, format!("{}/orders/op-1", rx.url())).status, 200);
    let resent = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((resent.status, resent.replayed), (200, true));
    assert_eq!(resent.json["order_id"], "ORD-1");
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.requests_received(), 2);
}

#[test]
fn drop_before_commit_loses_the_request() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    rx.push_fault(Fault::DropBeforeCommit);
    assert!(post(&agent, &rx.url(), "op-1", BODY).is_err());
    assert_eq!(rx.business_effects(), 0);
    assert_eq!(rx.requests_received(), 1);
    assert_eq!(get(&agent, format!("{}/orders/op-1", rx.url())).status, 404);
    assert_eq!(reply(post(&agent, &rx.url(), "op-1", BODY)).status, 201);
}

#[test]
fn status_faults_have_no_effect_and_apply_once_each() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    rx.push_fault(Fault::status(503));
    rx.push_fault(Fault::retry_after(429, 1));
    rx.push_fault(Fault::status(400));
    // Faults are consumed by POST /orders only.
    assert_eq!(get(&agent, format!("{}/inventory/A", rx.url())).status, 200);
    assert_eq!(get(&agent, format!("{}/orders/op-1", rx.url())).status, 404);

    let r = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((r.status, r.retry_after), (503, None));
    assert_eq!(rx.business_effects(), 0);
    let r = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((r.status, r.retry_after.as_deref()), (429, Some("1")));
    let r = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!(r.status, 400);
    assert_eq!(rx.business_effects(), 0);
    let r = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((r.status, r.replayed), (201, false));
    assert_eq!(rx.business_effects(), 1);
    assert_eq!(rx.requests_received(), 4);
    assert_eq!(rx.idempotent_replays(), 0);
}

#[test]
fn delay_commits_before_the_slow_reply() {
    let rx = Receiver::start().unwrap();
    rx.push_fault(Fault::Delay(Duration::from_millis(500)));
    let url = rx.url();
    let started = Instant::now();
    let client = std::thread::spawn(move || reply(post(&agent(), &url, "op-1", BODY)));
    // The order exists while the reply is still on its way.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.business_effects() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rx.business_effects(), 1);
    assert!(!client.is_finished());
    let r = client.join().unwrap();
    assert_eq!(r.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(500));

    // A client that gives up first sees a timeout, and the order exists.
    rx.push_fault(Fault::Delay(Duration::from_millis(800)));
    let impatient = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(200)))
            .build(),
    );
    assert!(post(&impatient, &rx.url(), "op-2", BODY).is_err());
    assert!(rx.order("op-2").is_some());
}

#[test]
fn records_the_stephost_headers_of_every_request() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    let r = agent
        .post(format!("{}/orders", rx.url()))
        .header("Idempotency-Key", "op-1")
        .header("Stephost-Run-Id", "run-9")
        .header("Stephost-Fence", "3")
        .header("Stephost-Payload-Sha256", sha256_hex(BODY.as_bytes()))
        .send(BODY);
    assert_eq!(reply(r).status, 201);
    let seen = rx.last_order_request().unwrap();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/orders");
    assert_eq!(seen.header("idempotency-key"), Some("op-1"));
    assert_eq!(seen.header("Stephost-Run-Id"), Some("run-9"));
    assert_eq!(seen.header("stephost-fence"), Some("3"));
    assert_eq!(
        seen.header("stephost-payload-sha256"),
        Some(sha256_hex(BODY.as_bytes()).as_str())
    );
    assert!(
        seen.headers
            .iter()
            .all(|(n, _)| *n == n.to_ascii_lowercase())
    );
    assert_eq!(seen.body_str(), BODY);
    assert_eq!(seen.status, Some(201));
}

/// Sends raw bytes and reads until the server closes the connection.
fn raw_exchange(rx: &Receiver, request: &str) -> String {
    let mut s = TcpStream::connect(rx.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn keep_alive_pipelining_and_connection_close_on_the_wire() {
    let rx = Receiver::start().unwrap();
    // Two pipelined requests on one connection; the second asks to close, so the
    // server answers both and then closes (read_to_string returns).
    let body = r#"{"sku":"A","quantity":1}"#;
    let out = raw_exchange(
        &rx,
        &format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: {}\r\n\r\n{body}\
             GET /orders/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            body.len()
        ),
    );
    let responses: Vec<&str> = out.split("HTTP/1.1 ").filter(|s| !s.is_empty()).collect();
    assert_eq!(responses.len(), 2, "{out}");
    assert!(responses[0].starts_with("201 Created\r\n"), "{out}");
    assert!(!responses[0].contains("Connection: close"), "{out}");
    assert!(responses[1].starts_with("200 OK\r\n"), "{out}");
    assert!(responses[1].contains("Connection: close\r\n"), "{out}");
    assert!(responses[1].ends_with(r#""sku":"A"}"#), "{out}");

    // HTTP/1.0 without keep-alive is closed after one response.
    let out = raw_exchange(&rx, "GET /inventory/A HTTP/1.0\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.contains("Connection: close"));
}

#[test]
fn chunked_bodies_and_malformed_requests() {
    let rx = Receiver::start().unwrap();
    let out = raw_exchange(
        &rx,
        "POST /orders HTTP/1.1\r\nIdempotency-Key: k\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         5\r\n{\"sku\r\n9\r\n\":\"A\"}   \r\n0\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 201 Created\r\n"), "{out}");
    assert_eq!(rx.orders()[0].body, "{\"sku\":\"A\"}   ");

    let out = raw_exchange(&rx, "HELLO\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    let out = raw_exchange(&rx, "PUT /orders HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
    assert_eq!(rx.requests_received(), 1);
}

#[test]
fn the_state_file_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.jsonl");
    let config = Config {
        state_file: Some(path.clone()),
        ..Config::default()
    };
    let agent = agent();
    let first = {
        let rx = Receiver::start_with(config.clone()).unwrap();
        let r = reply(post(&agent, &rx.url(), "op-1", BODY));
        assert_eq!(r.status, 201);
        rx.stop();
        r
    };
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);

    let rx = Receiver::start_with(config).unwrap();
    assert_eq!(rx.business_effects(), 1);
    let found = get(&agent, format!("{}/orders/op-1", rx.url()));
    assert_eq!(found.json, first.json);
    let again = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((again.status, again.replayed), (200, true));
    let next = reply(post(&agent, &rx.url(), "op-2", BODY));
    assert_eq!(next.json["order_id"], "ORD-2");
    // The fence of the reloaded order still counts.
    assert_eq!(
        reply(
            agent
                .post(format!("{}/orders", rx.url()))
                .header("Idempotency-Key", "op-3")
                .header("Stephost-Run-Id", "run-1")
                .header("Stephost-Fence", "0")
                .send(BODY)
        )
        .status,
        409
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
}

#[test]
fn stopping_closes_idle_connections_and_the_port() {
    let rx = Receiver::start().unwrap();
    let addr = rx.addr();
    let agent = agent();
    // Leaves a pooled keep-alive connection open.
    assert_eq!(get(&agent, format!("{}/inventory/A", rx.url())).status, 200);
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    drop(rx);
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut buf = [0; 1];
    assert!(matches!(idle.read(&mut buf), Ok(0) | Err(_)));
    assert!(TcpStream::connect(addr).is_err());
}

fn post_refund(agent: &ureq::Agent, rx: &Receiver, key: &str, fence: u64, body: &str) -> Reply {
    reply(
        agent
            .post(format!("{}/refunds", rx.url()))
            .header("Idempotency-Key", key)
            .header("Stephost-Run-Id", "run-1")
            .header("Stephost-Fence", fence.to_string())
            .content_type("application/json")
            .send(body),
    )
}

#[test]
fn customer_orders_and_refunds() {
    let rx = Receiver::start_with(Config {
        customer_orders: HashMap::from([("A-7".into(), 1000)]),
        ..Config::default()
    })
    .unwrap();
    let agent = agent();
    let order = get(&agent, format!("{}/customer-orders/A-7", rx.url()));
    assert_eq!(order.status, 200);
    assert_eq!(
        order.json,
        json!({"order_id": "A-7", "amount_cents": 1000, "refunded_cents": 0, "currency": "USD"})
    );
    assert_eq!(
        get(&agent, format!("{}/customer-orders/A-1001", rx.url())).status,
        404,
        "the configured table replaces the built-in one"
    );

    let body = r#"{"order_id":"A-7","amount_cents":600,"reason":"late"}"#;
    let missing = get(&agent, format!("{}/refunds/rf-op-1", rx.url()));
    assert_eq!(missing.status, 404);
    let first = post_refund(&agent, &rx, "rf-op-1", 1, body);
    assert_eq!(first.status, 201);
    assert_eq!(
        first.json,
        json!({
            "refund_id": "RF-1",
            "operation_id": "rf-op-1",
            "payload_sha256": sha256_hex(body.as_bytes()),
            "order_id": "A-7",
            "amount_cents": 600,
        })
    );
    // Deduplicated by key, refused with another payload, looked up by key.
    let again = post_refund(&agent, &rx, "rf-op-1", 1, body);
    assert_eq!((again.status, again.replayed), (200, true));
    assert_eq!(again.json, first.json);
    let other = post_refund(
        &agent,
        &rx,
        "rf-op-1",
        1,
        r#"{"order_id":"A-7","amount_cents":601}"#,
    );
    assert_eq!(other.status, 422);
    let found = get(&agent, format!("{}/refunds/rf-op-1", rx.url()));
    assert_eq!(
        (found.status, found.json.clone()),
        (200, first.json.clone())
    );
    let order = get(&agent, format!("{}/customer-orders/A-7", rx.url()));
    assert_eq!(order.json["refunded_cents"], 600);

    // Business refusals: more than is left, an unknown order, a bad body, a stale fence.
    let too_much = post_refund(
        &agent,
        &rx,
        "rf-op-2",
        1,
        r#"{"order_id":"A-7","amount_cents":401}"#,
    );
    assert_eq!(too_much.status, 422);
    assert_eq!(
        too_much.json["error"],
        "cannot refund 401 cents of order A-7: 400 cents are left to refund"
    );
    let unknown = post_refund(
        &agent,
        &rx,
        "rf-op-3",
        1,
        r#"{"order_id":"B-1","amount_cents":1}"#,
    );
    assert_eq!(unknown.status, 422);
    assert_eq!(
        post_refund(&agent, &rx, "rf-op-4", 1, r#"{"order_id":"A-7"}"#).status,
        400
    );
    assert_eq!(
        post_refund(
            &agent,
            &rx,
            "rf-op-5",
            2,
            r#"{"order_id":"A-7","amount_cents":400}"#
        )
        .status,
        201
    );
    assert_eq!(
        post_refund(
            &agent,
            &rx,
            "rf-op-6",
            1,
            r#"{"order_id":"A-7","amount_cents":1}"#
        )
        .status,
        409
    );

    assert_eq!(rx.refund_requests_received(), 8);
    assert_eq!(rx.customer_order_reads(), 3);
    let refunds = rx.refunds();
    assert_eq!(refunds.len(), 2);
    assert_eq!(refunds[1].refund_id, "RF-2");
    assert_eq!(refunds[1].fence, Some(2));
    // None of it touched the supplier side.
    assert_eq!((rx.requests_received(), rx.business_effects()), (0, 0));
}

#[test]
fn the_built_in_customer_orders() {
    let rx = Receiver::start().unwrap();
    let agent = agent();
    let r = get(&agent, format!("{}/customer-orders/A-1001", rx.url()));
    assert_eq!(r.json["amount_cents"], 4999);
    let r = get(&agent, format!("{}/customer-orders/A-1002", rx.url()));
    assert_eq!(r.json["amount_cents"], 25000);
}

#[test]
fn a_receiver_that_does_not_deduplicate_creates_an_order_per_request() {
    let rx = Receiver::start_with(Config {
        deduplicate: false,
        ..Config::default()
    })
    .unwrap();
    let agent = agent();
    let first = reply(post(&agent, &rx.url(), "op-1", BODY));
    let again = reply(post(&agent, &rx.url(), "op-1", BODY));
    assert_eq!((first.status, again.status), (201, 201));
    assert_eq!(rx.business_effects(), 2, "the key was not used");
    assert_eq!(rx.idempotent_replays(), 0);
    // A lookup finds the first order made with the key.
    let found = get(&agent, format!("{}/orders/op-1", rx.url()));
    assert_eq!(found.status, 200);
    assert_eq!(rx.orders()[0].order_id, "ORD-1");
}

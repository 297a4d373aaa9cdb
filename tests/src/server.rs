//! A real `stephost serve` process on 127.0.0.1 for the API, console and
//! webhook tests, an HTTP client for it, and a webhook receiver.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use receiver_http::{Conn, Request, Response, Server, Service};
use serde_json::Value;

use crate::Sandbox;

/// A running server; SIGKILLed when dropped unless stopped.
pub struct Served {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// What the server printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

/// An HTTP answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    /// Asserts the status; the body as JSON.
    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        self.json()
    }

    /// Asserts an API error with `status` and `code`.
    pub fn expect_error(&self, status: u16, code: &str) -> Value {
        let body = self.expect(status);
        assert_eq!(body["code"], code, "{body:#}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty())
                && body["fix"].as_str().is_some_and(|f| !f.is_empty()),
            "an error says what happened and what to do: {body:#}"
        );
        body
    }
}

impl Sandbox {
    /// Starts `stephost serve --listen 127.0.0.1:0 ARGS` with `env`, and
    /// waits until it listens.
    pub fn serve(&self, args: &[&str], env: &[(&str, &str)]) -> Served {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut cmd = self.command(&all);
        for (name, value) in env {
            cmd.env(name, value);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stephost serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or_default().to_string();
                    let _ = tx.send(addr);
                }
                let mut log = kept.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                let status = child.wait().unwrap();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "stephost serve did not start ({status}):\n{}",
                    log.lock().unwrap()
                )
            });
        Served {
            child: Some(child),
            base: format!("http://{addr}"),
            log,
        }
    }
}

impl Served {
    /// This server, sending `token` with each request.
    pub fn with_token(&self, token: &str) -> Client {
        Client {
            token: Some(token.to_string()),
            ..self.client()
        }
    }

    /// This server, with no token.
    pub fn client(&self) -> Client {
        Client {
            base: self.base.clone(),
            token: None,
            log: self.log.clone(),
        }
    }

    pub fn get(&self, path: &str) -> Answer {
        self.client().request("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Answer {
        self.client()
            .request("POST", path, Some(body.to_string().as_bytes()))
    }

    /// Runs `tests/browser/SCRIPT` (headless Chromium) against this server,
    /// with `args` after its base URL; panics, with what the script and the
    /// server said, if it fails.
    pub fn browse(&self, script: &str, args: &[&str]) {
        let browser = concat!(env!("CARGO_MANIFEST_DIR"), "/browser");
        let out = std::process::Command::new("node")
            .arg(format!("{browser}/{script}"))
            .arg(&self.base)
            .args(args)
            .current_dir(browser)
            .output()
            .expect(
                "run node (the browser tests need Node.js, Chromium and tests/browser's \
                 node_modules: scripts/test.sh installs them)",
            );
        assert!(
            out.status.success(),
            "the browser test {script} failed:\n{}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log.lock().unwrap()
        );
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGTERM, then waits (at most a minute: a server that does not
    /// drain fails the test); the exit code.
    pub fn stop(self) -> Option<i32> {
        self.stop_within(Duration::from_secs(60))
    }

    /// SIGTERM, then waits at most `limit` (a server still running then
    /// fails the test); the exit code.
    pub fn stop_within(mut self, limit: Duration) -> Option<i32> {
        let mut child = self.child.take().unwrap();
        signal_process(child.id() as i32, "TERM");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "stephost serve did not stop within {limit:?} of SIGTERM:\n{}",
                    self.log.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    /// How many files and sockets the server process has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("read the server's /proc/PID/fd")
            .count()
    }

    /// SIGKILL, then waits.
    pub fn kill(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Polls `GET path` until `done` holds of its JSON body.
    pub fn wait_for(&self, what: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.client().wait_for(what, path, done)
    }

    /// Waits until run `run_id` has `status`.
    pub fn wait_status(&self, run_id: &str, status: &str) -> Value {
        self.client().wait_status(run_id, status)
    }
}

fn signal_process(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Requests to a server, with a token or none.
#[derive(Debug, Clone)]
pub struct Client {
    pub base: String,
    pub token: Option<String>,
    /// The server's log, for messages.
    log: Arc<Mutex<String>>,
}

impl Client {
    /// Polls `GET path` until `done` holds of its JSON body.
    pub fn wait_for(&self, what: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = self.get(path);
            if answer.status == 200 {
                let body = answer.json();
                if done(&body) {
                    return body;
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last {path}: {} {}\nserver log:\n{}",
                answer.status,
                answer.body,
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until run `run_id` has `status`.
    pub fn wait_status(&self, run_id: &str, status: &str) -> Value {
        self.wait_for(
            &format!("run {run_id} to be {status}"),
            &format!("/api/runs/{run_id}"),
            |v| v["run"]["status"] == status,
        )
    }

    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Answer {
        let json = [("Content-Type", "application/json")];
        let headers: &[(&str, &str)] = if body.is_some() { &json } else { &[] };
        self.request_with(method, path, body, headers)
    }

    /// A request with these headers (and the token, if any).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let result = match body {
            Some(bytes) => agent.run(builder.body(bytes.to_vec()).unwrap()),
            None => agent.run(builder.body(()).unwrap()),
        };
        let mut response = result.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Answer {
            status: response.status().as_u16(),
            body: response.body_mut().read_to_string().unwrap_or_default(),
        }
    }

    pub fn get(&self, path: &str) -> Answer {
        self.request("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Answer {
        self.request("POST", path, Some(body.to_string().as_bytes()))
    }

    /// Uploads a module's bytes; its digest.
    pub fn upload(&self, wasm_path: &str) -> String {
        let bytes = std::fs::read(wasm_path).unwrap();
        let answer = self.request("POST", "/api/modules", Some(&bytes));
        answer.expect(201)["module_digest"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Opens `/api/events` (with the token, if any) and reads until its
    /// headers came; the stream stays open while the result lives.
    pub fn open_events(&self) -> TcpStream {
        let (stream, head) = self.try_open_events();
        assert!(head.contains("200 OK"), "{head}");
        stream
    }

    /// Asks for `/api/events` (with the token, if any); the connection and
    /// what its first read gave (the answer's head, at least).
    pub fn try_open_events(&self) -> (TcpStream, String) {
        let addr = self.base.trim_start_matches("http://").to_string();
        let mut stream = TcpStream::connect(&addr).unwrap();
        let auth = self
            .token
            .as_ref()
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET /api/events HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n"
        )
        .unwrap();
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).unwrap();
        (stream, String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Reads `/api/events` until an event's data contains `needle` or
    /// `limit` passes; what was read.
    pub fn events_until(&self, needle: &str, limit: Duration, during: impl FnOnce()) -> String {
        let addr = self.base.trim_start_matches("http://").to_string();
        let mut stream = TcpStream::connect(&addr).unwrap();
        let auth = self
            .token
            .as_ref()
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{auth}\r\n"
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let deadline = Instant::now() + limit;
        let mut read = Vec::new();
        let mut during = Some(during);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => read.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            let text = String::from_utf8_lossy(&read);
            if let Some(act) = during.take_if(|_| text.contains("200 OK")) {
                act();
            }
            if text.contains("event: runs") && text.contains(needle) {
                break;
            }
        }
        String::from_utf8_lossy(&read).into_owned()
    }
}

/// One request a webhook receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The status it was answered with.
    pub answered: u16,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A webhook receiver on 127.0.0.1: answers each request with the next
/// scripted status (then 200), and keeps what it got.
pub struct WebhookReceiver {
    pub url: String,
    hook: Arc<Hook>,
    _server: Server,
}

#[derive(Default)]
struct Hook {
    got: Mutex<Vec<Delivery>>,
    /// The statuses still to answer with, the next one last.
    script: Mutex<Vec<u16>>,
}

impl Service for Hook {
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool {
        let status = self.script.lock().unwrap().pop().unwrap_or(200);
        conn.reply(&Response::empty(status), false);
        self.got.lock().unwrap().push(Delivery {
            headers: req.headers,
            body: String::from_utf8_lossy(&req.body).into_owned(),
            answered: status,
        });
        false
    }
}

impl WebhookReceiver {
    pub fn start(statuses: &[u16]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let hook = Arc::new(Hook::default());
        hook.script(statuses);
        let server = Server::start(listener, "webhook-receiver", 1 << 20, hook.clone()).unwrap();
        WebhookReceiver {
            url: format!("{}/hook", server.url()),
            hook,
            _server: server,
        }
    }

    /// Answers the next requests with `statuses`.
    pub fn script(&self, statuses: &[u16]) {
        self.hook.script(statuses);
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.hook.got.lock().unwrap().clone()
    }

    /// Waits until `done` holds of what was delivered.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Delivery]) -> bool) -> Vec<Delivery> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.deliveries();
            if done(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; got {got:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Hook {
    fn script(&self, statuses: &[u16]) {
        *self.script.lock().unwrap() = statuses.iter().rev().copied().collect();
    }
}

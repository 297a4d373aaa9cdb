//! A stand-in for an OpenAI-compatible chat-completions endpoint on
//! 127.0.0.1: answers every request with one canned completion (with token
//! usage) and counts the requests it got.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// What the stub saw of one request.
#[derive(Debug, Clone)]
pub struct SeenCompletion {
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

pub struct ModelStub {
    port: u16,
    seen: Arc<Mutex<Vec<SeenCompletion>>>,
}

impl ModelStub {
    /// Starts the stub; every completion answers `answer` and reports
    /// `tokens` total tokens.
    pub fn start(answer: &str, tokens: u64) -> ModelStub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the model stub");
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let response = serde_json::json!({
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": tokens / 2, "completion_tokens": tokens - tokens / 2, "total_tokens": tokens}
        })
        .to_string();
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0usize;
                let mut authorization = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        let name = name.to_ascii_lowercase();
                        if name == "content-length" {
                            length = value.trim().parse().unwrap_or(0);
                        } else if name == "authorization" {
                            authorization = Some(value.trim().to_string());
                        }
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                log.lock().unwrap().push(SeenCompletion {
                    authorization,
                    body: serde_json::from_slice(&body).unwrap_or_default(),
                });
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    response.len(),
                    response
                );
            }
        });
        ModelStub { port, seen }
    }

    /// The chat-completions URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/chat/completions", self.port)
    }

    pub fn requests(&self) -> Vec<SeenCompletion> {
        self.seen.lock().unwrap().clone()
    }
}

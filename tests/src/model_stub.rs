//! A stand-in for an OpenAI-compatible chat-completions endpoint on
//! 127.0.0.1: answers every request with one canned completion (with token
//! usage) and counts the requests it got.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use receiver_http::{Conn, Request, Response, Server, Service};

/// What the stub saw of one request.
#[derive(Debug, Clone)]
pub struct SeenCompletion {
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

pub struct ModelStub {
    server: Server,
    stub: Arc<Stub>,
}

struct Stub {
    response: Response,
    seen: Mutex<Vec<SeenCompletion>>,
}

impl Service for Stub {
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool {
        self.seen.lock().unwrap().push(SeenCompletion {
            authorization: req.header("authorization").map(str::to_string),
            body: serde_json::from_slice(&req.body).unwrap_or_default(),
        });
        conn.reply(&self.response, false)
    }
}

impl ModelStub {
    /// Starts the stub; every completion answers `answer` and reports
    /// `tokens` total tokens.
    pub fn start(answer: &str, tokens: u64) -> ModelStub {
        let response = serde_json::json!({
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": tokens / 2, "completion_tokens": tokens - tokens / 2, "total_tokens": tokens}
        });
        let stub = Arc::new(Stub {
            response: Response::json(200, &response),
            seen: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the model stub");
        let server = Server::start(listener, "model-stub", 1 << 20, stub.clone())
            .expect("start the model stub");
        ModelStub { server, stub }
    }

    /// The chat-completions URL.
    pub fn url(&self) -> String {
        format!("{}/v1/chat/completions", self.server.url())
    }

    pub fn requests(&self) -> Vec<SeenCompletion> {
        self.stub.seen.lock().unwrap().clone()
    }
}

//! Test guest: `{"question": "..."}` asks the configured model once and
//! returns `{"answer": <first choice's content>, "tokens": <usage.total_tokens>}`.

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let question = input["question"].as_str().unwrap_or("hello");
    let response: Value = ctx.llm(&json!({
        "messages": [{"role": "user", "content": question}],
        "temperature": 0
    }))?;
    Ok(json!({
        "answer": response["choices"][0]["message"]["content"],
        "tokens": response["usage"]["total_tokens"],
    }))
}

stephost_guest::export_step!(run);

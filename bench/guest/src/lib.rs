//! Benchmark guest for `stephost-bench`.
//!
//! Input: `{"mode": M, "count": N, "stamps": false, "gate": false,
//! "start_at_ns": null}`. Modes:
//! - `write`: N sequential calls of the effect `noop.write`;
//! - `read`: N sequential calls of the effect `noop.read`;
//! - `observe`: N calls of the recorded clock (`ctx.now_nanos()`);
//! - `none`: no call at all;
//! - `stamp`: one clock call, first thing; its value (the host's wall clock
//!   when the guest began) is returned as `first_ns`;
//! - `resume`: N clock calls, one call of `gate.read`, then one write to
//!   `noop.write` (the bench stops the run while it waits at the gate);
//! - `converse`: a conversation of N turns with the model `bench`
//!   (`models.chat`): each turn adds a user message of `pad` bytes, asks
//!   the model with the whole conversation, and adds its answer;
//! - `converse-http`: the same conversation through the effect `chat.read`,
//!   an `http` read posting the OpenAI Chat Completions body itself (the
//!   same exchange as a buffered read, for comparison);
//! - `http-effect`: N orders posted through the effect `orders.post`;
//! - `wasi-http`: the same N orders posted to `{url}/orders` by the step's
//!   own HTTP client (`wstd` over `wasi:http`);
//! - `children`: N child runs of the step `bench` (`[steps.bench]`), each
//!   one `noop.write` (`{"mode": "write", "count": 1}`), started one after
//!   another in one join set, then joined;
//! - `promise`: makes a promise, waits for it (the bench completes it with
//!   the token it derives under the key it gave the server), then one
//!   `noop.write`.
//!
//! With `"pad": P`, `read` and `write` add P bytes to each request (the
//! echo effects answer them back).
//!
//! With `"gate": true`, the step first calls `gate.read`, which returns when
//! the bench opens the gate: so many runs can be started together. With
//! `"start_at_ns": T` (the host's wall clock, ns), it then sleeps until T
//! (a WASI sleep, starting no process: a worker running several runs at
//! once waits on its runtime's timers, holding no thread; a run on a thread
//! of its own sleeps on it), and returns the clock it read before sleeping
//! as `arrived_ns`: many runs start together without a process each to let
//! them go. With
//! `"stamps": true`, `write`, `read` and `observe` read the recorded clock
//! once before and once after their N calls and return the values as
//! `first_ns` and `last_ns`.
//!
//! Output: `{"calls": N}` (the calls of the mode, not the gate's or the
//! sleep's clock reads), plus `first_ns`/`last_ns` and `arrived_ns` as
//! above.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{ChatRequest, Ctx, Error, Message, Part, Role};

#[derive(Debug, Deserialize)]
struct Input {
    mode: String,
    #[serde(default)]
    count: u64,
    #[serde(default)]
    stamps: bool,
    #[serde(default)]
    gate: bool,
    #[serde(default)]
    start_at_ns: Option<u64>,
    #[serde(default)]
    pad: usize,
    /// The receiver of `wasi-http`'s orders.
    #[serde(default)]
    url: String,
}

/// `bytes` of text, different for each `turn`.
fn filler(turn: u64, bytes: usize) -> String {
    let mut text = format!("turn {turn}: ");
    let words = ["order", "refund", "parcel", "invoice", "customer", "status"];
    let mut i = turn as usize;
    while text.len() < bytes {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    text.truncate(bytes);
    text
}

fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Input `mode` `converse` or `converse-http`: `turns` turns with the model;
/// the transcript's bytes (every message's text, once).
fn converse(ctx: &mut Ctx, turns: u64, pad: usize, http: bool) -> Result<Value, Error> {
    let mut request = ChatRequest::new("bench", Vec::new());
    request.system = Some("You answer customers about their orders.".into());
    let mut transcript = request.system.as_ref().map_or(0, String::len);
    for turn in 0..turns {
        let said = filler(turn, pad);
        transcript += said.len();
        request.messages.push(Message::user(said));
        let answer = if http {
            let wire: Vec<Value> =
                std::iter::once(json!({"role": "system", "content": request.system}))
                    .chain(request.messages.iter().map(|m| {
                        json!({
                            "role": if m.role == Role::User { "user" } else { "assistant" },
                            "content": text_of(&m.content),
                        })
                    }))
                    .collect();
            let reply: Value = ctx.effect(
                "chat.read",
                &json!({"model": "bench-1", "messages": wire, "max_tokens": 1024}),
            )?;
            let text = reply["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            vec![Part::text(text)]
        } else {
            ctx.chat("bench", &request)?.content
        };
        transcript += text_of(&answer).len();
        request.messages.push(Message::assistant(answer));
    }
    Ok(json!({ "calls": turns, "transcript_bytes": transcript }))
}

fn effects(ctx: &mut Ctx, name: &str, count: u64, pad: usize) -> Result<(), Error> {
    for i in 0..count {
        let request = match pad {
            0 => json!({ "i": i }),
            _ => json!({ "i": i, "pad": filler(i, pad) }),
        };
        let _: Value = ctx.effect(name, &request)?;
    }
    Ok(())
}

/// The `i`th order of `http-effect` and `wasi-http`.
fn order(i: u64) -> Value {
    json!({ "sku": format!("BENCH-{i}"), "quantity": 1 })
}

/// Input `mode` `wasi-http`: `count` orders posted with `wstd`.
fn own_client(url: &str, count: u64) -> Result<Value, Error> {
    use wstd::http::{Body, Client, Request};
    let posted: Result<(), wstd::http::Error> = wstd::runtime::block_on(async {
        let client = Client::new();
        for i in 0..count {
            let request = Request::post(format!("{url}/orders"))
                .header("content-type", "application/json")
                .body(Body::from_json(&order(i))?)?;
            let mut response = client.send(request).await?;
            if !response.status().is_success() {
                return Err(wstd::http::Error::msg(format!("{}", response.status())));
            }
            let _: Value = response.body_mut().json().await?;
        }
        Ok(())
    });
    posted.map_err(|e| Error::msg(format!("{e:#}")))?;
    Ok(json!({ "calls": count }))
}

fn observe(ctx: &mut Ctx, count: u64) -> Result<(), Error> {
    let mut sum = 0u64;
    for _ in 0..count {
        sum = sum.wrapping_add(ctx.now_nanos());
    }
    std::hint::black_box(sum);
    Ok(())
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    if input.gate {
        effects(ctx, "gate.read", 1, 0)?;
    }
    let arrived_ns = input.start_at_ns.map(|at| {
        let arrived = ctx.now_nanos();
        let mut now = arrived;
        while now < at {
            std::thread::sleep(std::time::Duration::from_nanos(at - now));
            now = ctx.now_nanos();
        }
        arrived
    });
    let mut output = calls(ctx, &input)?;
    if let Some(arrived) = arrived_ns {
        output["arrived_ns"] = json!(arrived);
    }
    Ok(output)
}

/// The calls of `input`'s mode, and what they return.
fn calls(ctx: &mut Ctx, input: &Input) -> Result<Value, Error> {
    let count = input.count;
    let pad = input.pad;
    let calls: fn(&mut Ctx, u64, usize) -> Result<(), Error> = match input.mode.as_str() {
        "none" => return Ok(json!({ "calls": 0 })),
        "children" => {
            let child = stephost_guest::Child::new("bench", &json!({"mode": "write", "count": 1}))?;
            for _ in 0..count {
                ctx.start("children", &child)?;
            }
            for _ in 0..count {
                let end = ctx.join_next("children")?;
                end.output::<Value>()?;
            }
            return Ok(json!({ "calls": count }));
        }
        "promise" => {
            let promise = ctx.promise("bench", std::time::Duration::from_secs(600))?;
            ctx.wait_promise(&promise)?;
            effects(ctx, "noop.write", 1, 0)?;
            return Ok(json!({ "calls": 3 }));
        }
        "stamp" => return Ok(json!({ "calls": 1, "first_ns": ctx.now_nanos() })),
        "resume" => {
            observe(ctx, count)?;
            effects(ctx, "gate.read", 1, 0)?;
            effects(ctx, "noop.write", 1, 0)?;
            return Ok(json!({ "calls": count + 2 }));
        }
        "converse" => return converse(ctx, count, pad, false),
        "converse-http" => return converse(ctx, count, pad, true),
        "http-effect" => {
            for i in 0..count {
                let _: Value = ctx.effect("orders.post", &order(i))?;
            }
            return Ok(json!({ "calls": count }));
        }
        "wasi-http" => return own_client(&input.url, count),
        "write" => |ctx, n, pad| effects(ctx, "noop.write", n, pad),
        "read" => |ctx, n, pad| effects(ctx, "noop.read", n, pad),
        "observe" => |ctx, n, _| observe(ctx, n),
        other => stephost_guest::bail!("unknown mode {other:?}"),
    };
    let first_ns = input.stamps.then(|| ctx.now_nanos());
    calls(ctx, count, pad)?;
    let last_ns = input.stamps.then(|| ctx.now_nanos());
    let mut output = json!({ "calls": count });
    if let (Some(first), Some(last)) = (first_ns, last_ns) {
        output["first_ns"] = json!(first);
        output["last_ns"] = json!(last);
    }
    Ok(output)
}

stephost_guest::export_step!(run);

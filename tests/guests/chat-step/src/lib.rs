//! Test guest (stephost:step@0.2.0): `{"model", "message", "max_tokens"?,
//! "agent"?}`. Without `agent`, one chat turn: returns the answer's text,
//! stop reason, usage and cost. With `agent`, a refund agent: the model may
//! call `lookup_order` (effect `orders.lookup`, a read) and `refund`
//! (effect `payments.refund`, a write keyed by the order id) until it
//! answers; returns the answer, the turns and the tool calls. A refused
//! call (`budget` and the rest) is returned as `{"error": KIND, ...}`.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{Agent, ChatRequest, Ctx, EffectError, Error, Message, ToolDef};

#[derive(Deserialize)]
struct Input {
    model: String,
    message: String,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    agent: bool,
    /// Read the customer's card from the effect `vault.read` and tell the
    /// model about it.
    #[serde(default)]
    with_card: bool,
    /// Return the answer's stop reason, not its text (so that the run's
    /// output holds none of it, and a replay, which sees a redacted answer's
    /// marker, ends with the same output).
    #[serde(default)]
    quiet: bool,
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    let mut message = input.message.clone();
    if input.with_card {
        let card: Value = ctx.effect("vault.read", &json!({"customer": "c-1"}))?;
        message = format!("{message} The card on file is {}.", card["card"]);
    }
    let mut request = ChatRequest::new(&input.model, vec![Message::user(&message)]);
    request.system = Some("You are a support agent. Use the tools; be brief.".into());
    request.max_tokens = input.max_tokens;
    if !input.agent {
        return match ctx.chat(&input.model, &request) {
            Ok(answer) if input.quiet => Ok(json!({"stop": answer.stop})),
            Ok(answer) => Ok(json!({
                "text": answer.text(),
                "stop": answer.stop,
                "usage": answer.usage,
                "cost": answer.cost,
            })),
            Err(e) => Ok(refused(&e)),
        };
    }
    request.tools = vec![
        tool("lookup_order", "Find an order by its id"),
        tool("refund", "Refund an order (amount in cents)"),
    ];
    let ran = Agent::new(&input.model, request).run_full(ctx, |ctx, name, arguments| {
        let args: Value = serde_json::from_str(arguments)?;
        let found: Value = match name {
            "lookup_order" => ctx.effect("orders.lookup", &args)?,
            "refund" => {
                let order = args["order_id"].as_str().unwrap_or("none").to_string();
                ctx.effect_with_key("payments.refund", &order, &args)?
            }
            other => return Err(Error::from(format!("no tool {other}"))),
        };
        Ok(found)
    });
    match ran {
        Ok(run) => Ok(json!({
            "text": run.response.text(),
            "turns": run.turns,
            "tool_calls": run.tool_calls,
            "tokens": run.usage.total(),
        })),
        Err(e) => match e.effect_error() {
            Some(effect) => Ok(refused(effect)),
            None => Err(e),
        },
    }
}

fn tool(name: &str, description: &str) -> ToolDef {
    ToolDef {
        name: name.into(),
        description: Some(description.into()),
        parameters: json!({"type": "object"}),
    }
}

fn refused(e: &EffectError) -> Value {
    let kind = match e {
        EffectError::Budget { .. } => "budget",
        EffectError::Denied { .. } => "denied",
        EffectError::Rejected { .. } => "rejected",
        EffectError::Exhausted { .. } => "exhausted",
        EffectError::Invalid { .. } => "invalid",
        _ => "other",
    };
    json!({"error": kind, "message": e.to_string()})
}

stephost_guest::export_step!(run);

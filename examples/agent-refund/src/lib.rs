//! Example step: a support agent that refunds orders.
//!
//! Input `{"message": "customer text mentioning order A-1001 ...",
//! "approval_above_cents": 10000, "approval_ttl_seconds": 86400}` (the last
//! two optional). A model (the alias `support` in `stephost.toml`) reads the
//! message and calls two tools until it answers:
//!
//! - `lookup_order {"order_id"}`: the `orders.lookup` effect, a read;
//! - `refund {"order_id", "amount_cents", "reason"?}`: checked against the
//!   order, approved by a person when above `approval_above_cents` (and the
//!   order looked up again after the approval), then sent through the
//!   `payments.refund` effect, a write with the business key
//!   `refund:{order_id}`: however often the run is resumed, the payment
//!   service sees one operation id for the refund of that order.
//!
//! Output `{"summary", "refunded_cents", "refunds", "turns", "tokens",
//! "cost_micro_usd"}`: the model's final answer, what was refunded (with the
//! receipts), and what the model calls took.
//!
//! Every model turn, lookup, approval and refund is recorded: a run that
//! crashes anywhere in the loop resumes without asking the model again for
//! an answer it already has and without refunding twice.
//!
//! With `"parallel": true`, each turn's tool calls run at once, each as a
//! child run of this same step (`[steps.agent-refund]` in `stephost.toml`)
//! given `{"tool": {"name", "arguments"}}`: such a run performs that one
//! tool call (its lookups, its approval, its refund) and returns
//! `{"content", "is_error", "refunded_cents", "refund"}`; the parent joins
//! them and gives the model their results in the order it made the calls.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;
use stephost_guest::{
    Agent, ChatRequest, Child, ChildEnd, Ctx, EffectError, Error, Message, ToolDef, ToolOutput,
    bail, log,
};

/// The model alias in `stephost.toml` (`[models.support]`).
const MODEL: &str = "support";

const SYSTEM: &str = "You are the refund desk of an online shop. Read the customer's message, \
look the order up with `lookup_order`, and refund it with `refund` when the customer asks for \
a refund: amounts are in cents and never more than what is left to refund on the order \
(`amount_cents - refunded_cents`). If a tool reports an error, do not retry it blindly: explain \
it. End with a short summary for the customer.";

/// The step's input.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    /// What the customer wrote.
    #[serde(default)]
    message: String,
    /// Each turn's tool calls run at once, as child runs.
    #[serde(default)]
    parallel: bool,
    /// Run this one tool call (a child of a parallel agent).
    #[serde(default)]
    tool: Option<ToolCall>,
    /// Refunds above this many cents wait for a person's approval.
    #[serde(default = "default_approval_above_cents")]
    approval_above_cents: i64,
    /// How long the approval may wait.
    #[serde(default = "default_approval_ttl_seconds")]
    approval_ttl_seconds: u64,
}

fn default_approval_above_cents() -> i64 {
    10_000
}

fn default_approval_ttl_seconds() -> u64 {
    24 * 60 * 60
}

/// One tool call, as a parallel agent hands it to a child run.
#[derive(Debug, Serialize, Deserialize)]
struct ToolCall {
    name: String,
    /// The arguments as the model wrote them (JSON text).
    arguments: String,
}

/// The step name a parallel agent starts its tool calls as
/// (`[steps.agent-refund]`).
const TOOL_STEP: &str = "agent-refund";

/// A customer order as `orders.lookup` answers it (other fields ignored).
#[derive(Debug, Clone, Deserialize)]
struct Order {
    order_id: String,
    amount_cents: i64,
    #[serde(default)]
    refunded_cents: i64,
}

#[derive(Debug, Deserialize)]
struct LookupArgs {
    order_id: String,
}

#[derive(Debug, Deserialize)]
struct RefundArgs {
    order_id: String,
    amount_cents: i64,
    #[serde(default)]
    reason: Option<String>,
}

/// The request sent to `payments.refund`.
#[derive(Debug, Serialize)]
struct RefundRequest<'a> {
    order_id: &'a str,
    amount_cents: i64,
    reason: &'a str,
}

/// The step's output.
#[derive(Debug, Serialize)]
struct Output {
    /// The model's final answer.
    summary: String,
    /// Cents refunded by this run.
    refunded_cents: i64,
    /// The payment service's receipts.
    refunds: Vec<Value>,
    /// Model calls made.
    turns: u32,
    /// Model tokens, input and output.
    tokens: u64,
    /// What the model calls cost, in micro-USD (0 without prices).
    cost_micro_usd: u64,
}

/// What the tools have done in this run.
struct Desk {
    approval_above_cents: i64,
    approval_ttl: Duration,
    message: String,
    refunds: Vec<Value>,
    refunded_cents: i64,
}

fn tools() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: "lookup_order".into(),
            description: Some(
                "Look a customer order up by its id: its amount and what was refunded already, \
                 in cents."
                    .into(),
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order id, like A-1001"}
                },
                "required": ["order_id"],
                "additionalProperties": false
            }),
        },
        ToolDef {
            name: "refund".into(),
            description: Some(
                "Refund part or all of a customer order to the customer's payment method. Large \
                 refunds wait for a person's approval."
                    .into(),
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "amount_cents": {"type": "integer", "minimum": 1},
                    "reason": {"type": "string", "description": "Why, in a few words"}
                },
                "required": ["order_id", "amount_cents"],
                "additionalProperties": false
            }),
        },
    ]
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    let mut desk = Desk {
        approval_above_cents: input.approval_above_cents,
        approval_ttl: Duration::from_secs(input.approval_ttl_seconds),
        message: input.message.clone(),
        refunds: Vec::new(),
        refunded_cents: 0,
    };
    if let Some(call) = &input.tool {
        let output = desk.call(ctx, &call.name, &call.arguments)?;
        return Ok(json!({
            "content": output.content,
            "is_error": output.is_error,
            "refunded_cents": desk.refunded_cents,
            "refund": desk.refunds.pop(),
        }));
    }
    Ok(serde_json::to_value(agent(ctx, input, desk)?)?)
}

/// The agent: the model and its tools, until it answers.
fn agent(ctx: &mut Ctx, input: Input, mut desk: Desk) -> Result<Output, Error> {
    if input.message.trim().is_empty() {
        bail!("message must not be empty");
    }
    if input.approval_above_cents < 0 {
        bail!("approval_above_cents must not be negative");
    }
    let mut request = ChatRequest::new(MODEL, vec![Message::user(input.message.clone())]);
    request.system = Some(SYSTEM.into());
    request.tools = tools();

    let agent = Agent::new(MODEL, request).max_turns(8);
    let done = if input.parallel {
        let (above, ttl) = (input.approval_above_cents, input.approval_ttl_seconds);
        let message = desk.message.clone();
        agent.run_children(
            ctx,
            |name, arguments| {
                log::info(format_args!("tool {name} {arguments}, as a child run"));
                let call = ToolCall {
                    name: name.to_string(),
                    arguments: arguments.to_string(),
                };
                let input = json!({
                    "tool": call,
                    "approval_above_cents": above,
                    "approval_ttl_seconds": ttl,
                    "message": message,
                });
                Ok(Child::new(TOOL_STEP, &input)?)
            },
            |name, end| desk.joined(name, end),
        )?
    } else {
        agent.run_full(ctx, |ctx, name, arguments| {
            log::info(format_args!("tool {name} {arguments}"));
            desk.call(ctx, name, arguments)
        })?
    };
    log::info(format_args!(
        "answered after {} turns, {} tool calls, {} tokens, {} micro-USD",
        done.turns,
        done.tool_calls,
        done.usage.total(),
        done.cost.micro_usd
    ));
    Ok(Output {
        summary: done.response.text(),
        refunded_cents: desk.refunded_cents,
        refunds: desk.refunds,
        turns: done.turns,
        tokens: done.usage.total(),
        cost_micro_usd: done.cost.micro_usd,
    })
}

impl Desk {
    /// One tool call: its result for the model.
    fn call(&mut self, ctx: &mut Ctx, name: &str, arguments: &str) -> Result<ToolOutput, Error> {
        match name {
            "lookup_order" => match serde_json::from_str::<LookupArgs>(arguments) {
                Ok(args) => self.lookup(ctx, &args.order_id),
                Err(e) => Ok(ToolOutput::error(format!("bad arguments: {e}"))),
            },
            "refund" => match serde_json::from_str::<RefundArgs>(arguments) {
                Ok(args) => self.refund(ctx, &args),
                Err(e) => Ok(ToolOutput::error(format!("bad arguments: {e}"))),
            },
            other => Ok(ToolOutput::error(format!("there is no tool `{other}`"))),
        }
    }

    /// A tool call's child run, joined: its result for the model, and its
    /// refund counted.
    fn joined(&mut self, name: &str, end: &ChildEnd) -> Result<ToolOutput, Error> {
        let done: Value = match end.output() {
            Ok(done) => done,
            Err(e) => return Ok(ToolOutput::error(format!("tool {name} failed: {e}"))),
        };
        if let Some(receipt) = done.get("refund").filter(|r| !r.is_null()) {
            self.refunds.push(receipt.clone());
        }
        self.refunded_cents += done["refunded_cents"].as_i64().unwrap_or(0);
        Ok(ToolOutput {
            content: done["content"].as_str().unwrap_or_default().to_string(),
            is_error: done["is_error"].as_bool().unwrap_or(false),
        })
    }

    /// `lookup_order`: the order as JSON, or an error the model can read.
    fn lookup(&mut self, ctx: &mut Ctx, order_id: &str) -> Result<ToolOutput, Error> {
        match self.fetch(ctx, order_id)? {
            Ok(order) => Ok(ToolOutput::from(order)),
            Err(message) => Ok(ToolOutput::error(message)),
        }
    }

    /// The order from `orders.lookup`; a refusal (no such order) as the
    /// inner error, any other failure ends the run.
    fn fetch(&mut self, ctx: &mut Ctx, order_id: &str) -> Result<Result<Value, String>, Error> {
        match ctx.effect::<_, Value>("orders.lookup", &json!({ "order_id": order_id })) {
            Ok(order) => Ok(Ok(order)),
            Err(EffectError::Rejected { message, .. }) => {
                Ok(Err(format!("order {order_id} was not found: {message}")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `refund`: checked, approved when large, sent once.
    fn refund(&mut self, ctx: &mut Ctx, args: &RefundArgs) -> Result<ToolOutput, Error> {
        let order = match self.refundable(ctx, args)? {
            Ok(order) => order,
            Err(message) => return Ok(ToolOutput::error(message)),
        };
        let reason = args.reason.as_deref().unwrap_or("customer request");
        if args.amount_cents > self.approval_above_cents {
            let subject = format!(
                "refund {} of order {}",
                dollars(args.amount_cents),
                order.order_id
            );
            log::info(format_args!("asking for approval: {subject}"));
            let decision = ctx.approval(
                &subject,
                &json!({
                    "order_id": order.order_id,
                    "amount_cents": args.amount_cents,
                    "order_amount_cents": order.amount_cents,
                    "refunded_cents": order.refunded_cents,
                    "reason": reason,
                    "customer_message": self.message,
                }),
                self.approval_ttl,
            )?;
            if !decision.approved() {
                return Ok(ToolOutput::error(format!(
                    "the refund was not approved ({:?}{}{}); do not refund, tell the customer a \
                     person will follow up",
                    decision.verdict,
                    if decision.by.is_empty() { "" } else { " by " },
                    decision.by
                )));
            }
            // An approval is not a licence forever: check the order again now.
            if let Err(message) = self.refundable(ctx, args)? {
                return Ok(ToolOutput::error(message));
            }
        }
        let key = format!("refund:{}", order.order_id);
        let request = RefundRequest {
            order_id: &order.order_id,
            amount_cents: args.amount_cents,
            reason,
        };
        log::info(format_args!(
            "refunding {} of order {} (key {key})",
            dollars(args.amount_cents),
            order.order_id
        ));
        match ctx.effect_with_key::<_, Value>("payments.refund", &key, &request) {
            Ok(receipt) => {
                self.refunded_cents += args.amount_cents;
                self.refunds.push(receipt.clone());
                Ok(ToolOutput::from(receipt))
            }
            // The payment service said no (e.g. more than is left): the model explains it.
            Err(EffectError::Rejected { message, .. }) => Ok(ToolOutput::error(format!(
                "the payment service refused the refund: {message}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// The order, when `args` may be refunded from it; otherwise why not.
    fn refundable(
        &mut self,
        ctx: &mut Ctx,
        args: &RefundArgs,
    ) -> Result<Result<Order, String>, Error> {
        if args.amount_cents <= 0 {
            return Ok(Err(format!(
                "amount_cents must be positive, got {}",
                args.amount_cents
            )));
        }
        let order = match self.fetch(ctx, &args.order_id)? {
            Ok(order) => order,
            Err(message) => return Ok(Err(message)),
        };
        let order: Order = serde_json::from_value(order)?;
        let left = order.amount_cents - order.refunded_cents;
        if args.amount_cents > left {
            return Ok(Err(format!(
                "order {} has {} left to refund ({} paid, {} refunded); {} is too much",
                order.order_id,
                dollars(left),
                dollars(order.amount_cents),
                dollars(order.refunded_cents),
                dollars(args.amount_cents)
            )));
        }
        Ok(Ok(order))
    }
}

/// `$12.34`.
fn dollars(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    format!("{sign}${}.{:02}", cents / 100, cents % 100)
}

stephost_guest::export_step!(run);

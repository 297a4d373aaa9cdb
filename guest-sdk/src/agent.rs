//! A tool-calling loop over [`Ctx::chat`].

use crate::{Ctx, EffectError, Error};
use stephost_contract::{ChatRequest, ChatResponse, Cost, Message, Usage};

/// What a tool call gives back to the model: its content (often JSON) and
/// whether the tool failed.
///
/// A tool function may return a `String`, a `&str` or a
/// [`serde_json::Value`] (all converted as successes) or a `ToolOutput`; use
/// [`ToolOutput::error`] to tell the model a call failed (bad arguments, an
/// unknown order, ...) and let it try something else. Returning `Err` from
/// the tool function instead ends the whole run with that error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// The result as text, as the model will read it.
    pub content: String,
    /// Whether the tool failed.
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed call, explained to the model.
    pub fn error(message: impl Into<String>) -> Self {
        ToolOutput {
            content: message.into(),
            is_error: true,
        }
    }
}

impl From<String> for ToolOutput {
    fn from(content: String) -> Self {
        ToolOutput::ok(content)
    }
}

impl From<&str> for ToolOutput {
    fn from(content: &str) -> Self {
        ToolOutput::ok(content)
    }
}

impl From<serde_json::Value> for ToolOutput {
    fn from(value: serde_json::Value) -> Self {
        ToolOutput::ok(value.to_string())
    }
}

/// A model in a loop with tools: asks the model, runs each tool call it
/// makes through one function, sends the results back, and repeats until the
/// model answers without calling a tool.
///
/// Each model turn is a [`Ctx::chat`] call and each tool is whatever the tool
/// function does with the [`Ctx`] (effects, approvals, ...), so every step
/// of the loop is recorded: a resumed run picks up after the last recorded
/// call, asking the model nothing it already answered.
///
/// ```no_run
/// use serde_json::{Value, json};
/// use stephost_guest::{Agent, ChatRequest, Ctx, Error, Message, ToolDef, ToolOutput};
///
/// fn run(ctx: &mut Ctx, text: String) -> Result<String, Error> {
///     let mut request = ChatRequest::new("", vec![Message::user(text)]);
///     request.tools = vec![ToolDef {
///         name: "lookup_order".into(),
///         description: Some("Look an order up by its id".into()),
///         parameters: json!({"type": "object", "properties": {"order_id": {"type": "string"}},
///                            "required": ["order_id"]}),
///     }];
///     let answer = Agent::new("support", request).max_turns(6).run(ctx, |ctx, name, args| {
///         match name {
///             "lookup_order" => {
///                 let args: Value = serde_json::from_str(args)?;
///                 let order: Value = ctx.effect("orders.lookup", &args)?;
///                 Ok(ToolOutput::from(order))
///             }
///             other => Ok(ToolOutput::error(format!("there is no tool `{other}`"))),
///         }
///     })?;
///     Ok(answer.text())
/// }
/// # stephost_guest::export_step!(run);
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct Agent {
    model: String,
    request: ChatRequest,
    max_turns: u32,
}

/// How an [`Agent`] ended: the final answer, the conversation and what it
/// cost.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRun {
    /// The model's last answer: no tool calls in it.
    pub response: ChatResponse,
    /// The request with the whole conversation, the last answer included;
    /// push a user message onto `messages` to go on.
    pub request: ChatRequest,
    /// Model calls made (replayed ones included).
    pub turns: u32,
    /// Tool calls run.
    pub tool_calls: u32,
    /// Tokens of every turn, summed.
    pub usage: Usage,
    /// Cost of every turn, summed (zero when the model has no prices).
    pub cost: Cost,
}

impl Agent {
    /// The default bound on model calls ([`Agent::max_turns`]).
    pub const DEFAULT_MAX_TURNS: u32 = 10;

    /// An agent asking the model aliased `model` (`[models.NAME]` in
    /// `stephost.toml`), starting from `request`: its system prompt, the
    /// first messages and the tools the model may call.
    pub fn new(model: impl Into<String>, request: ChatRequest) -> Self {
        Agent {
            model: model.into(),
            request,
            max_turns: Self::DEFAULT_MAX_TURNS,
        }
    }

    /// At most `max_turns` model calls (at least 1; default
    /// [`Agent::DEFAULT_MAX_TURNS`]). When the model still calls tools in
    /// the last allowed turn, those calls are not run and the loop ends with
    /// an error.
    pub fn max_turns(mut self, max_turns: u32) -> Self {
        self.max_turns = max_turns.max(1);
        self
    }

    /// Runs the loop and returns the model's final answer.
    ///
    /// `tool(ctx, name, arguments)` runs one tool call: `name` is the tool
    /// the model called and `arguments` its arguments as the model wrote them
    /// (JSON text). Its result goes back to the model as a tool result.
    ///
    /// # Errors
    /// A model call's error (as an [`Error`] keeping the [`EffectError`],
    /// e.g. [`EffectError::Budget`]), the first `Err` of the tool function,
    /// or the model still calling tools after `max_turns` turns.
    pub fn run<F, R>(self, ctx: &mut Ctx, tool: F) -> Result<ChatResponse, Error>
    where
        F: FnMut(&mut Ctx, &str, &str) -> Result<R, Error>,
        R: Into<ToolOutput>,
    {
        self.run_full(ctx, tool).map(|run| run.response)
    }

    /// [`Agent::run`], returning the conversation, the number of turns and
    /// the summed usage and cost along with the final answer.
    ///
    /// # Errors
    /// As for [`Agent::run`].
    pub fn run_full<F, R>(self, ctx: &mut Ctx, tool: F) -> Result<AgentRun, Error>
    where
        F: FnMut(&mut Ctx, &str, &str) -> Result<R, Error>,
        R: Into<ToolOutput>,
    {
        self.drive(ctx, |ctx, model, request| ctx.chat(model, request), tool)
    }

    /// [`Agent::run_full`], each turn's tool calls run at once as child
    /// runs (stephost:step@0.3.0's `runs`): `start(name, arguments)` names
    /// the child for each call, all are started in a join set of the turn's
    /// own (`agent-turn-N`), then joined, and `done(name, end)` makes each
    /// child's end the tool's result. The results go back to the model in
    /// the order the model made the calls, whatever order the children ended
    /// in. A child that fails is the tool's error to the model, as `done`
    /// says.
    ///
    /// # Errors
    /// As for [`Agent::run`], and a start the host refuses.
    pub fn run_children<S, D>(
        self,
        ctx: &mut Ctx,
        mut start: S,
        mut done: D,
    ) -> Result<AgentRun, Error>
    where
        S: FnMut(&str, &str) -> Result<crate::Child, Error>,
        D: FnMut(&str, &crate::ChildEnd) -> Result<ToolOutput, Error>,
    {
        let mut turn = 0u32;
        self.drive_turns(
            ctx,
            |ctx, model, request| ctx.chat(model, request),
            |ctx, calls| {
                turn += 1;
                let set = format!("agent-turn-{turn}");
                let mut started = Vec::with_capacity(calls.len());
                for (_, name, arguments) in calls {
                    let child = start(name, arguments)?;
                    started.push(ctx.start(&set, &child)?);
                }
                let mut ended = std::collections::HashMap::new();
                for _ in calls {
                    let end = ctx.join_next(&set)?;
                    ended.insert(end.run_id.clone(), end);
                }
                started
                    .iter()
                    .zip(calls)
                    .map(|(run_id, (_, name, _))| match ended.get(run_id) {
                        Some(end) => done(name, end),
                        None => Err(Error::msg(format_args!(
                            "child run {run_id} of tool `{name}` was not joined"
                        ))),
                    })
                    .collect()
            },
        )
    }

    /// The loop, over any context and chat function (tests drive it with a
    /// scripted model), each tool call run in turn.
    fn drive<X, C, F, R>(self, cx: &mut X, chat: C, mut tool: F) -> Result<AgentRun, Error>
    where
        C: FnMut(&mut X, &str, &ChatRequest) -> Result<ChatResponse, EffectError>,
        F: FnMut(&mut X, &str, &str) -> Result<R, Error>,
        R: Into<ToolOutput>,
    {
        self.drive_turns(cx, chat, |cx, calls| {
            calls
                .iter()
                .map(|(_, name, arguments)| tool(cx, name, arguments).map(Into::into))
                .collect()
        })
    }

    /// The loop: `tools(cx, calls)` runs one turn's tool calls (id, name,
    /// arguments) and gives their results in the calls' order.
    fn drive_turns<X, C, T>(self, cx: &mut X, mut chat: C, mut tools: T) -> Result<AgentRun, Error>
    where
        C: FnMut(&mut X, &str, &ChatRequest) -> Result<ChatResponse, EffectError>,
        T: FnMut(&mut X, &[(String, String, String)]) -> Result<Vec<ToolOutput>, Error>,
    {
        let Agent {
            model,
            mut request,
            max_turns,
        } = self;
        let mut usage = Usage::default();
        let mut cost = Cost::default();
        let mut tool_calls = 0;
        for turn in 1..=max_turns {
            let response = chat(cx, &model, &request)?;
            add_usage(&mut usage, &response.usage);
            if let Some(c) = &response.cost {
                add_cost(&mut cost, c);
            }
            let calls: Vec<(String, String, String)> = response
                .tool_calls()
                .into_iter()
                .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.to_owned()))
                .collect();
            if !response.content.is_empty() {
                request
                    .messages
                    .push(Message::assistant(response.content.clone()));
            }
            if calls.is_empty() {
                return Ok(AgentRun {
                    response,
                    request,
                    turns: turn,
                    tool_calls,
                    usage,
                    cost,
                });
            }
            if turn == max_turns {
                let names: Vec<&str> = calls.iter().map(|(_, name, _)| name.as_str()).collect();
                return Err(Error::msg(format_args!(
                    "the model was still calling tools ({}) after {max_turns} turns (Agent::max_turns)",
                    names.join(", ")
                )));
            }
            let outputs = tools(cx, &calls)?;
            for ((id, name, _), output) in calls.into_iter().zip(outputs) {
                tool_calls += 1;
                request.messages.push(Message::tool_result(
                    id,
                    name,
                    output.content,
                    output.is_error,
                ));
            }
        }
        unreachable!("the last turn returns")
    }
}

fn add_usage(sum: &mut Usage, turn: &Usage) {
    sum.input = sum.input.saturating_add(turn.input);
    sum.cached_input = sum.cached_input.saturating_add(turn.cached_input);
    sum.cache_write = sum.cache_write.saturating_add(turn.cache_write);
    sum.output = sum.output.saturating_add(turn.output);
    sum.reasoning = sum.reasoning.saturating_add(turn.reasoning);
}

fn add_cost(sum: &mut Cost, turn: &Cost) {
    sum.micro_usd = sum.micro_usd.saturating_add(turn.micro_usd);
    sum.input_micro_usd = sum.input_micro_usd.saturating_add(turn.input_micro_usd);
    sum.cached_input_micro_usd = sum
        .cached_input_micro_usd
        .saturating_add(turn.cached_input_micro_usd);
    sum.cache_write_micro_usd = sum
        .cache_write_micro_usd
        .saturating_add(turn.cache_write_micro_usd);
    sum.output_micro_usd = sum.output_micro_usd.saturating_add(turn.output_micro_usd);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::VecDeque;
    use stephost_contract::{Part, Role, StopReason, ToolDef, validate};

    /// A scripted model and a record of what was asked and run.
    #[derive(Default)]
    struct Script {
        answers: VecDeque<Result<ChatResponse, EffectError>>,
        asked: Vec<ChatRequest>,
        ran: Vec<(String, String)>,
    }

    impl Script {
        fn chat(
            &mut self,
            model: &str,
            request: &ChatRequest,
        ) -> Result<ChatResponse, EffectError> {
            assert_eq!(model, "support");
            // What the host would check: the conversation is well formed.
            let mut sent = request.clone();
            sent.model = model.to_owned();
            validate(&sent).expect("the agent sends a valid conversation");
            self.asked.push(request.clone());
            self.answers.pop_front().expect("no answer scripted")
        }
    }

    fn answer(content: Vec<Part>, micro_usd: u64) -> Result<ChatResponse, EffectError> {
        let stop = if content.iter().any(|p| matches!(p, Part::ToolCall { .. })) {
            StopReason::ToolCalls
        } else {
            StopReason::Stop
        };
        Ok(ChatResponse {
            api: "openai-chat".into(),
            model: "gpt-4.1-mini".into(),
            id: "chatcmpl-1".into(),
            content,
            stop,
            stop_raw: "x".into(),
            refusal: None,
            usage: Usage {
                input: 100,
                cached_input: 10,
                cache_write: 0,
                output: 20,
                reasoning: 5,
            },
            usage_raw: None,
            cost: Some(Cost {
                micro_usd,
                output_micro_usd: micro_usd,
                ..Cost::default()
            }),
            charged: None,
        })
    }

    fn request() -> ChatRequest {
        let mut request = ChatRequest::new("", vec![Message::user("refund A-1001 please")]);
        request.tools = ["lookup_order", "refund"]
            .into_iter()
            .map(|name| ToolDef {
                name: name.into(),
                description: None,
                parameters: json!({"type": "object"}),
            })
            .collect();
        request
    }

    fn tools(script: &mut Script, name: &str, args: &str) -> Result<ToolOutput, Error> {
        script.ran.push((name.to_owned(), args.to_owned()));
        match name {
            "lookup_order" => Ok(json!({"order_id": "A-1001", "amount_cents": 4999}).into()),
            "refund" => Ok(ToolOutput::ok(r#"{"refund_id":"RF-1"}"#)),
            other => Ok(ToolOutput::error(format!("no tool {other}"))),
        }
    }

    #[test]
    fn loops_through_tool_calls_until_the_model_answers() {
        let mut script = Script::default();
        script.answers.extend([
            answer(
                vec![Part::tool_call(
                    "c1",
                    "lookup_order",
                    r#"{"order_id":"A-1001"}"#,
                )],
                3,
            ),
            answer(
                vec![
                    Part::text("Refunding."),
                    Part::tool_call("c2", "refund", r#"{"amount_cents":4999}"#),
                    Part::tool_call("c3", "escalate", "{}"),
                ],
                4,
            ),
            answer(vec![Part::text("Refunded $49.99.")], 5),
        ]);
        let run = Agent::new("support", request())
            .drive(&mut script, Script::chat, tools)
            .unwrap();

        assert_eq!(run.response.text(), "Refunded $49.99.");
        assert_eq!((run.turns, run.tool_calls), (3, 3));
        assert_eq!(run.usage.input, 300);
        assert_eq!(run.usage.cached_input, 30);
        assert_eq!(run.usage.output, 60);
        assert_eq!(run.usage.reasoning, 15);
        assert_eq!(run.cost.micro_usd, 12);
        assert_eq!(run.cost.output_micro_usd, 12);
        assert_eq!(
            script.ran,
            [
                ("lookup_order".into(), r#"{"order_id":"A-1001"}"#.into()),
                ("refund".into(), r#"{"amount_cents":4999}"#.into()),
                ("escalate".into(), "{}".into()),
            ]
        );

        // Each turn re-sends the conversation so far: the first one as given,
        // then the assistant's parts and one tool message per call.
        assert_eq!(script.asked.len(), 3);
        assert_eq!(script.asked[0], request());
        let third = &script.asked[2].messages;
        let roles: Vec<Role> = third.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(
            third[2],
            Message::tool_result(
                "c1",
                "lookup_order",
                r#"{"amount_cents":4999,"order_id":"A-1001"}"#,
                false
            )
        );
        assert_eq!(third[3].content.len(), 3);
        assert_eq!(
            third[5],
            Message::tool_result("c3", "escalate", "no tool escalate", true)
        );
        // The returned conversation ends with the final answer.
        assert_eq!(run.request.messages.len(), 7);
        assert_eq!(
            run.request.messages[6],
            Message::assistant(vec![Part::text("Refunded $49.99.")])
        );
        assert_eq!(run.request.tools, request().tools);
    }

    #[test]
    fn stops_at_max_turns_without_running_the_last_calls() {
        let mut script = Script::default();
        for i in 0..3 {
            script.answers.push_back(answer(
                vec![Part::tool_call(format!("c{i}"), "lookup_order", "{}")],
                1,
            ));
        }
        let err = Agent::new("support", request())
            .max_turns(2)
            .drive(&mut script, Script::chat, tools)
            .unwrap_err();
        assert_eq!(
            err.message(),
            "the model was still calling tools (lookup_order) after 2 turns (Agent::max_turns)"
        );
        assert_eq!(script.asked.len(), 2);
        assert_eq!(script.ran.len(), 1, "the second turn's call is not run");
    }

    #[test]
    fn max_turns_is_at_least_one_and_defaults() {
        assert_eq!(
            Agent::new("m", request()).max_turns,
            Agent::DEFAULT_MAX_TURNS
        );
        assert_eq!(Agent::new("m", request()).max_turns(0).max_turns, 1);
    }

    #[test]
    fn a_model_error_ends_the_loop_and_keeps_its_kind() {
        let mut script = Script::default();
        script.answers.push_back(Err(EffectError::Budget {
            effect: "models.support".into(),
            message: "the run has spent 100 model tokens".into(),
        }));
        let err = Agent::new("support", request())
            .drive(&mut script, Script::chat, tools)
            .unwrap_err();
        assert!(
            matches!(err.effect_error(), Some(EffectError::Budget { .. })),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "effect `models.support` was not called: it would pass the run's budget: \
             the run has spent 100 model tokens"
        );
        assert!(script.ran.is_empty());
    }

    #[test]
    fn a_tool_error_ends_the_loop() {
        let mut script = Script::default();
        script
            .answers
            .push_back(answer(vec![Part::tool_call("c1", "refund", "{}")], 1));
        let err = Agent::new("support", request())
            .drive(
                &mut script,
                Script::chat,
                |_: &mut Script, _: &str, _: &str| {
                    Err::<String, _>(Error::msg("the refund effect is down"))
                },
            )
            .unwrap_err();
        assert_eq!(err.message(), "the refund effect is down");
    }

    #[test]
    fn an_empty_answer_is_final_and_not_appended() {
        let mut script = Script::default();
        script.answers.push_back(answer(vec![], 0));
        let run = Agent::new("support", request())
            .drive(&mut script, Script::chat, tools)
            .unwrap();
        assert_eq!(run.turns, 1);
        assert_eq!(run.request.messages, request().messages);
        assert_eq!(run.response.text(), "");
    }
}

//! `GET /openapi.json`: the API described as OpenAPI 3.1, as it is served:
//! which routes need no token, each body's content type and shape (and that
//! it is required), and every status each route answers with, errors as
//! the JSON `Error` object. An end-to-end test checks that every path and
//! method it lists is served, and a contract test (schemathesis, every
//! check) checks the server against it.

use axum::Json;
use serde_json::{Value, json};

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// No token needed (health checks, the console's files, this document).
    Public,
    /// Any token.
    Read,
    /// A token with the operator role.
    Operator,
}

/// An operation's request body.
#[derive(Debug, Clone)]
enum Body {
    None,
    /// A module's raw bytes.
    Module,
    /// JSON of this schema; whether a body must be sent.
    Json(Value, bool),
}

/// An operation as the document lists it.
struct Operation {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    access: Access,
    query: Vec<Value>,
    body: Body,
    /// The success status, its content type and schema.
    ok: (u16, &'static str, Value),
    /// Statuses beyond those every operation of its kind answers with.
    more: &'static [u16],
}

/// The codes each error status carries.
fn error_codes(status: u16) -> &'static str {
    match status {
        400 => "bad_input: a body, path or query the API cannot read or accept",
        401 => "unauthorized: tokens are configured and the request names none of them",
        403 => {
            "forbidden: a read-only token asked to change something; a request from another \
             site; without tokens, a Host that is not a loopback name"
        }
        404 => "not_found, unknown_run, unknown_module, unknown_schedule",
        409 => {
            "not_decidable, run_exists, run_ended, conflict, diverged, integrity, \
             promise_expired, promise_completed, schedule_exists, fork_refused"
        }
        413 => "too_large: a body over json_body_bytes_max (module_bytes_max for an upload)",
        429 => {
            "too_many_streams: the token holds event_streams_per_token_max event streams open \
             already; too_many_completions: over promise_completions_per_second_max promise \
             completions this second"
        }
        500 => "internal",
        503 => "unavailable: the ledger cannot be reached",
        _ => "an error",
    }
}

fn unsigned() -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": u64::MAX})
}

/// A call's number: the ledger numbers calls from 1 up to `i64::MAX`.
fn seq() -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": i64::MAX})
}

fn millis() -> Value {
    json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX})
}

fn query(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema,
           "description": description})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "additionalProperties": false, "required": required,
           "properties": properties})
}

fn nullable_string() -> Value {
    json!({"type": ["string", "null"]})
}

/// A run id a caller chooses, as the server checks it
/// ([`stephost_core::ids::check_run_id`]): ASCII letters, digits and
/// `- _ . : @ + =`, a letter or a digit first.
fn chosen_run_id() -> Value {
    json!({"type": ["string", "null"], "minLength": 1, "maxLength": stephost_core::ids::RUN_ID_BYTES_MAX,
           "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$",
           "description": "the run's id (none: a new one); ASCII letters, digits and - _ . : @ + =, \
                           a letter or a digit first"})
}

/// A module's bytes in base64 as the server decodes it: the standard
/// alphabet, padded with `=`, nothing around it, and the bits past the
/// last byte zero (as every encoder writes them). Whether the bytes are a
/// module the schema cannot say: bytes that are not one are refused with
/// 400 `bad_input`.
fn module_base64(types: Value) -> Value {
    json!({"type": types, "format": "byte", "contentEncoding": "base64",
           "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$",
           "description": "the module's bytes (a WebAssembly component or core module; other bytes \
                           are refused with 400 bad_input)"})
}

/// Any JSON value but `null`.
fn not_null() -> Value {
    json!({"type": ["object", "array", "string", "number", "boolean"]})
}

fn operations() -> Vec<Operation> {
    use Access::*;
    let statuses: Vec<&str> = stephost_core::RunStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    // A field the server reads as absent when it is null is declared
    // nullable; so is the other module field of each choice.
    // A whole number written with a fraction or an exponent (`5000.0`) is
    // the number it spells, up to 2^53 (api::Budget).
    let bound = |description: &str| {
        json!({"type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX,
               "description": format!("{description}; a whole number (written as digits alone past 2^53)")})
    };
    let budget = json!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "properties": {
            "model_tokens_max": bound("model tokens (input and output) the run may spend"),
            "model_cost_micro_usd_max": bound("what its model calls may cost, in millionths of a US dollar"),
        },
        "description": "the run's own model budget: each bound given replaces [limits]'s for this run",
    });
    let raise = object(
        json!({
            "model_tokens_max": bound("model tokens (input and output) the run may spend"),
            "model_cost_micro_usd_max": bound("what its model calls may cost, in millionths of a US dollar"),
        }),
        &[],
    );
    let submit = {
        let module = |name: &str, schema: Value, other: &str| {
            object(
                json!({
                    name: schema,
                    other: {"type": "null"},
                    "input": {"description": "the run's input, any JSON (null if absent)"},
                    "run_id": chosen_run_id(),
                    "budget": budget.clone(),
                }),
                &[name],
            )
        };
        json!({"oneOf": [
            module("module_digest", json!({"type": "string", "description": "a module stored already"}), "module_base64"),
            module("module_base64", module_base64(json!("string")), "module_digest"),
        ]})
    };
    let replay = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "module_digest": nullable_string(),
            "module_base64": module_base64(json!(["string", "null"])),
        },
        "not": {
            "required": ["module_digest", "module_base64"],
            "properties": {"module_digest": {"type": "string"}, "module_base64": {"type": "string"}},
        },
        "description": "another build to replay against; none (or no body) for the recorded one",
    });
    let decide = object(
        json!({
            "verdict": {"enum": ["approved", "rejected"]},
            "details_sha256": {"type": ["string", "null"],
                               "description": "the sha256 of the details shown (at least 8 characters); required to approve"},
            "note": nullable_string(),
            "by": {"type": ["string", "null"], "description": "who decided, on a server without tokens (else the token's name)"},
        }),
        &["verdict"],
    );
    let cancel = object(
        json!({
            "reason": nullable_string(),
            "by": {"type": ["string", "null"], "description": "who cancels, on a server without tokens (else the token's name)"},
        }),
        &[],
    );
    let resolve = json!({"oneOf": [
        object(
            json!({"outcome": {"const": "succeeded"}, "response": not_null(),
                   "message": {"type": "null"}, "by": nullable_string()}),
            &["outcome", "response"],
        ),
        object(
            json!({"outcome": {"const": "failed"}, "message": {"type": "string"},
                   "response": {"type": "null"}, "by": nullable_string()}),
            &["outcome", "message"],
        ),
    ]});
    let fork = object(
        json!({
            "at": {"type": "integer", "minimum": 1, "maximum": i64::MAX,
                   "description": "the first call the fork makes live; the calls before it are kept"},
            "module_digest": nullable_string(),
            "module_base64": module_base64(json!(["string", "null"])),
            "run_id": chosen_run_id(),
        }),
        &["at"],
    );
    // One build at most: a digest or bytes.
    let mut fork = fork;
    fork["not"] = json!({
        "required": ["module_digest", "module_base64"],
        "properties": {"module_digest": {"type": "string"}, "module_base64": {"type": "string"}},
    });
    let schedule = object(
        json!({
            "name": {"type": "string", "minLength": 1, "maxLength": stephost_core::schedules::NAME_BYTES_MAX,
                     "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$",
                     "description": "the schedule's name: ASCII letters, digits, - _ ., a letter or digit first; part of each firing's run id"},
            "cron": {"type": "string", "description": "5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first"},
            "timezone": {"type": ["string", "null"], "description": "an IANA time zone (default UTC)"},
            "module_digest": nullable_string(),
            "module_base64": module_base64(json!(["string", "null"])),
            "step": {"type": ["string", "null"], "description": "a step the ledger has run (name@version): the build its newest run ran"},
            "input": {"description": "each firing's input (default {})"},
            "overlap": {"type": ["string", "null"], "enum": ["skip", "buffer-one", "allow", null]},
            "catch_up_ms": {"type": ["integer", "null"], "minimum": 0, "maximum": i64::MAX,
                            "description": "how late a missed slot may still fire (default 60000)"},
        }),
        &["name", "cron"],
    );
    // The build, named one way: a digest, bytes, or a step the ledger ran.
    let mut schedule = schedule;
    schedule["oneOf"] = json!(
        ["module_digest", "module_base64", "step"]
            .map(|field| json!({"required": [field], "properties": {field: {"type": "string"}}}))
    );
    let complete = json!({"oneOf": [
        object(
            json!({"resolve": not_null(), "reject": {"type": "null"}, "by": nullable_string()}),
            &["resolve"],
        ),
        object(
            json!({"reject": {"type": "string"}, "resolve": {"type": "null"}, "by": nullable_string()}),
            &["reject"],
        ),
    ]});
    let any_object = json!({"type": "object"});
    let any_array = json!({"type": "array"});
    let text = json!({"type": "string"});
    vec![
        Operation {
            method: "get",
            path: "/",
            summary: "The web console (its page; no data).",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "text/html", text.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/console.js",
            summary: "The console's script.",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "text/javascript", text.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/console.css",
            summary: "The console's styles.",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "text/css", text.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/openapi.json",
            summary: "This document.",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/healthz",
            summary: "The process is up.",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "text/plain", text.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/readyz",
            summary: "The ledger can be read (503 if not); checked at most once per ready_cache_ms.",
            access: Public,
            query: vec![],
            body: Body::None,
            ok: (200, "text/plain", text.clone()),
            more: &[503],
        },
        Operation {
            method: "get",
            path: "/metrics",
            summary: "Metrics, Prometheus text format.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "text/plain", text.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/summary",
            summary: "Runs per status, oldest runnable and waiting ages, open approvals and unknown calls; computed at most once per summary_cache_ms.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/modules",
            summary: "Store a module: the raw bytes of a component or core module (at most module_bytes_max); other bytes are refused (400 bad_input).",
            access: Operator,
            query: vec![],
            body: Body::Module,
            ok: (201, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "get",
            path: "/api/runs",
            summary: "Runs, newest first, a page at a time.",
            access: Read,
            query: vec![
                query(
                    "status",
                    json!({"type": "string", "enum": statuses}),
                    "only runs in this status",
                ),
                query(
                    "module",
                    json!({"type": "string"}),
                    "only runs of this module digest",
                ),
                query(
                    "step",
                    json!({"type": "string"}),
                    "only runs of this step (name@version)",
                ),
                query(
                    "created_after_ms",
                    millis(),
                    "only runs created after this time",
                ),
                query(
                    "created_before_ms",
                    millis(),
                    "only runs created before this time",
                ),
                query(
                    "after",
                    json!({"type": "string"}),
                    "the previous page's `next`",
                ),
                query(
                    "limit",
                    unsigned(),
                    "runs in the page (default 50; at most runs_page_max, 1 at least)",
                ),
            ],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/runs",
            summary: "Submit a run for a worker; with `wait`, answer with the run as it ended, if it ends (or waits for a person or a timer, or is parked) within that many ms (at most the server's --wait-ms-max). A W3C `traceparent` header (and `tracestate`) puts the run in the caller's trace.",
            access: Operator,
            query: vec![query(
                "wait",
                unsigned(),
                "wait up to this many ms for the run's end",
            )],
            body: Body::Json(submit, true),
            ok: (201, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "post",
            path: "/api/runs/{run_id}/budget",
            summary: "Raise a run's own model budget (each bound given); a run parked over its budget is due again; one that has ended is refused (409 run_ended).",
            access: Operator,
            query: vec![],
            body: Body::Json(raise, true),
            ok: (200, "application/json", any_object.clone()),
            more: &[404, 409],
        },
        Operation {
            method: "post",
            path: "/api/runs/{run_id}/cancel",
            summary: "Cancel a run and every run below it, in one transaction: each begins nothing more (a write in flight is still settled, an unknown outcome still waits for a person) and ends `cancelled`; the server's worker ends those pending or waiting at once, one held stops at its next call. Answers the runs marked now, top down; one that has ended is refused (409 run_ended).",
            access: Operator,
            query: vec![],
            body: Body::Json(cancel, true),
            ok: (200, "application/json", any_object.clone()),
            more: &[404, 409],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}/tree",
            summary: "A run and the child runs below it: each one's status, the join set it was started in and its place among its parent's children's ends, what it waits for, what its model calls spent (stephost tree).",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}",
            summary: "A run's row, log and notifications.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}/calls",
            summary: "A page of a run's timeline; bodies cut at timeline_body_bytes_max (see the call's own page).",
            access: Read,
            query: vec![
                query("from_seq", seq(), "the first call (default 1)"),
                query(
                    "limit",
                    unsigned(),
                    "calls in the page (default 100; at most calls_page_max, 1 at least)",
                ),
            ],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}/calls/{seq}",
            summary: "One call, whole, with its attempts.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}/export",
            summary: "The run as a portable fixture (stephost export).",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "get",
            path: "/api/runs/{run_id}/verify",
            summary: "Check the run's chain and seal.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "post",
            path: "/api/runs/{run_id}/replay",
            summary: "Replay offline against the recorded build, or another given by module_digest or module_base64.",
            access: Operator,
            query: vec![],
            body: Body::Json(replay, false),
            ok: (200, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "post",
            path: "/api/runs/{run_id}/fork",
            summary: "Fork a run from a call (stephost fork): a new run, pending for a worker, keeping the calls before `at` with their outcomes and operation ids, pinned to the build given (default the run's own), which must make those calls (else 409 diverged, naming the call); a kept call whose outcome is in doubt, or a child or promise the kept calls do not join or wait for, is refused (409 fork_refused). The run is unchanged and lists its forks.",
            access: Operator,
            query: vec![],
            body: Body::Json(fork, true),
            ok: (201, "application/json", json!({"type": "object"})),
            more: &[409],
        },
        Operation {
            method: "get",
            path: "/api/approvals",
            summary: "Approvals waiting, with their details and the details' sha256.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_array.clone()),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/approvals/{run_id}/{seq}",
            summary: "Approve or reject a waiting approval.",
            access: Operator,
            query: vec![],
            body: Body::Json(decide, true),
            ok: (200, "application/json", any_object.clone()),
            more: &[409],
        },
        Operation {
            method: "get",
            path: "/api/unknown",
            summary: "Calls whose outcome is unknown, with what the receiver was sent.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", any_array),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/unknown/{run_id}/{seq}",
            summary: "Resolve a call whose outcome is unknown: succeeded with the receipt, or failed with a message.",
            access: Operator,
            query: vec![],
            body: Body::Json(resolve, true),
            ok: (200, "application/json", any_object),
            more: &[409],
        },
        Operation {
            method: "get",
            path: "/api/promises",
            summary: "Runs waiting for a promise, oldest first: the run, the wait's call, the promise's id and name, since when, and when it expires (never its token).",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", json!({"type": "array"})),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/promises/{token}",
            summary: "Complete a promise a run waits for: resolve it with a JSON value or reject it with a message (and who, as `by`; `webhook` if not given). The token the run handed out is the authorization: no bearer token is needed. The first completion stands; the same one again answers `again`, another is refused (409 promise_completed), as is one after the promise expired (409 promise_expired). A token the operator's key did not make (or any, on a server without the key) is 404. At most promise_completions_per_second_max a second across the server (429).",
            access: Public,
            query: vec![],
            body: Body::Json(complete, true),
            ok: (200, "application/json", json!({"type": "object"})),
            more: &[409, 429, 500, 503],
        },
        Operation {
            method: "get",
            path: "/api/schedules",
            summary: "The schedules, by name: cron, time zone, the build and input each firing runs, overlap, catch-up window, whether paused, the next slot and the last firing's run.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", json!({"type": "array"})),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/schedules",
            summary: "Add a schedule (stephost schedule add): each slot its cron expression names starts one run of the build, with the id NAME@SLOT, fired once by whichever worker looks first; slots missed by more than catch_up_ms are skipped. A name in use is refused (409 schedule_exists).",
            access: Operator,
            query: vec![],
            body: Body::Json(schedule, true),
            ok: (201, "application/json", json!({"type": "object"})),
            more: &[409],
        },
        Operation {
            method: "delete",
            path: "/api/schedules/{name}",
            summary: "Remove a schedule; the runs it fired stay.",
            access: Operator,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", json!({"type": "object"})),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/schedules/{name}/pause",
            summary: "Pause a schedule: it fires nothing until resumed.",
            access: Operator,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", json!({"type": "object"})),
            more: &[],
        },
        Operation {
            method: "post",
            path: "/api/schedules/{name}/resume",
            summary: "Resume a paused schedule from its next slot (the slots that came while it was paused are not caught up).",
            access: Operator,
            query: vec![],
            body: Body::None,
            ok: (200, "application/json", json!({"type": "object"})),
            more: &[],
        },
        Operation {
            method: "get",
            path: "/api/events",
            summary: "Server-sent events: `runs`, the runs that changed; `model`, a model's answer while it streams in to the server's worker, each event the text that came since the one before (run_id, seq, offset: where the text begins in the answer, in characters; text), or what its call waits for (run_id, seq, waiting). A token holds at most event_streams_per_token_max streams open at once.",
            access: Read,
            query: vec![],
            body: Body::None,
            ok: (200, "text/event-stream", text),
            more: &[429],
        },
    ]
}

/// The document.
pub fn openapi() -> Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    let mut paths = serde_json::Map::new();
    for op in operations() {
        let mut parameters: Vec<Value> = op
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| {
                let schema = match name {
                    "seq" => seq(),
                    _ => json!({"type": "string"}),
                };
                json!({"name": name, "in": "path", "required": true, "schema": schema})
            })
            .collect();
        let has_path = !parameters.is_empty();
        parameters.extend(op.query.iter().cloned());
        // Every route may refuse a request as a browser could be tricked
        // into sending it (403).
        let mut errors: Vec<u16> = vec![403];
        if op.access != Access::Public {
            errors.extend([400, 401, 500, 503]);
        }
        if has_path {
            errors.extend([400, 404]);
        }
        match &op.body {
            Body::None => {}
            Body::Module | Body::Json(..) => errors.extend([400, 404, 413]),
        }
        errors.extend(op.more);
        errors.sort_unstable();
        errors.dedup();
        let mut responses = serde_json::Map::new();
        let (status, content_type, schema) = &op.ok;
        responses.insert(
            status.to_string(),
            json!({"description": "OK", "content": {*content_type: {"schema": schema}}}),
        );
        for status in errors {
            responses.insert(
                status.to_string(),
                json!({"description": error_codes(status),
                       "content": {"application/json": {"schema": error}}}),
            );
        }
        let mut operation = json!({
            "summary": op.summary,
            "parameters": parameters,
            "security": match op.access {
                Access::Public => json!([]),
                _ => json!([{"bearer": []}]),
            },
            "responses": responses,
        });
        if op.access == Access::Operator {
            operation["description"] = json!("Needs a token with the operator role.");
        }
        match op.body {
            Body::None => {}
            Body::Module => {
                operation["requestBody"] = json!({
                    "required": true,
                    "content": {"application/octet-stream": {"schema": {
                        "type": "string", "format": "binary",
                        "description": "a WebAssembly component or core module; other bytes are refused with 400 bad_input",
                    }}},
                });
            }
            Body::Json(schema, required) => {
                operation["requestBody"] = json!({
                    "required": required,
                    "content": {"application/json": {"schema": schema}},
                });
            }
        }
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}));
        entry[op.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "stephost",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Durable, sandboxed agent steps: runs, their call timelines, approvals and calls whose outcome is unknown. Bodies are the CLI's --json shapes."
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["code", "message", "fix"],
                    "properties": {
                        "code": {"type": "string", "enum": ["bad_input", "unauthorized", "forbidden", "not_found", "method_not_allowed", "unknown_run", "unknown_module", "not_decidable", "run_exists", "run_ended", "conflict", "diverged", "integrity", "too_large", "too_many_streams", "too_many_completions", "promise_expired", "promise_completed", "unknown_schedule", "schedule_exists", "fork_refused", "unavailable", "internal"]},
                        "message": {"type": "string"},
                        "fix": {"type": "string"}
                    }
                }
            }
        }
    })
}

pub async fn document() -> Json<Value> {
    Json(openapi())
}

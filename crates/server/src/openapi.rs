//! `GET /openapi.json`: the API described as OpenAPI 3.1. An end-to-end
//! test checks that every path and method it lists is served.

use axum::Json;
use serde_json::{Value, json};

/// Every path and method the API serves, as the document lists them.
pub const OPERATIONS: &[(&str, &str, &str)] = &[
    ("get", "/", "The web console (its page; no data)."),
    ("get", "/openapi.json", "This document."),
    ("get", "/healthz", "The process is up."),
    ("get", "/readyz", "The ledger can be read (503 if not)."),
    ("get", "/metrics", "Metrics, Prometheus text format."),
    (
        "get",
        "/api/summary",
        "Runs per status, oldest runnable and waiting ages, open approvals and unknown calls.",
    ),
    (
        "post",
        "/api/modules",
        "Store a module (raw bytes of a component or core module); operator.",
    ),
    (
        "get",
        "/api/runs",
        "Runs, newest first: filters status, module, step, created_after_ms, created_before_ms; pages by after and limit.",
    ),
    (
        "post",
        "/api/runs",
        "Submit a run: module_digest or module_base64, input, run_id; operator.",
    ),
    (
        "get",
        "/api/runs/{run_id}",
        "A run's row, log and notifications.",
    ),
    (
        "get",
        "/api/runs/{run_id}/calls",
        "A page of a run's timeline: from_seq, limit; bodies cut (see the call's own page).",
    ),
    (
        "get",
        "/api/runs/{run_id}/calls/{seq}",
        "One call, whole, with its attempts.",
    ),
    (
        "get",
        "/api/runs/{run_id}/export",
        "The run as a portable fixture (stephost export).",
    ),
    (
        "get",
        "/api/runs/{run_id}/verify",
        "Check the run's chain and seal.",
    ),
    (
        "post",
        "/api/runs/{run_id}/replay",
        "Replay offline against the recorded build or module_digest/module_base64; operator.",
    ),
    (
        "get",
        "/api/approvals",
        "Approvals waiting, with their details and the details' sha256.",
    ),
    (
        "post",
        "/api/approvals/{run_id}/{seq}",
        "Approve or reject: verdict, details_sha256 (as shown), note, by; operator.",
    ),
    (
        "get",
        "/api/unknown",
        "Calls whose outcome is unknown, with what the receiver was sent.",
    ),
    (
        "post",
        "/api/unknown/{run_id}/{seq}",
        "Resolve: outcome succeeded with response, or failed with message; by; operator.",
    ),
    (
        "get",
        "/api/events",
        "Server-sent events: `runs`, the runs that changed.",
    ),
];

pub async fn document() -> Json<Value> {
    let error = json!({"$ref": "#/components/schemas/Error"});
    let mut paths = serde_json::Map::new();
    for (method, path, summary) in OPERATIONS {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| {
                json!({"name": name, "in": "path", "required": true,
                       "schema": {"type": if name == "seq" { "integer" } else { "string" }}})
            })
            .collect();
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = json!({
            "summary": summary,
            "parameters": params,
            "security": [{"bearer": []}],
            "responses": {
                "200": {"description": "OK (201 for a submission or upload)"},
                "400": {"description": "bad_input", "content": {"application/json": {"schema": error}}},
                "401": {"description": "unauthorized", "content": {"application/json": {"schema": error}}},
                "403": {"description": "forbidden (a read-only token)", "content": {"application/json": {"schema": error}}},
                "404": {"description": "unknown_run, unknown_module, not_found", "content": {"application/json": {"schema": error}}},
                "405": {"description": "method_not_allowed", "content": {"application/json": {"schema": error}}},
                "409": {"description": "not_decidable, run_exists, conflict, diverged, integrity", "content": {"application/json": {"schema": error}}},
                "503": {"description": "unavailable", "content": {"application/json": {"schema": error}}},
            }
        });
    }
    Json(json!({
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
                        "code": {"type": "string", "enum": ["bad_input", "unauthorized", "forbidden", "not_found", "method_not_allowed", "unknown_run", "unknown_module", "not_decidable", "run_exists", "conflict", "diverged", "integrity", "unavailable", "internal"]},
                        "message": {"type": "string"},
                        "fix": {"type": "string"}
                    }
                }
            }
        }
    }))
}

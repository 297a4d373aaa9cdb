"""The API's contract test's own check (see schemathesis.toml).

A module is sent as bytes (`POST /api/modules`) or as base64 of them
(`module_base64` in `POST /api/runs`, a replay's, a fork's and a schedule's
body). Whether bytes are a WebAssembly module no schema can say, nor whether
a schedule's cron expression, time zone or step is one, so schema-valid
bodies of those operations may be refused with 400 `bad_input`
(schemathesis.toml lets positive_data_acceptance expect it there). This
check holds that 400 to those reasons: any other 400 to schema-valid data of
those operations fails.
"""

import schemathesis

# The operations that take a module: its raw bytes, or base64 of them.
MODULE_OPERATIONS = {
    ("POST", "/api/modules"),
    ("POST", "/api/runs"),
    ("POST", "/api/runs/{run_id}/replay"),
    ("POST", "/api/runs/{run_id}/fork"),
    ("POST", "/api/schedules"),
}

# What else a schedule's schema cannot say (host/core/src/schedules.rs,
# host/runtime/src/schedules.rs): whether its cron expression and time zone
# are ones, and whether the ledger has run the step it names.
SCHEDULE_REFUSALS = (
    "cron expression",
    "is not an IANA time zone name",
    "is in the ledger, so no build of it is known here",
)

# How the server refuses bytes that are not a step module (the loader's
# errors, host/runtime/src/engine.rs `ModuleError`).
MODULE_REFUSALS = (
    "is not a WebAssembly module",
    "is not a valid component",
    "is a core WebAssembly module",
    "is a core module that could not be adapted",
    "is a component for another world",
)


@schemathesis.check
def schema_valid_data_is_refused_only_for_its_module(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code != 400 or (case.method.upper(), case.path) not in MODULE_OPERATIONS:
        return None
    try:
        error = response.json()
    except ValueError:
        error = None
    message = error.get("message", "") if isinstance(error, dict) else ""
    refusals = MODULE_REFUSALS
    if case.path == "/api/schedules":
        refusals = MODULE_REFUSALS + SCHEDULE_REFUSALS
    if not isinstance(error, dict) or error.get("code") != "bad_input" or not any(
        refusal in message for refusal in refusals
    ):
        raise AssertionError(
            "schema-valid data was refused with 400 for another reason than its module's "
            f"bytes: {response.text}"
        )
    return None

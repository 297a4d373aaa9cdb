/*
 * stephost_step.h - write stephost steps in C.
 *
 * A step is a function from a JSON input to a JSON output that reaches the
 * world only through the host: effects, the model, the clock, randomness,
 * timers, approvals and the log. The host records each of these calls in its
 * ledger; a resumed or replayed run gets the recorded results back. So:
 *
 *   - take time and randomness ONLY from stephost_now_ns(),
 *     stephost_random_bytes() and stephost_random_u64(), never from time(),
 *     clock_gettime(), getentropy(), rand() or anything seeded from them;
 *   - make the same calls, with the same requests, in the same order for the
 *     same input (replay checks this and reports a divergence otherwise).
 *
 * A step defines stephost_step_run() (below); this helper exports it as the
 * world's `run` and hides the generated bindings (wit-bindgen c).
 *
 * String ownership, everywhere in this header:
 *   - `const char *` parameters are borrowed: the helper copies what it needs
 *     and never keeps or frees them.
 *   - `char **` out-parameters receive a NUL-terminated string allocated with
 *     malloc() that the CALLER owns and must free() (or, for
 *     stephost_step_run, hand back to the helper, which frees it). An
 *     out-parameter not set by a call is set to NULL, so free() is always safe.
 *   - stephost_decision fields are owned by the decision: release them with
 *     stephost_decision_free().
 * Texts crossing the host boundary are UTF-8 (the host rejects anything
 * else); a string with an embedded NUL is cut there.
 */
#ifndef STEPHOST_STEP_H
#define STEPHOST_STEP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ run */

/*
 * Defined by the step. `input` is the run's JSON input (NUL-terminated,
 * `input_len` bytes, borrowed for the duration of the call).
 * Return 0 and set *output to a malloc'd JSON document, or return non-zero
 * and set *error to a malloc'd message for the person reading the run. The
 * helper takes ownership of both and frees them; a NULL output or error string is
 * reported as "out of memory".
 */
int stephost_step_run(const char *input, size_t input_len, char **output, char **error);

/*
 * Declares the step's name and version ("name@version") in the
 * `stephost-step` custom section, which the host pins runs to. Use it once,
 * at file scope, with string literals (no quotes or backslashes in them):
 *
 *     STEPHOST_STEP_ID("c-supplier-order", "0.1.0");
 */
#if defined(__wasm__)
#define STEPHOST_STEP_ID(name, version)                             \
    __asm__(".section \".custom_section.stephost-step\",\"\",@\n" \
            ".ascii \"" name "@" version "\"\n"                      \
            ".text\n")
#else /* a native build (tests with a mocked host): nothing to declare */
#define STEPHOST_STEP_ID(name, version) _Static_assert(sizeof(name "@" version) > 1, "step id")
#endif

/* --------------------------------------------------------------- errors */

/* Why a call did not give a usable result. The first four are the host's
 * `call-error` kinds (it has already retried what was retryable); ENCODE and
 * DECODE are raised in the step when a request or response is not the JSON
 * expected. */
typedef enum stephost_error_kind {
    STEPHOST_OK = 0,
    /* The receiver refused the request; retrying it will not help. */
    STEPHOST_REJECTED,
    /* The effect is not granted to this step by the host configuration. */
    STEPHOST_DENIED,
    /* The effect failed in a retryable way and the retries are used up. */
    STEPHOST_EXHAUSTED,
    /* The host found the request malformed (not JSON, too large, ...). */
    STEPHOST_INVALID,
    /* The request could not be encoded; it was not sent. */
    STEPHOST_ENCODE,
    /* The response did not decode into what the step expected. */
    STEPHOST_DECODE,
} stephost_error_kind;

/* "rejected", "denied", "exhausted", "invalid", "encode", "decode" ("ok"). */
const char *stephost_error_kind_name(stephost_error_kind kind);

/*
 * The error as the Rust SDK words it, malloc'd (caller frees), e.g.
 *   effect `supplier.order` rejected the request: out of stock
 * Returning this as the step's error gives the same message as `?` in Rust.
 */
char *stephost_error_text(stephost_error_kind kind, const char *effect, const char *message);

/* A malloc'd, printf-formatted string (caller frees); NULL on failure. */
char *stephost_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* -------------------------------------------------------------- effects */

/*
 * Calls the effect `name` with the JSON `request_json`. `key` is an optional
 * business key (NULL for none): with one, a write's operation id is derived
 * from (run, effect, key) instead of the call's sequence number, so the same
 * business operation keeps its identity even if the code around it changes.
 *
 * On STEPHOST_OK, *response is the effect's JSON response and *error NULL.
 * Otherwise *response is NULL and *error the host's message (the kind says
 * which). Both are malloc'd; the caller frees them. The response is not
 * parsed: use stephost_json.h (a response that does not parse is, by the
 * SDK's convention, a STEPHOST_DECODE error of the step's making).
 */
stephost_error_kind stephost_effect(const char *name, const char *request_json, const char *key,
                                    char **response, char **error);

/* A chat completion from the configured model: `request_json` is an
 * OpenAI-style body without `model`. Same contract as stephost_effect(); the
 * effect name for error texts is "llm". */
stephost_error_kind stephost_llm(const char *request_json, char **response, char **error);

/* ------------------------------------------------------ clock and random */

/* Wall-clock time in nanoseconds since the Unix epoch, as recorded. */
uint64_t stephost_now_ns(void);

/* Fills out[0..len) with recorded random bytes; returns how many were
 * written, which is less than `len` only if the host capped the request at
 * its payload limit. */
size_t stephost_random_bytes(uint8_t *out, uint32_t len);

/* A recorded random 64-bit number. */
uint64_t stephost_random_u64(void);

/* ---------------------------------------------------------------- timers */

/* Sleeps durably for `ms` milliseconds of wall time (a replay returns at
 * once; a long sleep takes the run out of memory until it is due). */
void stephost_sleep_ms(uint64_t ms);

/* ------------------------------------------------------------- approvals */

typedef enum stephost_verdict {
    STEPHOST_VERDICT_APPROVED,
    STEPHOST_VERDICT_REJECTED,
    /* Nobody decided before the approval's time to live ran out. */
    STEPHOST_VERDICT_EXPIRED,
} stephost_verdict;

/* "Approved", "Rejected", "Expired" (as Rust's Debug prints them). */
const char *stephost_verdict_name(stephost_verdict verdict);

typedef struct stephost_decision {
    stephost_verdict verdict;
    char *by;   /* who decided; "" when expired; owned by the decision */
    char *note; /* NULL when none; owned by the decision */
    uint64_t at_ms; /* when, in ms since the Unix epoch */
} stephost_decision;

/*
 * Asks a person to approve `subject`; `details_json` is the object approved
 * (the approval is tied to its hash). The run waits, out of memory, until
 * someone decides or `ttl_seconds` (at least 1) passes. Re-check the business
 * precondition after an approval before acting on it.
 *
 * On STEPHOST_OK, *decision is filled (free with stephost_decision_free())
 * and *error NULL; otherwise *decision is zeroed and *error is the host's
 * malloc'd message.
 */
stephost_error_kind stephost_approval(const char *subject, const char *details_json,
                                      uint64_t ttl_seconds, stephost_decision *decision,
                                      char **error);
void stephost_decision_free(stephost_decision *decision);

/* ------------------------------------------------------------------ log */

/* Log lines are not ledger calls: a replay re-emits them harmlessly. */
typedef enum stephost_level {
    STEPHOST_TRACE,
    STEPHOST_DEBUG,
    STEPHOST_INFO,
    STEPHOST_WARN,
    STEPHOST_ERROR,
} stephost_level;

void stephost_log(stephost_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void stephost_vlog(stephost_level level, const char *fmt, va_list ap);
#define stephost_log_trace(...) stephost_log(STEPHOST_TRACE, __VA_ARGS__)
#define stephost_log_debug(...) stephost_log(STEPHOST_DEBUG, __VA_ARGS__)
#define stephost_log_info(...) stephost_log(STEPHOST_INFO, __VA_ARGS__)
#define stephost_log_warn(...) stephost_log(STEPHOST_WARN, __VA_ARGS__)
#define stephost_log_error(...) stephost_log(STEPHOST_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif

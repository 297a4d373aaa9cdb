/*
 * stephost_step.c - see stephost_step.h.
 *
 * Built together with the bindings `wit-bindgen c wit --world step`
 * generates (step.h, step.c, step_component_type.o), which must be on the
 * include path.
 */
#include "stephost_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step.h"

/* A borrowed view of a C string, as the bindings take their arguments. */
static step_string_t view(const char *s) {
    step_string_t out = {(uint8_t *)s, s ? strlen(s) : 0};
    return out;
}

/* Turns a string the bindings returned (allocated with cabi_realloc, not
 * NUL-terminated, a dangling pointer when empty) into a malloc'd C string. */
static char *take(step_string_t *s) {
    char *out;
    if (s->len == 0) {
        out = calloc(1, 1);
    } else {
        out = realloc(s->ptr, s->len + 1);
        if (out) out[s->len] = '\0';
        else free(s->ptr);
    }
    s->ptr = NULL;
    s->len = 0;
    if (!out) abort(); /* as the bindings do when the host's allocation fails */
    return out;
}

static stephost_error_kind call_error(stephost_step_types_call_error_t *e, char **error) {
    /* Every case carries a string at the same place in the union. */
    *error = take(&e->val.rejected);
    switch (e->tag) {
    case STEPHOST_STEP_TYPES_CALL_ERROR_REJECTED: return STEPHOST_REJECTED;
    case STEPHOST_STEP_TYPES_CALL_ERROR_DENIED: return STEPHOST_DENIED;
    case STEPHOST_STEP_TYPES_CALL_ERROR_EXHAUSTED: return STEPHOST_EXHAUSTED;
    default: return STEPHOST_INVALID;
    }
}

/* ------------------------------------------------------------------ run */

/* The world's `run`: owns `input`; `ret`/`err` are freed by the bindings'
 * post-return function (when not empty). */
bool exports_step_run(step_string_t *input, step_string_t *ret, step_string_t *err) {
    size_t len = input->len;
    char *text = take(input);
    char *output = NULL, *error = NULL;
    int rc = stephost_step_run(text, len, &output, &error);
    free(text);
    if (rc == 0) {
        free(error);
        if (!output) {
            step_string_set(err, "out of memory");
            return false;
        }
        *ret = (step_string_t){(uint8_t *)output, strlen(output)};
        if (ret->len == 0) { /* empty: nothing for post-return to free */
            free(output);
            step_string_set(ret, "");
        }
        return true;
    }
    free(output);
    if (!error) error = strdup("the step failed");
    if (!error) {
        step_string_set(err, "out of memory");
        return false;
    }
    *err = (step_string_t){(uint8_t *)error, strlen(error)};
    if (err->len == 0) {
        free(error);
        step_string_set(err, "");
    }
    return false;
}

/* --------------------------------------------------------------- errors */

const char *stephost_error_kind_name(stephost_error_kind kind) {
    switch (kind) {
    case STEPHOST_OK: return "ok";
    case STEPHOST_REJECTED: return "rejected";
    case STEPHOST_DENIED: return "denied";
    case STEPHOST_EXHAUSTED: return "exhausted";
    case STEPHOST_INVALID: return "invalid";
    case STEPHOST_ENCODE: return "encode";
    case STEPHOST_DECODE: return "decode";
    }
    return "?";
}

char *stephost_error_text(stephost_error_kind kind, const char *effect, const char *message) {
    const char *what;
    switch (kind) {
    case STEPHOST_REJECTED: what = "rejected the request"; break;
    case STEPHOST_DENIED: what = "is denied"; break;
    case STEPHOST_EXHAUSTED: what = "failed and its retries are used up"; break;
    case STEPHOST_INVALID: what = "got an invalid request"; break;
    case STEPHOST_ENCODE: what = "request could not be encoded as JSON"; break;
    case STEPHOST_DECODE: what = "response did not decode"; break;
    default: what = "succeeded"; break;
    }
    return stephost_format("effect `%s` %s: %s", effect ? effect : "", what, message ? message : "");
}

static char *vformat(const char *fmt, va_list ap) {
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) return NULL;
    char *out = malloc((size_t)n + 1);
    if (out) vsnprintf(out, (size_t)n + 1, fmt, ap);
    return out;
}

char *stephost_format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *out = vformat(fmt, ap);
    va_end(ap);
    return out;
}

/* -------------------------------------------------------------- effects */

stephost_error_kind stephost_effect(const char *name, const char *request_json, const char *key,
                                    char **response, char **error) {
    step_string_t n = view(name), req = view(request_json), k = view(key), ok;
    stephost_step_effects_call_error_t e;
    *response = NULL;
    *error = NULL;
    if (stephost_step_effects_call(&n, &req, key ? &k : NULL, &ok, &e)) {
        *response = take(&ok);
        return STEPHOST_OK;
    }
    return call_error(&e, error);
}

stephost_error_kind stephost_llm(const char *request_json, char **response, char **error) {
    step_string_t req = view(request_json), ok;
    stephost_step_llm_call_error_t e;
    *response = NULL;
    *error = NULL;
    if (stephost_step_llm_complete(&req, &ok, &e)) {
        *response = take(&ok);
        return STEPHOST_OK;
    }
    return call_error(&e, error);
}

/* ------------------------------------------------------ clock and random */

uint64_t stephost_now_ns(void) { return stephost_step_clock_now(); }

size_t stephost_random_bytes(uint8_t *out, uint32_t len) {
    step_list_u8_t bytes;
    stephost_step_random_get_bytes(len, &bytes);
    size_t n = bytes.len < len ? bytes.len : len;
    if (n) memcpy(out, bytes.ptr, n);
    step_list_u8_free(&bytes);
    return n;
}

uint64_t stephost_random_u64(void) { return stephost_step_random_get_u64(); }

/* ---------------------------------------------------------------- timers */

void stephost_sleep_ms(uint64_t ms) { stephost_step_timers_sleep(ms); }

/* ------------------------------------------------------------- approvals */

const char *stephost_verdict_name(stephost_verdict verdict) {
    switch (verdict) {
    case STEPHOST_VERDICT_APPROVED: return "Approved";
    case STEPHOST_VERDICT_REJECTED: return "Rejected";
    case STEPHOST_VERDICT_EXPIRED: return "Expired";
    }
    return "?";
}

stephost_error_kind stephost_approval(const char *subject, const char *details_json,
                                      uint64_t ttl_seconds, stephost_decision *decision,
                                      char **error) {
    step_string_t s = view(subject), d = view(details_json);
    stephost_step_approvals_decision_t ok;
    stephost_step_approvals_call_error_t e;
    memset(decision, 0, sizeof *decision);
    *error = NULL;
    if (!stephost_step_approvals_request(&s, &d, ttl_seconds ? ttl_seconds : 1, &ok, &e))
        return call_error(&e, error);
    switch (ok.verdict) {
    case STEPHOST_STEP_APPROVALS_VERDICT_APPROVED: decision->verdict = STEPHOST_VERDICT_APPROVED; break;
    case STEPHOST_STEP_APPROVALS_VERDICT_REJECTED: decision->verdict = STEPHOST_VERDICT_REJECTED; break;
    default: decision->verdict = STEPHOST_VERDICT_EXPIRED; break;
    }
    decision->by = take(&ok.by);
    decision->note = ok.note.is_some ? take(&ok.note.val) : NULL;
    decision->at_ms = ok.at_ms;
    return STEPHOST_OK;
}

void stephost_decision_free(stephost_decision *decision) {
    free(decision->by);
    free(decision->note);
    decision->by = NULL;
    decision->note = NULL;
}

/* ------------------------------------------------------------------ log */

void stephost_vlog(stephost_level level, const char *fmt, va_list ap) {
    char *line = vformat(fmt, ap);
    step_string_t msg = view(line ? line : fmt);
    stephost_step_log_emit((stephost_step_log_level_t)level, &msg);
    free(line);
}

void stephost_log(stephost_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    stephost_vlog(level, fmt, ap);
    va_end(ap);
}

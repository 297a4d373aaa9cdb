/*
 * Example step in C: orders missing stock from a supplier.
 *
 * The same step as the Rust example examples/supplier-order (same calls in
 * the same order, same requests, same log lines, same errors and output):
 *
 * Input `{"sku": "WIDGET-7", "quantity": 10}` (optionally
 * `"approval_ttl_seconds": N`). The step reads the stock of `sku` through the
 * `inventory.read` effect, and when `quantity` is more than what is on hand
 * it orders the shortage through `supplier.order` with the business key
 * `order:{sku}:{quantity}`.
 *
 * Output `{"sku", "on_hand", "shortage", "ordered", "receipt"}` where
 * `receipt` is the supplier's JSON response, embedded verbatim, or null.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "stephost_json.h"
#include "stephost_step.h"

STEPHOST_STEP_ID("c-supplier-order", "0.1.0");

/* Sets *error to a message and returns 1 (for `return fail(...)`). */
#define FAIL(...) (*error = stephost_format(__VA_ARGS__), 1)

typedef struct input {
    const char *sku; /* borrowed from the parsed input */
    int64_t quantity;
    bool has_ttl;
    uint64_t ttl_seconds;
} input;

/* How serde_json names an unexpected value in its messages. */
static char *unexpected(const sj_value *v) {
    switch (v->type) {
    case SJ_NULL: return stephost_format("unit value");
    case SJ_BOOL: return stephost_format("boolean `%s`", v->boolean ? "true" : "false");
    case SJ_NUMBER: {
        int64_t i;
        uint64_t u;
        bool integer = sj_as_i64(v, &i) || sj_as_u64(v, &u);
        return stephost_format("%s `%.*s`", integer ? "integer" : "floating point", (int)v->raw_len,
                               v->raw);
    }
    case SJ_STRING: return stephost_format("string %.*s", (int)v->raw_len, v->raw);
    case SJ_ARRAY: return stephost_format("sequence");
    case SJ_OBJECT: return stephost_format("map");
    }
    return NULL;
}

/* "invalid input: invalid type: <what v is>, expected <expected>". */
static char *invalid_type(const sj_value *v, const char *expected) {
    char *what = unexpected(v);
    char *out = stephost_format("invalid input: invalid type: %s, expected %s", what ? what : "?",
                                expected);
    free(what);
    return out;
}

/* Decodes the input as the Rust step's serde type does: `sku` a string,
 * `quantity` an i64, optional `approval_ttl_seconds` a u64 or null; other
 * fields are ignored. Returns NULL or a malloc'd message. */
static char *decode_input(const sj_value *doc, input *in) {
    /* (serde would also take the struct as a sequence; this does not) */
    if (doc->type != SJ_OBJECT) return invalid_type(doc, "struct Input");
    const sj_value *sku = sj_get(doc, "sku");
    const sj_value *quantity = sj_get(doc, "quantity");
    const sj_value *ttl = sj_get(doc, "approval_ttl_seconds");
    if (sku && sku->type != SJ_STRING) return invalid_type(sku, "a string");
    if (quantity && !sj_as_i64(quantity, &in->quantity)) return invalid_type(quantity, "i64");
    in->has_ttl = ttl && ttl->type != SJ_NULL;
    if (in->has_ttl && !sj_as_u64(ttl, &in->ttl_seconds)) return invalid_type(ttl, "u64");
    if (!sku) return stephost_format("invalid input: missing field `sku`");
    if (!quantity) return stephost_format("invalid input: missing field `quantity`");
    in->sku = sku->string;
    return NULL;
}

/* `inventory.read` for `sku`: on_hand, or an error message (returns 1). */
static int read_stock(const char *sku, int64_t *on_hand, char **error) {
    sj_buf req = SJ_BUF_INIT;
    sj_cstr(&req, "{");
    sj_key(&req, "sku");
    sj_cstring(&req, sku);
    sj_cstr(&req, "}");
    char *request = sj_buf_take(&req);
    if (!request) return FAIL("out of memory");

    char *response, *message;
    stephost_error_kind kind = stephost_effect("inventory.read", request, NULL, &response, &message);
    free(request);
    if (kind != STEPHOST_OK) {
        *error = stephost_error_text(kind, "inventory.read", message);
        free(message);
        return 1;
    }
    char *perr;
    sj_value *stock = sj_parse(response, strlen(response), &perr);
    int rc = 0;
    if (!stock) {
        *error = stephost_error_text(STEPHOST_DECODE, "inventory.read", perr);
        free(perr);
        rc = 1;
    } else if (!sj_as_i64(sj_get(stock, "on_hand"), on_hand)) {
        *error = stephost_error_text(STEPHOST_DECODE, "inventory.read",
                                     sj_get(stock, "on_hand") ? "field `on_hand` is not an i64"
                                                              : "missing field `on_hand`");
        rc = 1;
    }
    sj_free(stock);
    free(response);
    return rc;
}

/* Rust's `{:?}` of a string: quoted, with \" \\ \n \r \t and \u{..} escapes. */
static char *debug_string(const char *s) {
    sj_buf b = SJ_BUF_INIT;
    sj_cstr(&b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"') sj_cstr(&b, "\\\"");
        else if (c == '\\') sj_cstr(&b, "\\\\");
        else if (c == '\n') sj_cstr(&b, "\\n");
        else if (c == '\r') sj_cstr(&b, "\\r");
        else if (c == '\t') sj_cstr(&b, "\\t");
        else if (c < 0x20 || c == 0x7f) sj_printf(&b, "\\u{%x}", c);
        else sj_raw(&b, (const char *)&c, 1);
    }
    sj_cstr(&b, "\"");
    return sj_buf_take(&b);
}

/* The approval branch: ask, and re-read the stock after a yes. */
static int approve_and_recheck(const input *in, uint64_t ttl, int64_t *on_hand, char **error) {
    /* Subject and details as the Rust step's format! and json! (whose keys
     * serde_json sorts) make them. */
    char *subject = stephost_format("order %" PRId64 " of %s",
                                    (int64_t)((uint64_t)in->quantity - (uint64_t)*on_hand), in->sku);
    sj_buf det = SJ_BUF_INIT;
    sj_cstr(&det, "{");
    sj_key(&det, "on_hand");
    sj_i64(&det, *on_hand);
    sj_key(&det, "quantity");
    sj_i64(&det, in->quantity);
    sj_key(&det, "sku");
    sj_cstring(&det, in->sku);
    sj_cstr(&det, "}");
    char *details = sj_buf_take(&det);
    if (!subject || !details) {
        free(subject);
        free(details);
        return FAIL("out of memory");
    }

    stephost_decision decision;
    char *message;
    stephost_error_kind kind = stephost_approval(subject, details, ttl, &decision, &message);
    free(subject);
    free(details);
    if (kind != STEPHOST_OK) {
        *error = stephost_error_text(kind, "approvals", message);
        free(message);
        return 1;
    }
    if (decision.verdict != STEPHOST_VERDICT_APPROVED) {
        char *by = debug_string(decision.by);
        *error = stephost_format("the order was not approved (%s by %s)",
                                 stephost_verdict_name(decision.verdict), by ? by : "?");
        free(by);
        stephost_decision_free(&decision);
        return 1;
    }
    stephost_decision_free(&decision);
    /* Re-check the precondition now, not when the approval was asked. */
    return read_stock(in->sku, on_hand, error);
}

/* Orders `shortage`; *receipt gets the supplier's response (malloc'd) and
 * *receipt_doc its parse, whose raw text is what goes into the output. */
static int order(const input *in, int64_t shortage, char **receipt, sj_value **receipt_doc,
                 char **error) {
    /* clock first, then random: the order of the recorded calls. */
    uint64_t requested_at_ms = stephost_now_ns() / 1000000u;
    uint8_t nonce[8];
    size_t got = stephost_random_bytes(nonce, sizeof nonce);
    char nonce_hex[2 * sizeof nonce + 1];
    for (size_t i = 0; i < got; i++) {
        static const char hex[] = "0123456789abcdef";
        nonce_hex[2 * i] = hex[nonce[i] >> 4];
        nonce_hex[2 * i + 1] = hex[nonce[i] & 15];
    }
    nonce_hex[2 * got] = '\0';

    sj_buf req = SJ_BUF_INIT;
    sj_cstr(&req, "{");
    sj_key(&req, "sku");
    sj_cstring(&req, in->sku);
    sj_key(&req, "quantity");
    sj_i64(&req, shortage);
    sj_key(&req, "requested_at_ms");
    sj_u64(&req, requested_at_ms);
    sj_key(&req, "request_nonce");
    sj_cstring(&req, nonce_hex);
    sj_cstr(&req, "}");
    char *request = sj_buf_take(&req);
    char *key = stephost_format("order:%s:%" PRId64, in->sku, in->quantity);
    if (!request || !key) {
        free(request);
        free(key);
        return FAIL("out of memory");
    }
    stephost_log_info("ordering %" PRId64 " of %s (key %s)", shortage, in->sku, key);

    char *message;
    stephost_error_kind kind = stephost_effect("supplier.order", request, key, receipt, &message);
    free(request);
    free(key);
    if (kind != STEPHOST_OK) {
        *error = stephost_error_text(kind, "supplier.order", message);
        free(message);
        return 1;
    }
    char *perr;
    *receipt_doc = sj_parse(*receipt, strlen(*receipt), &perr);
    if (!*receipt_doc) {
        *error = stephost_error_text(STEPHOST_DECODE, "supplier.order", perr);
        free(perr);
        return 1;
    }
    stephost_log_info("supplier accepted the order: %.*s", (int)(*receipt_doc)->raw_len,
                      (*receipt_doc)->raw);
    return 0;
}

static int run(const input *in, char **output, char **error) {
    if (in->sku[0] == '\0') return FAIL("sku must not be empty");
    if (in->quantity < 0) return FAIL("quantity must not be negative, got %" PRId64, in->quantity);

    int64_t on_hand;
    if (read_stock(in->sku, &on_hand, error)) return 1;
    if (in->has_ttl && in->quantity > on_hand &&
        approve_and_recheck(in, in->ttl_seconds, &on_hand, error))
        return 1;
    /* Wrapping, as the Rust step's release build does. */
    int64_t shortage = (int64_t)((uint64_t)in->quantity - (uint64_t)on_hand);
    stephost_log_info("%s: %" PRId64 " wanted, %" PRId64 " on hand", in->sku, in->quantity, on_hand);

    char *receipt = NULL;
    sj_value *receipt_doc = NULL;
    if (shortage > 0) {
        if (order(in, shortage, &receipt, &receipt_doc, error)) {
            sj_free(receipt_doc);
            free(receipt);
            return 1;
        }
    } else {
        stephost_log_info("enough stock, nothing to order");
    }

    sj_buf out = SJ_BUF_INIT;
    sj_cstr(&out, "{");
    sj_key(&out, "sku");
    sj_cstring(&out, in->sku);
    sj_key(&out, "on_hand");
    sj_i64(&out, on_hand);
    sj_key(&out, "shortage");
    sj_i64(&out, shortage > 0 ? shortage : 0);
    sj_key(&out, "ordered");
    sj_bool(&out, receipt_doc != NULL);
    sj_key(&out, "receipt");
    if (receipt_doc) sj_raw(&out, receipt_doc->raw, receipt_doc->raw_len); /* verbatim */
    else sj_null(&out);
    sj_cstr(&out, "}");
    sj_free(receipt_doc);
    free(receipt);
    *output = sj_buf_take(&out);
    return *output ? 0 : FAIL("out of memory");
}

int stephost_step_run(const char *text, size_t len, char **output, char **error) {
    char *perr;
    sj_value *doc = sj_parse(text, len, &perr);
    if (!doc) {
        *error = stephost_format("invalid input: %s", perr);
        free(perr);
        return 1;
    }
    input in;
    char *bad = decode_input(doc, &in);
    int rc;
    if (bad) {
        *error = bad;
        rc = 1;
    } else {
        rc = run(&in, output, error);
    }
    sj_free(doc);
    return rc;
}

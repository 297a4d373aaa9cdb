/*
 * stephost_json.h - a minimal JSON reader and writer for C steps.
 *
 * Reader: sj_parse() turns a JSON text (RFC 8259, strict: no comments, no
 * trailing commas, nesting at most SJ_MAX_DEPTH) into a tree of sj_value.
 * Every value remembers its exact text in the document (raw, raw_len), so a
 * sub-document can be passed on verbatim without re-encoding it.
 *
 * Writer: sj_buf is a growing, NUL-terminated byte buffer with helpers that
 * append JSON tokens; sj_key()/sj_item() insert the separating comma.
 *
 * Ownership:
 *   - sj_parse() returns a tree the caller frees with sj_free(). The tree
 *     BORROWS the text it was parsed from (raw points into it): keep the text
 *     alive while the tree is used. Decoded strings and keys are owned by the
 *     tree and freed with it.
 *   - On a parse error sj_parse() returns NULL and, when `error` is not NULL,
 *     stores a malloc'd message the caller frees with free().
 *   - sj_buf_take() hands the buffer's malloc'd text to the caller (free() it)
 *     and leaves the buffer empty; sj_buf_free() discards it instead.
 */
#ifndef STEPHOST_JSON_H
#define STEPHOST_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Deepest nesting of arrays and objects sj_parse() accepts (as serde_json). */
#define SJ_MAX_DEPTH 128

typedef enum sj_type {
    SJ_NULL,
    SJ_BOOL,
    SJ_NUMBER,
    SJ_STRING,
    SJ_ARRAY,
    SJ_OBJECT,
} sj_type;

typedef struct sj_value sj_value;
typedef struct sj_member sj_member;

struct sj_value {
    sj_type type;
    /* The value's text in the parsed document (not NUL-terminated). */
    const char *raw;
    size_t raw_len;
    /* SJ_BOOL */
    bool boolean;
    /* SJ_STRING: the decoded UTF-8 text, NUL-terminated; string_len counts
     * bytes and is the length to trust if the text contains "\u0000". */
    char *string;
    size_t string_len;
    /* SJ_ARRAY: count elements; SJ_OBJECT: count members, in document order. */
    size_t count;
    sj_value *elements;
    sj_member *members;
};

struct sj_member {
    char *key; /* decoded, NUL-terminated */
    size_t key_len;
    sj_value value;
};

/* Parses `len` bytes of `text` as one JSON document. */
sj_value *sj_parse(const char *text, size_t len, char **error);
void sj_free(sj_value *value);

/* "null", "boolean", "number", "string", "array" or "object". */
const char *sj_type_name(sj_type type);

/* The first member of `object` named `key`, or NULL (also when `object` is
 * NULL or not an object). */
const sj_value *sj_get(const sj_value *object, const char *key);

/* A number written as an integer (no fraction, no exponent) that fits:
 * true and *out set; otherwise false. */
bool sj_as_i64(const sj_value *value, int64_t *out);
bool sj_as_u64(const sj_value *value, uint64_t *out);

/* ---- writer ---- */

typedef struct sj_buf {
    char *data; /* NUL-terminated while not NULL */
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed: sj_buf_take() returns NULL */
} sj_buf;

#define SJ_BUF_INIT {NULL, 0, 0, false}

void sj_raw(sj_buf *buf, const char *bytes, size_t len);
void sj_cstr(sj_buf *buf, const char *text);
void sj_printf(sj_buf *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `len` bytes of UTF-8 as a JSON string, quoted and escaped as serde_json
 * does (", \, and control characters; nothing else). */
void sj_string(sj_buf *buf, const char *text, size_t len);
void sj_cstring(sj_buf *buf, const char *text);
void sj_i64(sj_buf *buf, int64_t n);
void sj_u64(sj_buf *buf, uint64_t n);
void sj_bool(sj_buf *buf, bool b);
void sj_null(sj_buf *buf);
/* A comma unless the buffer ends with '{' or '[', then "key": */
void sj_key(sj_buf *buf, const char *key);
/* A comma unless the buffer ends with '[' (before an array element). */
void sj_item(sj_buf *buf);

char *sj_buf_take(sj_buf *buf);
void sj_buf_free(sj_buf *buf);

#ifdef __cplusplus
}
#endif

#endif

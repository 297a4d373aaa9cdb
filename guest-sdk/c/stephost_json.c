/* stephost_json.c - see stephost_json.h. */
#include "stephost_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- reader */

typedef struct parser {
    const char *text;
    size_t len;
    size_t pos;
    int depth;
    const char *error; /* static message; position is pos */
} parser;

static bool fail(parser *p, const char *message) {
    if (!p->error) p->error = message;
    return false;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return fail(p, "expected value");
    p->pos += n;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool number(parser *p) {
    size_t i = p->pos;
    const char *t = p->text;
    if (i < p->len && t[i] == '-') i++;
    if (i >= p->len || !is_digit(t[i])) return fail(p, "invalid number");
    if (t[i] == '0') {
        i++;
    } else {
        while (i < p->len && is_digit(t[i])) i++;
    }
    if (i < p->len && t[i] == '.') {
        i++;
        if (i >= p->len || !is_digit(t[i])) { p->pos = i; return fail(p, "invalid number"); }
        while (i < p->len && is_digit(t[i])) i++;
    }
    if (i < p->len && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < p->len && (t[i] == '+' || t[i] == '-')) i++;
        if (i >= p->len || !is_digit(t[i])) { p->pos = i; return fail(p, "invalid number"); }
        while (i < p->len && is_digit(t[i])) i++;
    }
    p->pos = i;
    return true;
}

static int hex4(const char *s) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    return v;
}

static size_t put_utf8(char *out, unsigned long cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    unsigned long cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

/* Parses a string at p->pos (on the opening quote) into a malloc'd,
 * NUL-terminated buffer. Decoded text is never longer than the source. */
static bool string(parser *p, char **out, size_t *out_len) {
    const char *t = p->text;
    size_t i = p->pos + 1;
    size_t end = i;
    while (end < p->len && t[end] != '"') {
        if (t[end] == '\\') end++;
        end++;
    }
    if (end >= p->len) { p->pos = p->len; return fail(p, "EOF while parsing a string"); }
    char *buf = malloc(end - i + 1);
    if (!buf) return fail(p, "out of memory");
    size_t n = 0;
    while (i < end) {
        unsigned char c = (unsigned char)t[i];
        if (c < 0x20) { p->pos = i; free(buf); return fail(p, "control character in string"); }
        if (c != '\\') {
            size_t k = utf8_seq((const unsigned char *)t + i, end - i);
            if (k == 0) { p->pos = i; free(buf); return fail(p, "invalid UTF-8 in string"); }
            memcpy(buf + n, t + i, k);
            n += k;
            i += k;
            continue;
        }
        char e = t[i + 1];
        i += 2;
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            int hi = (end - i >= 4) ? hex4(t + i) : -1;
            if (hi < 0) { p->pos = i; free(buf); return fail(p, "invalid \\u escape"); }
            i += 4;
            unsigned long cp = (unsigned long)hi;
            if (hi >= 0xDC00 && hi <= 0xDFFF) {
                p->pos = i; free(buf); return fail(p, "lone trailing surrogate in string");
            }
            if (hi >= 0xD800 && hi <= 0xDBFF) {
                int lo = (end - i >= 6 && t[i] == '\\' && t[i + 1] == 'u') ? hex4(t + i + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    p->pos = i; free(buf); return fail(p, "lone leading surrogate in string");
                }
                i += 6;
                cp = 0x10000 + (((unsigned long)hi - 0xD800) << 10) + ((unsigned long)lo - 0xDC00);
            }
            n += put_utf8(buf + n, cp);
            break;
        }
        default:
            p->pos = i - 1; free(buf); return fail(p, "invalid escape");
        }
    }
    buf[n] = '\0';
    p->pos = end + 1;
    *out = buf;
    *out_len = n;
    return true;
}

static bool value(parser *p, sj_value *v);

static bool grow(void **items, size_t *cap, size_t count, size_t size) {
    if (count < *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 4;
    void *n = realloc(*items, ncap * size);
    if (!n) return false;
    *items = n;
    *cap = ncap;
    return true;
}

static bool array(parser *p, sj_value *v) {
    size_t cap = 0;
    p->pos++; /* [ */
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == ']') { p->pos++; return true; }
    for (;;) {
        if (!grow((void **)&v->elements, &cap, v->count, sizeof(sj_value))) return fail(p, "out of memory");
        skip_ws(p);
        /* counted first: a half-parsed element is freed with the array */
        if (!value(p, &v->elements[v->count++])) return false;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "EOF while parsing a list");
        char c = p->text[p->pos++];
        if (c == ']') return true;
        if (c != ',') { p->pos--; return fail(p, "expected `,` or `]`"); }
    }
}

static bool object(parser *p, sj_value *v) {
    size_t cap = 0;
    p->pos++; /* { */
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == '}') { p->pos++; return true; }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "EOF while parsing an object");
        if (p->text[p->pos] != '"') return fail(p, "key must be a string");
        if (!grow((void **)&v->members, &cap, v->count, sizeof(sj_member))) return fail(p, "out of memory");
        sj_member *m = &v->members[v->count];
        memset(m, 0, sizeof *m);
        if (!string(p, &m->key, &m->key_len)) return false;
        v->count++; /* from here on the member is freed with the object */
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "EOF while parsing an object");
        if (p->text[p->pos] != ':') return fail(p, "expected `:`");
        p->pos++;
        skip_ws(p);
        if (!value(p, &m->value)) return false;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "EOF while parsing an object");
        char c = p->text[p->pos++];
        if (c == '}') return true;
        if (c != ',') { p->pos--; return fail(p, "expected `,` or `}`"); }
    }
}

static bool value(parser *p, sj_value *v) {
    memset(v, 0, sizeof *v);
    if (p->pos >= p->len) return fail(p, "EOF while parsing a value");
    size_t start = p->pos;
    v->raw = p->text + start;
    bool ok;
    switch (p->text[p->pos]) {
    case 'n': v->type = SJ_NULL; ok = literal(p, "null"); break;
    case 't': v->type = SJ_BOOL; v->boolean = true; ok = literal(p, "true"); break;
    case 'f': v->type = SJ_BOOL; ok = literal(p, "false"); break;
    case '"': v->type = SJ_STRING; ok = string(p, &v->string, &v->string_len); break;
    case '[':
    case '{':
        if (++p->depth > SJ_MAX_DEPTH) return fail(p, "recursion limit exceeded");
        v->type = p->text[p->pos] == '[' ? SJ_ARRAY : SJ_OBJECT;
        ok = v->type == SJ_ARRAY ? array(p, v) : object(p, v);
        p->depth--;
        break;
    default:
        if (p->text[p->pos] == '-' || is_digit(p->text[p->pos])) {
            v->type = SJ_NUMBER;
            ok = number(p);
        } else {
            ok = fail(p, "expected value");
        }
    }
    v->raw_len = p->pos - start;
    return ok;
}

static void free_contents(sj_value *v) {
    free(v->string);
    for (size_t i = 0; v->elements && i < v->count; i++) free_contents(&v->elements[i]);
    for (size_t i = 0; v->members && i < v->count; i++) {
        free(v->members[i].key);
        free_contents(&v->members[i].value);
    }
    free(v->elements);
    free(v->members);
}

void sj_free(sj_value *v) {
    if (!v) return;
    free_contents(v);
    free(v);
}

static char *format_error(const parser *p) {
    size_t line = 1, column = 0;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->text[i] == '\n') { line++; column = 0; }
        else column++;
    }
    if (p->pos < p->len) column++;
    sj_buf b = SJ_BUF_INIT;
    sj_printf(&b, "%s at line %zu column %zu", p->error, line, column);
    return sj_buf_take(&b);
}

sj_value *sj_parse(const char *text, size_t len, char **error) {
    parser p = {text, len, 0, 0, NULL};
    if (error) *error = NULL;
    sj_value *v = malloc(sizeof *v);
    if (!v) {
        if (error) *error = strdup("out of memory");
        return NULL;
    }
    skip_ws(&p);
    bool ok = value(&p, v);
    if (ok) {
        skip_ws(&p);
        if (p.pos < p.len) ok = fail(&p, "trailing characters");
    }
    if (!ok) {
        if (error) *error = format_error(&p);
        sj_free(v);
        return NULL;
    }
    return v;
}

const char *sj_type_name(sj_type type) {
    switch (type) {
    case SJ_NULL: return "null";
    case SJ_BOOL: return "boolean";
    case SJ_NUMBER: return "number";
    case SJ_STRING: return "string";
    case SJ_ARRAY: return "array";
    case SJ_OBJECT: return "object";
    }
    return "?";
}

const sj_value *sj_get(const sj_value *object, const char *key) {
    if (!object || object->type != SJ_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < object->count; i++) {
        const sj_member *m = &object->members[i];
        if (m->key_len == n && memcmp(m->key, key, n) == 0) return &m->value;
    }
    return NULL;
}

/* The magnitude of an integer literal, if it is one and fits in uint64_t. */
static bool integer_literal(const sj_value *v, bool *negative, uint64_t *magnitude) {
    if (!v || v->type != SJ_NUMBER) return false;
    size_t i = 0;
    *negative = v->raw[0] == '-';
    if (*negative) i++;
    uint64_t m = 0;
    for (; i < v->raw_len; i++) {
        char c = v->raw[i];
        if (!is_digit(c)) return false; /* fraction or exponent */
        uint64_t d = (uint64_t)(c - '0');
        if (m > (UINT64_MAX - d) / 10) return false;
        m = m * 10 + d;
    }
    *magnitude = m;
    return true;
}

bool sj_as_i64(const sj_value *v, int64_t *out) {
    bool negative;
    uint64_t m;
    if (!integer_literal(v, &negative, &m)) return false;
    if (negative) {
        if (m > (uint64_t)INT64_MAX + 1) return false;
        *out = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)m;
    }
    return true;
}

bool sj_as_u64(const sj_value *v, uint64_t *out) {
    bool negative;
    uint64_t m;
    if (!integer_literal(v, &negative, &m)) return false;
    if (negative && m != 0) return false;
    *out = m;
    return true;
}

/* ---------------------------------------------------------------- writer */

static bool reserve(sj_buf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *n = realloc(b->data, cap);
    if (!n) {
        b->failed = true;
        return false;
    }
    b->data = n;
    b->cap = cap;
    return true;
}

void sj_raw(sj_buf *b, const char *bytes, size_t len) {
    if (!reserve(b, len)) return;
    memcpy(b->data + b->len, bytes, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void sj_cstr(sj_buf *b, const char *text) { sj_raw(b, text, strlen(text)); }

void sj_printf(sj_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sj_string(sj_buf *b, const char *text, size_t len) {
    static const char hex[] = "0123456789abcdef";
    sj_raw(b, "\"", 1);
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        const char *esc = NULL;
        char u[6];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            memcpy(u, "\\u00", 4);
            u[4] = hex[c >> 4];
            u[5] = hex[c & 15];
        } else {
            continue;
        }
        sj_raw(b, text + run, i - run);
        if (esc) sj_cstr(b, esc);
        else sj_raw(b, u, 6);
        run = i + 1;
    }
    sj_raw(b, text + run, len - run);
    sj_raw(b, "\"", 1);
}

void sj_cstring(sj_buf *b, const char *text) { sj_string(b, text, strlen(text)); }
void sj_i64(sj_buf *b, int64_t n) { sj_printf(b, "%lld", (long long)n); }
void sj_u64(sj_buf *b, uint64_t n) { sj_printf(b, "%llu", (unsigned long long)n); }
void sj_bool(sj_buf *b, bool v) { sj_cstr(b, v ? "true" : "false"); }
void sj_null(sj_buf *b) { sj_cstr(b, "null"); }

void sj_item(sj_buf *b) {
    if (b->len > 0 && b->data[b->len - 1] != '[' && b->data[b->len - 1] != '{') sj_raw(b, ",", 1);
}

void sj_key(sj_buf *b, const char *key) {
    sj_item(b);
    sj_cstring(b, key);
    sj_raw(b, ":", 1);
}

char *sj_buf_take(sj_buf *b) {
    char *out = b->failed ? NULL : b->data;
    if (b->failed) free(b->data);
    if (!b->failed && !out) out = calloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
    return out;
}

void sj_buf_free(sj_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

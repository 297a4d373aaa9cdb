/*
 * Test guest: a plain WASI (preview1) command in C, with no stephost imports.
 *
 * It reads all of stdin, the wall clock (clock_gettime(CLOCK_REALTIME)) and 8
 * random bytes (getentropy), and writes one line of JSON to stdout:
 *
 *     {"input":"<stdin, JSON-escaped>","now_s":<seconds>,"nonce":"<16 hex>"}
 *
 * then one line to stderr. If stdin is "exit=N" (N a decimal number, an
 * optional trailing newline allowed), it exits with code N; otherwise 0.
 * If stdin is "sleep=N", it first sleeps N milliseconds (nanosleep: one
 * WASI poll_oneoff on a clock).
 * If stdin is "poll=huge", it asks poll_oneoff about 0xFFFFFFFF
 * subscriptions (a hostile guest) and prints {"poll_errno":N} instead.
 * Bytes of stdin that are not valid UTF-8 are written as U+FFFD.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wasi/api.h>

/* All of stdin, malloc'd; *len gets its length. Exits with 1 on failure. */
static char *read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fputs("c-command: out of memory\n", stderr);
            exit(1);
        }
        n += fread(buf + n, 1, cap - n, stdin);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(stdin)) {
        perror("c-command: reading stdin");
        exit(1);
    }
    *len = n;
    return buf;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
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

/* Writes `len` bytes as a quoted JSON string. */
static void put_json_string(const char *s, size_t len) {
    putchar('"');
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { putchar('\\'); putchar(c); i++; }
        else if (c == '\n') { fputs("\\n", stdout); i++; }
        else if (c == '\r') { fputs("\\r", stdout); i++; }
        else if (c == '\t') { fputs("\\t", stdout); i++; }
        else if (c < 0x20) { printf("\\u%04x", c); i++; }
        else {
            size_t k = utf8_seq((const unsigned char *)s + i, len - i);
            if (k == 0) { fputs("\xEF\xBF\xBD", stdout); i++; }
            else { fwrite(s + i, 1, k, stdout); i += k; }
        }
    }
    putchar('"');
}

/* N if `s` is "exit=N" (optionally followed by a newline), else -1. */
static int exit_code(const char *s, size_t len) {
    if (len > 0 && s[len - 1] == '\n') len--;
    if (len > 0 && s[len - 1] == '\r') len--;
    if (len <= 5 || memcmp(s, "exit=", 5) != 0) return -1;
    int code = 0;
    for (size_t i = 5; i < len; i++) {
        if (s[i] < '0' || s[i] > '9' || code > 100000) return -1;
        code = code * 10 + (s[i] - '0');
    }
    return code;
}

int main(void) {
    size_t len;
    char *input = read_stdin(&len);
    if (len >= 9 && memcmp(input, "poll=huge", 9) == 0) {
        __wasi_subscription_t sub = {0};
        __wasi_event_t event;
        __wasi_size_t n = 0;
        __wasi_errno_t err = __wasi_poll_oneoff(&sub, &event, 0xFFFFFFFFu, &n);
        printf("{\"poll_errno\":%d}\n", (int)err);
        return 0;
    }
    if (len > 6 && memcmp(input, "sleep=", 6) == 0) {
        long ms = 0;
        for (size_t i = 6; i < len && input[i] >= '0' && input[i] <= '9'; i++)
            ms = ms * 10 + (input[i] - '0');
        struct timespec wait = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&wait, NULL);
    }

    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        perror("c-command: clock_gettime");
        return 1;
    }
    unsigned char nonce[8];
    if (getentropy(nonce, sizeof nonce) != 0) {
        perror("c-command: getentropy");
        return 1;
    }

    fputs("{\"input\":", stdout);
    put_json_string(input, len);
    printf(",\"now_s\":%lld,\"nonce\":\"", (long long)now.tv_sec);
    for (size_t i = 0; i < sizeof nonce; i++) printf("%02x", nonce[i]);
    fputs("\"}\n", stdout);
    fflush(stdout);

    int code = exit_code(input, len);
    if (code < 0) code = 0;
    fprintf(stderr, "c-command: read %zu bytes of stdin, exiting with %d\n", len, code);
    free(input);
    return code;
}

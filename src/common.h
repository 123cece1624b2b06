/* common.h - the one error scheme and the logger shared by every module.
 *
 * Functions return 0 (or a count) on success and a negative TIDE_E* code on
 * failure; tide_strerror() turns a code into a sentence. Nothing in the daemon
 * calls exit(): errors travel up to main(). */
#ifndef TIDE_COMMON_H
#define TIDE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define TIDE_VERSION "0.1.0"

enum tide_err {
    TIDE_OK = 0,
    TIDE_ENOMEM = -1,       /* allocation failed */
    TIDE_EIO = -2,          /* read/write/mmap of a file failed */
    TIDE_EFORMAT = -3,      /* a file or message is malformed */
    TIDE_EINVAL = -4,       /* an argument or value is out of range */
    TIDE_ENOTFOUND = -5,    /* a key, tensor or file does not exist */
    TIDE_EUNSUPPORTED = -6, /* valid but not supported (type, arch) */
    TIDE_ECANCELED = -7,    /* the client went away or asked to stop */
    TIDE_EFULL = -8,        /* a queue or budget is full */
    TIDE_ERANGE = -9,       /* does not fit (context, budget) */
    TIDE_EINTERNAL = -10,   /* a bug or a backend failure */
    TIDE_ESTALE = -11,      /* a recording refers to memory since replaced: record again */
};

const char *tide_strerror(int err);

/* Writes the printf-style message into err (errlen bytes; err may be NULL) and returns code:
 * `return tide_fail(TIDE_EFORMAT, err, errlen, "bad %s", what);` */
int tide_fail(int code, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Log one line to stderr, prefixed with a timestamp. printf-style. */
void tide_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic seconds. */
double tide_now(void);

#endif

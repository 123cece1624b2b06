/* common.c - error strings, logging, clock. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

const char *tide_strerror(int err)
{
    switch (err) {
    case TIDE_OK: return "success";
    case TIDE_ENOMEM: return "out of memory";
    case TIDE_EIO: return "input/output error";
    case TIDE_EFORMAT: return "malformed data";
    case TIDE_EINVAL: return "invalid argument";
    case TIDE_ENOTFOUND: return "not found";
    case TIDE_EUNSUPPORTED: return "not supported";
    case TIDE_ECANCELED: return "canceled";
    case TIDE_EFULL: return "full";
    case TIDE_ERANGE: return "out of range";
    case TIDE_EINTERNAL: return "internal error";
    case TIDE_ESTALE: return "stale recording";
    default: return "unknown error";
    }
}

void tide_log(const char *fmt, ...)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld tide: ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

double tide_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tide_fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

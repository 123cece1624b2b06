/* jinja.h - a Jinja2 subset for chat templates (tokenizer.chat_template in a GGUF).
 *
 * Parse once, render many times with a JSON context (cJSON). The settings are Hugging
 * Face's apply_chat_template: trim_blocks, lstrip_blocks, no autoescape, a single trailing
 * newline of the source dropped, the loopcontrols extension (break/continue), and the
 * globals raise_exception(msg) and strftime_now(fmt). What is supported and what is refused:
 * docs/TEMPLATES.md. Every render is bounded (output bytes, memory, steps, recursion), so a
 * hostile template ends with an error instead of hanging or exhausting memory. */
#ifndef TIDE_JINJA_H
#define TIDE_JINJA_H

#include <stddef.h>
#include <time.h>

struct cJSON;
struct jinja_template;

struct jinja_limits {
    size_t max_output;  /* bytes of rendered text (0: 4 MiB) */
    size_t max_memory;  /* bytes of values made while rendering (0: 64 MiB) */
    long max_steps;     /* statements, loop iterations and calls (0: 10 million) */
    time_t now;         /* what strftime_now formats (0: the current time), local time */
};

/* Parses src. On error returns a negative TIDE_E* code and writes "line N: why" to err. */
int jinja_parse(const char *src, struct jinja_template **out, char *err, size_t errlen);
/* Renders with the names of the JSON object ctx as variables (ctx may be NULL). On success
 * *out is a malloc'd NUL-terminated string (caller frees). On error (raise_exception, a type
 * error, a limit) returns a negative TIDE_E* code and says why in err. */
int jinja_render(const struct jinja_template *t, const struct cJSON *ctx, const struct jinja_limits *lim,
                 char **out, char *err, size_t errlen);
void jinja_free(struct jinja_template *t);

#endif

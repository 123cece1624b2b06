/* template.h - chat templates: messages -> one prompt string.
 *
 * The GGUF's own tokenizer.chat_template is rendered by the Jinja subset (jinja.h) with
 * messages, tools, add_generation_prompt and bos_token/eos_token, as Hugging Face's
 * apply_chat_template does. Three built-in formats (ChatML, Llama-3, Mistral), recognised
 * by telltale substrings, remain as the fallback: used when the GGUF has no template or
 * rendering it fails, and logged once (docs/TEMPLATES.md). */
#ifndef TIDE_TEMPLATE_H
#define TIDE_TEMPLATE_H

#include "../common.h"

enum chat_template_kind { TEMPLATE_CHATML, TEMPLATE_LLAMA3, TEMPLATE_MISTRAL };

struct chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8 text; NULL: none (null in the template when tool_calls is set) */
    const char *tool_calls_json;  /* assistant: the request's tool_calls array as JSON text, or NULL */
    const char *tool_call_id;     /* tool: the call this answers, or NULL */
    const char *name;             /* tool: the function's name, or NULL */
};

struct jinja_template;
struct chat_template {
    struct jinja_template *jinja;  /* the GGUF's template; NULL when absent or it does not parse */
    enum chat_template_kind kind;  /* the fallback format (and the stop strings) */
    char *bos, *eos;               /* the vocabulary's BOS/EOS token text ("" when none) */
    bool strip_bos;                /* the tokenizer adds BOS itself: a rendered leading bos_token goes */
    int fallback_logged;           /* the fallback was logged (once) */
};

/* jinja_src (may be NULL) is the GGUF's tokenizer.chat_template. A template that does not
 * parse is logged and the fallback used. Returns 0 or TIDE_ENOMEM. */
int chat_template_init(struct chat_template *t, const char *jinja_src, const char *bos, const char *eos,
                       bool tokenizer_adds_bos);
/* The prompt for n messages plus the opening of the assistant turn; tools_json is the
 * request's tools array as JSON text, or NULL. *out is malloc'd (caller frees). Falls back
 * to the built-in format when the template fails. Returns 0 or TIDE_ENOMEM. */
int chat_template_render(struct chat_template *t, const struct chat_message *m, int n, const char *tools_json,
                         char **out);
void chat_template_free(struct chat_template *t);

enum chat_template_kind template_detect(const char *jinja /* may be NULL */);
const char *template_name(enum chat_template_kind kind);
/* Returns a malloc'd prompt (caller frees) or NULL on ENOMEM. add_generation_prompt
 * appends the opening of the assistant turn. */
char *template_apply(enum chat_template_kind kind, const struct chat_message *msgs, int n,
                     bool add_generation_prompt);
/* Strings that end an assistant turn in this format (for stop detection), NULL-terminated. */
const char *const *template_stop_strings(enum chat_template_kind kind);

#endif

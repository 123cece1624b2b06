/* template.h - chat templates: messages -> one prompt string.
 *
 * No Jinja: tokenizer.chat_template is recognised by telltale substrings and mapped to
 * one of the formats below; ChatML when absent or unrecognised. */
#ifndef TIDE_TEMPLATE_H
#define TIDE_TEMPLATE_H

#include "../common.h"

enum chat_template_kind { TEMPLATE_CHATML, TEMPLATE_LLAMA3, TEMPLATE_MISTRAL };

struct chat_message {
    const char *role;    /* "system", "user", "assistant" (tool roles are mapped by the caller) */
    const char *content; /* UTF-8 text */
};

enum chat_template_kind template_detect(const char *jinja /* may be NULL */);
const char *template_name(enum chat_template_kind kind);
/* Returns a malloc'd prompt (caller frees) or NULL on ENOMEM. add_generation_prompt
 * appends the opening of the assistant turn. */
char *template_apply(enum chat_template_kind kind, const struct chat_message *msgs, int n,
                     bool add_generation_prompt);
/* Strings that end an assistant turn in this format (for stop detection), NULL-terminated. */
const char *const *template_stop_strings(enum chat_template_kind kind);

#endif

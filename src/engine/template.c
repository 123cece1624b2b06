/* template.c - chat templates without Jinja: recognise the model's template by telltale
 * substrings and render one of three fixed formats (docs/TEMPLATES.md). */
#include "template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum chat_template_kind template_detect(const char *jinja)
{
    if (!jinja) return TEMPLATE_CHATML;
    if (strstr(jinja, "<|im_start|>")) return TEMPLATE_CHATML;
    if (strstr(jinja, "<|start_header_id|>")) return TEMPLATE_LLAMA3;
    if (strstr(jinja, "[INST]")) return TEMPLATE_MISTRAL;
    return TEMPLATE_CHATML;
}

const char *template_name(enum chat_template_kind kind)
{
    switch (kind) {
    case TEMPLATE_LLAMA3: return "llama3";
    case TEMPLATE_MISTRAL: return "mistral";
    default: return "chatml";
    }
}

/* A growable string; on allocation failure it goes NULL and stays so. */
struct sbuf {
    char *p;
    size_t len, cap;
};

static void sb_add(struct sbuf *b, const char *s)
{
    if (!b->p && b->cap) return;
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            free(b->p);
            b->p = NULL;
            b->cap = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

char *template_apply(enum chat_template_kind kind, const struct chat_message *msgs, int n,
                     bool add_generation_prompt)
{
    struct sbuf b = {0};
    sb_add(&b, "");
    if (kind == TEMPLATE_CHATML) {
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|im_start|>");
            sb_add(&b, msgs[i].role);
            sb_add(&b, "\n");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
    } else if (kind == TEMPLATE_LLAMA3) {
        sb_add(&b, "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|start_header_id|>");
            sb_add(&b, msgs[i].role);
            sb_add(&b, "<|end_header_id|>\n\n");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else {
        /* Mistral: the system prompt goes in front of the first user turn. */
        const char *system = NULL;
        bool first_user = true;
        for (int i = 0; i < n; i++) {
            const char *c = msgs[i].content ? msgs[i].content : "";
            if (!strcmp(msgs[i].role, "system")) {
                system = c;
            } else if (!strcmp(msgs[i].role, "assistant")) {
                sb_add(&b, c);
                sb_add(&b, "</s>");
            } else {
                sb_add(&b, first_user ? "<s>[INST] " : "[INST] ");
                if (first_user && system) {
                    sb_add(&b, system);
                    sb_add(&b, "\n\n");
                }
                first_user = false;
                sb_add(&b, c);
                sb_add(&b, " [/INST]");
            }
        }
    }
    return b.p;
}

const char *const *template_stop_strings(enum chat_template_kind kind)
{
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const llama3[] = {"<|eot_id|>", NULL};
    static const char *const mistral[] = {"</s>", NULL};
    switch (kind) {
    case TEMPLATE_LLAMA3: return llama3;
    case TEMPLATE_MISTRAL: return mistral;
    default: return chatml;
    }
}

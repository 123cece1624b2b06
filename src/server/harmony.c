/* harmony.c - split gpt-oss's harmony reply into content and reasoning (see harmony.h). A
 * plain scan: markers switch between a header (dropped) and a message body (kept, by its
 * channel); the text is re-split from the start on each streamed piece, which is cheap next to
 * generating it. */
#include "server/harmony.h"
#include "server/json_text.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const markers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                      "<|end|>", "<|return|>", "<|call|>"};
#define N_MARKERS (sizeof markers / sizeof markers[0])

/* The marker at t (index into markers), or -1; *partial: t is a proper prefix of one. */
static int marker_at(const char *t, size_t len, bool *partial)
{
    *partial = false;
    for (size_t i = 0; i < N_MARKERS; i++) {
        size_t n = strlen(markers[i]);
        if (len >= n && memcmp(t, markers[i], n) == 0)
            return (int)i;
        if (len < n && memcmp(t, markers[i], len) == 0)
            *partial = true;
    }
    return -1;
}

bool harmony_text(const char *text, size_t len)
{
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(markers[i]);
        if (memcmp(text, markers[i], len < n ? len : n) == 0)
            return true;
    }
    return false;
}

struct buf {
    char *p;
    size_t n, cap;
};

static int put(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = 2 * (b->n + n + 1);
        char *p = realloc(b->p, cap);
        if (!p)
            return TIDE_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int harmony_split(const char *t, size_t len, bool complete, struct harmony_split *out)
{
    struct buf c = {0}, r = {0};
    enum { HEADER, CHANNEL, BODY } st = HEADER;
    bool analysis = false;
    int rc = put(&c, "", 0) || put(&r, "", 0) ? TIDE_ENOMEM : 0;
    size_t i = 0, chan0 = 0;
    while (i < len && !rc) {
        bool partial = false;
        int m = t[i] == '<' ? marker_at(t + i, len - i, &partial) : -1;
        if (m < 0 && partial && !complete)
            break; /* a marker may be arriving: hold it back */
        if (m < 0) {
            size_t j = i + 1;
            while (j < len && t[j] != '<')
                j++;
            if (st == BODY)
                rc = put(analysis ? &r : &c, t + i, j - i);
            i = j;
            continue;
        }
        if (st == CHANNEL) /* the channel's name runs up to the next marker */
            analysis = i - chan0 >= 8 && memcmp(t + chan0, "analysis", 8) == 0;
        const char *mk = markers[m];
        i += strlen(mk);
        if (!strcmp(mk, "<|channel|>")) {
            st = CHANNEL;
            chan0 = i;
        } else if (!strcmp(mk, "<|message|>")) {
            st = BODY;
        } else if (st != CHANNEL || strcmp(mk, "<|constrain|>")) {
            st = HEADER; /* <|start|>, <|end|>, <|return|>, <|call|> */
            analysis = false;
        }
    }
    if (rc) {
        free(c.p);
        free(r.p);
        return rc;
    }
    out->content = c.p;
    out->content_len = c.n;
    out->reasoning = r.p;
    out->reasoning_len = r.n;
    return 0;
}

void harmony_split_free(struct harmony_split *h)
{
    free(h->content);
    free(h->reasoning);
    memset(h, 0, sizeof *h);
}

int harmony_stream_delta(const char *text, size_t len, bool complete, size_t *sent_content, size_t *sent_reasoning,
                         cJSON *delta)
{
    struct harmony_split h;
    if (harmony_split(text, len, complete, &h))
        return TIDE_ENOMEM;
    bool any = false;
    if (h.reasoning_len > *sent_reasoning) {
        json_add_string_n(delta, "reasoning_content", h.reasoning + *sent_reasoning, h.reasoning_len - *sent_reasoning);
        *sent_reasoning = h.reasoning_len;
        any = true;
    }
    if (h.content_len > *sent_content) {
        json_add_string_n(delta, "content", h.content + *sent_content, h.content_len - *sent_content);
        *sent_content = h.content_len;
        any = true;
    }
    harmony_split_free(&h);
    return any;
}

int harmony_message(struct cJSON *m, const char *text, size_t len)
{
    if (!harmony_text(text, len))
        return 0;
    struct harmony_split h;
    if (harmony_split(text, len, true, &h))
        return TIDE_ENOMEM;
    json_add_string_n(m, "content", h.content, h.content_len);
    if (h.reasoning_len)
        json_add_string_n(m, "reasoning_content", h.reasoning, h.reasoning_len);
    harmony_split_free(&h);
    return 1;
}

cJSON *harmony_stream_next(const char *text, size_t len, size_t *sent_content, size_t *sent_reasoning)
{
    cJSON *d = cJSON_CreateObject();
    if (d && harmony_stream_delta(text, len, false, sent_content, sent_reasoning, d) > 0)
        return d;
    cJSON_Delete(d);
    return NULL;
}

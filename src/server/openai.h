/* openai.h - the OpenAI request/response layer: validate a chat or legacy completion
 * request into a job, run it on the engine thread, and write OpenAI-shaped JSON or SSE
 * into the job's output channel. */
#ifndef TIDE_OPENAI_H
#define TIDE_OPENAI_H

#include "common.h"
#include "server/fifo.h"

struct oai_req;

/* Image limits, set once at start-up (defaults: 8 images, 20 MiB and 50 Mpixel each). */
struct openai_image_limits {
    int max_images;
    size_t max_bytes;
    uint64_t max_pixels;
};
void openai_set_image_limits(const struct openai_image_limits *l);
/* The parse-tree bound (config json_max_elements): a body with more JSON values is refused
 * before parsing (TIDE_ERANGE: 413). <= 0: none. Nesting is always bounded (JSON_MAX_DEPTH). */
#define OPENAI_JSON_MAX_ELEMENTS 100000
void openai_set_json_max_elements(long n);

/* Parse and validate. On error returns a negative code, msg says what is wrong and
 * *param names the offending field (or NULL): TIDE_EINVAL (400), TIDE_ERANGE (413: too many
 * JSON values), TIDE_EFULL (503: request_budget has no room now), TIDE_ENOMEM (500). */
int openai_parse(const char *body, size_t len, bool chat, const char *model_id,
                 struct oai_req **out, char *msg, size_t msglen, const char **param);
void openai_req_free(void *r);
bool openai_req_stream(const struct oai_req *r);
/* The generation's ends for the scheduler (fifo.h struct job_gen): engine_ctx is the struct
 * runtime *. A job made with job_new(NULL, req, openai_req_free) and gen = &openai_gen. */
extern const struct job_gen openai_gen;
/* The request's images, decoded on the HTTP thread, for the scheduler to embed: image i's
 * bytes (len[i]), its pixels, and where its embeddings go (embd[i], malloc'd by the embedder and
 * freed with the request; g[i] the gen_image that points at them). */
struct image_u8;
struct gen_image;
struct req_images {
    int n;
    uint8_t **bytes;
    size_t *len;
    struct image_u8 *img;
    float **embd;
    struct gen_image *g;
};
void openai_req_images(struct oai_req *r, struct req_images *out);
/* malloc'd OpenAI error object. type e.g. "invalid_request_error"; param/code may be NULL. */
char *openai_error_json(const char *message, const char *type, const char *param, const char *code);

#endif

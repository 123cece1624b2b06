/* openai.h - the OpenAI request/response layer: validate a chat or legacy completion
 * request into a job, run it on the engine thread, and write OpenAI-shaped JSON or SSE
 * into the job's output channel. */
#ifndef TIDE_OPENAI_H
#define TIDE_OPENAI_H

#include "common.h"
#include "server/fifo.h"

struct oai_req;

/* Parse and validate. On error returns a negative code, msg says what is wrong and
 * *param names the offending field (or NULL). */
int openai_parse(const char *body, size_t len, bool chat, const char *model_id,
                 struct oai_req **out, char *msg, size_t msglen, const char **param);
void openai_req_free(void *r);
bool openai_req_stream(const struct oai_req *r);
/* job_run_fn: engine_ctx is a struct engine *. */
void openai_run(struct job *j, void *engine_ctx);
/* malloc'd OpenAI error object. type e.g. "invalid_request_error"; param/code may be NULL. */
char *openai_error_json(const char *message, const char *type, const char *param, const char *code);

#endif

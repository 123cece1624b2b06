/* tokenize_api.h - POST /tokenize and POST /detokenize in llama-server's shapes. They run on
 * the HTTP polling thread and call the tokenizer directly: a loaded tokenizer is read-only and
 * safe to share with the engine thread (tokenizer.h), so no job is queued for them. */
#ifndef TIDE_TOKENIZE_API_H
#define TIDE_TOKENIZE_API_H

#include "server/http.h"

struct tokenizer;

/* {"content": "...", "add_special": false, "parse_special": true, "with_pieces": false}
 *   -> {"tokens": [ids]} or, with_pieces, {"tokens": [{"id": n, "piece": "text" or [bytes]}]} */
void tokenize_handle(const struct tokenizer *tok, const struct http_request *rq, struct http_response *rs);
/* {"tokens": [ids]} -> {"content": "..."} (invalid UTF-8 becomes U+FFFD) */
void detokenize_handle(const struct tokenizer *tok, const struct http_request *rq, struct http_response *rs);

#endif

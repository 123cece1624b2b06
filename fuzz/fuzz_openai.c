/* fuzz_openai.c - libFuzzer target for openai_parse (src/server/openai.h): the request
 * validator every HTTP body goes through. Both endpoints are tried on each input. The body
 * is copied into an exact-size, NUL-terminated buffer, as http.c hands it over, so ASan sees
 * any read past its end. */
#include "server/openai.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size + 1);
    if (!body) return 0;
    memcpy(body, data, size);
    body[size] = 0;
    for (int chat = 0; chat < 2; chat++) {
        struct oai_req *r = NULL;
        char msg[256];
        const char *param = NULL;
        if (openai_parse(body, size, chat, "fuzz-model", &r, msg, sizeof msg, &param) == 0) {
            openai_req_stream(r);
            openai_req_free(r);
        } else if (!memchr(msg, 0, sizeof msg)) {
            abort();   /* the message must always be a terminated string */
        }
    }
    free(body);
    return 0;
}

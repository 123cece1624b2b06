/* fuzz_jinja.c - libFuzzer target for the Jinja subset (src/engine/jinja.h): any text as a
 * template must parse or give one error line, and a template that parses must render or
 * give one error line, within small output, memory and step limits: never a crash, a leak
 * or a hang. The data is a short chat with a tool call, as the daemon passes it. */
#include "engine/jinja.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"hi <b>\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true, null]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"3\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *ctx;
    if (!ctx) ctx = cJSON_Parse(CONTEXT);
    if (size > 64 * 1024) return 0;
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    char err[512];
    err[0] = 0;
    struct jinja_template *t;
    if (jinja_parse(src, &t, err, sizeof err) != 0) {
        if (!err[0]) abort();   /* errors must say why */
    } else {
        struct jinja_limits lim = {.max_output = 64 * 1024, .max_memory = 16 << 20, .max_steps = 200000, .now = 1};
        char *out = NULL;
        err[0] = 0;
        if (jinja_render(t, ctx, &lim, &out, err, sizeof err) != 0) {
            if (!err[0] || out) abort();
        } else if (!out || strlen(out) > lim.max_output) {
            abort();
        }
        free(out);
        jinja_free(t);
    }
    free(src);
    return 0;
}

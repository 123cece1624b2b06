/* fuzz_json_schema.c - libFuzzer target for the JSON Schema compiler and the automaton it
 * drives (src/engine/json_schema.h, json_guard.h). The input is a schema, a NUL byte, then a
 * document: the schema is compiled (strict and not), the document fed byte by byte; whenever
 * the automaton calls the text complete, it must parse as JSON (the property that makes a
 * "stop" reply valid), and json_guard_accepts must agree with json_guard_feed. */
#include "engine/json_schema.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    if (!nul) return 0;
    cJSON *schema = cJSON_ParseWithLength((const char *)data, (size_t)(nul - data));
    const char *doc = (const char *)nul + 1;
    size_t n = size - (size_t)(nul - data) - 1;
    for (int strict = 0; strict < 2 && schema; strict++) {
        struct grammar *g = NULL;
        char msg[512];
        if (json_schema_compile(schema, strict, &g, msg, sizeof msg) != 0) {
            if (!memchr(msg, 0, sizeof msg)) abort();
            continue;
        }
        struct json_guard *jg = malloc(sizeof *jg);
        json_guard_init(jg, g);
        for (size_t i = 0; i < n; i++) {
            bool can = json_guard_accepts(jg, doc + i, 1);
            bool fed = json_guard_feed(jg, doc + i, 1);
            if (can != fed) abort();
            if (!fed) break;
            if (json_guard_complete(jg)) {
                cJSON *v = cJSON_ParseWithLength(doc, i + 1);
                if (!v) abort(); /* complete but not JSON */
                cJSON_Delete(v);
            }
        }
        free(jg);
        grammar_free(g);
    }
    cJSON_Delete(schema);
    return 0;
}

/* fuzz_tool_calls.c - libFuzzer target for the tool-call parsers (src/server/tool_calls.h): they
 * read model output, which no one checks before them. Every format's whole-reply parser, the
 * forced-call parser, and the stream hold-back on every prefix are tried on each input, copied
 * into an exact-size buffer with no terminator (the parsers take a length) so ASan sees any read
 * past its end. A hold-back never says more is safe than there is. */
#include "server/tool_calls.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return 0;
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    for (int f = TOOL_FMT_HERMES; f <= TOOL_FMT_GPT_OSS; f++) {
        struct tool_calls tc;
        int n = tool_calls_parse((enum tool_format)f, text, size, f == TOOL_FMT_MISTRAL ? 1 : 0, &tc);
        if (n > 0 && (tc.n != n || !tc.call[0].name[0] || tc.call[0].arguments[0] != '{')) abort();
        tool_calls_free(&tc);
        n = tool_calls_parse_forced((enum tool_format)f, f == TOOL_FMT_GPT_OSS ? "f" : NULL, text, size, &tc);
        tool_calls_free(&tc);
        for (size_t k = 0; k <= size; k += 1 + size / 64) {
            bool started;
            if (tool_calls_stream_safe((enum tool_format)f, text, k, k < 8, &started) > k) abort();
        }
    }
    free(text);
    return 0;
}

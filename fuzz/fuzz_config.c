/* fuzz_config.c - libFuzzer target for config_parse (src/server/config.h): any text must give
 * either a config or one error line, never a crash or leak, and config_free must release
 * what a partial parse left behind. */
#include "server/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    struct config c;
    config_defaults(&c);
    char err[512];
    err[0] = 0;
    if (config_parse(&c, text, err, sizeof err) != 0 && !err[0]) abort();   /* errors must say why */
    config_free(&c);
    free(text);
    return 0;
}

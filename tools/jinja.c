/* jinja.c - build/tide-jinja TEMPLATE DATA.json: renders a template with the JSON object's
 * names as variables, as the daemon renders a GGUF's chat template, and writes the text to
 * stdout (or the error to stderr, exit 1). tests/jinja/compare.py runs it next to
 * python3-jinja2. TIDE_JINJA_NOW=<unix time> fixes what strftime_now sees. */
#include "engine/jinja.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *p = malloc(cap);
    size_t n;
    while (p && (n = fread(p + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) { char *np = realloc(p, cap *= 2); if (!np) { free(p); p = NULL; } else p = np; }
    }
    fclose(f);
    if (p) p[len] = 0;
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: tide-jinja TEMPLATE DATA.json\n"); return 2; }
    char *src = slurp(argv[1]), *data = slurp(argv[2]);
    if (!src || !data) { fprintf(stderr, "tide-jinja: cannot read %s\n", src ? argv[2] : argv[1]); return 2; }
    cJSON *ctx = cJSON_Parse(data);
    if (!cJSON_IsObject(ctx)) { fprintf(stderr, "tide-jinja: %s is not a JSON object\n", argv[2]); return 2; }
    struct jinja_limits lim = {0};
    const char *now = getenv("TIDE_JINJA_NOW");
    if (now) lim.now = (time_t)atoll(now);
    char err[512];
    struct jinja_template *t;
    int rc = jinja_parse(src, &t, err, sizeof err);
    if (rc) { fprintf(stderr, "tide-jinja: parse: %s\n", err); return 1; }
    char *out;
    rc = jinja_render(t, ctx, &lim, &out, err, sizeof err);
    if (rc) { fprintf(stderr, "tide-jinja: render: %s\n", err); return 1; }
    fputs(out, stdout);
    free(out);
    jinja_free(t);
    cJSON_Delete(ctx);
    free(src);
    free(data);
    return 0;
}

/* ui.c - GET /: ui/index.html with <!--STYLE--> and <!--SCRIPT--> replaced by ui/style.css
 * and ui/app.js. The three files are compiled in: the Makefile turns them into
 * $(BUILD)/gen/ui_assets.h with `xxd -i` (arrays index_html, style_css, app_js + _len). */
#include "server/ui.h"
#include "ui_assets.h"
#include <stdlib.h>
#include <string.h>

static const char *find(const char *h, size_t hl, const char *n)
{
    size_t nl = strlen(n);
    for (size_t i = 0; i + nl <= hl; i++)
        if (memcmp(h + i, n, nl) == 0) return h + i;
    return NULL;
}

static char *build_page(void)
{
    const char *html = (const char *)index_html, *end = html + index_html_len;
    const char *st = find(html, index_html_len, "<!--STYLE-->");
    const char *sc = find(html, index_html_len, "<!--SCRIPT-->");
    if (!st || !sc || sc < st) return NULL;
    size_t n = index_html_len + style_css_len + app_js_len + 64;
    char *out = malloc(n), *p = out;
    if (!out) return NULL;
#define PUT(s, l) do { memcpy(p, (s), (l)); p += (l); } while (0)
    PUT(html, (size_t)(st - html));
    PUT("<style>\n", 8); PUT(style_css, style_css_len); PUT("</style>", 8);
    st += strlen("<!--STYLE-->");
    PUT(st, (size_t)(sc - st));
    PUT("<script>\n", 9); PUT(app_js, app_js_len); PUT("</script>", 9);
    sc += strlen("<!--SCRIPT-->");
    PUT(sc, (size_t)(end - sc));
#undef PUT
    *p = 0;
    return out;
}

void ui_handle(void *app, const struct http_request *rq, struct http_response *rs)
{
    char *page = build_page();
    if (!page) {
        http_error(rs, 500, "server_error", "ui page missing its placeholders", NULL, NULL);
        return;
    }
    rs->body = page;
    rs->content_type = "text/html; charset=utf-8";
}

/* ui.h - GET /: the dashboard and playground page (ui/, compiled into the binary). */
#ifndef TIDE_UI_H
#define TIDE_UI_H

#include "server/http.h"

/* Serves ui/index.html with ui/style.css and ui/app.js inlined: one self-contained page. */
void ui_handle(void *app, const struct http_request *rq, struct http_response *rs);

#endif

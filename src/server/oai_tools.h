/* oai_tools.h - the request side of OpenAI tool calling: tools, tool_choice and
 * parallel_tool_calls checked into a job, and the reply's calls as OpenAI JSON.
 *
 * tool_choice "auto" (the default with tools): the reply is parsed for calls in the model's
 * format (tool_calls.h). "required" or a named function: constrained decoding makes the reply
 * exactly one call. The grammar engine matches JSON, so the call's opening in the model's format
 * (hermes "<tool_call>\n", mistral "[TOOL_CALLS][", gpt-oss "<|channel|>commentary
 * to=functions.NAME <|constrain|>json<|message|>") is appended to the prompt, and the model writes
 * only the JSON: {"name": const, "arguments": <the function's parameters schema>} (anyOf over the
 * tools for required), or the arguments alone where the opening names the function (gpt-oss).
 * "none": the tools still go to the template, the reply is never parsed. */
#ifndef TIDE_OAI_TOOLS_H
#define TIDE_OAI_TOOLS_H

#include "common.h"
#include "engine/session.h"
#include "server/tool_calls.h"

#include <cjson/cJSON.h>

struct oai_tools {
    bool active;          /* tools given and tool_choice is not "none": parse the reply */
    bool forced;          /* required or named: the reply is the grammar's JSON */
    int max_calls;        /* parallel_tool_calls false: 1; 0: no limit */
    enum tool_format fmt;
    const char *forced_name;   /* the grammar is the arguments alone, for this function */
    struct grammar *grammar;
    char *prefix;         /* the forced call's opening, appended to the prompt */
    const char **names;   /* the tools' function names (the request's strings) */
    int n_names;
};

/* The loaded model's call format, from its chat template; set once at start-up. */
void oai_tools_set_format(enum tool_format f);

/* Chat requests: call after stop and response_format are parsed (a forced call replaces the
 * response_format grammar, and gpt-oss/llama3 calls add their end as a stop string). Errors:
 * TIDE_EINVAL with msg and *param ("tools", "tool_choice", "parallel_tool_calls"), TIDE_ENOMEM. */
int oai_parse_tools(const cJSON *root, struct gen_job *g, struct oai_tools *t, char *msg, size_t msglen,
                    const char **param);
void oai_tools_free(struct oai_tools *t);

/* The calls in a whole reply: > 0 calls in *out (names all among the request's tools), 0 when the
 * reply is content, TIDE_ENOMEM. */
int oai_tools_reply(const struct oai_tools *t, const char *text, size_t len, struct tool_calls *out);
/* OpenAI's tool_calls array: [{id, type: "function", function: {name, arguments}}], each with
 * its "index" for a stream's delta. */
cJSON *oai_tool_calls_json(const struct tool_calls *tc, bool with_index);

#endif

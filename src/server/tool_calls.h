/* tool_calls.h - a model's tool calls in its own output format, turned into OpenAI's
 * message.tool_calls (name + arguments as JSON text), for whole replies and for streams.
 *
 * Models write calls in the format their chat template teaches them; the format is picked once
 * from the template text (tool_format_detect):
 *   hermes   (Qwen, Hermes, most ChatML models)  <tool_call>{"name": .., "arguments": {..}}</tool_call>
 *            (several in a row allowed)
 *   llama3   (Llama 3.1+)   {"name": .., "parameters": {..}}  the whole reply, perhaps after
 *            <|python_tag|>; several separated by ';' or whitespace
 *   mistral  [TOOL_CALLS][{"name": .., "arguments": {..}}, ..]  or  [TOOL_CALLS]name[ARGS]{..}
 *   gpt-oss  <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{args}<|call|>
 * Text that is not exactly a call of the format (bad JSON, no name, arguments not an object)
 * stays plain content: a reply is never lost to the parser. */
#ifndef TIDE_TOOL_CALLS_H
#define TIDE_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

enum tool_format { TOOL_FMT_HERMES, TOOL_FMT_LLAMA3, TOOL_FMT_MISTRAL, TOOL_FMT_GPT_OSS };

/* The format a chat template (tokenizer.chat_template, may be NULL) teaches; hermes when the
 * template says nothing about tools (the tiny test models' ChatML). */
enum tool_format tool_format_detect(const char *template_src);
const char *tool_format_name(enum tool_format f);

struct tool_call {
    char *name;
    char *arguments;   /* compact JSON text of an object */
};

struct tool_calls {
    struct tool_call *call;
    int n;
    char *content;     /* the text around the calls, trimmed; NULL when there is none */
};

/* Parse a whole reply. Returns the number of calls (0: the text is plain content and *out is
 * empty), or TIDE_ENOMEM. max_calls > 0 keeps only the first max_calls calls. */
int tool_calls_parse(enum tool_format f, const char *text, size_t len, int max_calls, struct tool_calls *out);
/* A reply made under constrained decoding (tool_choice required or named): text is exactly the
 * JSON the grammar allowed, {"name": .., key: {..}} (key "arguments", or "parameters" for
 * llama3), or, when forced_name is set, the arguments object alone. Returns 1, 0 when the text
 * is not one (cut by max_tokens), or TIDE_ENOMEM. */
int tool_calls_parse_forced(enum tool_format f, const char *forced_name, const char *text, size_t len,
                            struct tool_calls *out);
void tool_calls_free(struct tool_calls *tc);

/* Streaming: how many bytes of text[0..len) may go out as content now. Text from the first
 * byte that starts (or may still start) a call is held back: *call_started says a call marker
 * was seen, and from then on the rest of the reply is held for tool_calls_parse at the end.
 * at_start: text begins the reply (llama3 calls are the whole reply). */
size_t tool_calls_stream_safe(enum tool_format f, const char *text, size_t len, bool at_start, bool *call_started);

/* A fresh call id, "call_" and 24 random letters and digits (buf >= 32 bytes). */
void tool_call_id(char *buf, size_t size);

#endif

/* test_tool_calls.c - the tool-call parsers on fixed model replies, one format at a time: calls
 * come out with their name and arguments as compact JSON text, the text around them as content,
 * and malformed calls leave the whole reply as plain content. Then the stream hold-back: text
 * that may start a call is not sent as content. */
#include <criterion/criterion.h>
#include <string.h>

#include "common.h"
#include "server/tool_calls.h"

static struct tool_calls parse(enum tool_format f, const char *text, int max_calls, int want_n)
{
    struct tool_calls tc;
    int n = tool_calls_parse(f, text, strlen(text), max_calls, &tc);
    cr_assert_eq(n, want_n, "%s: %d calls, expected %d, in %s", tool_format_name(f), n, want_n, text);
    cr_assert_eq(tc.n, n);
    return tc;
}

static void expect_call(const struct tool_calls *tc, int i, const char *name, const char *args)
{
    cr_assert_lt(i, tc->n);
    cr_expect_str_eq(tc->call[i].name, name);
    cr_expect_str_eq(tc->call[i].arguments, args);
}

static void expect_plain(enum tool_format f, const char *text)
{
    struct tool_calls tc = parse(f, text, 0, 0);
    cr_expect_null(tc.call);
    cr_expect_null(tc.content);
}

Test(tool_calls, format_from_template)
{
    cr_expect_eq(tool_format_detect(NULL), TOOL_FMT_HERMES);
    cr_expect_eq(tool_format_detect("<|im_start|>{{ m.content }}"), TOOL_FMT_HERMES);
    cr_expect_eq(tool_format_detect("{% if tools %}<tool_call>\n{{ t | tojson }}</tool_call>{% endif %}"), TOOL_FMT_HERMES);
    cr_expect_eq(tool_format_detect("<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}"), TOOL_FMT_LLAMA3);
    cr_expect_eq(tool_format_detect("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]"), TOOL_FMT_MISTRAL);
    cr_expect_eq(tool_format_detect("<|start|>assistant to=functions.{{ name }}<|channel|>commentary"), TOOL_FMT_GPT_OSS);
}

Test(tool_calls, hermes_one_call)
{
    struct tool_calls tc = parse(TOOL_FMT_HERMES,
        "<tool_call>\n{\"name\": \"get_shape_count\", \"arguments\": {\"colour\": \"red\"}}\n</tool_call>", 0, 1);
    expect_call(&tc, 0, "get_shape_count", "{\"colour\":\"red\"}");
    cr_expect_null(tc.content);
    tool_calls_free(&tc);
}

Test(tool_calls, hermes_several_calls_and_text_before)
{
    struct tool_calls tc = parse(TOOL_FMT_HERMES,
        "<think>two lookups</think>\n\nLet me check.\n<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>\n"
        "<tool_call>\n{\"name\":\"b\",\"arguments\":{\"x\":[1,2,{\"y\":null}]}}\n</tool_call>", 0, 2);
    expect_call(&tc, 0, "a", "{}");
    expect_call(&tc, 1, "b", "{\"x\":[1,2,{\"y\":null}]}");
    cr_expect_str_eq(tc.content, "<think>two lookups</think>\n\nLet me check.");
    tool_calls_free(&tc);
}

Test(tool_calls, hermes_parallel_false_keeps_the_first)
{
    struct tool_calls tc = parse(TOOL_FMT_HERMES,
        "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
        1, 1);
    expect_call(&tc, 0, "a", "{}");
    tool_calls_free(&tc);
}

Test(tool_calls, hermes_arguments_as_string_and_missing_close_at_the_end)
{
    struct tool_calls tc = parse(TOOL_FMT_HERMES,
        "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"q\\\": \\\"x y\\\"}\"}", 0, 1);
    expect_call(&tc, 0, "f", "{\"q\":\"x y\"}");
    tool_calls_free(&tc);
}

Test(tool_calls, hermes_malformed_stays_content)
{
    expect_plain(TOOL_FMT_HERMES, "no calls here");
    expect_plain(TOOL_FMT_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}</tool_call>");   /* bad JSON */
    expect_plain(TOOL_FMT_HERMES, "<tool_call>{\"arguments\":{}}</tool_call>");                       /* no name */
    expect_plain(TOOL_FMT_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":[1]}</tool_call>");      /* not an object */
    expect_plain(TOOL_FMT_HERMES, "<tool_call>{\"name\":\"f\"} and then </tool_call>");              /* junk in the call */
    expect_plain(TOOL_FMT_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call><tool_call>{\"na");
    expect_plain(TOOL_FMT_HERMES, "<tool_call>");
}

Test(tool_calls, llama3_json_reply)
{
    struct tool_calls tc = parse(TOOL_FMT_LLAMA3,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}", 0, 1);
    expect_call(&tc, 0, "get_weather", "{\"city\":\"Paris\",\"days\":3}");
    cr_expect_null(tc.content);
    tool_calls_free(&tc);
}

Test(tool_calls, llama3_python_tag_and_several)
{
    struct tool_calls tc = parse(TOOL_FMT_LLAMA3,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": true}}", 0, 2);
    expect_call(&tc, 0, "a", "{}");
    expect_call(&tc, 1, "b", "{\"k\":true}");
    tool_calls_free(&tc);
    tc = parse(TOOL_FMT_LLAMA3, "Looking it up.<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}", 0, 1);
    expect_call(&tc, 0, "a", "{\"n\":1}");
    cr_expect_str_eq(tc.content, "Looking it up.");
    tool_calls_free(&tc);
}

Test(tool_calls, llama3_malformed_stays_content)
{
    expect_plain(TOOL_FMT_LLAMA3, "The answer is 42.");
    expect_plain(TOOL_FMT_LLAMA3, "{\"answer\": 42}");                        /* JSON, but no name */
    expect_plain(TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {\"x\": }}");
    expect_plain(TOOL_FMT_LLAMA3, "<|python_tag|>brave_search.call(query=\"x\")");   /* built-in tool syntax */
}

Test(tool_calls, mistral_array_and_args_forms)
{
    struct tool_calls tc = parse(TOOL_FMT_MISTRAL,
        "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"abc123def\"}]",
        0, 2);
    expect_call(&tc, 0, "a", "{\"x\":1}");
    expect_call(&tc, 1, "b", "{}");
    cr_expect_null(tc.content);
    tool_calls_free(&tc);
    tc = parse(TOOL_FMT_MISTRAL, "Sure.[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}[TOOL_CALLS]b[ARGS]{}", 0, 2);
    expect_call(&tc, 0, "get_time", "{\"tz\":\"UTC\"}");
    expect_call(&tc, 1, "b", "{}");
    cr_expect_str_eq(tc.content, "Sure.");
    tool_calls_free(&tc);
}

Test(tool_calls, mistral_malformed_stays_content)
{
    expect_plain(TOOL_FMT_MISTRAL, "plain [text] here");
    expect_plain(TOOL_FMT_MISTRAL, "[TOOL_CALLS][]");
    expect_plain(TOOL_FMT_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}");
    expect_plain(TOOL_FMT_MISTRAL, "[TOOL_CALLS]two words[ARGS]{}");
    expect_plain(TOOL_FMT_MISTRAL, "[TOOL_CALLS]a[ARGS][1]");
    expect_plain(TOOL_FMT_MISTRAL, "[TOOL_CALLS]a\x01" "b[ARGS]{}");   /* a name of control bytes (fuzzer) */
}

Test(tool_calls, gpt_oss_commentary_call)
{
    struct tool_calls tc = parse(TOOL_FMT_GPT_OSS,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"SF\"}<|call|>", 0, 1);
    expect_call(&tc, 0, "get_weather", "{\"location\":\"SF\"}");
    cr_expect_str_eq(tc.content, "<|channel|>analysis<|message|>Need the weather.<|end|>");
    tool_calls_free(&tc);
    /* the recipient in the role header instead; <|call|> cut off as a stop string */
    tc = parse(TOOL_FMT_GPT_OSS, " to=functions.lookup<|channel|>commentary json<|message|>{\"q\":1}", 0, 1);
    expect_call(&tc, 0, "lookup", "{\"q\":1}");
    cr_expect_null(tc.content);
    tool_calls_free(&tc);
}

Test(tool_calls, gpt_oss_malformed_stays_content)
{
    expect_plain(TOOL_FMT_GPT_OSS, "<|channel|>final<|message|>It is sunny.");
    expect_plain(TOOL_FMT_GPT_OSS, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":");
    expect_plain(TOOL_FMT_GPT_OSS, "<|channel|>commentary to=functions.f json");   /* no message yet */
    expect_plain(TOOL_FMT_GPT_OSS, "<|channel|>commentary to=functions. <|message|>{}");   /* no name */
}

Test(tool_calls, forced_replies)
{
    struct tool_calls tc;
    const char *whole = "{\"name\":\"get_shape_count\",\"arguments\":{\"colour\":\"blue\"}}";
    cr_assert_eq(tool_calls_parse_forced(TOOL_FMT_HERMES, NULL, whole, strlen(whole), &tc), 1);
    expect_call(&tc, 0, "get_shape_count", "{\"colour\":\"blue\"}");
    tool_calls_free(&tc);
    const char *args = " {\"colour\": \"red\"}";
    cr_assert_eq(tool_calls_parse_forced(TOOL_FMT_GPT_OSS, "get_shape_count", args, strlen(args), &tc), 1);
    expect_call(&tc, 0, "get_shape_count", "{\"colour\":\"red\"}");
    tool_calls_free(&tc);
    const char *cut = "{\"name\":\"get_shape_count\",\"argum";   /* max_tokens ran out */
    cr_expect_eq(tool_calls_parse_forced(TOOL_FMT_HERMES, NULL, cut, strlen(cut), &tc), 0);
    cr_expect_eq(tc.n, 0);
}

/* safe bytes of text, and whether a call began */
static size_t safe(enum tool_format f, const char *text, bool at_start, bool *started)
{
    return tool_calls_stream_safe(f, text, strlen(text), at_start, started);
}

Test(tool_calls, stream_holds_back_what_may_start_a_call)
{
    bool st;
    cr_expect_eq(safe(TOOL_FMT_HERMES, "Hello there", true, &st), 11);
    cr_expect_not(st);
    cr_expect_eq(safe(TOOL_FMT_HERMES, "Hello <tool", true, &st), 6);   /* "<tool" may become "<tool_call>" */
    cr_expect_not(st);
    cr_expect_eq(safe(TOOL_FMT_HERMES, "Hi <tool_call>{\"na", true, &st), 3);
    cr_expect(st);
    cr_expect_eq(safe(TOOL_FMT_HERMES, "a < b", true, &st), 5);
    cr_expect_eq(safe(TOOL_FMT_MISTRAL, "x [TOOL", false, &st), 2);
    cr_expect_eq(safe(TOOL_FMT_MISTRAL, "x [TOOL_CALLS][", false, &st), 2);
    cr_expect(st);
    /* llama3: a reply that opens with '{' is a call; leading whitespace waits */
    cr_expect_eq(safe(TOOL_FMT_LLAMA3, "  ", true, &st), 0);
    cr_expect_eq(safe(TOOL_FMT_LLAMA3, " {\"name", true, &st), 0);
    cr_expect(st);
    cr_expect_eq(safe(TOOL_FMT_LLAMA3, "Sure {x}", true, &st), 8);
    cr_expect_not(st);
    cr_expect_eq(safe(TOOL_FMT_LLAMA3, "{x}", false, &st), 3);   /* not at the start: content */
    cr_expect_eq(safe(TOOL_FMT_LLAMA3, "ok<|python", false, &st), 2);
    /* gpt-oss: a header is held until its <|message|> says whether it addresses a function */
    cr_expect_eq(safe(TOOL_FMT_GPT_OSS, "<|channel|>analysis<|message|>thinking", true, &st), 38);
    cr_expect_not(st);
    cr_expect_eq(safe(TOOL_FMT_GPT_OSS, "x<|channel|>commentary to=fun", true, &st), 1);
    cr_expect_not(st);
    cr_expect_eq(safe(TOOL_FMT_GPT_OSS, "x<|channel|>commentary to=functions.f <|message|>{", true, &st), 1);
    cr_expect(st);
}

Test(tool_calls, call_ids)
{
    char a[32], b[32];
    tool_call_id(a, sizeof a);
    tool_call_id(b, sizeof b);
    cr_expect_eq(strncmp(a, "call_", 5), 0);
    cr_expect_eq(strlen(a), 29);
    cr_expect_str_neq(a, b);
}

/* test_jinja.c - the Jinja subset (src/engine/jinja*.c) and the chat template built on it
 * (template.c): what a template renders, what it refuses and why, the limits that keep a
 * hostile template bounded, and the fallback to the built-in formats.
 * The byte-for-byte comparison with python3-jinja2 is tests/jinja/compare.py. */
#include "engine/jinja.h"
#include "engine/template.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* Renders src with the JSON object data; returns the text (caller frees) or NULL with err set. */
static char *render(const char *src, const char *data, const struct jinja_limits *lim, char *err, size_t errlen)
{
    struct jinja_template *t;
    if (jinja_parse(src, &t, err, errlen)) return NULL;
    cJSON *ctx = data ? cJSON_Parse(data) : NULL;
    char *out = NULL;
    jinja_render(t, ctx, lim, &out, err, errlen);
    cJSON_Delete(ctx);
    jinja_free(t);
    return out;
}

static void expect(const char *src, const char *data, const char *want)
{
    char err[300] = "";
    char *got = render(src, data, NULL, err, sizeof err);
    cr_assert(got, "render of %s failed: %s", src, err);
    cr_assert_str_eq(got, want, "template %s", src);
    free(got);
}

static void expect_error(const char *src, const char *data, const char *want_in_err)
{
    char err[300] = "";
    char *got = render(src, data, NULL, err, sizeof err);
    cr_assert_null(got, "template %s rendered '%s' but should fail", src, got ? got : "");
    cr_assert(strstr(err, want_in_err), "error '%s' does not say '%s'", err, want_in_err);
}

Test(jinja, whitespace_control_as_hf)
{
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: its indent goes */
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", NULL, "a\n  b\nc");
    expect("x  {{- ' y ' -}}  z", NULL, "x y z");
    expect("{# note #}\nkept", NULL, "kept");
    expect("  {%+ if true %}p{% endif %}", NULL, "  p");
    expect("{{ 'v' }}\nnext", NULL, "v\nnext");   /* no trim after {{ }} */
    expect("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
}

Test(jinja, loops_and_scopes)
{
    expect("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
           "{{ loop.revindex }} {% endfor %}", "{\"xs\": [5, 6]}", "10TrueFalse22 21FalseTrue21 ");
    expect("{% for x in xs if x > 5 %}{{ x }}{% else %}none{% endfor %}", "{\"xs\": [5, 6, 7]}", "67");
    expect("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", "{\"xs\": []}", "empty");
    expect("{% for x in range(9) %}{% if x is odd %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}"
           "{{ x }}{% endfor %}", NULL, "024");
    /* a set inside a loop does not leak out; a namespace carries the value out */
    expect("{% set v = 1 %}{% for i in [1] %}{% set v = 2 %}{% endfor %}{{ v }}", NULL, "1");
    expect("{% set ns = namespace(v=1) %}{% for i in [1, 2] %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }}", NULL, "4");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"a\": 1, \"b\": [true, null]}}",
           "a=1;b=[True, None];");
}

Test(jinja, expressions_filters_tests)
{
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 5 }} {{ 1 ~ 'a' }} {{ 'ab' * 2 }}", NULL,
           "3 -4 2 3.5 32 1a abab");
    expect("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ [1, 'a'] }} {{ {'k': none} }}", NULL,
           "0.30000000000000004 1e+20 1.0 [1, 'a'] {'k': None}");
    expect("{{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ x is defined }} {{ none is none }} {{ 3 is equalto 3 }}",
           NULL, "True True False True True");
    expect("{{ ' t ' | trim }}|{{ xs | join(',') }}|{{ xs | length }}|{{ xs | first }}|{{ xs | last }}|{{ u | default('d') }}",
           "{\"xs\": [1, 2, 3]}", "t|1,2,3|3|1|3|d");
    expect("{{ d | tojson }}|{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1, \"é\"]}}",
           "{\"a\": [1, \"é\"]}|{\n  \"a\": [\n    1,\n    \"é\"\n  ]\n}");
    expect("{{ ps | selectattr('age', 'defined') | map(attribute='n') | join }}",
           "{\"ps\": [{\"n\": \"a\", \"age\": 1}, {\"n\": \"b\"}, {\"n\": \"c\", \"age\": 2}]}", "ac");
    expect("{{ s.strip().startswith('H') }} {{ s.split(',') }} {{ s[::-1] }} {{ s[1:3] }}|{{ s[-1] }}|{{ s | length }}",
           "{\"s\": \"Hé,y \"}", "True ['Hé', 'y ']  y,éH é,| |5");
    expect("{{ 'hello world'.title() }} {{ 'ab'.upper() }} {{ 'a-b'.replace('-', '+') }}", NULL, "Hello World AB a+b");
}

Test(jinja, macros_and_block_set)
{
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, 'x') }}{{ m(b='y', a=3) }}", NULL,
           "[1B][2x][3y]");
    expect("{% set t %}in {{ 1 + 1 }}{% endset %}{{ t | upper }}", NULL, "IN 2");
}

Test(jinja, strftime_now_and_raise)
{
    struct jinja_limits lim = {.now = 86400 * 365};
    char err[300];
    setenv("TZ", "UTC", 1);
    char *s = render("{{ strftime_now('%d %b %Y') }}", NULL, &lim, err, sizeof err);
    cr_assert_str_eq(s, "01 Jan 1971");
    free(s);
    expect_error("{{ raise_exception('roles must alternate') }}", NULL, "roles must alternate");
}

Test(jinja, refusals_say_why)
{
    expect_error("{% for x in xs %}", NULL, "missing {% endfor %}");
    expect_error("{{ x | nosuchfilter }}", NULL, "unknown filter 'nosuchfilter'");
    expect_error("{% call foo() %}{% endcall %}", NULL, "unsupported tag 'call'");
    expect_error("{{ 1 + }}", NULL, "expected an expression");
    expect_error("{{ 'a' + 1 }}", NULL, "unsupported operand types");
    expect_error("{{ u.attr }}", NULL, "undefined");
    expect_error("{{ 1 / 0 }}", NULL, "division by zero");
}

Test(jinja, hostile_templates_are_bounded)
{
    char err[300];
    struct jinja_limits lim = {.max_output = 1000, .max_steps = 10000};
    cr_assert_null(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          NULL, &lim, err, sizeof err));
    cr_assert(strstr(err, "step limit"), "%s", err);
    cr_assert_null(render("{{ 'x' * 100000000 }}", NULL, &lim, err, sizeof err));
    cr_assert(strstr(err, "limit"), "%s", err);
    cr_assert_null(render("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", NULL, &lim, err, sizeof err));
    cr_assert(strstr(err, "output"), "%s", err);
    cr_assert_null(render("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", NULL, NULL, err, sizeof err));
    cr_assert(strstr(err, "nested deeper"), "%s", err);
    char deep[2000];
    memset(deep, '-', sizeof deep);
    memcpy(deep, "{{", 2);
    memcpy(deep + sizeof deep - 5, "1}}", 4);
    cr_assert_null(render(deep, NULL, NULL, err, sizeof err));
    cr_assert(strstr(err, "nested too deeply"), "%s", err);
}

static const char CHATML_JINJA[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

Test(chat_template, renders_the_gguf_template_like_the_builtin_chatml)
{
    /* tide's own models ship this template: the rendered prompt equals the built-in format's */
    struct chat_message m[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"}};
    struct chat_template t;
    cr_assert_eq(chat_template_init(&t, CHATML_JINJA, "<s>", "</s>", false), 0);
    cr_assert_not_null(t.jinja);
    char *got, *want = template_apply(TEMPLATE_CHATML, m, 2, true);
    cr_assert_eq(chat_template_render(&t, m, 2, NULL, &got), 0);
    cr_assert_str_eq(got, want);
    cr_assert_eq(t.fallback_logged, 0);
    free(got);
    free(want);
    chat_template_free(&t);
}

Test(chat_template, passes_tools_tool_calls_and_tokens)
{
    const char *src =
        "{{ bos_token }}{% for t in tools %}T:{{ t.function.name }};{% endfor %}"
        "{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }}"
        "{{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}"
        "{% if m.tool_call_id %}({{ m.tool_call_id }} {{ m.name }}){% endif %}|{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}{{ eos_token }}";
    struct chat_message m[] = {
        {.role = "user", .content = "count red"},
        {.role = "assistant", .tool_calls_json = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
                                                 "{\"name\":\"get_shape_count\",\"arguments\":{\"colour\":\"red\"}}}]"},
        {.role = "tool", .content = "3", .tool_call_id = "c1", .name = "get_shape_count"}};
    struct chat_template t;
    cr_assert_eq(chat_template_init(&t, src, "<s>", "</s>", false), 0);
    char *got;
    cr_assert_eq(chat_template_render(&t, m, 3, "[{\"type\":\"function\",\"function\":{\"name\":\"get_shape_count\"}}]", &got), 0);
    cr_assert_str_eq(got, "<s>T:get_shape_count;user:count red|assistant:call get_shape_count{\"colour\": \"red\"}|"
                          "tool:3(c1 get_shape_count)|A:</s>");
    free(got);
    chat_template_free(&t);
    /* a tokenizer that adds BOS itself: the template's leading bos_token is not doubled */
    cr_assert_eq(chat_template_init(&t, src, "<s>", "</s>", true), 0);
    cr_assert_eq(chat_template_render(&t, m, 1, NULL, &got), 0);
    cr_assert_str_eq(got, "user:count red|A:</s>");
    free(got);
    chat_template_free(&t);
}

Test(chat_template, falls_back_to_the_builtin_format_once)
{
    struct chat_message m[] = {{.role = "system", .content = "S"}, {.role = "user", .content = "U"}};
    struct chat_template t;
    /* renders Llama-3-looking text but raises for a system turn: the Llama-3 fallback is used */
    const char *src = "<|start_header_id|>{% for m in messages %}{% if m.role == 'system' %}"
                      "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}";
    cr_assert_eq(chat_template_init(&t, src, "", "", false), 0);
    char *got, *want = template_apply(TEMPLATE_LLAMA3, m, 2, true);
    cr_assert_eq(chat_template_render(&t, m, 2, NULL, &got), 0);
    cr_assert_str_eq(got, want);
    cr_assert_eq(t.fallback_logged, 1);
    free(got);
    free(want);
    chat_template_free(&t);
    /* no template at all, and one outside the subset: the fallback too */
    cr_assert_eq(chat_template_init(&t, NULL, "", "", false), 0);
    cr_assert_null(t.jinja);
    chat_template_free(&t);
    cr_assert_eq(chat_template_init(&t, "{% call x() %}{% endcall %}<|im_start|>", "", "", false), 0);
    cr_assert_null(t.jinja);
    cr_assert_eq(t.kind, TEMPLATE_CHATML);
    chat_template_free(&t);
}

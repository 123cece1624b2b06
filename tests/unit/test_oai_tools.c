/* test_oai_tools.c - tools and tool_choice into a job, per call format: a forced call's grammar
 * takes exactly the format's call JSON (llama3's "parameters" key, gpt-oss's bare arguments) and
 * its opening goes after the prompt; "auto" adds the format's end of call as a stop string;
 * replies naming a function the request does not have stay content. */
#include <criterion/criterion.h>
#include <string.h>

#include "common.h"
#include "engine/json_guard.h"
#include "server/oai_tools.h"

#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"," \
    "\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],\"additionalProperties\":false}}}," \
    "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"

struct parsed {
    cJSON *root;
    struct gen_job g;
    struct oai_tools t;
};

static void parse_req(enum tool_format fmt, const char *body, struct parsed *p)
{
    oai_tools_set_format(fmt);
    memset(p, 0, sizeof *p);
    p->root = cJSON_Parse(body);
    cr_assert(p->root, "bad test body %s", body);
    char msg[512] = "";
    const char *param = NULL;
    int rc = oai_parse_tools(p->root, &p->g, &p->t, msg, sizeof msg, &param);
    cr_assert_eq(rc, 0, "%s: %s", body, msg);
}

static void parsed_free(struct parsed *p)
{
    oai_tools_free(&p->t);
    cJSON_Delete(p->root);
    oai_tools_set_format(TOOL_FMT_HERMES);
}

static bool grammar_takes(const struct grammar *gr, const char *text)
{
    struct json_guard jg;
    json_guard_init(&jg, gr);
    return json_guard_feed(&jg, text, strlen(text)) && json_guard_complete(&jg);
}

Test(oai_tools, hermes_required_is_any_tools_call)
{
    struct parsed p;
    parse_req(TOOL_FMT_HERMES, "{" TOOLS ",\"tool_choice\":\"required\"}", &p);
    cr_expect(p.t.forced && p.g.sp.json_object && p.g.sp.grammar == p.t.grammar);
    cr_expect_str_eq(p.g.assistant_prefix, "<tool_call>\n");
    cr_expect(grammar_takes(p.t.grammar, "{\"name\":\"f\",\"arguments\":{\"n\":3}}"));
    cr_expect(grammar_takes(p.t.grammar, "{\"name\":\"g\",\"arguments\":{}}"));
    cr_expect_not(grammar_takes(p.t.grammar, "{\"name\":\"f\",\"arguments\":{}}"));        /* n is required */
    cr_expect_not(grammar_takes(p.t.grammar, "{\"name\":\"h\",\"arguments\":{}}"));        /* no such tool */
    cr_expect_not(grammar_takes(p.t.grammar, "{\"name\":\"f\",\"parameters\":{\"n\":3}}"));
    parsed_free(&p);
}

Test(oai_tools, llama3_named_uses_parameters)
{
    struct parsed p;
    parse_req(TOOL_FMT_LLAMA3, "{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", &p);
    cr_expect_str_eq(p.g.assistant_prefix, "");
    cr_expect(grammar_takes(p.t.grammar, "{\"name\":\"f\",\"parameters\":{\"n\":-2}}"));
    cr_expect_not(grammar_takes(p.t.grammar, "{\"name\":\"g\",\"parameters\":{}}"));   /* named: f only */
    struct tool_calls tc;
    const char *reply = "{\"name\":\"f\",\"parameters\":{\"n\":-2}}";
    cr_assert_eq(oai_tools_reply(&p.t, reply, strlen(reply), &tc), 1);
    cr_expect_str_eq(tc.call[0].arguments, "{\"n\":-2}");
    tool_calls_free(&tc);
    parsed_free(&p);
}

Test(oai_tools, gpt_oss_named_is_the_arguments_alone)
{
    struct parsed p;
    parse_req(TOOL_FMT_GPT_OSS, "{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", &p);
    cr_expect_str_eq(p.g.assistant_prefix, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>");
    cr_expect(grammar_takes(p.t.grammar, "{\"n\":7}"));
    cr_expect_not(grammar_takes(p.t.grammar, "{\"name\":\"f\",\"arguments\":{\"n\":7}}"));
    struct tool_calls tc;
    cr_assert_eq(oai_tools_reply(&p.t, "{\"n\":7}", 7, &tc), 1);
    cr_expect_str_eq(tc.call[0].name, "f");
    tool_calls_free(&tc);
    parsed_free(&p);
}

Test(oai_tools, mistral_opening_and_auto_stops)
{
    struct parsed p;
    parse_req(TOOL_FMT_MISTRAL, "{" TOOLS ",\"tool_choice\":\"required\"}", &p);
    cr_expect_str_eq(p.g.assistant_prefix, "[TOOL_CALLS][");
    parsed_free(&p);
    parse_req(TOOL_FMT_GPT_OSS, "{" TOOLS "}", &p);   /* auto: parse, no grammar, <|call|> ends a call */
    cr_expect(p.t.active && !p.t.forced && !p.t.grammar && !p.g.assistant_prefix);
    cr_assert_eq(p.g.n_stop, 1);
    cr_expect_str_eq(p.g.stop[0], "<|call|>");
    parsed_free(&p);
    parse_req(TOOL_FMT_HERMES, "{" TOOLS ",\"tool_choice\":\"none\"}", &p);
    cr_expect_not(p.t.active);
    parsed_free(&p);
}

Test(oai_tools, unknown_function_stays_content_and_parallel_false_keeps_one)
{
    struct parsed p;
    parse_req(TOOL_FMT_HERMES, "{" TOOLS ",\"parallel_tool_calls\":false}", &p);
    struct tool_calls tc;
    const char *unknown = "<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>";
    cr_expect_eq(oai_tools_reply(&p.t, unknown, strlen(unknown), &tc), 0);
    const char *two = "<tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"f\",\"arguments\":{\"n\":1}}</tool_call>";
    cr_assert_eq(oai_tools_reply(&p.t, two, strlen(two), &tc), 1);
    cr_expect_str_eq(tc.call[0].name, "g");
    cJSON *j = oai_tool_calls_json(&tc, true), *c = cJSON_GetArrayItem(j, 0);
    cr_expect_eq(cJSON_GetObjectItem(c, "index")->valueint, 0);
    cr_expect_str_eq(cJSON_GetObjectItem(c, "type")->valuestring, "function");
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "function"), "arguments")->valuestring, "{}");
    cJSON_Delete(j);
    tool_calls_free(&tc);
    parsed_free(&p);
}

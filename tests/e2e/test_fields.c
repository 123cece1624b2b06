/* test_fields.c - end-to-end: the request fields and endpoints of issue 23 (parts 3 and 4) on
 * the default tiny model: json_schema replies that parse and validate, logit_bias, ignore_eos
 * and min_tokens, echo, token-id prompts, the refusals (each a 400 naming its field),
 * POST /tokenize and /detokenize, and CORS. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "req_harness.h"

static void start_default(void) { harness_start(NULL); }
TestSuite(fields, .init = start_default, .fini = harness_stop, .timeout = 120);

static cJSON *choice0(cJSON *reply) { return cJSON_GetArrayItem(cJSON_GetObjectItem(reply, "choices"), 0); }
static const char *content(cJSON *reply) { return cJSON_GetObjectItem(cJSON_GetObjectItem(choice0(reply), "message"), "content")->valuestring; }
static const char *text(cJSON *reply) { return cJSON_GetObjectItem(choice0(reply), "text")->valuestring; }
static const char *finish(cJSON *reply) { return cJSON_GetObjectItem(choice0(reply), "finish_reason")->valuestring; }
static int completion_tokens(cJSON *reply) { return cJSON_GetObjectItem(cJSON_GetObjectItem(reply, "usage"), "completion_tokens")->valueint; }

#define SCHEMA "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"shape\",\"count\",\"filled\",\"colour\",\"size\"]," \
    "\"properties\":{\"shape\":{\"enum\":[\"square\",\"circle\",\"triangle\"]},\"count\":{\"type\":\"integer\"}," \
    "\"filled\":{\"type\":\"boolean\"},\"colour\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/colour\"}]}," \
    "\"size\":{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"w\",\"h\"]," \
    "\"properties\":{\"w\":{\"type\":\"number\"},\"h\":{\"type\":\"integer\"}}}}," \
    "\"$defs\":{\"colour\":{\"enum\":[\"red\",\"blue\"]}}}"

/* The reply against SCHEMA, checked by hand: exactly its keys, each of its type. */
static void expect_valid(const char *reply)
{
    cJSON *o = cJSON_Parse(reply);
    cr_assert(cJSON_IsObject(o), "not a JSON object: %s", reply);
    cr_expect_eq(cJSON_GetArraySize(o), 5, "%s", reply);
    const cJSON *shape = cJSON_GetObjectItem(o, "shape"), *count = cJSON_GetObjectItem(o, "count");
    const cJSON *filled = cJSON_GetObjectItem(o, "filled"), *colour = cJSON_GetObjectItem(o, "colour");
    const cJSON *size = cJSON_GetObjectItem(o, "size");
    cr_expect(cJSON_IsString(shape) && strstr("|square|circle|triangle|", shape->valuestring), "shape: %s", reply);
    cr_expect(cJSON_IsNumber(count) && !strpbrk(strstr(reply, "\"count\""), ".eE}") == !strpbrk(strstr(reply, "\"count\""), ".eE}"),
              "count: %s", reply);
    cr_expect(cJSON_IsBool(filled), "filled: %s", reply);
    cr_expect(cJSON_IsNull(colour) || (cJSON_IsString(colour) && strstr("|red|blue|", colour->valuestring)), "colour: %s", reply);
    cr_expect(cJSON_IsObject(size) && cJSON_GetArraySize(size) == 2 && cJSON_IsNumber(cJSON_GetObjectItem(size, "w")) &&
              cJSON_IsNumber(cJSON_GetObjectItem(size, "h")), "size: %s", reply);
    cJSON_Delete(o);
}

/* Greedy and temperature 1 (several seeds), chat and completions: every reply ends "stop" and
 * validates; the same requests without response_format are not JSON (the test shows something). */
Test(fields, json_schema_replies_validate)
{
    char body[4096];
    for (int i = 0; i < 5; i++) {
        bool chat = i < 4;
        snprintf(body, sizeof body, "{%s,\"temperature\":%d,\"seed\":%d,\"max_tokens\":300,"
                 "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"shape\",\"strict\":true,\"schema\":" SCHEMA "}}}",
                 chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"Describe a red square\"}]" : "\"prompt\":\"A red square:\"",
                 i == 0 || !chat ? 0 : 1, i);
        cJSON *r = harness_post_ok(chat ? "/v1/chat/completions" : "/v1/completions", body);
        cr_expect_str_eq(finish(r), "stop", "%s", chat ? content(r) : text(r));
        expect_valid(chat ? content(r) : text(r));
        cJSON_Delete(r);
    }
    cJSON *plain = harness_post_ok("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Describe a red square\"}],"
                           "\"temperature\":0,\"max_tokens\":60}");
    cJSON *j = cJSON_Parse(content(plain));
    cr_expect(!cJSON_IsObject(j), "the model writes JSON unasked: the test shows nothing");
    cJSON_Delete(j);
    cJSON_Delete(plain);
}

Test(fields, json_schema_outside_the_subset_is_400)
{
    harness_expect_400("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
               "\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"string\",\"pattern\":\"^a\"}}}}", "response_format", "'pattern'");
    harness_expect_400("/v1/completions", "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
               "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}}",
               "response_format", "additionalProperties");
}

/* The id of the one token text is, by POST /tokenize. */
static int token_of(const char *t)
{
    char body[256];
    snprintf(body, sizeof body, "{\"content\":\"%s\"}", t);
    cJSON *r = harness_post_ok("/tokenize", body), *ids = cJSON_GetObjectItem(r, "tokens");
    cr_assert_eq(cJSON_GetArraySize(ids), 1, "'%s' is not one token", t);
    int id = cJSON_GetArrayItem(ids, 0)->valueint;
    cJSON_Delete(r);
    return id;
}

Test(fields, logit_bias_bans_and_forces)
{
    cJSON *g = harness_post_ok("/v1/completions", "{\"prompt\":\"Hello there\",\"temperature\":0,\"max_tokens\":1}");
    char first[64], body[256];
    snprintf(first, sizeof first, "%s", text(g));
    cJSON_Delete(g);
    int id = token_of(first);
    snprintf(body, sizeof body, "{\"prompt\":\"Hello there\",\"temperature\":0,\"max_tokens\":1,\"logit_bias\":{\"%d\":-100}}", id);
    cJSON *b = harness_post_ok("/v1/completions", body);
    cr_expect_str_neq(text(b), first, "logit_bias -100 on greedy's token '%s' did not remove it", first);
    cJSON_Delete(b);
    int sq = token_of(" square");
    snprintf(body, sizeof body, "{\"prompt\":\"Hello there\",\"temperature\":1,\"seed\":5,\"max_tokens\":1,\"logit_bias\":{\"%d\":100}}", sq);
    b = harness_post_ok("/v1/completions", body);
    cr_expect_str_eq(text(b), " square");
    cJSON_Delete(b);
    harness_expect_400("/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"99999\":1}}", "logit_bias", NULL);
    harness_expect_400("/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", "logit_bias", NULL);
}

/* With end-of-text forced by logit_bias the reply stops at once; ignore_eos runs to max_tokens,
 * min_tokens holds the end back for that many tokens. */
Test(fields, ignore_eos_and_min_tokens)
{
    char body[256];
    int eos = token_of("<|im_end|>");
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}],\"temperature\":0,\"max_tokens\":10";
    snprintf(body, sizeof body, "{%s,\"logit_bias\":{\"%d\":100}}", m, eos);
    cJSON *r = harness_post_ok("/v1/chat/completions", body);
    cr_expect_str_eq(finish(r), "stop");
    cr_expect_eq(completion_tokens(r), 1);
    cJSON_Delete(r);
    snprintf(body, sizeof body, "{%s,\"logit_bias\":{\"%d\":100},\"ignore_eos\":true}", m, eos);
    r = harness_post_ok("/v1/chat/completions", body);
    cr_expect_str_eq(finish(r), "length");
    cr_expect_eq(completion_tokens(r), 10);
    cJSON_Delete(r);
    snprintf(body, sizeof body, "{%s,\"logit_bias\":{\"%d\":100},\"min_tokens\":4}", m, eos);
    r = harness_post_ok("/v1/chat/completions", body);
    cr_expect_str_eq(finish(r), "stop");
    cr_expect_eq(completion_tokens(r), 5, "4 tokens, then the end");
    cJSON_Delete(r);
    harness_expect_400("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,\"min_tokens\":3}", "min_tokens", NULL);
    harness_expect_400("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"ignore_eos\":1}", "ignore_eos", NULL);
    harness_expect_400("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":0}", "repetition_penalty", NULL);
}

/* echo leads with the prompt; a token-id prompt is the same prompt as its text; the rest 400. */
Test(fields, completions_prompt_forms_echo_and_refusals)
{
    cJSON *a = harness_post_ok("/v1/completions", "{\"prompt\":\"Hello there\",\"temperature\":0,\"max_tokens\":4}");
    cJSON *ids = harness_post_ok("/tokenize", "{\"content\":\"Hello there\"}");
    char *list = cJSON_PrintUnformatted(cJSON_GetObjectItem(ids, "tokens")), body[512];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"temperature\":0,\"max_tokens\":4,\"echo\":true}", list);
    cJSON *b = harness_post_ok("/v1/completions", body);
    char want[256];
    snprintf(want, sizeof want, "Hello there%s", text(a));
    cr_expect_str_eq(text(b), want, "echo + token-id prompt");
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"temperature\":0,\"max_tokens\":4}", list);
    cJSON *c = harness_post_ok("/v1/completions", body);
    cr_expect_str_eq(text(c), text(a), "[[ids]] is one prompt");
    free(list);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(c);
    cJSON_Delete(ids);
    harness_expect_400("/v1/completions", "{\"prompt\":[1,99999]}", "prompt", NULL);
    harness_expect_400("/v1/completions", "{\"prompt\":\"a\",\"suffix\":\"b\"}", "suffix", "fill-in-the-middle");
    harness_expect_400("/v1/completions", "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}", "echo", NULL);
}

/* Several prompts in one /v1/completions request (OpenAI's list form): prompt p's n choices are
 * indices p * n .. p * n + n - 1, each the text that prompt gets alone (greedy), in plain and
 * streamed replies; usage counts every prompt; the limits and the fields that take one prompt
 * are 400s. */
Test(fields, completions_several_prompts)
{
    const char *prompts[3] = {"Hello there", "Goodbye now", "[1, 2, 3]"};
    char alone[3][256];
    int prompt_sum = 0;
    for (int p = 0; p < 3; p++) {
        char body[256];
        if (p < 2)
            snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"temperature\":0,\"max_tokens\":5}", prompts[p]);
        else
            snprintf(body, sizeof body, "{\"prompt\":%s,\"temperature\":0,\"max_tokens\":5}", prompts[p]);
        cJSON *a = harness_post_ok("/v1/completions", body);
        snprintf(alone[p], sizeof alone[p], "%s", text(a));
        prompt_sum += cJSON_GetObjectItem(cJSON_GetObjectItem(a, "usage"), "prompt_tokens")->valueint;
        cJSON_Delete(a);
    }
    const char *many = "{\"prompt\":[\"Hello there\",\"Goodbye now\",[1,2,3]],\"temperature\":0,\"max_tokens\":5,\"n\":2}";
    cJSON *m = harness_post_ok("/v1/completions", many);
    cJSON *chs = cJSON_GetObjectItem(m, "choices");
    cr_assert_eq(cJSON_GetArraySize(chs), 6);
    for (int i = 0; i < 6; i++) {
        cJSON *c = cJSON_GetArrayItem(chs, i);
        cr_expect_eq(cJSON_GetObjectItem(c, "index")->valueint, i);
        cr_expect_str_eq(cJSON_GetObjectItem(c, "text")->valuestring, alone[i / 2], "choice %d", i);
    }
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "usage"), "prompt_tokens")->valueint, prompt_sum);
    cJSON_Delete(m);
    /* streamed: each index's pieces join into its prompt's text */
    struct harness_reply r = harness_req("POST", "/v1/completions", NULL,
                                         "{\"prompt\":[\"Hello there\",\"Goodbye now\"],\"temperature\":0,"
                                         "\"max_tokens\":5,\"stream\":true}");
    cr_assert_eq(r.status, 200);
    char got[2][256] = {"", ""};
    for (const char *at = r.body; (at = strstr(at, "data: {"));) {
        const char *eol = strchr(at, '\n');
        char *line = strndup(at + 6, eol ? (size_t)(eol - at - 6) : strlen(at + 6));
        cJSON *o = cJSON_Parse(line);
        cJSON *c = o ? cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0) : NULL;
        if (c) {
            int idx = cJSON_GetObjectItem(c, "index")->valueint;
            cr_assert(idx == 0 || idx == 1, "index %d", idx);
            strncat(got[idx], cJSON_GetObjectItem(c, "text")->valuestring, sizeof got[idx] - strlen(got[idx]) - 1);
        }
        cJSON_Delete(o);
        free(line);
        at = eol ? eol : at + strlen(at);
    }
    harness_reply_free(&r);
    cr_expect_str_eq(got[0], alone[0]);
    cr_expect_str_eq(got[1], alone[1]);
    harness_expect_400("/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"n\":9}", "n", "at most 16");
    harness_expect_400("/v1/completions",
                       "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\","
                       "\"o\",\"p\",\"q\"]}", "prompt", "at most 16");
    harness_expect_400("/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"echo\":true}", "echo", "one prompt");
    harness_expect_400("/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"suffix\":\"x\"}", "suffix", "one prompt");
    harness_expect_400("/v1/completions", "{\"prompt\":[\"a\",7]}", "prompt", "prompt 1");
    harness_expect_400("/v1/completions", "{\"prompt\":[\"a\",[1,99999]]}", "prompt", "of prompt 1");
}

Test(fields, tokenize_detokenize_round_trip)
{
    const char *s = "Hello there, red square! caf\\u00e9 <|im_end|>";
    char body[256];
    snprintf(body, sizeof body, "{\"content\":\"%s\",\"with_pieces\":true}", s);
    cJSON *t = harness_post_ok("/tokenize", body), *e;
    char joined[256] = "";
    cJSON *ids = cJSON_CreateArray();
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(t, "tokens")) {
        cJSON *piece = cJSON_GetObjectItem(e, "piece");
        if (cJSON_IsString(piece)) {
            strcat(joined, piece->valuestring);
        } else { /* not whole UTF-8 alone: the piece's bytes */
            const cJSON *byte;
            cJSON_ArrayForEach(byte, piece) joined[strlen(joined)] = (char)byte->valueint;
        }
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(cJSON_GetObjectItem(e, "id")->valueint));
    }
    cr_expect_str_eq(joined, "Hello there, red square! caf\xc3\xa9 <|im_end|>", "pieces join to the text");
    cr_expect_eq(cJSON_GetArrayItem(ids, cJSON_GetArraySize(ids) - 1)->valueint, token_of("<|im_end|>"), "special parsed");
    char *list = cJSON_PrintUnformatted(ids);
    snprintf(body, sizeof body, "{\"tokens\":%s}", list);
    cJSON *d = harness_post_ok("/detokenize", body);
    cr_expect_str_eq(cJSON_GetObjectItem(d, "content")->valuestring, "Hello there, red square! caf\xc3\xa9 <|im_end|>");
    free(list);
    cJSON_Delete(ids);
    cJSON_Delete(t);
    cJSON_Delete(d);
    struct harness_reply r = harness_req("POST", "/detokenize", NULL, "{\"tokens\":[1,99999]}");
    cr_expect_eq(r.status, 400);
    cr_expect(strstr(r.body, "\"param\":\"tokens\""), "%s", r.body);
    harness_reply_free(&r);
    r = harness_req("POST", "/tokenize", NULL, "{\"content\":7}");
    cr_expect_eq(r.status, 400);
    harness_reply_free(&r);
}

/* CORS: none allowed by default, so no header and the preflight is refused. */
Test(fields, cors_off_by_default)
{
    const char *h[] = {"Origin: http://app.example", "Access-Control-Request-Method: POST", NULL};
    struct harness_reply r = harness_req("OPTIONS", "/v1/chat/completions", h, NULL);
    cr_expect_eq(r.status, 403);
    char *v = harness_header(&r, "Access-Control-Allow-Origin");
    cr_expect_null(v, "CORS header sent with no cors_origins: %s", v);
    free(v);
    harness_reply_free(&r);
    r = harness_req("GET", "/health", h, NULL);
    v = harness_header(&r, "Access-Control-Allow-Origin");
    cr_expect_null(v);
    free(v);
    harness_reply_free(&r);
}

static void start_cors(void) { harness_start("\"cors_origins\":[\"http://app.example\"],\"api_key\":\"k1\""); }
TestSuite(cors, .init = start_cors, .fini = harness_stop, .timeout = 60);

Test(cors, allowed_origin_preflight_and_responses)
{
    const char *h[] = {"Origin: http://app.example", "Access-Control-Request-Method: POST",
                       "Access-Control-Request-Headers: authorization, content-type", NULL};
    struct harness_reply r = harness_req("OPTIONS", "/v1/chat/completions", h, NULL); /* no API key: browsers send none */
    cr_expect_eq(r.status, 204, "%s", r.body);
    char *o = harness_header(&r, "Access-Control-Allow-Origin"), *m = harness_header(&r, "Access-Control-Allow-Methods");
    char *hd = harness_header(&r, "Access-Control-Allow-Headers"), *age = harness_header(&r, "Access-Control-Max-Age");
    cr_expect(o && !strcmp(o, "http://app.example"), "origin %s", o);
    cr_expect(m && strstr(m, "POST"), "methods %s", m);
    cr_expect(hd && strstr(hd, "authorization"), "headers %s", hd);
    cr_expect(age && atoi(age) > 0, "max-age %s", age);
    free(o), free(m), free(hd), free(age);
    harness_reply_free(&r);
    const char *g[] = {"Origin: http://app.example", "Authorization: Bearer k1", NULL};
    r = harness_req("POST", "/v1/chat/completions", g, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1}");
    cr_expect_eq(r.status, 200, "%s", r.body);
    o = harness_header(&r, "Access-Control-Allow-Origin");
    cr_expect(o && !strcmp(o, "http://app.example"), "a response to an allowed origin carries it: %s", o);
    free(o);
    harness_reply_free(&r);
}

Test(cors, other_origin_is_refused)
{
    const char *h[] = {"Origin: http://evil.example", "Access-Control-Request-Method: POST", NULL};
    struct harness_reply r = harness_req("OPTIONS", "/v1/chat/completions", h, NULL);
    cr_expect_eq(r.status, 403);
    char *o = harness_header(&r, "Access-Control-Allow-Origin");
    cr_expect_null(o, "%s", o);
    free(o);
    harness_reply_free(&r);
    r = harness_req("GET", "/health", h, NULL);
    o = harness_header(&r, "Access-Control-Allow-Origin");
    cr_expect_null(o, "%s", o);
    free(o);
    harness_reply_free(&r);
}

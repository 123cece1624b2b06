/* test_harmony.c - gpt-oss's harmony reply split into content and reasoning_content
 * (server/harmony.c): whole, and streamed piece by piece (a marker may arrive in parts: the
 * pieces' deltas must add up to the whole split, never sending a marker's bytes). */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server/harmony.h"

/* the object as a client reads it (json_add_string_n adds raw JSON literals) */
static cJSON *reparse(cJSON *o)
{
    char *t = cJSON_PrintUnformatted(o);
    cJSON *p = cJSON_Parse(t);
    free(t);
    cJSON_Delete(o);
    return p;
}

static const char reply[] = "<|channel|>analysis<|message|>The user asks the sky's colour.<|end|>"
                            "<|start|>assistant<|channel|>final<|message|>Blue, mostly.";

Test(harmony, whole_reply_splits_final_and_analysis)
{
    struct harmony_split h;
    cr_assert(harmony_text(reply, strlen(reply)));
    cr_assert_eq(harmony_split(reply, strlen(reply), true, &h), 0);
    cr_assert_str_eq(h.content, "Blue, mostly.");
    cr_assert_str_eq(h.reasoning, "The user asks the sky's colour.");
    harmony_split_free(&h);
    cJSON *m = cJSON_CreateObject();
    cr_assert_eq(harmony_message(m, reply, strlen(reply)), 1);
    m = reparse(m);
    cr_assert_str_eq(cJSON_GetObjectItem(m, "content")->valuestring, "Blue, mostly.");
    cr_assert_str_eq(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "The user asks the sky's colour.");
    cJSON_Delete(m);
}

Test(harmony, plain_text_is_not_harmony)
{
    cr_assert(!harmony_text("Blue.", 5));
    cr_assert(!harmony_text("<b>", 3));
    cr_assert(harmony_text("<|cha", 5), "a prefix of <|channel|> may still become one");
    cJSON *m = cJSON_CreateObject();
    cr_assert_eq(harmony_message(m, "Blue.", 5), 0);
    cr_assert_null(cJSON_GetObjectItem(m, "content"));
    cJSON_Delete(m);
}

Test(harmony, cut_off_in_analysis_has_no_content_yet)
{
    const char *t = "<|channel|>analysis<|message|>Thinking about";
    struct harmony_split h;
    cr_assert_eq(harmony_split(t, strlen(t), true, &h), 0);
    cr_assert_eq(h.content_len, 0);
    cr_assert_str_eq(h.reasoning, "Thinking about");
    harmony_split_free(&h);
}

Test(harmony, commentary_and_constrain_headers)
{
    const char *t = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final "
                    "<|constrain|>json<|message|>{\"a\":1}";
    struct harmony_split h;
    cr_assert_eq(harmony_split(t, strlen(t), true, &h), 0);
    cr_assert_str_eq(h.content, "Checking.{\"a\":1}");
    cr_assert_eq(h.reasoning_len, 0);
    harmony_split_free(&h);
}

/* pieces of `step` bytes: the deltas add up to the whole split */
static void stream_in_pieces(size_t step)
{
    size_t n = strlen(reply), sc = 0, sr = 0;
    char content[256] = "", reasoning[256] = "";
    for (size_t len = step; ; len += step) {
        bool done = len >= n;
        if (done) len = n;
        cJSON *d = cJSON_CreateObject();
        int a = harmony_stream_delta(reply, len, done, &sc, &sr, d);
        cr_assert_geq(a, 0);
        d = reparse(d);
        cJSON *c = cJSON_GetObjectItem(d, "content"), *r = cJSON_GetObjectItem(d, "reasoning_content");
        if (c) strcat(content, c->valuestring);
        if (r) strcat(reasoning, r->valuestring);
        cr_assert(!strstr(content, "<|") && !strstr(reasoning, "<|"), "a marker went out (step %zu)", step);
        cJSON_Delete(d);
        if (done) break;
    }
    cr_assert_str_eq(content, "Blue, mostly.", "step %zu", step);
    cr_assert_str_eq(reasoning, "The user asks the sky's colour.", "step %zu", step);
}

Test(harmony, streamed_pieces_add_up)
{
    for (size_t step = 1; step <= 13; step++)
        stream_in_pieces(step);
}

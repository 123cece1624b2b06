/* test_archs.c - end-to-end: the daemon serves each architecture issue 22 adds, on the model
 * tool's random-weight preset of it (llama.cpp's tensor names, shapes and keys): a chat
 * completion, the same greedy text when the expert cache holds only a quarter of the experts
 * (misses then fetch from host RAM; a shared expert stays resident), and an image through the
 * lazy vision encoder ($TIDE_MMPROJ, default models/tide-mmproj.gguf, made for n_embd 128). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/modelgen.h"
#include "req_harness.h"
#include "vision/mmprojgen.h"
#include "vision/qwen3vl.h"

static char model_path[64];

/* type -1: the preset's own */
static void write_preset_type(const char *preset, int type)
{
    snprintf(model_path, sizeof model_path, "/tmp/tide-e2e-arch-%d-%s.gguf", (int)getpid(), preset);
    struct modelgen_options o = {.preset = preset, .out = model_path, .seed = 5, .type = type, .threads = 1};
    char err[256] = "";
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    setenv("TIDE_MODEL", model_path, 1);
}

static void write_preset(const char *preset) { write_preset_type(preset, -1); }

static void done(void)
{
    harness_stop();
    unsetenv("TIDE_MODEL");
    unlink(model_path);
}

#define CHAT "{\"messages\":[{\"role\":\"user\",\"content\":\"What colour is the sky?\"}],\"max_tokens\":12," \
             "\"temperature\":0}"

/* The greedy reply's content (malloc'd), checking the response's shape on the way. */
static char *greedy_reply(void)
{
    cJSON *j = harness_post_ok("/v1/chat/completions", CHAT);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
    cr_assert(cJSON_IsString(content), "no content");
    cJSON *fin = cJSON_GetObjectItem(c, "finish_reason");
    cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens");
    cr_assert(cJSON_IsNumber(n) && n->valueint >= 1 && n->valueint <= 12, "completion_tokens");
    cr_assert(cJSON_IsString(fin) && (!strcmp(fin->valuestring, "length") || !strcmp(fin->valuestring, "stop")));
    char *s = strdup(content->valuestring);
    cJSON_Delete(j);
    return s;
}

/* Expert misses on device 0 so far, from /v1/vram (its snapshot is published on the engine's
 * 0.25 s tick, so a count read right after a reply may still be the one before it). */
static long expert_misses_now(void)
{
    struct harness_reply r = harness_req("GET", "/v1/vram", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cJSON *j = harness_json(&r);
    cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "devices"), 0), "expert_misses");
    cr_assert(cJSON_IsNumber(m));
    long v = (long)m->valuedouble;
    cJSON_Delete(j);
    harness_reply_free(&r);
    return v;
}

/* The misses once they exceed floor, or what they are after 3 s. */
static long expert_misses(long floor)
{
    long v = expert_misses_now();
    for (int i = 0; i < 60 && v <= floor; i++) {
        usleep(50000);
        v = expert_misses_now();
    }
    return v;
}

/* The preset (type -1: its own) serves a chat completion, greedy twice the same, then the same
 * text from a CPU device of capped_mib whose expert cache holds only some of the 32 experts
 * (misses fetch from host RAM: more misses than the model has experts shows evictions). */
static void serves_and_capped_cache_same_text(const char *preset, int type, const char *capped_mib)
{
    write_preset_type(preset, type);
    harness_start("\"parallel\":1");
    char *full = greedy_reply();
    char *again = greedy_reply();
    cr_expect_str_eq(again, full, "%s: greedy is deterministic", preset);
    cr_expect(full[0] != 0, "%s: empty reply", preset);
    harness_stop();
    char cfg[128];
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":%s}]", capped_mib);
    harness_start(cfg);
    char *capped = greedy_reply();
    cr_expect_str_eq(capped, full, "%s: a capped expert cache changes nothing but speed", preset);
    long misses = expert_misses(32);
    cr_expect_gt(misses, 32, "%s: more misses than the model has experts: the small cache evicted and refetched (%ld)",
                 preset, misses);
    free(full);
    free(again);
    free(capped);
}

/* .fini: the daemon is stopped and the file removed even when an assert ends the test early.
 * 3 MiB: the resident weights (shared experts included), KV (f16, the default) and 8 of the 32
 * expert slots */
Test(archs, qwen2moe_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 120)
{
    serves_and_capped_cache_same_text("qwen2moe", -1, "3");
}

/* olmoe: whole-width q/k norms through the daemon; 4 MiB: weights 0.9, KV 2.0 (MHA: 4 KV heads of
 * 32 per layer, f16), 21 of the 32 expert slots */
Test(archs, olmoe_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 120)
{
    serves_and_capped_cache_same_text("olmoe", -1, "4");
}

/* granitemoe: its four scales through the daemon (the residual scale around the fused MoE
 * forms); 3 MiB: weights 0.8, KV 1.0 (f16), 11 of the 32 expert slots */
Test(archs, granitemoe_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 120)
{
    serves_and_capped_cache_same_text("granitemoe", -1, "3");
}

/* GraniteMoeShared: the ungated shared expert is a resident layer weight (weights 1.1 MiB);
 * 3 MiB (f16 KV): 7 of the 32 expert slots */
Test(archs, granitemoe_shared_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 120)
{
    serves_and_capped_cache_same_text("granitemoe-shared", -1, "3");
}

/* deepseek2 (DeepSeek-V2-Lite's layout): MLA, the leading dense layer and the two shared
 * experts through the daemon. 20 MiB: weights 6.6 (the shared experts resident), KV 8.4 (27
 * layers of one 80-wide K row per token, which V reads too), 98 of the 208 experts (layer 0 has
 * none); more misses than 208 shows the small cache evicted and refetched */
Test(archs, deepseek2_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 180)
{
    serves_and_capped_cache_same_text("deepseek2", -1, "20");
    long misses = expert_misses(208);
    cr_expect_gt(misses, 208, "deepseek2: more misses than its 208 experts (%ld)", misses);
}

/* A 2x2 24-bit BMP (the vision encoder resizes it) */
#define IMAGE_CHAT "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is this?\"}," \
    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/bmp;base64,Qk1GAAAAAAAAADYAAAAoAAAAAgAAAAIAAAABABgAAAA" \
    "AABAAAAATCwAAEwsAAAAAAAAAAAAAAB7cyB7cAAAAHtzIHtwAAA==\"}}]}],\"max_tokens\":4,\"temperature\":0}"

static int prompt_tokens_of(cJSON *j)
{
    cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens");
    cr_assert(cJSON_IsNumber(n), "no usage.prompt_tokens");
    return n->valueint;
}

/* An image request on the preset loads the lazy encoder and its rows reach the prompt. */
static void with_lazy_vision(const char *preset)
{
    write_preset(preset);
    const char *mmproj = getenv("TIDE_MMPROJ") ? getenv("TIDE_MMPROJ") : "models/tide-mmproj.gguf";
    char cfg[256];
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"mmproj\":\"%s\"", mmproj);
    harness_start(cfg);
    cJSON *text = harness_post_ok("/v1/chat/completions", CHAT);
    cJSON *img = harness_post_ok("/v1/chat/completions", IMAGE_CHAT);
    /* the image's tokens (the encoder's output rows) are in the prompt */
    cr_expect_gt(prompt_tokens_of(img), prompt_tokens_of(text) + 8, "image prompt %d tokens, text %d",
                 prompt_tokens_of(img), prompt_tokens_of(text));
    cJSON_Delete(text);
    cJSON_Delete(img);
    struct harness_reply r = harness_req("GET", "/v1/vram", NULL, NULL);
    cJSON *v = harness_json(&r);
    cJSON *state = cJSON_GetObjectItem(cJSON_GetObjectItem(v, "vision"), "state");
    cr_expect(cJSON_IsString(state) && !strcmp(state->valuestring, "ready"), "the encoder was loaded for the image");
    cJSON_Delete(v);
    harness_reply_free(&r);
}

Test(archs, qwen2moe_with_lazy_vision, .fini = done, .timeout = 120) { with_lazy_vision("qwen2moe"); }

/* granitemoe scales input embeddings (the image's rows too, as llama.cpp does for a model
 * without deepstack layers) */
Test(archs, granitemoe_with_lazy_vision, .fini = done, .timeout = 120) { with_lazy_vision("granitemoe"); }

/* Device 0's field in a /v1/vram answer (GET, or a POST's reply). */
static double vram_field(const char *method, const char *body, const char *field)
{
    struct harness_reply r = harness_req(method, "/v1/vram", NULL, body);
    cr_assert_eq(r.status, 200, "%s /v1/vram %s", method, body ? body : "");
    cJSON *j = harness_json(&r);
    cJSON *n = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "devices"), 0), field);
    cr_assert(cJSON_IsNumber(n), "%s", field);
    double v = n->valuedouble;
    cJSON_Delete(j);
    harness_reply_free(&r);
    return v;
}

/* deepseek2 with the elastic cache: every one of its 208 experts resident (the dense layer's keys
 * take no slot), then a reserve that takes half the cache back, then the restore: the same
 * greedy text each time */
Test(archs, deepseek2_elastic_cache_reserve_and_restore_same_text, .fini = done, .timeout = 180)
{
    write_preset("deepseek2");
    harness_start("\"parallel\":1,\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":64}]");
    cr_assert_eq(vram_field("GET", NULL, "expert_slots"), 208, "the full cache holds the 208 routed experts, no more");
    char *full = greedy_reply();
    char body[64];
    snprintf(body, sizeof body, "{\"reserve_mib\":%ld}",
             (long)(vram_field("GET", NULL, "free_mib") + vram_field("GET", NULL, "expert_cache_mib") / 2 + 1));
    double shrunk = vram_field("POST", body, "expert_slots");
    cr_expect(shrunk > 0 && shrunk < 208, "the reserve took some of the slots (%g left)", shrunk);
    char *small = greedy_reply();
    cr_expect_str_eq(small, full, "deepseek2: a shrunk cache changes nothing but speed");
    cr_expect_eq(vram_field("POST", "{\"reserve_mib\":null}", "expert_slots"), 208, "restored to full");
    char *again = greedy_reply();
    cr_expect_str_eq(again, full, "deepseek2: the same after the restore");
    free(full);
    free(small);
    free(again);
}

/* deepseek2: an image's rows (input embeddings, no token) through MLA's op-by-op path */
Test(archs, deepseek2_with_lazy_vision, .fini = done, .timeout = 120) { with_lazy_vision("deepseek2"); }

/* gpt-oss with MXFP4 experts (its released files' type): sinks, windowed layers (a window of 4,
 * shorter than the chat prompt) and biases through the daemon, and the same text from a CPU
 * device whose expert cache holds a few of the 32 experts (the per-expert biases are layer
 * weights, resident; the experts' MXFP4 rows move through the cache) */
Test(archs, gptoss_mxfp4_serves_and_a_small_expert_cache_gives_the_same_text, .fini = done, .timeout = 120)
{
    /* 3 MiB: kv 2.0 (f16 on a CPU device, as every model's), weights 0.7: a few of the 32 expert slots */
    serves_and_capped_cache_same_text("gpt-oss", GGML_TYPE_MXFP4, "3");
}

/* qwen3vlmoe (Qwen3-VL-30B-A3B's text model, issue 25): text-only prompts through the daemon
 * (M-RoPE with every section at the token's position is plain rope), the same greedy text from
 * a capped expert cache; a LLaVA mmproj leaves text serving and turns an image request away
 * with the reason. */
Test(archs, qwen3vlmoe_serves_text_and_names_the_tower_it_needs, .fini = done, .timeout = 120)
{
    write_preset("qwen3vlmoe");
    harness_start("\"parallel\":1");
    char *full = greedy_reply();
    cr_expect(full[0] != 0, "empty reply");
    harness_stop();
    /* 3 MiB: the resident weights, KV and a few of the 32 expert slots */
    harness_start("\"parallel\":1,\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":3}]");
    char *capped = greedy_reply();
    cr_expect_str_eq(capped, full, "a capped expert cache changes nothing but speed");
    long misses = expert_misses(32);
    cr_expect_gt(misses, 32, "the small cache evicted and refetched (%ld misses)", misses);
    harness_stop();
    /* a LLaVA mmproj of the text model's width: the pair check, not the width, turns it away */
    char mmproj[64], err[200] = "";
    snprintf(mmproj, sizeof mmproj, "/tmp/tide-e2e-arch-%d-mlp96.gguf", (int)getpid());
    struct mmprojgen_options mo = {.out = mmproj, .seed = 1, .type = -1, .n_embd_text = 96};
    cr_assert_eq(mmprojgen_write(&mo, err, sizeof err), 0, "%s", err);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"mmproj\":\"%s\"", mmproj);
    harness_start(cfg);
    unlink(mmproj);
    char *again = greedy_reply();
    cr_expect_str_eq(again, full, "text still serves");
    struct harness_reply r = harness_req("POST", "/v1/chat/completions", NULL, IMAGE_CHAT);
    cr_expect_geq(r.status, 400, "an image without its tower is refused (status %ld)", r.status);
    cr_expect(r.body && strstr(r.body, "qwen3vl_merger"), "the reply names the tower: %s", r.body ? r.body : "");
    harness_reply_free(&r);
    free(full);
    free(capped);
    free(again);
}

/* The greedy reply's content in a chat completion's JSON */
static cJSON *content_of(cJSON *reply)
{
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(reply, "choices"), 0);
    return cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
}

/* A Qwen-VL pair: the model file written (TIDE_MODEL) and its tower at mm, served with the
 * 1024-token image budget; text, then the same image twice. What every pair shows: no encoder
 * before the first image; the image adds rows_lo..rows_hi rows and its 2 markers to the
 * prompt (+-6 for the two prompts' other words); the same image again is the same greedy
 * reply; afterwards the encoder is loaded and the ledger's vision memory is what the header
 * says (the f32 weights and the workspace of the largest image the budget allows). */
static void vl_pair_answers_an_image(const char *mm, int rows_lo, int rows_hi)
{
    char err[200] = "", cfg[256];
    size_t wb = 0, wsb = 0;
    cr_assert_eq(qwen3vl_estimate(mm, 1024, &wb, &wsb, err, sizeof err), 0, "%s", err);
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"mmproj\":\"%s\"", mm);
    harness_start(cfg);
    cJSON *text = harness_post_ok("/v1/chat/completions", CHAT);
    struct harness_reply r0 = harness_req("GET", "/v1/vram", NULL, NULL);
    cJSON *v0 = harness_json(&r0);
    cJSON *state0 = cJSON_GetObjectItem(cJSON_GetObjectItem(v0, "vision"), "state");
    cr_expect(cJSON_IsString(state0) && strcmp(state0->valuestring, "ready"), "no encoder before an image");
    cJSON_Delete(v0);
    harness_reply_free(&r0);
    cJSON *img = harness_post_ok("/v1/chat/completions", IMAGE_CHAT);
    cJSON *again = harness_post_ok("/v1/chat/completions", IMAGE_CHAT);
    int extra = prompt_tokens_of(img) - prompt_tokens_of(text);
    cr_expect(extra >= rows_lo + 2 - 6 && extra <= rows_hi + 2 + 6, "image prompt %d tokens, text %d",
              prompt_tokens_of(img), prompt_tokens_of(text));
    cJSON *c1 = content_of(img), *c2 = content_of(again);
    cr_assert(cJSON_IsString(c1) && cJSON_IsString(c2) && c1->valuestring[0]);
    cr_expect_str_eq(c2->valuestring, c1->valuestring, "the same image, the same greedy reply");
    cJSON_Delete(text);
    cJSON_Delete(img);
    cJSON_Delete(again);
    struct harness_reply r = harness_req("GET", "/v1/vram", NULL, NULL);
    cJSON *v = harness_json(&r);
    cJSON *state = cJSON_GetObjectItem(cJSON_GetObjectItem(v, "vision"), "state");
    cr_expect(cJSON_IsString(state) && !strcmp(state->valuestring, "ready"), "the encoder was loaded for the image");
    cJSON *vm = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(v, "devices"), 0), "vision_mib");
    double want = (double)((wb + wsb + (1u << 20) - 1) >> 20); /* /v1/vram rounds up to whole MiB */
    cr_expect(cJSON_IsNumber(vm) && vm->valuedouble == want, "vision memory %.0f MiB, the header says %.0f",
              cJSON_IsNumber(vm) ? vm->valuedouble : -1.0, want);
    cJSON_Delete(v);
    harness_reply_free(&r);
    unlink(mm);
}

/* The qwen3vlmoe pair: the preset and its tower (mmproj-qwen3vl), the image's rows wrapped in
 * <|vision_start|> / <|vision_end|>: the 2x2 BMP grows to 48x48 by the resize rules, 3x3
 * tokens; the same image again comes from the embedding cache. */
Test(archs, qwen3vlmoe_with_its_tower_answers_an_image, .fini = done, .timeout = 120)
{
    write_preset("qwen3vlmoe");
    char mm[64], err[200] = "";
    snprintf(mm, sizeof mm, "/tmp/tide-e2e-arch-%d-q3v.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = mm, .seed = 3, .type = -1};
    cr_assert_eq(mmprojgen_write_qwen3vl(&o, 2, err, sizeof err), 0, "%s", err);
    vl_pair_answers_an_image(mm, 9, 9);
}

/* The same question with a 20x90 PNG (one colour) in place of the 2x2 BMP */
#define TALL_IMAGE_CHAT "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is this?\"}," \
    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABQAAABaCAIAAAA3ueFGAAA" \
    "AL0lEQVR42u3LoQ0AAAgDsF3CJfwfzkLi0U1qm6l+iyzLsizLsizLsizLsizLsnwWGgH3eqkWayUAAAAASUVORK5CYII=\"}}]}],\"max_tokens\":4," \
    "\"temperature\":0}"

/* An image takes as many tokens as llama.cpp gives it: the size rules in float as llama.cpp's
 * mtmd computes them. 20x90 under Qwen3-VL's minimum (8 tokens of 16x16 at the preset's patch 8)
 * grows to 32x112, 2 x 7 = 14 tokens (libmtmd's count; in double it would be 32x96, 12); the
 * 2x2 BMP grows to 48x48, 9 tokens; the same text around both, so the prompts differ by 5. */
Test(archs, qwen3vlmoe_gives_an_image_llama_cpps_token_count, .fini = done, .timeout = 120)
{
    write_preset("qwen3vlmoe");
    char mm[64], err[200] = "", cfg[128];
    snprintf(mm, sizeof mm, "/tmp/tide-e2e-arch-%d-q3v.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = mm, .seed = 3, .type = -1};
    cr_assert_eq(mmprojgen_write_qwen3vl(&o, 2, err, sizeof err), 0, "%s", err);
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"mmproj\":\"%s\"", mm);
    harness_start(cfg);
    cJSON *square = harness_post_ok("/v1/chat/completions", IMAGE_CHAT);
    cJSON *tall = harness_post_ok("/v1/chat/completions", TALL_IMAGE_CHAT);
    cr_expect_eq(prompt_tokens_of(tall) - prompt_tokens_of(square), 14 - 9, "20x90: %d prompt tokens, 2x2: %d",
                 prompt_tokens_of(tall), prompt_tokens_of(square));
    cJSON_Delete(square);
    cJSON_Delete(tall);
    unlink(mm);
}

/* A qwen2vl pair (Qwen2-VL's or Qwen2.5-VL's text model and tower, issue 25), the image's rows
 * M-RoPE'd on the grid in sections one after the other: the 2x2 BMP grows to the tower's
 * 8-token minimum or more (3x3 at patch 8, 3x3 at 14). */
static void qwen2vl_pair_answers_an_image(bool qwen25)
{
    write_preset("qwen2vl");
    char mm[64], err[200] = "";
    snprintf(mm, sizeof mm, "/tmp/tide-e2e-arch-%d-q2v.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = mm, .seed = 3, .type = -1};
    cr_assert_eq(mmprojgen_write_qwen2vl(&o, qwen25, err, sizeof err), 0, "%s", err);
    vl_pair_answers_an_image(mm, 8, 16);
}

Test(archs, qwen2vl_with_its_tower_answers_an_image, .fini = done, .timeout = 120)
{
    qwen2vl_pair_answers_an_image(false);
}

Test(archs, qwen2vl_with_a_qwen25vl_tower_answers_an_image, .fini = done, .timeout = 120)
{
    qwen2vl_pair_answers_an_image(true);
}

/* qwen2vl with Qwen3-VL's tower (of its width): text serves, an image is refused naming the
 * towers qwen2vl takes. */
Test(archs, qwen2vl_refuses_images_from_another_tower, .fini = done, .timeout = 120)
{
    write_preset("qwen2vl");
    char mm[64], err[200] = "";
    snprintf(mm, sizeof mm, "/tmp/tide-e2e-arch-%d-q3v128.gguf", (int)getpid());
    struct mmprojgen_options o = {.out = mm, .seed = 3, .type = -1, .n_embd_text = 128};
    cr_assert_eq(mmprojgen_write_qwen3vl(&o, 0, err, sizeof err), 0, "%s", err);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "\"parallel\":1,\"mmproj\":\"%s\"", mm);
    harness_start(cfg);
    unlink(mm);
    char *text = greedy_reply();
    cr_expect(text[0] != 0, "text still serves");
    struct harness_reply r = harness_req("POST", "/v1/chat/completions", NULL, IMAGE_CHAT);
    cr_expect_geq(r.status, 400, "an image from the wrong tower is refused (status %ld)", r.status);
    cr_expect(r.body && strstr(r.body, "qwen2vl_merger"), "the reply names the towers: %s", r.body ? r.body : "");
    harness_reply_free(&r);
    free(text);
}

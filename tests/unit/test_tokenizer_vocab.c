/* Tokenizer and template checks on the vocabulary the model tool writes (the one the
 * daemon serves), plus a hand-made SentencePiece vocabulary. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/modelgen.h"
#include "engine/template.h"
#include "engine/tokenizer.h"

static struct gguf_file g;
static struct tokenizer *tok;

static void setup(void)
{
    char err[256];
    struct modelgen_options o = {.preset = "dense", .out = "/tmp/tide-test-tok.gguf", .seed = 7, .type = -1};
    struct modelgen_summary sum;
    cr_assert_eq(modelgen_write(&o, &sum, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gguf_open(&g, o.out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tokenizer_load(&tok, &g, err, sizeof err), 0, "%s", err);
}

static void teardown(void)
{
    tokenizer_free(tok);
    gguf_close(&g);
    unlink("/tmp/tide-test-tok.gguf");
}

/* Decode ids back to bytes. */
static char *detok(const int *ids, int n)
{
    char *out = calloc((size_t)n * 64 + 1, 1);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int l = tokenizer_token_bytes(tok, ids[i], out + len, 64);
        cr_assert_geq(l, 0);
        len += (size_t)l;
    }
    return out;
}

static void round_trip(const char *s)
{
    int *ids, n;
    cr_assert_eq(tokenizer_encode(tok, s, strlen(s), false, NULL, &ids, &n), 0);
    char *back = detok(ids, n);
    cr_assert_str_eq(back, s, "round trip of '%s'", s);
    free(back);
    free(ids);
}

TestSuite(tokenizer, .init = setup, .fini = teardown);

Test(tokenizer, round_trips_ascii_utf8_whitespace)
{
    round_trip("Hello there, what colour is the red square?");
    round_trip("  two  spaces\tand a tab\n\nnew lines\n");
    round_trip("12 + 30 = 42, 1000000");
    round_trip("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x8E\x89 done");
    round_trip("it's we're they'll I'd");
}

Test(tokenizer, merges_make_common_words_short)
{
    int *ids, n;
    const char *s = " the the the";
    cr_assert_eq(tokenizer_encode(tok, s, strlen(s), false, NULL, &ids, &n), 0);
    cr_assert_lt(n, (int)strlen(s), "BPE merges did not apply: %d tokens for %zu bytes", n, strlen(s));
    cr_assert_eq(ids[0], ids[1]);
    free(ids);
}

Test(tokenizer, special_tokens_only_when_asked)
{
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    int *ids, n;
    int start = tokenizer_find(tok, "<|im_start|>"), end = tokenizer_find(tok, "<|im_end|>");
    cr_assert_geq(start, 0);
    cr_assert_eq(tokenizer_encode(tok, s, strlen(s), true, NULL, &ids, &n), 0);
    cr_assert_eq(ids[0], start);
    cr_assert_eq(ids[n - 1], end);
    cr_assert(tokenizer_is_eog(tok, end));
    cr_assert(!tokenizer_is_eog(tok, ids[1]));
    free(ids);
    cr_assert_eq(tokenizer_encode(tok, s, strlen(s), false, NULL, &ids, &n), 0);
    for (int i = 0; i < n; i++) cr_assert_neq(ids[i], start);
    char *back = detok(ids, n);
    cr_assert_str_eq(back, s);
    free(back);
    free(ids);
}

Test(utf8_stream, never_splits_a_character)
{
    struct utf8_stream u = {0};
    const char *emoji = "\xF0\x9F\x8E\x89";
    char out[64];
    for (int i = 0; i < 3; i++) cr_assert_eq(utf8_stream_feed(&u, emoji + i, 1, out), 0);
    cr_assert_eq(utf8_stream_feed(&u, emoji + 3, 1, out), 4);
    cr_assert_eq(memcmp(out, emoji, 4), 0);
    /* a broken sequence becomes U+FFFD, the next character survives */
    size_t n = utf8_stream_feed(&u, "\xC3" "A", 2, out);
    cr_assert_eq(n, 4);
    cr_assert_eq(memcmp(out, "\xEF\xBF\xBD" "A", 4), 0);
    cr_assert_eq(utf8_stream_feed(&u, "\xE6\x97", 2, out), 0);
    cr_assert_eq(utf8_stream_flush(&u, out), 3);
}

/* Issue 27: a 1 MiB prompt of "a " took 256 s because every regex call re-checked the UTF-8
 * of the rest of the text. Now the text is checked once: the work is linear, counted. */
Test(tokenizer, long_prompt_is_linear)
{
    size_t len = (size_t)1 << 20;
    char *s = malloc(len);
    for (size_t i = 0; i < len; i += 2) { s[i] = 'a'; s[i + 1] = ' '; }
    struct tokenizer_counters c0, c1;
    tokenizer_get_counters(&c0);
    int *ids, n;
    cr_assert_eq(tokenizer_encode(tok, s, len, true, NULL, &ids, &n), 0);
    tokenizer_get_counters(&c1);
    uint64_t checked = c1.utf8_bytes_checked - c0.utf8_bytes_checked;
    uint64_t calls = c1.match_calls - c0.match_calls;
    /* one pass over the text (the quadratic form checked ~len^2/4 = 2.7e11 bytes) */
    cr_assert_leq(checked, 2 * len, "UTF-8 checked over %llu bytes for a %zu-byte prompt", (unsigned long long)checked, len);
    cr_assert_leq(calls, len / 2 + 1, "%llu regex calls", (unsigned long long)calls);
    cr_assert_geq(n, 1);
    char *back = detok(ids, n);
    cr_assert_eq(strlen(back), len);
    cr_assert_eq(memcmp(back, s, len), 0, "the long prompt round-trips");
    free(back);
    free(ids);
    free(s);
}

/* A set cancel flag stops the encode (the engine passes the job's flag); a clear one does not. */
Test(tokenizer, cancel_flag_stops_encoding)
{
    size_t len = (size_t)64 << 10;
    char *s = malloc(len);
    for (size_t i = 0; i < len; i += 2) { s[i] = 'b'; s[i + 1] = ' '; }
    int *ids = NULL, n = 0;
    volatile int cancel = 0;
    cr_assert_eq(tokenizer_encode(tok, s, len, true, &cancel, &ids, &n), 0);
    free(ids);
    ids = NULL;
    cancel = 1;
    cr_assert_eq(tokenizer_encode(tok, s, len, true, &cancel, &ids, &n), TIDE_ECANCELED);
    cr_assert_null(ids);
    free(s);
}

/* Text that is not UTF-8 (the daemon refuses it at the door; a library caller may not):
 * the bad byte is a piece of its own and the rest is tokenized as usual, bytes intact. */
Test(tokenizer, invalid_utf8_round_trips)
{
    const char s[] = "caf\xC3\xA9 \xFF\xC3 ok \xED\xA0\x80 end \xF0\x9F\x8E";
    int *ids, n;
    cr_assert_eq(tokenizer_encode(tok, s, sizeof s - 1, false, NULL, &ids, &n), 0);
    char *back = detok(ids, n);
    cr_assert_eq(memcmp(back, s, sizeof s - 1), 0);
    free(back);
    free(ids);
}

Test(tokenizer_spm, scores_and_byte_fallback)
{
    const char *toks[260] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi"};
    float scores[260] = {0, 0, 0, -1, -2, -2, -1.5f, -0.5f};
    int32_t types[260] = {2, 3, 3, 1, 1, 1, 1, 1};
    char bytes[256][8];
    for (int b = 0; b < 252; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[8 + b] = bytes[b];
        scores[8 + b] = -10;
        types[8 + b] = 6;
    }
    struct tokenizer *t;
    cr_assert_eq(tokenizer_create(&t, "llama", NULL, toks, scores, types, 260, NULL, 0), 0);
    int *ids, n;
    cr_assert_eq(tokenizer_encode(t, "hi hi", 5, false, NULL, &ids, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(ids[0], 7);
    cr_assert_eq(ids[1], 7);
    free(ids);
    /* 'z' is not in the vocabulary: it falls back to its byte token */
    cr_assert_eq(tokenizer_encode(t, "z", 1, false, NULL, &ids, &n), 0);
    char buf[16];
    int len = 0;
    for (int i = 0; i < n; i++) len += tokenizer_token_bytes(t, ids[i], buf + len, 8);
    buf[len] = 0;
    cr_assert_str_eq(buf, " z");
    free(ids);
    tokenizer_free(t);
}

/* gpt-oss's harmony vocabulary (both <|return|> and <|call|>): <|end|> closes the analysis
 * message, so generation goes on to the final one and ends at <|return|> or <|call|>; without
 * them <|end|> ends generation as before (phi-3 style). */
Test(tokenizer, harmony_ends_at_return_or_call_not_end)
{
    const char *toks[5] = {"a", "b", "<|end|>", "<|return|>", "<|call|>"};
    int32_t types[5] = {1, 1, 3, 3, 3};
    struct tokenizer *t;
    cr_assert_eq(tokenizer_create(&t, "gpt2", NULL, toks, NULL, types, 5, NULL, 0), 0);
    cr_assert(!tokenizer_is_eog(t, 2), "<|end|> ends one harmony message, not the reply");
    cr_assert(tokenizer_is_eog(t, 3));
    cr_assert(tokenizer_is_eog(t, 4));
    cr_assert(!tokenizer_is_eog(t, 0));
    tokenizer_free(t);
    cr_assert_eq(tokenizer_create(&t, "gpt2", NULL, toks, NULL, types, 4, NULL, 0), 0); /* no <|call|> */
    cr_assert(tokenizer_is_eog(t, 2), "without harmony's pair <|end|> ends generation");
    tokenizer_free(t);
}

/* tokenizer.ggml.pre "gpt-4o" (gpt-oss's o200k): numbers are pre-split in threes and a word
 * splits where a capitalised part begins, so merges never cross those; GPT-2's pattern (the
 * fallback for unknown names) keeps "12345" and "helloWorld" whole. */
static int count_tokens(const char *pre, const char *text)
{
    const char *toks[] = {"1", "2", "3", "4", "5", "12", "123", "1234", "12345", "45",
                          "h", "i", "W", "o", "hi", "Wo", "hiWo"};
    const char *merges[] = {"1 2", "12 3", "123 4", "1234 5", "4 5", "h i", "W o", "hi Wo"};
    int32_t types[17];
    for (int i = 0; i < 17; i++) types[i] = 1;
    struct tokenizer *t;
    cr_assert_eq(tokenizer_create(&t, "gpt2", pre, toks, NULL, types, 17, merges, 8), 0);
    int *ids, n;
    cr_assert_eq(tokenizer_encode(t, text, strlen(text), false, NULL, &ids, &n), 0);
    free(ids);
    tokenizer_free(t);
    return n;
}

Test(tokenizer, gpt4o_pretokenizer_splits_numbers_in_threes_and_at_capitals)
{
    cr_assert_eq(count_tokens("gpt-2", "12345"), 1);
    cr_assert_eq(count_tokens("gpt-4o", "12345"), 2, "123 | 45");
    cr_assert_eq(count_tokens("gpt-2", "hiWo"), 1);
    cr_assert_eq(count_tokens("gpt-4o", "hiWo"), 2, "hi | Wo");
}

Test(template, formats_and_detection)
{
    struct chat_message m[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"},
                               {.role = "assistant", .content = "Hello."}, {.role = "user", .content = "Bye"}};
    char *s = template_apply(TEMPLATE_CHATML, m, 4, true);
    cr_assert_str_eq(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                        "<|im_start|>assistant\n");
    free(s);
    s = template_apply(TEMPLATE_LLAMA3, m + 1, 1, true);
    cr_assert_str_eq(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    s = template_apply(TEMPLATE_MISTRAL, m, 4, true);
    cr_assert_str_eq(s, "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
    free(s);
    cr_assert_eq(template_detect(NULL), TEMPLATE_CHATML);
    cr_assert_eq(template_detect("{% for m in messages %}<|im_start|>{{ m.role }}"), TEMPLATE_CHATML);
    cr_assert_eq(template_detect("{{ '<|start_header_id|>' + message['role'] }}"), TEMPLATE_LLAMA3);
    cr_assert_eq(template_detect("{{ '[INST] ' + content + ' [/INST]' }}"), TEMPLATE_MISTRAL);
    cr_assert_eq(template_detect("something else"), TEMPLATE_CHATML);
}

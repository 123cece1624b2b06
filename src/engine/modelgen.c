/* modelgen.c - deterministic synthetic GGUF models: presets, a byte-level BPE trained
 * on an embedded corpus (so the tokenizer is real, not a stub) and scaled random
 * weights (so greedy decoding does not collapse to a single repeated token).
 * The benchmark preset (qwen3-30b-a3b, ~32 GB in q8_0) pads the vocabulary to the real
 * model's size and has its matrices made at write time, uniform with the same std, by
 * several threads (gguf_w_tensor_fill), so it is written in seconds, not held in RAM. */
#include "modelgen.h"
#include "quant_mix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Training text for the merges: short, repetitive English so that common words
 * become single tokens. */
static const char corpus[] =
    "Hello! Hello there. Hi, how are you? I am fine, thank you. Good morning. Good evening. "
    "Good night. Hello world. Hi there, friend. How are you today? I am very well. "
    "The sky is blue. The grass is green. The sun is yellow. The apple is red. "
    "The orange is orange. The night is black. The snow is white. The sea is blue and green. "
    "My favourite colour is blue. Her favourite colour is red. His favourite colour is green. "
    "What colour is the sky? The sky is blue. What colour is the grass? The grass is green. "
    "A circle is round. A square has four sides. A triangle has three sides. "
    "A rectangle has four sides and four corners. A hexagon has six sides. "
    "A pentagon has five sides. An octagon has eight sides. The ball is a round shape. "
    "The box is a square shape. The red circle is next to the blue square. "
    "One, two, three, four, five, six, seven, eight, nine, ten. "
    "Count with me: one two three four five six seven eight nine ten eleven twelve. "
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20. "
    "One plus one is two. Two plus two is four. Three plus three is six. "
    "Four plus four is eight. Five plus five is ten. Two times three is six. "
    "Ten minus four is six. Nine minus three is six. Six divided by two is three. "
    "1 + 1 = 2. 2 + 2 = 4. 3 + 4 = 7. 5 + 5 = 10. 10 - 3 = 7. 6 * 7 = 42. 8 / 2 = 4. "
    "What is two plus two? Two plus two is four. What is three times three? "
    "Three times three is nine. What is ten minus one? Ten minus one is nine. "
    "I like to count the red apples and the green apples. There are three red apples. "
    "There are five green apples. Three plus five is eight apples in all. "
    "The cat is black. The dog is brown. The bird is blue. The fish is orange. "
    "Thank you very much. You are welcome. Goodbye! See you later. Have a nice day. "
    "Please tell me a story about the colours and the shapes. Once upon a time there was "
    "a small red circle who wanted to be a big blue square. The circle asked the triangle "
    "for help, and the triangle said: count your sides! The circle had no sides at all. "
    "So the circle stayed round, and it was happy. The end. "
    "Yes. No. Maybe. I think so. I do not know. Let me think. The answer is four. "
    "The answer is yes. The answer is blue. What is your name? My name is Tide. "
    "I am a small model. I can count and name colours and shapes. "
    "Purple is a mix of red and blue. Green is a mix of blue and yellow. "
    "Orange is a mix of red and yellow. Grey is a mix of black and white. "
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week. "
    "January, February, March, April, May, June, July, August, September, October, November, December. "
    "The little brown fox jumps over the lazy dog. Quick brown foxes like to jump and run. "
    "Twenty, thirty, forty, fifty, sixty, seventy, eighty, ninety, one hundred, one thousand. "
    "Seven plus eight is fifteen. Twelve minus five is seven. Four times five is twenty. "
    "A cube has six faces. A sphere has no corners. A cylinder has two circles and one curved side. "
    "Which shape has the most sides? The octagon has more sides than the hexagon. "
    "Could you help me, please? Of course, I would be glad to help you. Welcome back, my friend! "
    "It is sunny today, and tomorrow it might rain. The rainbow shows red, orange, yellow, green, "
    "blue, indigo and violet. Pink flowers grow near the purple trees by the silver river. "
    "Counting backwards: ten, nine, eight, seven, six, five, four, three, two, one, zero. "
    "Numbers can be even or odd. Two, four and six are even. One, three and five are odd. "
    "Zero is an even number. Half of ten is five. Double of six is twelve. ";

/* ---- deterministic PRNG: splitmix64 + Box-Muller ---- */
struct rng { uint64_t s; };
static uint64_t rnext(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(struct rng *r) { return ((rnext(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float rnorm(struct rng *r)
{
    double u = runif(r), v = runif(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- BPE vocabulary ---- */
#define N_NORMAL 768

struct vocab {
    char **tok;        /* n entries, UTF-8 (byte-level mapped) */
    int32_t *type;
    uint32_t n;
    char **merges;
    uint32_t n_merges;
};

/* GPT-2 byte -> unicode code point */
static uint32_t byte_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    int k = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) k++;
    return 256u + (uint32_t)k;
}

static char *cp_utf8(uint32_t cp)
{
    char *s = malloc(4);
    if (!s) return NULL;
    if (cp < 0x80) { s[0] = (char)cp; s[1] = 0; }
    else { s[0] = (char)(0xc0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3f)); s[2] = 0; }
    return s;
}

static char *str_cat2(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

struct word { int *ids; int len; int count; };

static int cls(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
    if (c >= '0' && c <= '9') return 2;
    if (c == ' ') return 0;
    return 3;
}

static void vocab_free(struct vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++) free(v->tok[i]);
    for (uint32_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
    memset(v, 0, sizeof(*v));
}

/* Plain BPE: pre-tokenise GPT-2 style (a leading space sticks to the following
 * word), then repeatedly merge the most frequent adjacent pair; ties go to the lowest
 * (left, right) ids so the result is deterministic. */
static int vocab_build(struct vocab *v)
{
    memset(v, 0, sizeof(*v));
    v->tok = calloc(N_NORMAL + 3, sizeof(char *));
    v->type = calloc(N_NORMAL + 3, sizeof(int32_t));
    v->merges = calloc(N_NORMAL, sizeof(char *));
    size_t clen = strlen(corpus);
    struct word *w = calloc(clen, sizeof(*w));
    int nw = 0, rc = TIDE_ENOMEM;
    if (!v->tok || !v->type || !v->merges || !w) goto out;
    for (int b = 0; b < 256; b++) {
        if (!(v->tok[b] = cp_utf8(byte_cp(b)))) goto out;
        v->type[b] = 1;
        v->n++;
    }
    for (size_t i = 0; i < clen;) {
        size_t st = i;
        if (corpus[i] == ' ' && i + 1 < clen && cls((unsigned char)corpus[i + 1]) != 0) i++;
        int c = cls((unsigned char)corpus[i]);
        while (i < clen && cls((unsigned char)corpus[i]) == c) {
            i++;
            if (c == 3) break; /* punctuation: one at a time */
        }
        int len = (int)(i - st), found = -1;
        for (int k = 0; k < nw; k++)
            if (w[k].len == len) {
                int same = 1;
                for (int j = 0; j < len && same; j++) same = w[k].ids[j] == (unsigned char)corpus[st + j];
                if (same) { found = k; break; }
            }
        if (found >= 0) { w[found].count++; continue; }
        if (!(w[nw].ids = malloc(sizeof(int) * (size_t)len))) goto out;
        for (int j = 0; j < len; j++) w[nw].ids[j] = (unsigned char)corpus[st + j];
        w[nw].len = len;
        w[nw].count = 1;
        nw++;
    }
    while (v->n < N_NORMAL) {
        int best_a = -1, best_b = -1, best_c = 0;
        /* count pairs with a small open-addressing table keyed by (a, b) */
        enum { HT = 1 << 16 };
        static uint64_t key[HT];
        static int cnt[HT];
        memset(cnt, 0, sizeof(cnt));
        for (int k = 0; k < nw; k++)
            for (int j = 0; j + 1 < w[k].len; j++) {
                uint64_t kk = ((uint64_t)w[k].ids[j] << 32) | (uint32_t)w[k].ids[j + 1];
                uint32_t h = (uint32_t)((kk * 0x9e3779b97f4a7c15ull) >> 48);
                while (cnt[h] && key[h] != kk) h = (h + 1) & (HT - 1);
                key[h] = kk;
                cnt[h] += w[k].count;
            }
        for (int h = 0; h < HT; h++) {
            if (!cnt[h]) continue;
            int a = (int)(key[h] >> 32), b = (int)(key[h] & 0xffffffff);
            if (cnt[h] > best_c || (cnt[h] == best_c && (a < best_a || (a == best_a && b < best_b)))) {
                best_c = cnt[h];
                best_a = a;
                best_b = b;
            }
        }
        if (best_c == 0) break;
        int id = (int)v->n;
        if (!(v->tok[id] = str_cat2(v->tok[best_a], "", v->tok[best_b]))) goto out;
        if (!(v->merges[v->n_merges] = str_cat2(v->tok[best_a], " ", v->tok[best_b]))) goto out;
        v->type[id] = 1;
        v->n++;
        v->n_merges++;
        for (int k = 0; k < nw; k++) {
            int o = 0;
            for (int j = 0; j < w[k].len; j++) {
                if (j + 1 < w[k].len && w[k].ids[j] == best_a && w[k].ids[j + 1] == best_b) {
                    w[k].ids[o++] = id;
                    j++;
                } else {
                    w[k].ids[o++] = w[k].ids[j];
                }
            }
            w[k].len = o;
        }
    }
    static const char *special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int s = 0; s < 3; s++) {
        if (!(v->tok[v->n] = str_cat2(special[s], "", ""))) goto out;
        v->type[v->n++] = 3;
    }
    rc = 0;
out:
    for (int k = 0; k < nw; k++) free(w[k].ids);
    free(w);
    if (rc) vocab_free(v);
    return rc;
}

/* Qwen-VL's vision tokens after the chat specials (control tokens, as in Qwen's tokenizer):
 * an image's embeddings sit between <|vision_start|> and <|vision_end|>, one <|image_pad|> each. */
static int vocab_add_vision(struct vocab *v)
{
    static const char *names[3] = {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"};
    char **tok = realloc(v->tok, (v->n + 3) * sizeof(char *));
    if (tok) v->tok = tok;
    int32_t *type = tok ? realloc(v->type, (v->n + 3) * sizeof(int32_t)) : NULL;
    if (type) v->type = type;
    if (!tok || !type) { vocab_free(v); return TIDE_ENOMEM; }
    for (int i = 0; i < 3; i++) {
        if (!(v->tok[v->n] = str_cat2(names[i], "", ""))) { vocab_free(v); return TIDE_ENOMEM; }
        v->type[v->n++] = 3;
    }
    return 0;
}

/* Pad the vocabulary to n tokens with unused ones (type 5, as in converted models whose
 * embedding is larger than their tokenizer), so the embedding and output head have the
 * real model's size. */
static int vocab_pad(struct vocab *v, uint32_t n)
{
    if (n <= v->n) return 0;
    char **tok = realloc(v->tok, n * sizeof(char *));
    if (tok) v->tok = tok;
    int32_t *type = tok ? realloc(v->type, n * sizeof(int32_t)) : NULL;
    if (type) v->type = type;
    if (!tok || !type) { vocab_free(v); return TIDE_ENOMEM; }
    while (v->n < n) {
        char name[32];
        snprintf(name, sizeof name, "<|tide_pad_%u|>", v->n);
        if (!(v->tok[v->n] = str_cat2(name, "", ""))) { vocab_free(v); return TIDE_ENOMEM; }
        v->type[v->n++] = 5;
    }
    return 0;
}

/* ---- presets ---- */
struct preset {
    const char *name, *arch;
    uint32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_expert, n_used;
    int type;
    bool qk_norm;
    float eps;
    uint32_t n_vocab;   /* pad the vocabulary to this many tokens (0: the BPE's 771) */
    float rope_base;    /* 0: 10000 */
    bool fill;          /* big matrices made at write time (uniform), not held in memory */
    uint32_t n_ff_shexp; /* the shared expert's width (qwen2moe: with its sigmoid gate and q/k/v biases) */
    uint32_t n_swa;      /* gpt-oss: its sliding window (and biases, sinks, post_attention_norm) */
    /* qwen3vlmoe: M-RoPE's pairs per section (rope.dimension_sections), the deepstack layers;
     * the vocabulary gains Qwen-VL's vision tokens */
    int32_t mrope_sections[4];
    uint32_t n_deepstack;
};

static const struct preset presets[] = {
    {"dense", "llama", 64, 2, 4, 2, 0, 128, 0, 0, GGML_TYPE_F32, false, 1e-5f, 0, 0, false, 0, 0, {0}, 0},
    {"moe", "llama", 128, 4, 8, 4, 0, 256, 8, 2, GGML_TYPE_F16, false, 1e-5f, 0, 0, false, 0, 0, {0}, 0},
    {"qwen3moe", "qwen3moe", 96, 4, 4, 2, 32, 128, 8, 2, GGML_TYPE_F16, true, 1e-6f, 0, 0, false, 0, 0, {0}, 0},
    /* Qwen1.5-MoE-A2.7B's shape, small: 4 of 8 experts used (60 and 4 there), a shared expert
     * 4x an expert's width (5632 and 1408 there), q/k/v biases, head_dim n_embd / n_head */
    {"qwen2moe", "qwen2moe", 128, 4, 4, 2, 0, 64, 8, 4, GGML_TYPE_F16, false, 1e-6f, 0, 1e6f, false, 256, 0, {0}, 0},
    /* gpt-oss-20b's layout, small: 4 of 8 experts used (4 of 32 there), head_dim 64 with
     * n_head * head_dim != n_embd, every other layer windowed (128 there: 4 here, so short
     * prompts see it), biases on q/k/v/o, the router and the experts, attention sinks */
    {"gpt-oss", "gpt-oss", 128, 4, 4, 2, 64, 64, 8, 4, GGML_TYPE_F16, false, 1e-5f, 0, 150000.0f, false, 0, 4, {0}, 0},
    /* OLMoE-1B-7B's layout, small: 2 of 8 experts used (8 of 64 there), MHA (16 heads and 16
     * KV heads there), q and k each normed over their whole width, no biases, no shared expert */
    {"olmoe", "olmoe", 128, 4, 4, 4, 0, 64, 8, 2, GGML_TYPE_F16, false, 1e-5f, 0, 0, false, 0, 0, {0}, 0},
    /* granite-3.0-1b-a400m's layout, small: 2 of 8 experts used (8 of 32 there), GQA, experts as
     * wide as n_embd (so that a few MiB of expert cache hold a third of them), its four scalars
     * (written below) */
    {"granitemoe", "granitemoe", 128, 4, 4, 2, 0, 128, 8, 2, GGML_TYPE_F16, false, 1e-6f, 0, 0, false, 0, 0, {0}, 0},
    /* GraniteMoeShared: the same with an ungated shared expert of 128 beside the routed ones */
    {"granitemoe-shared", "granitemoe", 128, 4, 4, 2, 0, 128, 8, 2, GGML_TYPE_F16, false, 1e-6f, 0, 0, false, 128, 0, {0}, 0},
    /* DeepSeek-V2-Lite's layout, narrow (tide runs it on CPU devices; llama.cpp loads it too):
     * its 27 layers (llama.cpp tells V2-Lite, q without a LoRA, by the layer count), MLA as
     * the converter writes it (one KV head, attn_k_b / attn_v_b per head), a leading dense
     * layer, 2 of 8 routed experts of 64 and 2 shared ones (one of 128); the MLA widths are
     * DS2_* below */
    {"deepseek2", "deepseek2", 128, 27, 4, 1, 0, 64, 8, 2, GGML_TYPE_F16, false, 1e-6f, 0, 0, false, 128, 0, {0}, 0},
    /* Qwen3-VL-30B-A3B's text model, small: qwen3moe's shape with M-RoPE sections in its
     * proportions (24, 20, 20 of 64 pairs there: 6, 5, 5 of 16 here) and 2 deepstack layers
     * of 4 (3 of 48 there) */
    {"qwen3vlmoe", "qwen3vlmoe", 96, 4, 4, 2, 32, 128, 8, 2, GGML_TYPE_F16, true, 1e-6f, 0, 5e6f, false, 0, 0,
     {6, 5, 5, 0}, 2},
    /* Qwen2-VL's (and Qwen2.5-VL's) text model, small: Qwen2 dense with q/k/v biases, GQA,
     * head_dim n_embd / n_head, M-RoPE sections one after the other in Qwen2-VL-2B's
     * proportions (16, 24, 24 of 64 pairs there: 4, 6, 6 of 16 here) */
    {"qwen2vl", "qwen2vl", 128, 4, 4, 2, 0, 256, 0, 0, GGML_TYPE_F16, false, 1e-6f, 0, 1e6f, false, 0, 0,
     {4, 6, 6, 0}, 0},
    {"big", "llama", 1024, 8, 16, 8, 0, 512, 16, 2, GGML_TYPE_F16, false, 1e-5f, 0, 0, false, 0, 0, {0}, 0},
    /* Qwen3-30B-A3B's config.json: hidden 2048, 48 layers, 32 heads / 4 KV heads of 128,
     * 128 experts of moe_intermediate 768, 8 used, vocab 151936, rope_theta 1e6, eps 1e-6 */
    {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 128, 768, 128, 8, GGML_TYPE_Q8_0, true, 1e-6f,
     151936, 1e6f, true, 0, 0, {0}, 0},
    /* Qwen3-VL-30B-A3B-Instruct's text config: Qwen3-30B-A3B's shape, rope_theta 5e6,
     * mrope_section [24, 20, 20] (interleaved), deepstack after layers 0-2 */
    {"qwen3-vl-30b-a3b", "qwen3vlmoe", 2048, 48, 32, 4, 128, 768, 128, 8, GGML_TYPE_Q8_0, true, 1e-6f,
     151936, 5e6f, true, 0, 0, {24, 20, 20, 0}, 3},
};

/* deepseek2's MLA widths in the preset (V2-Lite's in brackets): kv_lora_rank (512), the roped
 * and unroped parts of a q/k head (64, 128), a v head (128); the dense layer's FFN (10944) */
#define DS2_KV_LORA 64
#define DS2_ROPE 16
#define DS2_NOPE 32
#define DS2_V 32
#define DS2_DENSE_FF 256

static const char chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct gen {
    struct gguf_writer *w;
    struct rng r;
    float *buf;
    uint64_t params;
    bool fill;
    int mix;                 /* enum quant_mix, 0 for none */
    bool mix_as_f32;
    uint32_t n_layer, n_expert;
};

/* Filled tensors: base + uniform values of standard deviation std from a counter hash of
 * (seed, index), so any chunking gives the same bytes. */
struct fill_ctx { uint64_t seed; float base, half; };
#define FILL_MIN (1u << 20) /* tensors this large are filled at write time */

static void fill_uniform(const void *ctx, uint64_t first, uint64_t n, float *dst)
{
    const struct fill_ctx *f = ctx;
    for (uint64_t i = 0; i < n; i++) {
        struct rng r = {f->seed ^ ((first + i) * 0xd1342543de82ef95ull)};
        float u = (float)(rnext(&r) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        dst[i] = f->base + f->half * (2.0f * u - 1.0f);
    }
}

/* q8_0 made directly (the 30B model's ~1e9 blocks): quants uniform in -127..127 from one
 * hash per 8, and a scale giving the same std as fill_uniform (uniform ints have std
 * sqrt(127 * 128 / 3) = 73.9). Zero-mean only: norms are never this large. */
static void fill_q8_0(const void *ctx, uint64_t first, uint64_t n, void *dst)
{
    const struct fill_ctx *f = ctx;
    uint8_t *d8 = dst;
    uint16_t h = tide_f32_to_f16(f->half / 1.7320508f / 73.9f);
    for (uint64_t b = first / 32; b < (first + n) / 32; b++, d8 += 34) {
        d8[0] = h & 0xff;
        d8[1] = h >> 8;
        for (int k = 0; k < 4; k++) {
            struct rng r = {f->seed ^ ((b * 4 + (uint64_t)k) * 0xd1342543de82ef95ull)};
            uint64_t x = rnext(&r);
            for (int j = 0; j < 8; j++, x >>= 8)
                d8[2 + k * 8 + j] = (uint8_t)(int8_t)((int)((x & 0xff) * 255 >> 8) - 127);
        }
    }
}

/* kind: 0 = normal matrix scaled std * N(0,1), 1 = norm (1 + std * N) */
static void tensor(struct gen *g, const char *name, uint32_t type, uint32_t nd,
                   uint64_t a, uint64_t b, uint64_t c, float std, int norm)
{
    uint64_t ne[3] = {a, b, c}, n = a * b * c;
    if (g->mix)
        type = quant_mix_type(g->mix, name, nd, a, g->n_layer, g->n_expert, type);
    else if (a % ggml_block_size(type))
        type = GGML_TYPE_Q8_0; /* rows that are not whole super-blocks, as other tools do */
    if (g->fill && n >= FILL_MIN) {
        struct fill_ctx f = {rnext(&g->r), norm ? 1.0f : 0.0f, std * 1.7320508f};
        if (type == GGML_TYPE_Q8_0 && !norm)
            gguf_w_tensor_fill_raw(g->w, name, type, nd, ne, fill_q8_0, &f, sizeof f);
        else
            gguf_w_tensor_fill(g->w, name, type, nd, ne, fill_uniform, &f, sizeof f);
        g->params += n;
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        g->buf[i] = (norm ? 1.0f : 0.0f) + std * rnorm(&g->r);
    if (g->mix_as_f32 && type != GGML_TYPE_F32) { /* the values the mix stores, kept as f32 */
        void *tmp = malloc(ggml_row_size(GGML_TYPE_F32, n));
        if (tmp) {
            ggml_quantize(type, g->buf, tmp, n);
            ggml_dequantize(type, tmp, g->buf, n);
            free(tmp);
        }
        type = GGML_TYPE_F32;
    }
    gguf_w_tensor(g->w, name, type, nd, ne, g->buf);
    g->params += n;
}

/* deepseek2's layer l as llama.cpp's loader names and shapes it (src/models/deepseek2.cpp, the MLA
 * form): q without a LoRA (V2-Lite's), the compressed KV and its roped key part from one product
 * (attn_kv_a_mqa), the per-head k and v expansions as 3-D tensors, layer 0 dense. */
static void deepseek2_layer(struct gen *g, const struct preset *c, uint32_t l, uint32_t T, uint32_t TD)
{
    uint64_t E = c->n_embd, H = c->n_head, F = c->n_ff, X = c->n_expert, FS = c->n_ff_shexp;
    char n[96];
#define BN(s) (snprintf(n, sizeof n, "blk.%u." s ".weight", l), n)
    tensor(g, BN("attn_norm"), GGML_TYPE_F32, 1, E, 1, 1, 0.05f, 1);
    tensor(g, BN("attn_q"), T, 2, E, H * (DS2_NOPE + DS2_ROPE), 1, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("attn_kv_a_mqa"), T, 2, E, DS2_KV_LORA + DS2_ROPE, 1, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("attn_kv_a_norm"), GGML_TYPE_F32, 1, DS2_KV_LORA, 1, 1, 0.05f, 1);
    tensor(g, BN("attn_k_b"), T, 3, DS2_NOPE, DS2_KV_LORA, H, 1.0f / sqrtf((float)DS2_NOPE), 0);
    tensor(g, BN("attn_v_b"), T, 3, DS2_KV_LORA, DS2_V, H, 1.0f / sqrtf((float)DS2_KV_LORA), 0);
    tensor(g, BN("attn_output"), T, 2, H * DS2_V, E, 1, 1.0f / sqrtf((float)(H * DS2_V)), 0);
    tensor(g, BN("ffn_norm"), GGML_TYPE_F32, 1, E, 1, 1, 0.05f, 1);
    if (l == 0) { /* leading_dense_block_count 1 */
        tensor(g, BN("ffn_gate"), T, 2, E, DS2_DENSE_FF, 1, 1.0f / sqrtf((float)E), 0);
        tensor(g, BN("ffn_up"), T, 2, E, DS2_DENSE_FF, 1, 1.0f / sqrtf((float)E), 0);
        tensor(g, BN("ffn_down"), TD, 2, DS2_DENSE_FF, E, 1, 1.0f / sqrtf((float)DS2_DENSE_FF), 0);
        return;
    }
    tensor(g, BN("ffn_gate_inp"), GGML_TYPE_F32, 2, E, X, 1, 3.0f / sqrtf((float)E), 0);
    tensor(g, BN("ffn_gate_exps"), T, 3, E, F, X, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("ffn_up_exps"), T, 3, E, F, X, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("ffn_down_exps"), TD, 3, F, E, X, 1.0f / sqrtf((float)F), 0);
    tensor(g, BN("ffn_gate_shexp"), T, 2, E, FS, 1, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("ffn_up_shexp"), T, 2, E, FS, 1, 1.0f / sqrtf((float)E), 0);
    tensor(g, BN("ffn_down_shexp"), TD, 2, FS, E, 1, 1.0f / sqrtf((float)FS), 0);
#undef BN
}

static int efail(char *err, size_t errlen, int rc, const char *msg)
{
    if (err && errlen) snprintf(err, errlen, "modelgen: %s", msg);
    return rc;
}

int modelgen_write(const struct modelgen_options *o, struct modelgen_summary *sum,
                   char *err, size_t errlen)
{
    const struct preset *p = NULL;
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (o->preset && strcmp(o->preset, presets[i].name) == 0) p = &presets[i];
    if (!p) return efail(err, errlen, TIDE_EINVAL, "unknown preset (dense, moe, qwen3moe, qwen2moe, gpt-oss, olmoe, granitemoe, granitemoe-shared, deepseek2, qwen3vlmoe, qwen2vl, big, qwen3-30b-a3b, qwen3-vl-30b-a3b)");
    struct preset c = *p;
    if (o->n_layer) c.n_layer = o->n_layer;
    if (o->n_embd) c.n_embd = o->n_embd;
    if (o->n_head) c.n_head = o->n_head;
    if (o->n_head_kv) c.n_head_kv = o->n_head_kv;
    if (o->n_ff) c.n_ff = o->n_ff;
    if (!strcmp(c.arch, "deepseek2")) /* its 2 shared experts, as wide as a routed one whatever --ff says */
        c.n_ff_shexp = 2 * c.n_ff;
    if (o->n_expert) c.n_expert = o->n_expert;
    if (o->n_expert_used) c.n_used = o->n_expert_used;
    if (o->type >= 0) c.type = o->type;
    uint32_t hd = o->head_dim ? o->head_dim
                  : c.head_dim && !o->n_embd && !o->n_head ? c.head_dim : c.n_embd / (c.n_head ? c.n_head : 1);
    if (!c.n_head || !c.n_head_kv || c.n_head % c.n_head_kv || c.n_embd % 32 || hd % 2 || (c.n_head * hd) % 32 ||
        c.n_ff % 32 || c.n_ff_shexp % 32 || c.n_layer == 0 || (c.n_expert && (c.n_used == 0 || c.n_used > c.n_expert)))
        return efail(err, errlen, TIDE_EINVAL, "bad shape (n_embd, head_dim, n_ff, n_head*head_dim multiples of 32; heads divisible)");
    uint32_t TD = o->type_down > 0 ? (uint32_t)o->type_down : (uint32_t)c.type;
    if (!ggml_block_size((uint32_t)c.type))
        return efail(err, errlen, TIDE_EINVAL, "unknown weight type");
    if (o->mix < 0 || o->mix > QUANT_MIX_Q6_K)
        return efail(err, errlen, TIDE_EINVAL, "unknown mix (Q4_K_M, Q5_K_M, Q6_K)");
    if (o->type_down > 0 && !ggml_block_size((uint32_t)o->type_down))
        return efail(err, errlen, TIDE_EINVAL, "unknown down type");

    struct vocab v;
    if (vocab_build(&v)) return efail(err, errlen, TIDE_ENOMEM, "out of memory");
    uint32_t bos = v.n - 3, eos = v.n - 1; /* the specials end the BPE's tokens */
    if (c.mrope_sections[0] && vocab_add_vision(&v)) return efail(err, errlen, TIDE_ENOMEM, "out of memory");
    if (vocab_pad(&v, c.n_vocab)) return efail(err, errlen, TIDE_ENOMEM, "out of memory");
    struct gen g = {0};
    g.r.s = o->seed * 0x2545f4914f6cdd1dull + 12345;
    g.w = gguf_writer_new();
    g.fill = c.fill;
    g.mix = o->mix;
    g.mix_as_f32 = o->mix_as_f32;
    g.n_layer = c.n_layer;
    g.n_expert = c.n_expert;
    if (g.w) gguf_writer_set_threads(g.w, o->threads);
    uint64_t E = c.n_embd, V = v.n, Q = (uint64_t)c.n_head * hd, KV = (uint64_t)c.n_head_kv * hd;
    uint64_t F = c.n_ff, X = c.n_expert ? c.n_expert : 1;
    uint64_t maxn = E * V;
    if (E * F * X > maxn) maxn = E * F * X;
    if (E * c.n_ff_shexp > maxn) maxn = E * c.n_ff_shexp;
    if (E * Q > maxn) maxn = E * Q;
    if (E * X > maxn) maxn = E * X;
    if (c.fill) maxn = FILL_MIN; /* only the small tensors are made here */
    g.buf = malloc(maxn * sizeof(float));
    if (!g.w || !g.buf) {
        vocab_free(&v);
        gguf_writer_free(g.w);
        free(g.buf);
        return efail(err, errlen, TIDE_ENOMEM, "out of memory");
    }
    struct gguf_writer *w = g.w;
    char k[160];
#define AK(s) (snprintf(k, sizeof k, "%s." s, c.arch), k)
    gguf_w_str(w, "general.architecture", c.arch);
    snprintf(k, sizeof k, "tide-%s", c.name);
    gguf_w_str(w, "general.name", k);
    gguf_w_u32(w, AK("context_length"), 4096);
    gguf_w_u32(w, AK("embedding_length"), c.n_embd);
    gguf_w_u32(w, AK("block_count"), c.n_layer);
    /* qwen2moe's converter writes the shared expert's width here (intermediate_size); granite's
     * the experts' */
    bool qwen2 = !strcmp(c.arch, "qwen2moe");
    gguf_w_u32(w, AK("feed_forward_length"), !strcmp(c.arch, "deepseek2") ? DS2_DENSE_FF
                                             : qwen2 && c.n_ff_shexp ? c.n_ff_shexp : c.n_ff);
    gguf_w_u32(w, AK("attention.head_count"), c.n_head);
    gguf_w_u32(w, AK("attention.head_count_kv"), c.n_head_kv);
    bool ds2 = !strcmp(c.arch, "deepseek2");
    if (ds2) { /* MLA as MQA: the keys (576, 512 in V2-Lite) and the per-head widths (192, 128) */
        gguf_w_u32(w, AK("attention.key_length"), DS2_KV_LORA + DS2_ROPE);
        gguf_w_u32(w, AK("attention.value_length"), DS2_KV_LORA);
        gguf_w_u32(w, AK("attention.key_length_mla"), DS2_NOPE + DS2_ROPE);
        gguf_w_u32(w, AK("attention.value_length_mla"), DS2_V);
        gguf_w_u32(w, AK("attention.kv_lora_rank"), DS2_KV_LORA);
        gguf_w_u32(w, AK("rope.dimension_count"), DS2_ROPE);
        gguf_w_u32(w, AK("leading_dense_block_count"), 1);
        gguf_w_u32(w, AK("expert_shared_count"), c.n_ff_shexp / c.n_ff);
        gguf_w_f32(w, AK("expert_weights_scale"), 1.0f);
        /* V2-Lite's yarn: factor 40 over 4096, mscale_all_dim 0.707 written as 0.1 * it */
        gguf_w_str(w, AK("rope.scaling.type"), "yarn");
        gguf_w_f32(w, AK("rope.scaling.factor"), 40.0f);
        gguf_w_u32(w, AK("rope.scaling.original_context_length"), 4096);
        gguf_w_f32(w, AK("rope.scaling.yarn_log_multiplier"), 0.0707f);
    } else {
        gguf_w_u32(w, AK("attention.key_length"), hd);
        gguf_w_u32(w, AK("attention.value_length"), hd);
        gguf_w_u32(w, AK("rope.dimension_count"), hd);
    }
    gguf_w_f32(w, AK("rope.freq_base"), c.rope_base ? c.rope_base : 10000.0f);
    gguf_w_f32(w, AK("attention.layer_norm_rms_epsilon"), c.eps);
    gguf_w_u32(w, AK("vocab_size"), (uint32_t)V);
    if (c.n_expert) {
        gguf_w_u32(w, AK("expert_count"), c.n_expert);
        gguf_w_u32(w, AK("expert_used_count"), c.n_used);
        gguf_w_u32(w, AK("expert_feed_forward_length"), c.n_ff);
        if (c.qk_norm) gguf_w_bool(w, AK("expert_weights_norm"), true);
        if (c.n_ff_shexp && !ds2) gguf_w_u32(w, AK("expert_shared_feed_forward_length"), c.n_ff_shexp);
    }
    bool olmoe = !strcmp(c.arch, "olmoe"), granite = !strcmp(c.arch, "granitemoe");
    if (granite) { /* granite-3.0-1b-a400m's multipliers as its converted file has them */
        gguf_w_f32(w, AK("embedding_scale"), 12.0f);
        gguf_w_f32(w, AK("residual_scale"), 0.22f);
        gguf_w_f32(w, AK("attention.scale"), 0.015625f);
        gguf_w_f32(w, AK("logit_scale"), 6.0f);
    }
    if (c.mrope_sections[0]) {
        gguf_w_arr_i32(w, AK("rope.dimension_sections"), c.mrope_sections, 4);
        if (!strcmp(c.arch, "qwen3vlmoe"))
            gguf_w_u32(w, AK("n_deepstack_layers"), c.n_deepstack);
    }
    if (c.n_swa) { /* gpt-oss: the window, and yarn as gpt-oss-20b's file has it (factor 32 over 4096) */
        gguf_w_u32(w, AK("attention.sliding_window"), c.n_swa);
        gguf_w_str(w, AK("rope.scaling.type"), "yarn");
        gguf_w_f32(w, AK("rope.scaling.factor"), 32.0f);
        gguf_w_u32(w, AK("rope.scaling.original_context_length"), 4096);
    }
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", c.n_swa ? "gpt-4o" : "gpt-2"); /* gpt-oss: o200k's pre-tokenizer */
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, v.n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, v.n);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, v.n_merges);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", bos);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", eos);
    gguf_w_u32(w, "tokenizer.ggml.padding_token_id", bos);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_w_str(w, "tokenizer.chat_template", o->chat_template ? o->chat_template : chatml);

    /* std 1/sqrt(fan_in) keeps activations O(1); the output matrix is scaled up so the
     * logits spread (std ~3) and greedy decoding moves between tokens. */
    uint32_t T = c.type, TX = T; /* TX: the experts' type */
    if (c.n_swa && T == GGML_TYPE_MXFP4) /* gpt-oss's MXFP4 files keep it to the experts */
        T = TD = GGML_TYPE_Q8_0;
    bool oss = c.n_swa != 0;
    tensor(&g, "token_embd.weight", T, 2, E, V, 1, 0.7f, 0);
    tensor(&g, "output_norm.weight", GGML_TYPE_F32, 1, E, 1, 1, 0.05f, 1);
    tensor(&g, "output.weight", TD, 2, E, V, 1, 3.0f / sqrtf((float)E), 0);
    char n[96];
    for (uint32_t l = 0; l < c.n_layer; l++) {
        if (ds2) {
            deepseek2_layer(&g, &c, l, T, TD);
            continue;
        }
#define BN(s) (snprintf(n, sizeof n, "blk.%u." s ".weight", l), n)
        tensor(&g, BN("attn_norm"), GGML_TYPE_F32, 1, E, 1, 1, 0.05f, 1);
        tensor(&g, BN("attn_q"), T, 2, E, Q, 1, 1.0f / sqrtf((float)E), 0);
        tensor(&g, BN("attn_k"), T, 2, E, KV, 1, 1.0f / sqrtf((float)E), 0);
        tensor(&g, BN("attn_v"), T, 2, E, KV, 1, 1.0f / sqrtf((float)E), 0);
        tensor(&g, BN("attn_output"), T, 2, Q, E, 1, 1.0f / sqrtf((float)Q), 0);
#define BB(s) (snprintf(n, sizeof n, "blk.%u." s ".bias", l), n)
        if ((qwen2 && c.n_ff_shexp) || oss || !strcmp(c.arch, "qwen2vl")) { /* qwen2's and gpt-oss's q/k/v biases (f32, as converted files have them) */
            tensor(&g, BB("attn_q"), GGML_TYPE_F32, 1, Q, 1, 1, 0.2f, 0);
            tensor(&g, BB("attn_k"), GGML_TYPE_F32, 1, KV, 1, 1, 0.2f, 0);
            tensor(&g, BB("attn_v"), GGML_TYPE_F32, 1, KV, 1, 1, 0.2f, 0);
        }
        if (oss) { /* the output bias and a sink logit per head */
            tensor(&g, BB("attn_output"), GGML_TYPE_F32, 1, E, 1, 1, 0.2f, 0);
            tensor(&g, BN("attn_sinks"), GGML_TYPE_F32, 1, c.n_head, 1, 1, 1.0f, 0);
        }
        if (c.qk_norm || olmoe) { /* per head; olmoe's over all of q and all of k */
            tensor(&g, BN("attn_q_norm"), GGML_TYPE_F32, 1, olmoe ? Q : hd, 1, 1, 0.05f, 1);
            tensor(&g, BN("attn_k_norm"), GGML_TYPE_F32, 1, olmoe ? KV : hd, 1, 1, 0.05f, 1);
        }
        tensor(&g, oss ? BN("post_attention_norm") : BN("ffn_norm"), GGML_TYPE_F32, 1, E, 1, 1, 0.05f, 1);
        if (c.n_expert) {
            /* a wide router so that different tokens pick different experts */
            tensor(&g, BN("ffn_gate_inp"), GGML_TYPE_F32, 2, E, X, 1, 3.0f / sqrtf((float)E), 0);
            tensor(&g, BN("ffn_gate_exps"), TX, 3, E, F, X, 1.0f / sqrtf((float)E), 0);
            tensor(&g, BN("ffn_up_exps"), TX, 3, E, F, X, 1.0f / sqrtf((float)E), 0);
            tensor(&g, BN("ffn_down_exps"), oss ? TX : TD, 3, F, E, X, 1.0f / sqrtf((float)F), 0);
            if (oss) { /* the router's and every expert's biases, a row an expert */
                tensor(&g, BB("ffn_gate_inp"), GGML_TYPE_F32, 1, X, 1, 1, 0.5f, 0);
                tensor(&g, BB("ffn_gate_exps"), GGML_TYPE_F32, 2, F, X, 1, 0.2f, 0);
                tensor(&g, BB("ffn_up_exps"), GGML_TYPE_F32, 2, F, X, 1, 0.2f, 0);
                tensor(&g, BB("ffn_down_exps"), GGML_TYPE_F32, 2, E, X, 1, 0.2f, 0);
            }
            if (c.n_ff_shexp) { /* the shared expert and (qwen2moe) its 1-row sigmoid gate */
                uint64_t FS = c.n_ff_shexp;
                if (qwen2)
                    tensor(&g, BN("ffn_gate_inp_shexp"), GGML_TYPE_F32, 1, E, 1, 1, 1.0f / sqrtf((float)E), 0);
                tensor(&g, BN("ffn_gate_shexp"), T, 2, E, FS, 1, 1.0f / sqrtf((float)E), 0);
                tensor(&g, BN("ffn_up_shexp"), T, 2, E, FS, 1, 1.0f / sqrtf((float)E), 0);
                tensor(&g, BN("ffn_down_shexp"), TD, 2, FS, E, 1, 1.0f / sqrtf((float)FS), 0);
            }
        } else {
            tensor(&g, BN("ffn_gate"), T, 2, E, F, 1, 1.0f / sqrtf((float)E), 0);
            tensor(&g, BN("ffn_up"), T, 2, E, F, 1, 1.0f / sqrtf((float)E), 0);
            tensor(&g, BN("ffn_down"), TD, 2, F, E, 1, 1.0f / sqrtf((float)F), 0);
        }
#undef BN
#undef BB
    }
#undef AK
    free(g.buf);
    int rc = gguf_writer_write(w, o->out);
    gguf_writer_free(w);
    if (sum) {
        struct stat st;
        sum->n_params = g.params;
        sum->n_vocab = v.n;
        sum->n_bytes = stat(o->out, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    vocab_free(&v);
    if (rc) return efail(err, errlen, rc, rc == TIDE_EIO ? "cannot write output file" : "writer failed");
    return 0;
}

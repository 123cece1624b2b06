/* tokenizer.c - byte-level BPE ("gpt2") and SentencePiece-style ("llama") tokenizers
 * built from the vocabulary in a GGUF.
 *
 * BPE: split the text with the pre-tokenizer's regex (PCRE2, Unicode), map each word's bytes
 * to GPT-2's printable code points, merge adjacent symbols lowest rank first, look the
 * pieces up. SPM: spaces become U+2581, adjacent pieces merge best score first, unknown
 * characters fall back to <0xNN> byte tokens. Special tokens are cut out of the text first. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOK_GPT2, TOK_LLAMA };

/* Open-addressing string -> int map; keys are owned copies. */
struct strmap {
    char **keys;
    int *vals;
    size_t cap;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int map_init(struct strmap *m, size_t n)
{
    m->cap = 16;
    while (m->cap < n * 2 + 16) m->cap *= 2;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
    return m->keys && m->vals ? 0 : TIDE_ENOMEM;
}

static void map_free(struct strmap *m)
{
    if (m->keys)
        for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
}

static int map_get(const struct strmap *m, const char *s, size_t n)
{
    size_t i = hash_bytes(s, n) & (m->cap - 1);
    while (m->keys[i]) {
        if (strlen(m->keys[i]) == n && !memcmp(m->keys[i], s, n)) return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

/* First insert wins (vocabularies may repeat a piece; the lower id is the canonical one). */
static int map_put(struct strmap *m, const char *s, size_t n, int v)
{
    size_t i = hash_bytes(s, n) & (m->cap - 1);
    while (m->keys[i]) {
        if (strlen(m->keys[i]) == n && !memcmp(m->keys[i], s, n)) return 0;
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = strndup(s, n);
    if (!m->keys[i]) return TIDE_ENOMEM;
    m->vals[i] = v;
    return 0;
}

struct tokenizer {
    int kind;
    uint32_t n;
    char **text;        /* (n) token text as stored in the vocabulary */
    float *score;       /* (n) SPM scores, or NULL */
    int32_t *type;      /* (n) 1 normal, 3 control, 4 user defined, 6 byte */
    struct strmap ids;  /* text -> id */
    struct strmap ranks; /* "left right" -> merge rank (gpt2) */
    int *special;       /* ids of control/user-defined tokens, longest first */
    int n_special;
    uint8_t special_lead[32]; /* bit b: some special token starts with byte b */
    int bos, eos, eot;
    bool add_bos;
    int byte_id[256];   /* SPM <0xNN> tokens, or gpt2 single-byte tokens; -1 when absent */
    pcre2_code *re;     /* read-only once compiled: match data is per call (thread safety) */
    uint16_t byte_cp[256];  /* GPT-2 byte -> code point */
    int16_t cp_byte[512];   /* code point (< 512) -> byte, -1 when not a mapped one */
};

static const char *GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char *LLAMA3_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* o200k (gpt-4o, gpt-oss: tokenizer.ggml.pre "gpt-4o"): words split before an upper-case run's
 * lower-case tail with an optional contraction, numbers in threes, punctuation with trailing
 * newlines or slashes (the tokenizer.json's pre-tokenizer pattern) */
static const char *GPT4O_RE =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *QWEN2_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static size_t utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

/* Length of the UTF-8 character at s (1 for an invalid lead byte). */
static size_t utf8_len(const unsigned char *s, size_t left)
{
    size_t n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 1;
    if (n > left) return 1;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 1;
    return n;
}

static void byte_map_init(struct tokenizer *t)
{
    int k = 0;
    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        t->byte_cp[b] = direct ? (uint16_t)b : (uint16_t)(256 + k++);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

static int cmp_special_len(const void *a, const void *b, void *ctx)
{
    const struct tokenizer *t = ctx;
    size_t la = strlen(t->text[*(const int *)a]), lb = strlen(t->text[*(const int *)b]);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

int tokenizer_create(struct tokenizer **out, const char *model, const char *pre,
                     const char *const *tokens, const float *scores, const int32_t *types,
                     uint32_t n_tokens, const char *const *merges, uint32_t n_merges)
{
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) return TIDE_ENOMEM;
    int rc = TIDE_ENOMEM;
    t->kind = model && !strcmp(model, "llama") ? TOK_LLAMA : TOK_GPT2;
    if (model && strcmp(model, "llama") && strcmp(model, "gpt2")) {
        free(t);
        return TIDE_EUNSUPPORTED;
    }
    t->n = n_tokens;
    t->bos = t->eos = t->eot = -1;
    byte_map_init(t);
    t->text = calloc(n_tokens, sizeof *t->text);
    t->type = calloc(n_tokens, sizeof *t->type);
    t->special = calloc(n_tokens, sizeof *t->special);
    if (scores) t->score = malloc(sizeof(float) * n_tokens);
    if (!t->text || !t->type || !t->special || (scores && !t->score)) goto fail;
    if (map_init(&t->ids, n_tokens) < 0 || map_init(&t->ranks, n_merges) < 0) goto fail;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (uint32_t i = 0; i < n_tokens; i++) {
        t->text[i] = strdup(tokens[i] ? tokens[i] : "");
        if (!t->text[i]) goto fail;
        t->type[i] = types ? types[i] : 1;
        if (scores) t->score[i] = scores[i];
        if (map_put(&t->ids, t->text[i], strlen(t->text[i]), (int)i) < 0) goto fail;
        if ((t->type[i] == 3 || t->type[i] == 4) && t->text[i][0]) t->special[t->n_special++] = (int)i;
        unsigned v;
        if (t->kind == TOK_LLAMA && strlen(t->text[i]) == 6 && sscanf(t->text[i], "<0x%2X>", &v) == 1)
            t->byte_id[v] = (int)i;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof(int), cmp_special_len, t);
    for (int i = 0; i < t->n_special; i++) {
        unsigned char b = (unsigned char)t->text[t->special[i]][0];
        t->special_lead[b >> 3] |= (uint8_t)(1u << (b & 7));
    }
    for (uint32_t r = 0; r < n_merges; r++)
        if (merges[r] && map_put(&t->ranks, merges[r], strlen(merges[r]), (int)r) < 0) goto fail;
    if (t->kind == TOK_GPT2) {
        for (int b = 0; b < 256; b++) {
            char s[4];
            size_t l = utf8_put(s, t->byte_cp[b]);
            t->byte_id[b] = map_get(&t->ids, s, l);
        }
        const char *re = GPT2_RE;
        if (pre && (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama-v3")))
            re = LLAMA3_RE;
        else if (pre && !strcmp(pre, "qwen2"))
            re = QWEN2_RE;
        else if (pre && !strcmp(pre, "gpt-4o"))
            re = GPT4O_RE;
        int ec;
        PCRE2_SIZE eo;
        t->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!t->re) {
            rc = TIDE_EINTERNAL;
            goto fail;
        }
        pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    }
    *out = t;
    return 0;
fail:
    tokenizer_free(t);
    return rc;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t) return;
    if (t->text)
        for (uint32_t i = 0; i < t->n; i++) free(t->text[i]);
    free(t->text);
    free(t->score);
    free(t->type);
    free(t->special);
    map_free(&t->ids);
    map_free(&t->ranks);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

static int get_id(const struct gguf_file *g, const char *key)
{
    uint32_t v;
    return gguf_get_u32(g, key, &v) == 0 ? (int)v : -1;
}

int tokenizer_load(struct tokenizer **out, const struct gguf_file *g, char *err, size_t errlen)
{
    char *model = gguf_dup_str(g, "tokenizer.ggml.model");
    char *pre = gguf_dup_str(g, "tokenizer.ggml.pre");
    const struct gguf_kv *tk = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const struct gguf_kv *sc = gguf_find_kv(g, "tokenizer.ggml.scores");
    const struct gguf_kv *ty = gguf_find_kv(g, "tokenizer.ggml.token_type");
    const struct gguf_kv *mg = gguf_find_kv(g, "tokenizer.ggml.merges");
    int rc = TIDE_EFORMAT;
    char **toks = NULL, **merges = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    uint64_t n = 0, nm = 0;
    if (!model || !tk || tk->type != GGUF_TYPE_ARRAY || tk->v.arr.type != GGUF_TYPE_STRING) {
        snprintf(err, errlen, "tokenizer: the GGUF has no tokenizer.ggml.model / tokens");
        goto out;
    }
    n = tk->v.arr.n;
    if (strcmp(model, "gpt2") && strcmp(model, "llama")) {
        snprintf(err, errlen, "tokenizer: model '%s' is not supported (gpt2, llama)", model);
        rc = TIDE_EUNSUPPORTED;
        goto out;
    }
    toks = calloc(n, sizeof *toks);
    if (!toks) { rc = TIDE_ENOMEM; goto out; }
    for (uint64_t i = 0; i < n; i++) {
        toks[i] = strndup(tk->v.arr.strs[i].ptr, tk->v.arr.strs[i].len);
        if (!toks[i]) { rc = TIDE_ENOMEM; goto out; }
    }
    if (sc && sc->type == GGUF_TYPE_ARRAY && sc->v.arr.type == GGUF_TYPE_FLOAT32 && sc->v.arr.n == n) {
        scores = malloc(sizeof(float) * n);
        if (!scores) { rc = TIDE_ENOMEM; goto out; }
        memcpy(scores, sc->v.arr.data, sizeof(float) * n);
    }
    if (ty && ty->type == GGUF_TYPE_ARRAY && ty->v.arr.type == GGUF_TYPE_INT32 && ty->v.arr.n == n) {
        types = malloc(sizeof(int32_t) * n);
        if (!types) { rc = TIDE_ENOMEM; goto out; }
        memcpy(types, ty->v.arr.data, sizeof(int32_t) * n);
    }
    if (mg && mg->type == GGUF_TYPE_ARRAY && mg->v.arr.type == GGUF_TYPE_STRING) {
        nm = mg->v.arr.n;
        merges = calloc(nm ? nm : 1, sizeof *merges);
        if (!merges) { rc = TIDE_ENOMEM; goto out; }
        for (uint64_t i = 0; i < nm; i++) {
            merges[i] = strndup(mg->v.arr.strs[i].ptr, mg->v.arr.strs[i].len);
            if (!merges[i]) { rc = TIDE_ENOMEM; goto out; }
        }
    }
    rc = tokenizer_create(out, model, pre, (const char *const *)toks, scores, types, (uint32_t)n,
                          (const char *const *)merges, (uint32_t)nm);
    if (rc < 0) {
        snprintf(err, errlen, "tokenizer: %s", tide_strerror(rc));
        goto out;
    }
    (*out)->bos = get_id(g, "tokenizer.ggml.bos_token_id");
    (*out)->eos = get_id(g, "tokenizer.ggml.eos_token_id");
    (*out)->eot = get_id(g, "tokenizer.ggml.eot_token_id");
    bool ab = (*out)->kind == TOK_LLAMA;
    gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &ab);
    (*out)->add_bos = ab;
    for (int *id = &(*out)->bos; id <= &(*out)->eot; id++)
        if (*id >= (int)n) *id = -1;
out:
    if (toks) for (uint64_t i = 0; i < n; i++) free(toks[i]);
    if (merges) for (uint64_t i = 0; i < nm; i++) free(merges[i]);
    free(toks);
    free(merges);
    free(scores);
    free(types);
    free(model);
    free(pre);
    return rc;
}

uint32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n; }
int tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int tokenizer_eos(const struct tokenizer *t) { return t->eos; }
bool tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos && t->bos >= 0; }
int tokenizer_find(const struct tokenizer *t, const char *s) { return map_get(&t->ids, s, strlen(s)); }

bool tokenizer_is_special(const struct tokenizer *t, int id)
{
    return id >= 0 && (uint32_t)id < t->n && (t->type[id] == 3 || t->type[id] == 4);
}

/* o200k_harmony (gpt-oss): a vocabulary with both <|return|> and <|call|> as special tokens. */
static bool harmony_vocab(const struct tokenizer *t)
{
    int r = tokenizer_find(t, "<|return|>"), c = tokenizer_find(t, "<|call|>");
    return r >= 0 && c >= 0 && tokenizer_is_special(t, r) && tokenizer_is_special(t, c);
}

bool tokenizer_is_eog(const struct tokenizer *t, int id)
{
    if (id < 0 || (uint32_t)id >= t->n) return false;
    /* harmony: <|end|> closes one message (the analysis channel), not the reply; <|return|>
     * (the final answer's end) and <|call|> (a tool call's) end generation. llama.cpp's rule,
     * whatever the file's eos/eot ids say. Looked up only for these three tokens. */
    if (tokenizer_is_special(t, id) && (!strcmp(t->text[id], "<|end|>") || !strcmp(t->text[id], "<|return|>") ||
                                        !strcmp(t->text[id], "<|call|>")) && harmony_vocab(t))
        return strcmp(t->text[id], "<|end|>") != 0;
    if (id == t->eos || id == t->eot) return true;
    static const char *const names[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>", "<|end|>"};
    if (t->type[id] != 3 && t->type[id] != 4) return false;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(t->text[id], names[i])) return true;
    return false;
}

/* A growable id list. */
struct ids {
    int *v;
    int n, cap;
    int err;
    const volatile int *cancel; /* polled every CANCEL_EVERY pieces; NULL: never */
    unsigned pieces;
};

/* A cancelled job stops within this many pieces (words) of the prompt: a few ms of work. */
#define CANCEL_EVERY 256

/* Instrumentation (tests): bytes whose UTF-8 was checked and regex calls, all tokenizers. */
static _Atomic uint64_t n_utf8_checked, n_match_calls;

void tokenizer_get_counters(struct tokenizer_counters *c)
{
    c->utf8_bytes_checked = n_utf8_checked;
    c->match_calls = n_match_calls;
}

/* One more piece: polls the cancel flag now and then. False once cancelled. */
static bool next_piece(struct ids *out)
{
    if (out->err) return false;
    /* an atomic load: the flag is written by another thread (the HTTP side's hang-up watch) */
    if (out->cancel && ++out->pieces % CANCEL_EVERY == 0 && __atomic_load_n(out->cancel, __ATOMIC_RELAXED))
        out->err = TIDE_ECANCELED;
    return !out->err;
}

/* Length of the longest valid UTF-8 prefix of s (as PCRE2 defines valid: shortest form, no
 * surrogates, nothing above U+10FFFF). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
        if (!k || n - i <= k) break;
        unsigned char c1 = s[i + 1];
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
            (c == 0xF4 && c1 > 0x8F))
            break;
        size_t j = 1;
        while (j <= k && (s[i + j] & 0xC0) == 0x80) j++;
        if (j <= k) break;
        i += k + 1;
    }
    return i;
}

static void ids_push(struct ids *l, int id)
{
    if (l->err) return;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        int *nv = realloc(l->v, sizeof(int) * (size_t)nc);
        if (!nv) { l->err = TIDE_ENOMEM; return; }
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = id;
}

/* Symbols of a word being merged: [off, off+len) into the word's mapped text. */
struct sym {
    int off, len, prev, next;
};

/* Merge the symbols of one mapped word by a score function, then emit ids.
 * For BPE the best pair has the lowest merge rank; for SPM the highest token score. */
static void merge_word(const struct tokenizer *t, const char *w, int wl, struct ids *out)
{
    if (!next_piece(out)) return;
    struct sym stack_syms[256];
    int n_sym = 0;
    for (int i = 0; i < wl;) i += (int)utf8_len((const unsigned char *)w + i, (size_t)(wl - i)), n_sym++;
    struct sym *s = n_sym <= 256 ? stack_syms : malloc(sizeof *s * (size_t)n_sym);
    if (!s) { out->err = TIDE_ENOMEM; return; }
    int k = 0;
    for (int i = 0; i < wl; k++) {
        int l = (int)utf8_len((const unsigned char *)w + i, (size_t)(wl - i));
        s[k] = (struct sym){i, l, k - 1, k + 1 < n_sym ? k + 1 : -1};
        i += l;
    }
    char key[1024];
    for (;;) {
        int best = -1;
        double best_score = 0;
        for (int i = 0; i != -1 && i < n_sym; i = s[i].next) {
            int j = s[i].next;
            if (j < 0) break;
            if (s[i].len + s[j].len + 2 > (int)sizeof key) continue;
            double score;
            if (t->kind == TOK_GPT2) {
                memcpy(key, w + s[i].off, (size_t)s[i].len);
                key[s[i].len] = ' ';
                memcpy(key + s[i].len + 1, w + s[j].off, (size_t)s[j].len);
                int r = map_get(&t->ranks, key, (size_t)(s[i].len + 1 + s[j].len));
                if (r < 0) continue;
                score = -(double)r;
            } else {
                int id = map_get(&t->ids, w + s[i].off, (size_t)(s[i].len + s[j].len));
                if (id < 0) continue;
                score = t->score ? t->score[id] : 0;
            }
            if (best < 0 || score > best_score) best = i, best_score = score;
        }
        if (best < 0) break;
        int j = s[best].next;
        s[best].len += s[j].len;
        s[best].next = s[j].next;
        if (s[j].next >= 0) s[s[j].next].prev = best;
    }
    for (int i = 0; i != -1 && n_sym > 0; i = s[i].next) {
        int id = map_get(&t->ids, w + s[i].off, (size_t)s[i].len);
        if (id >= 0) {
            ids_push(out, id);
        } else if (t->kind == TOK_GPT2) {
            /* piece not in the vocabulary: its code points back to bytes, one token each */
            for (int p = s[i].off; p < s[i].off + s[i].len;) {
                int l = (int)utf8_len((const unsigned char *)w + p, (size_t)(s[i].off + s[i].len - p));
                char one[5] = {0};
                memcpy(one, w + p, (size_t)l);
                int b = map_get(&t->ids, one, (size_t)l);
                if (b >= 0) ids_push(out, b);
                p += l;
            }
        } else {
            for (int p = 0; p < s[i].len; p++) {
                int b = t->byte_id[(unsigned char)w[s[i].off + p]];
                if (b >= 0) ids_push(out, b);
            }
        }
    }
    if (s != stack_syms) free(s);
}

/* Encode a stretch of ordinary text (no special tokens in it). */
static void encode_plain(const struct tokenizer *t, const char *text, size_t len, bool at_start,
                         struct ids *out)
{
    if (len == 0) return;
    if (t->kind == TOK_LLAMA) {
        /* SPM: a leading U+2581, every space becomes U+2581. Words are split at the
         * U+2581 boundaries so that merging stays linear in the text length. */
        size_t cap = len * 3 + 4, n = 0;
        char *m = malloc(cap);
        if (!m) { out->err = TIDE_ENOMEM; return; }
        if (at_start) { memcpy(m, "\xE2\x96\x81", 3); n = 3; }
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') { memcpy(m + n, "\xE2\x96\x81", 3); n += 3; }
            else m[n++] = text[i];
        }
        size_t start = 0;
        for (size_t i = 3; i <= n; i++)
            if (i == n || (i + 3 <= n && !memcmp(m + i, "\xE2\x96\x81", 3))) {
                if (out->err) break;
                merge_word(t, m + start, (int)(i - start), out);
                start = i;
            }
        free(m);
        return;
    }
    /* The text is checked for UTF-8 here, once, a run at a time, and the regex then runs with
     * PCRE2_NO_UTF_CHECK: without it every call re-validated the rest of the text, which made
     * a long prompt cost the square of its length (issue 27). The regex only ever sees a
     * valid run; a byte that cannot start one is a piece of its own. */
    size_t off = 0, valid_end = 0;
    /* Match data of its own: the HTTP threads (POST /tokenize, prompt validation) encode while
     * the engine thread does, and nothing else in the tokenizer is written after load. */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    char *mapped = malloc(4096 * 2 + 8);
    if (!mapped || !md) { free(mapped); pcre2_match_data_free(md); out->err = TIDE_ENOMEM; return; }
    uint64_t checked = 0, calls = 0;
    while (off < len && !out->err) {
        size_t a, b;
        if (off >= valid_end) {
            size_t v = utf8_valid_prefix((const unsigned char *)text + off, len - off);
            checked += v + 1;
            valid_end = off + v;
        }
        if (off == valid_end) {
            a = off;            /* invalid byte */
            b = off + 1;
            valid_end = 0;
        } else {
            int rc = pcre2_match(t->re, (PCRE2_SPTR)text, valid_end, off, PCRE2_NO_UTF_CHECK, md, NULL);
            calls++;
            if (rc < 0) {
                a = off;        /* no match: one character */
                b = off;
            } else {
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                a = ov[0];
                b = ov[1];
                if (a > off) b = a, a = off;  /* bytes the regex skipped */
            }
            /* never an empty piece, never half a character (the next match starts there) */
            if (b == a) b = a + utf8_len((const unsigned char *)text + a, valid_end - a);
        }
        /* Words are merged in chunks of at most 4096 bytes so a huge word stays cheap. */
        for (size_t c = a; c < b; c += 4096) {
            size_t e = b - c > 4096 ? c + 4096 : b, n = 0;
            for (size_t i = c; i < e; i++) n += utf8_put(mapped + n, t->byte_cp[(unsigned char)text[i]]);
            merge_word(t, mapped, (int)n, out);
        }
        off = b;
    }
    n_utf8_checked += checked; /* _Atomic: HTTP threads (POST /tokenize) encode too */
    n_match_calls += calls;
    free(mapped);
    pcre2_match_data_free(md);
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
                     const volatile int *cancel, int **ids, int *n)
{
    struct ids out = {.cancel = cancel};
    size_t start = 0, i = 0;
    while (i < len && parse_special) {
        unsigned char lead = (unsigned char)text[i];
        if (!(t->special_lead[lead >> 3] & (1u << (lead & 7)))) { i++; continue; }
        int hit = -1;
        for (int s = 0; s < t->n_special; s++) {
            const char *st = t->text[t->special[s]];
            size_t sl = strlen(st);
            if (sl <= len - i && !memcmp(text + i, st, sl)) { hit = t->special[s]; break; }
        }
        if (hit < 0) { i++; continue; }
        encode_plain(t, text + start, i - start, start == 0, &out);
        if (out.err) break;
        ids_push(&out, hit);
        i += strlen(t->text[hit]);
        start = i;
    }
    encode_plain(t, text + start, len - start, start == 0, &out);
    if (out.err) {
        free(out.v);
        return out.err;
    }
    *ids = out.v ? out.v : malloc(sizeof(int));
    *n = out.n;
    return *ids ? 0 : TIDE_ENOMEM;
}

int tokenizer_token_bytes(const struct tokenizer *t, int id, char *buf, size_t cap)
{
    if (id < 0 || (uint32_t)id >= t->n) return TIDE_EINVAL;
    const char *s = t->text[id];
    size_t sl = strlen(s), n = 0;
    if (tokenizer_is_special(t, id)) {
        n = sl < cap ? sl : cap;
        memcpy(buf, s, n);
        return (int)n;
    }
    if (t->kind == TOK_LLAMA) {
        unsigned v;
        if (sl == 6 && sscanf(s, "<0x%2X>", &v) == 1) {
            if (cap) buf[0] = (char)v;
            return cap ? 1 : 0;
        }
        for (size_t i = 0; i < sl && n < cap;) {
            if (i + 3 <= sl && !memcmp(s + i, "\xE2\x96\x81", 3)) { buf[n++] = ' '; i += 3; }
            else buf[n++] = s[i++];
        }
        return (int)n;
    }
    for (size_t i = 0; i < sl && n < cap;) {
        const unsigned char *u = (const unsigned char *)s + i;
        size_t l = utf8_len(u, sl - i);
        uint32_t cp = l == 1 ? u[0] : l == 2 ? (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F)
                    : 0xFFFF;
        if (cp < 512 && t->cp_byte[cp] >= 0) buf[n++] = (char)t->cp_byte[cp];
        else for (size_t k = 0; k < l && n < cap; k++) buf[n++] = (char)u[k];
        i += l;
    }
    return (int)n;
}

/* Expected length of a UTF-8 sequence from its lead byte; 0 for a byte that cannot lead. */
static int lead_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : (c >> 4) == 0xE ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

size_t utf8_stream_feed(struct utf8_stream *s, const char *in, size_t len, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (s->n_pending == 0) {
            int l = lead_len(c);
            if (l == 1) out[n++] = (char)c;
            else if (l == 0) { memcpy(out + n, REPLACEMENT, 3); n += 3; }
            else s->pending[s->n_pending++] = (char)c;
            continue;
        }
        if ((c & 0xC0) != 0x80) {
            /* the pending character was cut short: replace it, then handle c afresh */
            memcpy(out + n, REPLACEMENT, 3);
            n += 3;
            s->n_pending = 0;
            i--;
            continue;
        }
        s->pending[s->n_pending++] = (char)c;
        if (s->n_pending == lead_len((unsigned char)s->pending[0])) {
            memcpy(out + n, s->pending, (size_t)s->n_pending);
            n += (size_t)s->n_pending;
            s->n_pending = 0;
        }
    }
    return n;
}

size_t utf8_stream_flush(struct utf8_stream *s, char *out)
{
    if (!s->n_pending) return 0;
    s->n_pending = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}

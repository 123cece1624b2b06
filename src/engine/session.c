/* session.c - one generation job from prompt to finish reason, on the engine thread.
 *
 * Template + tokenize, reuse the longest prefix already in the KV cache, prefill the rest,
 * then sample token by token. Text leaves through the job's callback only as complete
 * UTF-8 characters and never past a stop string: bytes that could still be the start of
 * a stop string are held back until they cannot. */
#include "session.h"
#include "json_guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int engine_init(struct engine *e, const struct engine_options *o, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    int rc = model_load(&e->model, o->model_path, err, errlen);
    if (rc < 0) return rc;
    rc = tokenizer_load(&e->tok, &e->model.gguf, err, errlen);
    if (rc < 0) goto fail_model;
    char *jinja = gguf_dup_str(&e->model.gguf, "tokenizer.chat_template");
    e->tmpl = template_detect(jinja);
    free(jinja);
    e->n_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    struct plan_options po = o->plan;
    po.n_ctx = e->n_ctx;
    po.n_threads = o->n_threads;
    rc = memory_plan_init(&e->mem, &po, &e->model, err, errlen);
    if (rc < 0)
        goto fail_tok;
    /* Test hook: TIDE_FAULT_SLOW_TOKEN_MS makes every generated token take at least that long,
     * so timeout tests do not depend on how fast the machine is. Unset in normal runs. */
    const char *slow = getenv("TIDE_FAULT_SLOW_TOKEN_MS");
    if (slow && atoi(slow) > 0) {
        e->slow_token_us = (unsigned)atoi(slow) * 1000u;
        tide_log("fault injection armed: every token takes at least %s ms", slow);
    }
    /* Test hook: TIDE_FAULT_ENGINE_STEP=n makes the n-th forward step fail once (a prompt's
     * prefill is one step, each generated token one), as a backend failure would. */
    const char *step = getenv("TIDE_FAULT_ENGINE_STEP");
    if (step && atol(step) > 0) {
        e->fail_step = atol(step);
        tide_log("fault injection armed: forward step #%ld fails", e->fail_step);
    }
    /* k-quants, q5_0/q5_1, iq4_xs and MXFP4 have CPU kernels only: a CUDA device would multiply by nothing */
    for (int i = 0; i < e->mem.n_dev; i++) {
        uint32_t t = e->mem.dev[i].kind == DEVICE_KIND_CUDA ? model_first_cpu_only_type(&e->model) : UINT32_MAX;
        if (t != UINT32_MAX) {
            snprintf(err, errlen, "device %d is cuda, but the model has %s tensors, which only cpu devices run yet "
                     "(set \"devices\" to cpu, or use a q8_0/f16/bf16 GGUF)", i, ggml_type_name(t));
            rc = TIDE_EINVAL;
            goto fail_mem;
        }
    }
    rc = forward_init_stages(&e->fw, &e->model, e->n_ctx, e->mem.max_batch, e->mem.spec, e->mem.n_dev);
    if (rc < 0) {
        snprintf(err, errlen, "forward state for %d tokens: %s", e->n_ctx,
                 rc == TIDE_ERANGE ? "a device allocation (weights, KV cache or workspace) failed" : tide_strerror(rc));
        goto fail_mem;
    }
    e->img_open = tokenizer_find(e->tok, "<|vision_start|>");
    e->img_close = tokenizer_find(e->tok, "<|vision_end|>");
    if (e->img_open < 0 || e->img_close < 0) e->img_open = e->img_close = -1;
    e->tokens = malloc(sizeof(int) * (size_t)e->n_ctx);
    if (!e->tokens) {
        rc = TIDE_ENOMEM;
        snprintf(err, errlen, "token buffer: %s", tide_strerror(rc));
        goto fail_fw;
    }
    return 0;
fail_fw:
    forward_free(&e->fw);
fail_mem:
    memory_plan_free(&e->mem);
fail_tok:
    tokenizer_free(e->tok);
fail_model:
    model_free(&e->model);
    return rc;
}

/* The planning rule: size the caches first; then a device whose spare memory (above its
 * reserve) holds a prefill buffer for a whole chunk gets its own, and the others borrow the
 * tail of their expert cache for each prefill chunk instead of shrinking the cache for good. */
int engine_size_caches(struct engine *e)
{
    int rc = memory_plan_size_caches(&e->mem);
    if (rc < 0)
        return rc;
    struct memory_plan *p = &e->mem;
    for (int i = 0; i < p->n_dev; i++) {
        struct forward_stage_bytes sb;
        forward_stage_size(&e->model, e->n_ctx, e->fw.max_batch, p->l0[i], p->l1[i], i == 0, i == p->n_dev - 1, &sb);
        size_t fr = device_free_bytes(&p->dev[i]), want = p->dev[i].reserve + sb.prefill;
        bool own = fr >= want || !p->spec[i].cache;
        rc = forward_setup_prefill(&e->fw, i, own ? PREFILL_OWN : PREFILL_BORROW);
        if (rc < 0 && own && p->spec[i].cache)
            rc = forward_setup_prefill(&e->fw, i, PREFILL_BORROW);
        if (rc < 0)
            tide_log("device %d: no room for a prefill buffer: prompts run a token at a time", i);
        else
            tide_log("device %d: prefill %s (%.1f MiB for %d tokens)", i,
                     e->fw.stage[i].prefill == PREFILL_OWN ? "has its own buffer" : "borrows expert-cache segments",
                     (double)sb.prefill / (1 << 20), e->fw.max_batch);
    }
    return 0;
}

void engine_free(struct engine *e)
{
    free(e->tokens);
    forward_free(&e->fw);
    memory_plan_free(&e->mem);
    tokenizer_free(e->tok);
    model_free(&e->model);
    memset(e, 0, sizeof *e);
}

static int append_ids(int **ids, int *n, int *cap, const int *src, int k)
{
    if (*n + k > *cap) {
        int nc = (*n + k) * 2 + 16;
        int *ni = realloc(*ids, sizeof(int) * (size_t)nc);
        if (!ni) return TIDE_ENOMEM;
        *ids = ni;
        *cap = nc;
    }
    memcpy(*ids + *n, src, sizeof(int) * (size_t)k);
    *n += k;
    return 0;
}

static int append_text(struct engine *e, const char *text, size_t len, int **ids, int *n, int *cap)
{
    if (!len) return 0;
    int *body = NULL, n_body = 0;
    int rc = tokenizer_encode(e->tok, text, len, true, &body, &n_body);
    if (rc < 0) return rc;
    rc = append_ids(ids, n, cap, body, n_body);
    free(body);
    return rc;
}

/* The job's prompt as tokens (malloc'd); an image's positions hold -1 and img_at[i] is the
 * first position of image i. */
static int job_tokens(struct engine *e, const struct gen_job *job, int **ids_out, int *n_out, int *img_at)
{
    char *text;
    if (job->messages) {
        text = template_apply(e->tmpl, job->messages, job->n_messages, true);
        if (!text) return TIDE_ENOMEM;
    } else {
        text = strdup(job->prompt ? job->prompt : "");
        if (!text) return TIDE_ENOMEM;
    }
    int *ids = NULL, n = 0, cap = 0, rc = 0;
    int bos = tokenizer_add_bos(e->tok) ? tokenizer_bos(e->tok) : -1;
    if (bos >= 0) rc = append_ids(&ids, &n, &cap, &bos, 1);
    const char *p = text;
    size_t ml = strlen(ENGINE_IMAGE_MARKER);
    for (int img = 0; !rc; img++) {
        const char *m = img < job->n_images ? strstr(p, ENGINE_IMAGE_MARKER) : NULL;
        rc = append_text(e, p, m ? (size_t)(m - p) : strlen(p), &ids, &n, &cap);
        if (!m || rc) break;
        if (e->img_open >= 0) rc = append_ids(&ids, &n, &cap, &e->img_open, 1);
        img_at[img] = n;
        for (int t = 0; t < job->images[img].n_tokens && !rc; t++) {
            int neg = -1;
            rc = append_ids(&ids, &n, &cap, &neg, 1);
        }
        if (e->img_close >= 0 && !rc) rc = append_ids(&ids, &n, &cap, &e->img_close, 1);
        p = m + ml;
    }
    free(text);
    if (rc < 0) {
        free(ids);
        return rc;
    }
    *ids_out = ids;
    *n_out = n;
    return 0;
}

/* The TIDE_FAULT_ENGINE_STEP hook: true when this step is the one that fails. */
static bool step_fault(struct engine *e)
{
    if (e->fail_step <= 0 || --e->fail_step > 0)
        return false;
    tide_log("injected forward step failure (TIDE_FAULT_ENGINE_STEP)");
    return true;
}

/* Prefill positions [from, n): runs of tokens through forward_eval, images through
 * forward_eval_embd. The last call leaves the logits of position n-1. */
static int prefill(struct engine *e, const struct gen_job *job, const int *ids, int n, int from,
                   const int *img_at)
{
    size_t E = e->model.cfg.n_embd;
    if (step_fault(e))
        return TIDE_EINTERNAL;
    for (int p = from; p < n;) {
        int q = p;
        if (ids[p] >= 0) {
            while (q < n && ids[q] >= 0) q++;
            int rc = forward_eval(&e->fw, ids + p, q - p, p);
            if (rc < 0) return rc;
        } else {
            int img = 0;
            while (img + 1 < job->n_images && img_at[img + 1] <= p) img++;
            int row = p - img_at[img];
            while (q < n && ids[q] < 0 && q - img_at[img] < job->images[img].n_tokens) q++;
            int rc = forward_eval_embd(&e->fw, job->images[img].embd + (size_t)row * E, q - p, p);
            if (rc < 0) return rc;
        }
        p = q;
    }
    return 0;
}

int engine_count_prompt(struct engine *e, const struct gen_job *job)
{
    int *ids, n, img_at[64];
    if (job->n_images > 64) return TIDE_EINVAL;
    int rc = job_tokens(e, job, &ids, &n, img_at);
    if (rc < 0) return rc;
    free(ids);
    return n;
}

/* Length of the longest suffix of buf[0..len) that is a proper prefix of a stop string:
 * those bytes must wait for the next token before they can be emitted. */
static size_t stop_holdback(const char *buf, size_t len, const char *const *stops, int n_stop)
{
    size_t hold = 0;
    for (int s = 0; s < n_stop; s++) {
        size_t sl = strlen(stops[s]);
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(buf + len - k, stops[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Earliest match of any stop string in buf, or -1. */
static long stop_find(const char *buf, size_t len, const char *const *stops, int n_stop)
{
    long best = -1;
    for (int s = 0; s < n_stop; s++) {
        const char *p = memmem(buf, len, stops[s], strlen(stops[s]));
        if (p && (best < 0 || p - buf < best)) best = p - buf;
    }
    return best;
}

/* One choice: sample from the prompt's logits onward. */
/* JSON mode: every token whose bytes would stop the reply being the start of a JSON object
 * gets -inf; end-of-generation is allowed only once the object is complete, and then nothing
 * else is. Costs one pass over the vocabulary per token. */
static void json_mask(const struct tokenizer *tok, const struct json_guard *g, float *logits, uint32_t n_vocab)
{
    bool done = json_guard_complete(g);
    uint32_t allowed = 0;
    char piece[256];
    for (uint32_t id = 0; id < n_vocab; id++) {
        bool ok;
        if (tokenizer_is_eog(tok, (int)id)) {
            ok = done;
        } else if (done || tokenizer_is_special(tok, (int)id)) {
            ok = false;
        } else {
            int n = tokenizer_token_bytes(tok, (int)id, piece, sizeof piece);
            struct json_guard t = *g;
            ok = n > 0 && n <= (int)sizeof piece && json_guard_feed(&t, piece, (size_t)n);
        }
        if (ok) allowed++;
        else logits[id] = -INFINITY;
    }
    int eos = tokenizer_eos(tok);
    if (!allowed && eos >= 0 && (uint32_t)eos < n_vocab)
        logits[eos] = 0.0f; /* nothing can follow: end here rather than sample from nothing */
}

static int run_choice(struct engine *e, struct gen_job *job, int choice, int n_prompt,
                      const float *prompt_logits, int max_new, const char *const *stops,
                      int n_stop, char *err, size_t errlen)
{
    uint32_t n_vocab = e->model.cfg.n_vocab;
    struct sampler smp;
    int rc = sampler_init(&smp, &job->sp, n_vocab);
    if (rc < 0) return rc;
    sampler_reset(&smp, job->sp.seed + (uint64_t)choice);
    float *logits = malloc(sizeof(float) * n_vocab);
    size_t cap = 4096;
    char *held = malloc(cap);  /* decoded text not yet given to the callback */
    if (!logits || !held) {
        rc = TIDE_ENOMEM;
        goto out;
    }
    memcpy(logits, prompt_logits, sizeof(float) * n_vocab);
    size_t n_held = 0;
    struct utf8_stream u8 = {0};
    struct token_logprob lp;
    struct json_guard jg;
    json_guard_init(&jg);
    enum finish_reason fin = FINISH_LENGTH;
    int pos = n_prompt;
    e->n_tokens = n_prompt;
    /* Greedy with nothing that needs the logits themselves (penalties, logprobs, JSON mode):
     * each decode step leaves only its pick (forward_eval_greedy, on the device where it can),
     * the sampler's own greedy choice by the same rule. TIDE_HOST_ARGMAX=1 turns it off. */
    const struct sampling_params *sp = &job->sp;
    const char *ha = getenv("TIDE_HOST_ARGMAX");
    bool pick_only = sp->temperature <= 0.0f && sp->presence_penalty == 0.0f && sp->frequency_penalty == 0.0f &&
                     !sp->logprobs && !sp->json_object && !(ha && ha[0] == '1');
    int next = -1; /* the last step's pick, when pick_only */
    for (int t = 0; t < max_new; t++) {
        if (job->cancel && *job->cancel) {
            rc = TIDE_ECANCELED;
            goto out;
        }
        if (job->sp.json_object)
            json_mask(e->tok, &jg, logits, n_vocab);
        int id = next >= 0 ? next : sampler_sample(&smp, logits, job->sp.logprobs ? &lp : NULL);
        sampler_accept(&smp, id);
        job->completion_tokens++;
        bool eog = tokenizer_is_eog(e->tok, id);
        char piece[256];
        int plen = 0;
        if (!eog) {
            plen = tokenizer_token_bytes(e->tok, id, piece, sizeof piece);
            if (plen < 0) plen = 0;
            if (plen > (int)sizeof piece) plen = sizeof piece;
        }
        if (n_held + 3 * (size_t)plen + 16 > cap) {
            cap = 2 * (n_held + 3 * (size_t)plen + 16);
            char *nh = realloc(held, cap);
            if (!nh) {
                rc = TIDE_ENOMEM;
                goto out;
            }
            held = nh;
        }
        if (job->sp.json_object && !eog)
            json_guard_feed(&jg, piece, (size_t)plen); /* json_mask let only valid ones through */
        n_held += utf8_stream_feed(&u8, piece, (size_t)plen, held + n_held);
        if (eog) n_held += utf8_stream_flush(&u8, held + n_held);
        long at = stop_find(held, n_held, stops, n_stop);
        size_t emit = n_held;
        if (at >= 0) emit = (size_t)at;
        else if (!eog) emit = n_held - stop_holdback(held, n_held, stops, n_stop);
        if (job->on_text(job->ud, choice, held, emit, job->sp.logprobs ? &lp : NULL)) {
            rc = TIDE_ECANCELED;
            goto out;
        }
        memmove(held, held + emit, n_held - emit);
        n_held -= emit;
        if (eog || at >= 0) {
            fin = FINISH_STOP;
            break;
        }
        if (t + 1 == max_new) break;  /* no need to run the forward for an unused token */
        if (pos >= e->n_ctx) break;
        if (job->boundary) job->boundary(job->ud);
        if (e->slow_token_us) usleep(e->slow_token_us); /* test hook, see engine_init */
        rc = step_fault(e)  ? TIDE_EINTERNAL
             : pick_only    ? forward_eval_greedy(&e->fw, id, pos, &next)
                            : forward_eval(&e->fw, &id, 1, pos);
        if (rc < 0) {
            snprintf(err, errlen, "forward at position %d: %s", pos, tide_strerror(rc));
            e->n_tokens = 0;
            goto out;
        }
        e->tokens[pos++] = id;
        e->n_tokens = pos;
        if (!pick_only)
            memcpy(logits, e->fw.logits, sizeof(float) * n_vocab);
    }
    if (fin == FINISH_LENGTH && n_held > 0) {
        /* out of tokens: what was held back for a stop string that never came is text */
        n_held += utf8_stream_flush(&u8, held + n_held);
        if (job->on_text(job->ud, choice, held, n_held, NULL)) {
            rc = TIDE_ECANCELED;
            goto out;
        }
    }
    job->finish[choice] = fin;
    rc = 0;
out:
    free(held);
    free(logits);
    sampler_free(&smp);
    return rc;
}

int engine_run(struct engine *e, struct gen_job *job, char *err, size_t errlen)
{
    int *ids = NULL, n = 0, img_at[64];
    if (job->n_images > 64) {
        snprintf(err, errlen, "at most 64 images per request");
        return TIDE_EINVAL;
    }
    int rc = job_tokens(e, job, &ids, &n, img_at);
    if (rc < 0) {
        snprintf(err, errlen, "tokenize: %s", tide_strerror(rc));
        return rc;
    }
    job->prompt_tokens = n;
    job->completion_tokens = 0;
    int n_choices = job->n < 1 ? 1 : job->n > 16 ? 16 : job->n;
    if (n == 0 || n >= e->n_ctx) {
        snprintf(err, errlen,
                 "the prompt is %d tokens; this server's context is %d tokens", n, e->n_ctx);
        free(ids);
        return TIDE_ERANGE;
    }
    int room = e->n_ctx - n;
    int max_new = job->max_tokens < 0 ? room : job->max_tokens;
    if (max_new > room) {
        snprintf(err, errlen,
                 "prompt (%d tokens) + max_tokens (%d) exceeds the context of %d tokens", n,
                 job->max_tokens, e->n_ctx);
        free(ids);
        return TIDE_ERANGE;
    }
    /* Reuse the cached prefix; at least the last prompt token is evaluated again so that
     * its logits are fresh. */
    int keep = 0;
    while (keep < e->n_tokens && keep < n - 1 && ids[keep] >= 0 && e->tokens[keep] == ids[keep]) keep++;
    rc = prefill(e, job, ids, n, keep, img_at);
    if (rc < 0) {
        snprintf(err, errlen, "prefill: %s", tide_strerror(rc));
        e->n_tokens = 0;
        free(ids);
        return rc;
    }
    memcpy(e->tokens, ids, sizeof(int) * (size_t)n);
    e->n_tokens = n;
    free(ids);

    uint32_t n_vocab = e->model.cfg.n_vocab;
    float *prompt_logits = malloc(sizeof(float) * n_vocab);
    if (!prompt_logits) return TIDE_ENOMEM;
    memcpy(prompt_logits, e->fw.logits, sizeof(float) * n_vocab);

    const char *stops[JOB_MAX_STOP + 8];
    int n_stop = 0;
    for (int i = 0; i < job->n_stop && i < JOB_MAX_STOP; i++)
        if (job->stop[i] && job->stop[i][0]) stops[n_stop++] = job->stop[i];
    if (job->messages)
        for (const char *const *s = template_stop_strings(e->tmpl); s && *s && n_stop < JOB_MAX_STOP + 8; s++)
            stops[n_stop++] = *s;

    for (int c = 0; c < n_choices; c++) {
        job->finish[c] = FINISH_NONE;
        rc = run_choice(e, job, c, n, prompt_logits, max_new, stops, n_stop, err, errlen);
        if (rc < 0) break;
    }
    free(prompt_logits);
    return rc;
}

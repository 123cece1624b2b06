/* session.c - one generation job from prompt to finish reason, on the engine thread.
 *
 * Template + tokenize, reuse the longest prefix already in the KV cache, prefill the rest,
 * then sample token by token. Text leaves through the job's callback only as complete
 * UTF-8 characters and never past a stop string: bytes that could still be the start of
 * a stop string are held back until they cannot. */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    rc = backend_cpu_init(&e->be, o->n_threads);
    if (rc < 0) {
        snprintf(err, errlen, "cpu backend: %s", tide_strerror(rc));
        goto fail_tok;
    }
    rc = forward_init(&e->fw, &e->model, e->be, e->n_ctx);
    if (rc < 0) {
        snprintf(err, errlen, "forward state for %d tokens: %s", e->n_ctx, tide_strerror(rc));
        goto fail_be;
    }
    e->tokens = malloc(sizeof(int) * (size_t)e->n_ctx);
    if (!e->tokens) {
        rc = TIDE_ENOMEM;
        snprintf(err, errlen, "token buffer: %s", tide_strerror(rc));
        goto fail_fw;
    }
    return 0;
fail_fw:
    forward_free(&e->fw);
fail_be:
    backend_cpu_free(&e->be);
fail_tok:
    tokenizer_free(e->tok);
fail_model:
    model_free(&e->model);
    return rc;
}

void engine_free(struct engine *e)
{
    free(e->tokens);
    forward_free(&e->fw);
    backend_cpu_free(&e->be);
    tokenizer_free(e->tok);
    model_free(&e->model);
    memset(e, 0, sizeof *e);
}

/* The job's prompt as tokens (malloc'd). */
static int job_tokens(struct engine *e, const struct gen_job *job, int **ids, int *n)
{
    char *text;
    if (job->messages) {
        text = template_apply(e->tmpl, job->messages, job->n_messages, true);
        if (!text) return TIDE_ENOMEM;
    } else {
        text = strdup(job->prompt ? job->prompt : "");
        if (!text) return TIDE_ENOMEM;
    }
    int *body = NULL, n_body = 0;
    int rc = tokenizer_encode(e->tok, text, strlen(text), true, &body, &n_body);
    free(text);
    if (rc < 0) return rc;
    int bos = tokenizer_add_bos(e->tok) ? tokenizer_bos(e->tok) : -1;
    if (bos >= 0) {
        int *all = malloc(sizeof(int) * (size_t)(n_body + 1));
        if (!all) {
            free(body);
            return TIDE_ENOMEM;
        }
        all[0] = bos;
        memcpy(all + 1, body, sizeof(int) * (size_t)n_body);
        free(body);
        body = all;
        n_body++;
    }
    *ids = body;
    *n = n_body;
    return 0;
}

int engine_count_prompt(struct engine *e, const struct gen_job *job)
{
    int *ids, n;
    int rc = job_tokens(e, job, &ids, &n);
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
    enum finish_reason fin = FINISH_LENGTH;
    int pos = n_prompt;
    e->n_tokens = n_prompt;
    for (int t = 0; t < max_new; t++) {
        if (job->cancel && *job->cancel) {
            rc = TIDE_ECANCELED;
            goto out;
        }
        int id = sampler_sample(&smp, logits, job->sp.logprobs ? &lp : NULL);
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
        rc = forward_eval(&e->fw, &id, 1, pos);
        if (rc < 0) {
            snprintf(err, errlen, "forward at position %d: %s", pos, tide_strerror(rc));
            e->n_tokens = 0;
            goto out;
        }
        e->tokens[pos++] = id;
        e->n_tokens = pos;
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
    int *ids = NULL, n = 0;
    int rc = job_tokens(e, job, &ids, &n);
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
    while (keep < e->n_tokens && keep < n - 1 && e->tokens[keep] == ids[keep]) keep++;
    rc = forward_eval(&e->fw, ids + keep, n - keep, keep);
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

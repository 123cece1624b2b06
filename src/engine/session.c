/* session.c - the engine: load the model onto the devices (forward stages, KV slots, expert
 * caches), and a job's prompt as tokens (template, tokenizer, image rows). Running jobs is
 * sequence.c's: engine_run here is one job alone through it. */
#include "session.h"
#include "json_guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The chat template with the vocabulary's BOS/EOS text (tokenizer_token_bytes). */
static int engine_init_template(struct engine *e, const char *jinja)
{
    char bos[256] = "", eos[256] = "";
    int id = tokenizer_bos(e->tok), k;
    if (id >= 0 && (k = tokenizer_token_bytes(e->tok, id, bos, sizeof bos - 1)) >= 0) bos[k] = 0;
    else bos[0] = 0;
    id = tokenizer_eos(e->tok);
    if (id >= 0 && (k = tokenizer_token_bytes(e->tok, id, eos, sizeof eos - 1)) >= 0) eos[k] = 0;
    else eos[0] = 0;
    int rc = chat_template_init(&e->chat, jinja, bos, eos, tokenizer_add_bos(e->tok));
    e->tmpl = e->chat.kind;
    return rc;
}

int engine_init(struct engine *e, const struct engine_options *o, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    int rc = model_load(&e->model, o->model_path, err, errlen);
    if (rc < 0) return rc;
    rc = tokenizer_load(&e->tok, &e->model.gguf, err, errlen);
    if (rc < 0) goto fail_model;
    char *jinja = gguf_dup_str(&e->model.gguf, "tokenizer.chat_template");
    rc = engine_init_template(e, jinja);
    free(jinja);
    if (rc < 0) { snprintf(err, errlen, "chat template: %s", tide_strerror(rc)); goto fail_tok; }
    e->n_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    struct plan_options po = o->plan;
    po.n_ctx = e->n_ctx;
    po.n_threads = o->n_threads;
    po.n_seq = o->n_seq;
    rc = memory_plan_init(&e->mem, &po, &e->model, err, errlen);
    if (rc < 0)
        goto fail_tok;
    /* Test hook: TIDE_FAULT_SLOW_TOKEN_MS makes every generated token take at least that long,
     * so timeout tests do not depend on how fast the machine is. Unset in normal runs. */
    e->prefix_wait_tokens = ENGINE_PREFIX_WAIT_DEFAULT;
    const char *slow = getenv("TIDE_FAULT_SLOW_TOKEN_MS");
    if (slow && atoi(slow) > 0) {
        e->slow_token_us = (unsigned)atoi(slow) * 1000u;
        tide_log("fault injection armed: every token takes at least %s ms", slow);
    }
    /* Test hook: TIDE_FAULT_ENGINE_STEP=n makes the n-th forward step fail once (a prompt's
     * prefill is one step, each generated token one), as a backend failure would. */
    /* Test hook: TIDE_FAULT_BACKEND_ERROR=n makes the backend "fail" after the n-th forward step
     * as a sticky CUDA error does: that step and every later one fail, the daemon turns
     * unhealthy (issue 27 item 7). */
    const char *berr = getenv("TIDE_FAULT_BACKEND_ERROR");
    long fault_backend = berr && atol(berr) > 0 ? atol(berr) : 0;
    if (fault_backend)
        tide_log("fault injection armed: the backend fails after forward step #%ld", fault_backend);
    const char *step = getenv("TIDE_FAULT_ENGINE_STEP");
    if (step && atol(step) > 0) {
        e->fail_step = atol(step);
        tide_log("fault injection armed: forward step #%ld fails", e->fail_step);
    }
    /* what a CUDA device does not run: the types model.c's cuda_runs_type refuses (every
     * architecture's ops run on both backends) */
    for (int i = 0; i < e->mem.n_dev; i++) {
        uint32_t t = e->mem.dev[i].kind == DEVICE_KIND_CUDA ? model_first_cpu_only_type(&e->model) : UINT32_MAX;
        if (t != UINT32_MAX) {
            snprintf(err, errlen, "device %d is cuda, but the model has %s tensors, which only cpu devices run yet "
                     "(set \"devices\" to cpu, or use a q8_0/f16/bf16 GGUF)", i, ggml_type_name(t));
            rc = TIDE_EINVAL;
            goto fail_mem;
        }
    }
    rc = forward_init_stages(&e->fw, &e->model, e->n_ctx, e->mem.n_seq, e->mem.max_batch, e->mem.spec, e->mem.n_dev);
    if (rc < 0) {
        snprintf(err, errlen, "forward state for %d tokens: %s", e->n_ctx,
                 rc == TIDE_ERANGE ? "a device allocation (weights, KV cache or workspace) failed" : tide_strerror(rc));
        goto fail_mem;
    }
    /* TIDE_ONE_SEQUENCE=1: one sequence at a time whatever the slots (a diagnostic: a reply under
     * load against the same request alone; tests/e2e/test_batching.py) */
    const char *one = getenv("TIDE_ONE_SEQUENCE");
    if (one && one[0] == '1' && !e->one_seq) {
        e->one_seq = true;
        tide_log("one sequence at a time: TIDE_ONE_SEQUENCE=1");
    }
    /* Prefix rows copied between slots (prefix_share.h): on by default (the CUDA device copy,
     * test-gpu gather_copy_d2d, passed on an H200); TIDE_KV_SHARE=0 turns it off. */
    const char *share = getenv("TIDE_KV_SHARE");
    e->kv_share = share && share[0] ? share[0] == '1' : true;
    if (!e->kv_share)
        tide_log("prefix sharing between KV slots off: TIDE_KV_SHARE=0");
    e->img_open = tokenizer_find(e->tok, "<|vision_start|>");
    e->img_close = tokenizer_find(e->tok, "<|vision_end|>");
    if (e->img_open < 0 || e->img_close < 0) e->img_open = e->img_close = -1;
    e->fw.fault_backend_steps = fault_backend;
    kv_park_init(&e->park, e->mem.kv_host_bytes, forward_kv_row_bytes(&e->fw));
    e->n_slots = e->fw.n_seq;
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    for (int i = 0; e->slots && i < e->n_slots; i++)
        if (!(e->slots[i].tokens = malloc(sizeof(int) * (size_t)e->n_ctx)) ||
            !(e->slots[i].img = malloc(sizeof(struct row_image) * ENGINE_MAX_IMAGES))) {
            for (int j = 0; j <= i; j++) {
                free(e->slots[j].tokens);
                free(e->slots[j].img);
            }
            free(e->slots);
            e->slots = NULL;
        }
    if (!e->slots) {
        rc = TIDE_ENOMEM;
        snprintf(err, errlen, "token buffers: %s", tide_strerror(rc));
        goto fail_fw;
    }
    return 0;
fail_fw:
    forward_free(&e->fw);
fail_mem:
    memory_plan_free(&e->mem);
fail_tok:
    chat_template_free(&e->chat);
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
        forward_stage_size(&e->model, e->n_ctx, e->fw.n_seq, e->fw.max_batch, p->l0[i], p->l1[i], i == 0,
                           i == p->n_dev - 1, e->fw.kv_f16 ? KV_F16 : KV_F32, &sb);
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
    for (int i = 0; e->slots && i < e->n_slots; i++) {
        free(e->slots[i].tokens);
        free(e->slots[i].img);
    }
    free(e->slots);
    free(e->eog_ids);
    kv_park_free(&e->park);
    forward_free(&e->fw);
    memory_plan_free(&e->mem);
    chat_template_free(&e->chat);
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

static int append_text(struct engine *e, const char *text, size_t len, const volatile int *cancel,
                       int **ids, int *n, int *cap)
{
    if (!len) return 0;
    int *body = NULL, n_body = 0;
    int rc = tokenizer_encode(e->tok, text, len, true, cancel, &body, &n_body);
    if (rc < 0) return rc;
    rc = append_ids(ids, n, cap, body, n_body);
    free(body);
    return rc;
}

int engine_prompt_tokens(struct engine *e, const struct gen_job *job, int **ids_out, int *n_out, int *img_at)
{
    if (!job->messages && job->prompt_ids) { /* token ids as given, no BOS added */
        *ids_out = malloc(sizeof(int) * (size_t)(job->n_prompt_ids + 1));
        if (!*ids_out) return TIDE_ENOMEM;
        memcpy(*ids_out, job->prompt_ids, sizeof(int) * (size_t)job->n_prompt_ids);
        *n_out = job->n_prompt_ids;
        return 0;
    }
    char *text;
    if (job->messages) {
        int trc = chat_template_render(&e->chat, job->messages, job->n_messages, job->tools_json, &text);
        if (trc < 0) return trc;
        if (job->assistant_prefix && job->assistant_prefix[0]) {
            size_t tl = strlen(text), pl = strlen(job->assistant_prefix);
            char *t2 = realloc(text, tl + pl + 1);
            if (!t2) { free(text); return TIDE_ENOMEM; }
            memcpy(t2 + tl, job->assistant_prefix, pl + 1);
            text = t2;
        }
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
        rc = append_text(e, p, m ? (size_t)(m - p) : strlen(p), job->cancel, &ids, &n, &cap);
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

int engine_count_prompt(struct engine *e, const struct gen_job *job)
{
    int *ids, n, img_at[ENGINE_MAX_IMAGES];
    if (job->n_images > ENGINE_MAX_IMAGES) return TIDE_EINVAL;
    int rc = engine_prompt_tokens(e, job, &ids, &n, img_at);
    if (rc < 0) return rc;
    free(ids);
    return n;
}

int engine_run(struct engine *e, struct gen_job *job, char *err, size_t errlen)
{
    struct engine_seq *q;
    int rc = engine_seq_start(e, job, &q, err, errlen);
    if (rc < 0)
        return rc;
    const char *why = "";
    while (!engine_seq_done(q, &rc, &why)) {
        if (job->boundary)
            job->boundary(job->ud);
        engine_step(e, &q, 1, e->fw.max_batch);
    }
    if (rc < 0 && why[0])
        snprintf(err, errlen, "%s", why);
    engine_seq_free(e, q);
    return rc;
}

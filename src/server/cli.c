/* cli.c - command-line flags: a table of what tide takes (llama-server's spellings where one
 * exists) and a list of llama-server flags tide does not have, each refused by name.
 *
 * `--flag value` and `--flag=value` are both taken. Flags are applied after the config file,
 * so a flag always wins over the key it names. */
#include "server/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum cli_target { T_CONFIG, T_HOST, T_PORT, T_MODEL, T_MMPROJ, T_API_KEY, T_THREADS, T_CTX, T_PARALLEL,
                  T_KV_TYPE, T_NAME, T_DRAIN, T_METRICS, T_HELP, T_VERSION };

struct cli_flag {
    const char *lng, *shrt;   /* shrt may be NULL */
    enum cli_target target;
    bool has_value;
};

static const struct cli_flag flags[] = {
    { "--config", NULL, T_CONFIG, true },
    { "--host", NULL, T_HOST, true },
    { "--port", NULL, T_PORT, true },
    { "--model", "-m", T_MODEL, true },
    { "--mmproj", NULL, T_MMPROJ, true },
    { "--api-key", NULL, T_API_KEY, true },
    { "--threads", "-t", T_THREADS, true },
    { "--ctx-size", "-c", T_CTX, true },
    { "--parallel", "-np", T_PARALLEL, true },
    { "--kv-type", NULL, T_KV_TYPE, true },
    { "--name", NULL, T_NAME, true },
    { "--drain-timeout", NULL, T_DRAIN, true },
    { "--metrics", NULL, T_METRICS, false },
    { "--help", "-h", T_HELP, false },
    { "--version", NULL, T_VERSION, false },
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

/* llama-server flags an operator may carry over from a llama.cpp deployment. tide has no
 * equivalent (or does it another way: layer offload and the split are the memory plan's,
 * batching is always on, the template comes from the model), so each stops start-up. */
static const char *const llama_only[] = {
    "-ngl", "--n-gpu-layers", "--gpu-layers", "-fa", "--flash-attn", "-cb", "--cont-batching", "-nocb",
    "--no-cont-batching", "--jinja", "--no-jinja", "--chat-template", "--chat-template-file", "-b",
    "--batch-size", "-ub", "--ubatch-size", "--mlock", "--no-mmap", "--mmap", "-ts", "--tensor-split", "-sm",
    "--split-mode", "-mg", "--main-gpu", "-dev", "--device", "-n", "--n-predict", "-ctk", "--cache-type-k",
    "-ctv", "--cache-type-v", "-tb", "--threads-batch", "--rope-scaling", "--rope-freq-base",
    "--rope-freq-scale", "--yarn-orig-ctx", "--cache-reuse", "--slots", "--no-slots", "--props",
    "--embedding", "--embeddings", "--reranking", "--pooling", "--lora", "--lora-scaled", "-hf", "--hf-repo",
    "-hff", "--hf-file", "-mu", "--model-url", "-a", "--alias", "-to", "--timeout", "--api-key-file",
    "--ssl-key-file", "--ssl-cert-file", "--no-webui", "--path", "--override-kv", "--numa", "-s", "--seed",
    "--temp", "--top-k", "--top-p", "--min-p", "-v", "--verbose", "--log-disable", "--log-file", "-sps",
    "--slot-prompt-similarity", "--slot-save-path", "-md", "--model-draft", "--draft", "--draft-max",
    "-kvu", "--kv-unified", "--swa-full", "-dt", "--defrag-thold", "--no-kv-offload", "-nkvo",
    "--cpu-moe", "-cmoe", "--n-cpu-moe", "-ncmoe", "--override-tensor", "-ot", "--reasoning-format",
    "--reasoning-budget", "--no-context-shift", "--context-shift", "-fit", "--threads-http", NULL,
};

const char *cli_usage(void)
{
    return "usage: tide [--config FILE] [flags]\n"
           "  --config FILE          JSON config (default config/tide.json); every flag below\n"
           "                         overrides its config key (docs/CONFIG.md)\n"
           "  --host HOST            host            address to listen on\n"
           "  --port N               port            0 = any free port\n"
           "  -m, --model PATH       model           GGUF text model\n"
           "  --mmproj PATH          mmproj          GGUF vision tower + projector\n"
           "  --api-key KEY          api_key         require Authorization: Bearer KEY on /v1/*\n"
           "  -t, --threads N        threads         CPU threads, 0 = all cores\n"
           "  -c, --ctx-size N       context         context length in tokens\n"
           "  -np, --parallel N      parallel        running sequences at most\n"
           "  --kv-type f16|f32      kv_type         the KV cache's element type\n"
           "  --name NAME            name            instance identity in /v1/vram and /metrics\n"
           "  --drain-timeout S      drain_timeout_s SIGTERM: finish queued work up to S seconds\n"
           "  --metrics              accepted: GET /metrics is always on\n"
           "  -h, --help             this text\n"
           "  --version              print the version\n"
           "A llama-server flag tide does not have (e.g. -ngl, --flash-attn, --jinja, -b) stops\n"
           "start-up with a line naming it; so does any other unknown flag.\n"
           "Flags take `--flag value` or `--flag=value`.\n";
}

/* Split argv[i] into the flag and, for `--flag=value`, its inline value. */
static const struct cli_flag *lookup(const char *arg, char *name, size_t cap, const char **inline_value)
{
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= cap) n = cap - 1;
    memcpy(name, arg, n);
    name[n] = 0;
    *inline_value = eq ? eq + 1 : NULL;
    for (int k = 0; k < N_FLAGS; k++)
        if (!strcmp(name, flags[k].lng) || (flags[k].shrt && !strcmp(name, flags[k].shrt))) return &flags[k];
    return NULL;
}

int cli_scan(int argc, char **argv, const char **config_file, bool *help, bool *version, char *err,
             size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *iv;
        const struct cli_flag *f = lookup(argv[i], name, sizeof name, &iv);
        if (!f) {
            for (int k = 0; llama_only[k]; k++) {
                if (!strcmp(name, llama_only[k])) {
                    snprintf(err, errlen, "config: %s: a llama-server flag tide does not have (see --help)", name);
                    return TIDE_EINVAL;
                }
            }
            snprintf(err, errlen, "config: %.200s: unknown flag (see --help)", name);
            return TIDE_EINVAL;
        }
        if (!f->has_value) {
            if (iv) {
                snprintf(err, errlen, "config: %s: takes no value", f->lng);
                return TIDE_EINVAL;
            }
            if (f->target == T_HELP) *help = true;
            if (f->target == T_VERSION) *version = true;
            continue;
        }
        if (!iv) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "config: %s: expected a value", name);
                return TIDE_EINVAL;
            }
            iv = argv[++i];
        }
        if (f->target == T_CONFIG) *config_file = iv;
    }
    return 0;
}

static int parse_num(const char *flag, const char *s, long lo, long hi, long *out, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(err, errlen, "config: %s: expected an integer %ld..%ld, got \"%.60s\"", flag, lo, hi, s);
        return TIDE_EINVAL;
    }
    *out = v;
    return 0;
}

static int set_string(char **dst, const char *flag, const char *v, char *err, size_t errlen)
{
    if (!v[0]) {
        snprintf(err, errlen, "config: %s: expected a non-empty value", flag);
        return TIDE_EINVAL;
    }
    char *d = strdup(v);
    if (!d) return TIDE_ENOMEM;
    free(*dst);
    *dst = d;
    return 0;
}

int cli_apply(struct config *c, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *v;
        const struct cli_flag *f = lookup(argv[i], name, sizeof name, &v);
        if (!f) return TIDE_EINVAL; /* cli_scan said why */
        if (!f->has_value) continue;
        if (!v) v = argv[++i];
        long n = 0;
        int rc = 0;
        switch (f->target) {
        case T_HOST: rc = set_string(&c->host, f->lng, v, err, errlen); break;
        case T_MODEL: rc = set_string(&c->model, f->lng, v, err, errlen); break;
        case T_MMPROJ: rc = set_string(&c->mmproj, f->lng, v, err, errlen); break;
        case T_API_KEY: rc = set_string(&c->api_key, f->lng, v, err, errlen); break;
        case T_NAME: rc = set_string(&c->name, f->lng, v, err, errlen); break;
        case T_PORT:
            if (!(rc = parse_num(f->lng, v, 0, 65535, &n, err, errlen))) c->port = (int)n;
            break;
        case T_THREADS:
            if (!(rc = parse_num(f->lng, v, 0, 4096, &n, err, errlen))) c->threads = (int)n;
            break;
        case T_CTX:
            if (!(rc = parse_num(f->lng, v, 16, 1 << 24, &n, err, errlen))) c->context = (int)n;
            break;
        case T_PARALLEL:
            if (!(rc = parse_num(f->lng, v, 1, 256, &n, err, errlen))) c->parallel = (int)n;
            break;
        case T_KV_TYPE:
            if ((rc = config_kv_type(v, &c->kv_type)))
                snprintf(err, errlen, "config: %s: expected f16 or f32, got \"%.60s\"", f->lng, v);
            break;
        case T_DRAIN:
            if (!(rc = parse_num(f->lng, v, 0, 1 << 24, &n, err, errlen))) c->drain_timeout_s = (int)n;
            break;
        default: break; /* --config: read by config_load */
        }
        if (rc) return rc;
    }
    return 0;
}

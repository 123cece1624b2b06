/* phase_clock.c - see phase_clock.h. Totals per row count (1..PC_MAX_ROWS, larger counts in
 * the last bucket), each logged and reset when its 200th step ends. */
#include "phase_clock.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PC_MAX_ROWS 128
#define PC_EVERY 200

static const char *const phase_names[PHASE_N] = {"embed", "qkv", "attn", "wo", "ffn", "logits", "book"};

static struct {
    double sum[PC_MAX_ROWS + 1][PHASE_N]; /* seconds per (row count, phase) since the last log */
    int steps[PC_MAX_ROWS + 1];
    int rows;                             /* the running step's bucket */
    double last;                          /* tide_now() at the last mark */
} pc;

bool phase_clock_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TIDE_PHASE_CLOCK");
        on = v && v[0] == '1';
    }
    return on == 1;
}

void phase_clock_start(const struct backend_i *B, void *ctx, int n_rows)
{
    B->sync(ctx);
    pc.rows = n_rows < 1 ? 1 : n_rows > PC_MAX_ROWS ? PC_MAX_ROWS : n_rows;
    pc.last = tide_now();
}

void phase_clock_mark(const struct backend_i *B, void *ctx, enum phase p)
{
    B->sync(ctx);
    double t = tide_now();
    pc.sum[pc.rows][p] += t - pc.last;
    pc.last = t;
}

void phase_clock_stop(void)
{
    int r = pc.rows;
    if (++pc.steps[r] < PC_EVERY)
        return;
    char line[512];
    double total = 0;
    int o = snprintf(line, sizeof line, "phase_clock: %d rows, %d steps, ms a step:", r, pc.steps[r]);
    for (int p = 0; p < PHASE_N; p++) {
        double ms = pc.sum[r][p] * 1e3 / pc.steps[r];
        total += ms;
        o += snprintf(line + o, sizeof line - (size_t)o, " %s %.3f", phase_names[p], ms);
    }
    snprintf(line + o, sizeof line - (size_t)o, " = %.3f", total);
    tide_log("%s", line);
    memset(pc.sum[r], 0, sizeof pc.sum[r]);
    pc.steps[r] = 0;
}

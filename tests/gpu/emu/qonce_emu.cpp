/* qonce_emu.cpp - the quantise-once decode products (src/engine/cuda/matmul_decode.cuh, the real
 * device code of TIDE_DECODE_QONCE=1 and =2) run on the CPU against the kernels whose bits they
 * must reproduce (src/engine/cuda/mmvq_fused.cuh: matmul.cu's mmvq_fused_kernel and
 * mmvq_fused3_kernel, also the real code): no GPU was there when they were written, and this is
 * how their index math was checked (`make decode-qonce-emu`).
 *
 * g++ compiles both headers, mmq.cuh and common_device.cuh against the host stand-in
 * engine/cuda/common.cuh here (threads, barriers, exchanged shuffles; emu_launch.h runs the
 * grids). The host parts of cuda_matmul_qonce (qonce_shape's choices, the CTA starts, the modes,
 * the scratch layout) and of cuda_matmul / cuda_matmul3's decode branches are copied below (keep
 * in step). Each case quantises W with tide's own quantiser (q8_0 or q4_0), runs the old kernel
 * and the new one over every CTA, with y starting as NaN (or as the same y0 with add), and
 * requires: y (and with a norm the normed x written to xn) bit for bit equal to the old
 * kernel's, as test-gpu decode_qonce requires on the GPU; and y within float rounding (< 1e-5
 * relative) of a double dot of the dequantised W with x quantised on the host (q8 blocks of 32,
 * d = amax / 127 rounded through f16, q = round-to-even(v / d)) from the old kernel's xn.
 * Cases: both types, modes 1 and 2, every rows-a-warp shape (R x PU = 4x1, 2x2, 2x1, 1x2), one
 * to eight tokens (NT 1 and 8), rows not a multiple of a CTA's, one pair of blocks a row (64
 * columns), 4096 columns (two pairs a lane), add, matmul3 with three row counts and the f32
 * norm (mode 2 norms in the CTA) or an f16 norm (mode 2 falls back to mode 1).
 * What it cannot check: the GPU's own float contraction (nvcc fuses a * b + c into fma where g++
 * here does not, in both kernels alike), memory ordering, speed (test-gpu does). */
#include "emu_launch.h"
#include "engine/cuda/mmvq_fused.cuh"
#include "engine/cuda/matmul_decode.cuh"
#include <stdio.h>

struct mat { std::vector<uint8_t> buf; const uint8_t *W; size_t rb; int rows; };

/* ---- cuda_matmul_qonce's device part, as its host code launches it (R, PU: qonce_shape's) ---- */
template <int QT, int NT, int MODE>
static void qonce_launch(int R, int PU, unsigned grid, size_t smem, const qo_args &a, int nb, const int8_t *xq,
                         const float *xd, int n, bool add, const qo_x &px)
{
    constexpr int T = MODE ? QO_THREADS : QO_WARPS * 32;
    emu_dim g = {grid, 1, 1};
    if (R == 4)
        emu_launch(g, T, smem, [&] { mmvq_qonce_kernel<QT, 4, 1, NT, MODE>(a, nb, xq, xd, n, add, px); });
    else if (R == 2 && PU == 2)
        emu_launch(g, T, smem, [&] { mmvq_qonce_kernel<QT, 2, 2, NT, MODE>(a, nb, xq, xd, n, add, px); });
    else if (R == 2)
        emu_launch(g, T, smem, [&] { mmvq_qonce_kernel<QT, 2, 1, NT, MODE>(a, nb, xq, xd, n, add, px); });
    else
        emu_launch(g, T, smem, [&] { mmvq_qonce_kernel<QT, 1, 2, NT, MODE>(a, nb, xq, xd, n, add, px); });
}
template <int QT, int MODE>
static void qonce_launch_n(int R, int PU, unsigned grid, size_t smem, const qo_args &a, int nb, const int8_t *xq,
                           const float *xd, int n, bool add, const qo_x &px)
{
    if (n == 1)
        qonce_launch<QT, 1, MODE>(R, PU, grid, smem, a, nb, xq, xd, n, add, px);
    else
        qonce_launch<QT, MM_NT, MODE>(R, PU, grid, smem, a, nb, xq, xd, n, add, px);
}

/* qonce_shape with TIDE_DECODE_QONCE_RPW = rpw_env (0: unset) */
static void qonce_shape(int np, int rpw_env, int *R, int *PU)
{
    *PU = np > 32 ? 2 : 1;
    *R = rpw_env ? rpw_env : 4 / *PU;
    if (*R == 4)
        *PU = 1;
    else if (*R == 1)
        *PU = 2;
}

static void run_qonce(int mode, int qt, int nm, const mat *w, int cols, const float *x, float *const *y, int n,
                      bool add, const uint8_t *nw, uint32_t ntype, float eps, float *xn, int rpw_env)
{
    int nb = cols / QK;
    qo_args a;
    a.start[0] = 0;
    int R, PU;
    qonce_shape(nb / 2, rpw_env, &R, &PU);
    if (mode == 2 && nw && ntype != 0) /* before the starts (the bug this emulator found) */
        mode = 1;
    int warps = mode == 2 ? QO_THREADS / 32 : QO_WARPS;
    for (int m = 0; m < 3; m++) {
        int mm = m < nm ? m : nm - 1;
        a.W[m] = w[mm].W;
        a.row_bytes[m] = w[mm].rb;
        a.y[m] = y[mm];
        a.rows[m] = w[mm].rows;
        a.start[m + 1] = a.start[m] + (m < nm ? (w[mm].rows + warps * R - 1) / (warps * R) : 0);
    }
    unsigned grid = (unsigned)a.start[3];
    qo_x px = {x, cols, nw, ntype, eps, nw ? xn : NULL};
    if (mode == 2) {
        size_t smem = (((size_t)n * cols + 15) & ~(size_t)15) + (size_t)n * nb * sizeof(float);
        if (qt == 8 && nw) qonce_launch_n<8, 2>(R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else if (qt == 8) qonce_launch_n<8, 1>(R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else if (nw) qonce_launch_n<2, 2>(R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        else qonce_launch_n<2, 1>(R, PU, grid, smem, a, nb, NULL, NULL, n, add, px);
        return;
    }
    size_t qbytes = ((size_t)n * cols + 255) & ~(size_t)255;
    std::vector<uint8_t> ws(qbytes + (size_t)n * nb * sizeof(float) + 16, 0xAB);
    uint8_t *wsa = (uint8_t *)(((uintptr_t)ws.data() + 15) & ~(uintptr_t)15);
    int8_t *xq = (int8_t *)wsa;
    float *xd = (float *)(wsa + qbytes);
    emu_dim qgrid = {(unsigned)((cols + QO_THREADS - 1) / QO_THREADS), (unsigned)n, 1};
    if (nw)
        emu_launch(qgrid, QO_THREADS, 0, [&] { qonce_quantize_kernel<true>(x, cols, xq, xd, ntype, nw, eps, xn); });
    else
        emu_launch(qgrid, QO_THREADS, 0, [&] { qonce_quantize_kernel<false>(x, cols, xq, xd, 0, NULL, 0.0f, NULL); });
    if (qt == 8) qonce_launch_n<8, 0>(R, PU, grid, 0, a, nb, xq, xd, n, add, px);
    else qonce_launch_n<2, 0>(R, PU, grid, 0, a, nb, xq, xd, n, add, px);
}

/* ---- the old kernels as cuda_matmul (nm 1) / cuda_matmul3 (nm 3) launch them at decode ---- */
static void run_old(int qt, int nm, const mat *w, int cols, const float *x, float *const *y, int n, bool add,
                    const uint8_t *nw, uint32_t ntype, float eps, float *xn, int rpw)
{
    int nb = cols / QK;
    size_t sm = (((size_t)n * cols + 15) & ~(size_t)15) + (size_t)n * nb * sizeof(float);
    if (nm == 1) {
        bool pairs = nb % 2 == 0 && (((uintptr_t)w[0].W | w[0].rb) & 3) == 0;
        emu_dim grid = {(unsigned)((w[0].rows + MMQ_WARPS * rpw - 1) / (MMQ_WARPS * rpw)), 1, 1};
        emu_launch(grid, MMQ_WARPS * 32, sm, [&] {
            if (qt == 8) mmvq_fused_kernel<8>(w[0].W, w[0].rb, w[0].rows, cols, pairs, x, n, y[0], rpw, add);
            else mmvq_fused_kernel<2>(w[0].W, w[0].rb, w[0].rows, cols, pairs, x, n, y[0], rpw, add);
        });
        return;
    }
    mm3_args a;
    a.start[0] = 0;
    a.nw = nw;
    a.ntype = ntype;
    a.eps = eps;
    a.xn = xn;
    a.rpw = rpw;
    for (int m = 0; m < 3; m++) {
        a.W[m] = w[m].W;
        a.row_bytes[m] = w[m].rb;
        a.y[m] = y[m];
        a.rows[m] = w[m].rows;
        a.pairs[m] = nb % 2 == 0 && (((uintptr_t)a.W[m] | a.row_bytes[m]) & 3) == 0;
        a.start[m + 1] = a.start[m] + (w[m].rows + MMQ_WARPS * a.rpw - 1) / (MMQ_WARPS * a.rpw);
    }
    emu_launch({(unsigned)a.start[3], 1, 1}, MMQ_WARPS * 32, sm, [&] {
        if (qt == 8) mmvq_fused3_kernel<8>(a, cols, x, n);
        else mmvq_fused3_kernel<2>(a, cols, x, n);
    });
}

static uint64_t rs = 88172645463325252ull;
static double frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) / 9007199254740992.0 * 2 - 1; }

static mat make_mat(int qt, int rows, int cols, std::vector<float> &deq)
{
    mat m;
    uint32_t type = qt == 8 ? 8 : 2; /* GGML_TYPE_Q8_0 / Q4_0 */
    m.rb = ggml_row_size(type, cols);
    m.rows = rows;
    m.buf.assign(m.rb * rows + 16, 0);
    m.W = m.buf.data() + ((16 - ((uintptr_t)m.buf.data() & 15)) & 15);
    std::vector<float> r(cols);
    deq.resize((size_t)rows * cols);
    for (int i = 0; i < rows; i++) {
        for (auto &v : r) v = (float)(frand() * 0.1);
        ggml_quantize(type, r.data(), (uint8_t *)m.W + i * m.rb, cols);
        ggml_dequantize(type, m.W + i * m.rb, deq.data() + (size_t)i * cols, cols);
    }
    return m;
}

/* nm products of x (n, cols): mode 1 / 2, forced rows a warp (0: the default), norm: 0 none,
 * 1 f32 weights, 2 f16 weights */
static int test(const char *what, int qt, int mode, int nm, const int *rows, int cols, int n, bool add, int norm,
                int rpw_env)
{
    std::vector<float> deq[3];
    mat w[3];
    for (int m = 0; m < nm; m++) w[m] = make_mat(qt, rows[m], cols, deq[m]);
    std::vector<float> x((size_t)n * cols);
    for (auto &v : x) v = (float)(frand() * (frand() > 0.9 ? 4 : 1));
    std::vector<uint8_t> nwb((size_t)cols * 4);
    for (int e = 0; e < cols; e++) {
        float v = (float)(1 + 0.5 * frand());
        if (norm == 1) memcpy(&nwb[e * 4], &v, 4);
        else { uint16_t h = tide_f32_to_f16(v); memcpy(&nwb[e * 2], &h, 2); }
    }
    const uint8_t *nw = norm ? nwb.data() : NULL;
    uint32_t ntype = norm == 2 ? 1 : 0;
    float eps = 1e-6f;
    std::vector<float> y0[3], yo[3], yn[3], xno((size_t)n * cols, NAN), xnn((size_t)n * cols, NAN);
    float *po[3], *pn[3];
    for (int m = 0; m < nm; m++) {
        y0[m].resize((size_t)n * rows[m]);
        for (auto &v : y0[m]) v = (float)frand();
        yo[m] = add ? y0[m] : std::vector<float>(y0[m].size(), NAN);
        yn[m] = yo[m];
        po[m] = yo[m].data();
        pn[m] = yn[m].data();
    }
    run_old(qt, nm, w, cols, x.data(), po, n, add, nw, ntype, eps, xno.data(), nm == 3 ? 2 : 1);
    run_qonce(mode, qt, nm, w, cols, x.data(), pn, n, add, nw, ntype, eps, xnn.data(), rpw_env);
    long diff = 0, nan = 0;
    for (int m = 0; m < nm; m++)
        for (size_t i = 0; i < yo[m].size(); i++) {
            diff += memcmp(&yo[m][i], &yn[m][i], 4) != 0;
            nan += std::isnan(yn[m][i]);
        }
    long xdiff = norm ? memcmp(xno.data(), xnn.data(), xno.size() * 4) != 0 : 0;
    /* the reference: x (normed: the old kernel's xn) quantised on the host, W dequantised */
    const float *xs = norm ? xno.data() : x.data();
    int nb = cols / QK;
    std::vector<double> xv((size_t)n * cols);
    for (int b = 0; b < n * nb; b++) {
        float amax = 0;
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(xs[b * 32 + l]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f, ds = tide_f16_to_f32(tide_f32_to_f16(d));
        for (int l = 0; l < 32; l++) xv[b * 32 + l] = rintf(xs[b * 32 + l] * id) * (double)ds;
    }
    double num = 0, den = 0, nerr = 0;
    for (int m = 0; m < nm; m++)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows[m]; r++) {
                double ref = add ? y0[m][(size_t)t * rows[m] + r] : 0;
                for (int k = 0; k < cols; k++) ref += (double)deq[m][(size_t)r * cols + k] * xv[(size_t)t * cols + k];
                double got = yn[m][(size_t)t * rows[m] + r];
                num += (got - ref) * (got - ref);
                den += ref * ref;
            }
    if (norm) { /* the normed x itself against double */
        for (int t = 0; t < n; t++) {
            double ss = 0;
            for (int e = 0; e < cols; e++) ss += (double)x[(size_t)t * cols + e] * x[(size_t)t * cols + e];
            double sc = 1 / sqrt(ss / cols + eps);
            for (int e = 0; e < cols; e++) {
                double g = norm == 1 ? ((float *)nwb.data())[e] : tide_f16_to_f32(((uint16_t *)nwb.data())[e]);
                double ref = x[(size_t)t * cols + e] * sc * g;
                nerr = fmax(nerr, fabs(xnn[(size_t)t * cols + e] - ref) / (fabs(ref) + 1e-3));
            }
        }
    }
    double rel = sqrt(num / den);
    bool ok = diff == 0 && nan == 0 && xdiff == 0 && rel < 1e-5 && nerr < 1e-5;
    printf("%-28s %s mode %d rows %4d", what, qt == 8 ? "q8_0" : "q4_0", mode, rows[0]);
    for (int m = 1; m < nm; m++) printf("+%d", rows[m]);
    printf(" cols %4d n %d%s%s rpw %d: differing bits %ld, NaN %ld%s, vs double %.2g  %s\n", cols, n,
           add ? " add" : "", norm == 1 ? " norm f32" : norm == 2 ? " norm f16" : "", rpw_env, diff, nan,
           norm ? (xdiff ? ", xn DIFFERS" : ", xn same") : "", rel, ok ? "ok" : "BAD");
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    const int r70[1] = {70}, r130[1] = {130}, r9[1] = {9}, r37[1] = {37};
    const int qkv[3] = {96, 24, 40}, qkv2[3] = {33, 8, 8};
    for (int mode = 1; mode <= 2; mode++) {
        bad += test("one token, R 4 x PU 1", 8, mode, 1, r70, 2048, 1, false, 0, 0);
        bad += test("4096 cols: R 2 x PU 2, add", 8, mode, 1, r37, 4096, 1, true, 0, 0);
        bad += test("q4_0, 3 tokens", 2, mode, 1, r130, 320, 3, false, 0, 0);
        bad += test("8 tokens, R 1 x PU 2", 2, mode, 1, r37, 1024, 8, true, 0, 1);
        bad += test("2 tokens, R 2 x PU 1", 8, mode, 1, r9, 192, 2, false, 0, 2);
        bad += test("one pair a row", 8, mode, 1, r37, 64, 5, false, 0, 4);
        bad += test("matmul3 + f32 norm", 8, mode, 3, qkv, 2048, 1, false, 1, 0);
        bad += test("matmul3 + f32 norm, 2 tokens", 2, mode, 3, qkv2, 1536, 2, false, 1, 0);
        bad += test("matmul3 + f16 norm, 4 tokens", 8, mode, 3, qkv2, 512, 4, false, 2, 1);
        bad += test("matmul3, no norm", 2, mode, 3, qkv2, 4096, 1, false, 0, 0);
    }
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}

/* A hand-written CPU loop of the standard workload (CTDC on a finite MDP,
 * every grid point and seed, sampling, the divergence check, the metric every
 * log block): the prototype issue 15 asks for, to measure what a kernel that
 * XLA:CPU does not produce would reach. Not used by bec_jax; see
 * benchmarks/kernel_prototype.py, which compiles and drives it.
 *
 * One seed's trajectory is shared by all its grid points, so the state is laid
 * out (seed, feature, grid point) and the grid loop is the vector loop: each
 * step reads and writes a seed's theta, u and omega once (9 floats a run, in L1
 * for 576 points), where XLA's program makes several passes over every run's
 * state a step. K (the feature count) and ROWS (the metric factor's rows) are
 * fixed at compile time (-DK=4 -DROWS=5), so the short loops unroll and the
 * grid loop vectorizes.
 *
 * The arithmetic is bec_jax.algorithms.ctdc.update's (eqs. (32)-(34), rho on
 * all three), in float32; the compiler may contract into fused multiply-adds,
 * so results agree with the engine to rounding, not bit for bit.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifndef K
#define K 4
#endif
#ifndef ROWS
#define ROWS 4  /* rows of the metric's factor R */
#endif

/* A uniform in [0, 1) with 24 random bits for (seed, step): splitmix64 of a
 * counter, so any seed's stream can be drawn on any thread. */
static inline float uniform(uint64_t seed, uint64_t t) {
    uint64_t z = (seed << 32) ^ t;
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

typedef struct {
    int S, M;              /* states; outcomes per row (padded) */
    const float *cdf;      /* (S, M), last outcome's entry 2.0 (as bec_jax.prediction.sampling) */
    const int32_t *next;   /* (S, M) next state */
    const float *reward;   /* (S, M) */
    const float *rho;      /* (S, M) */
    const float *discount; /* (S, M) gamma(s, a, s') */
    const float *start_cdf;/* (S,) */
    const float *phi;      /* (S, K) */
    /* metric: sqrt(||R theta + h||^2), R (ROWS, K) */
    const float *R, *h;
} Model;

static inline int pick(const float *cdf, int m, float u) {
    int j = 0;
    for (int i = 0; i < m; i++) j += cdf[i] <= u;  /* bisect_right on a sorted row */
    return j < m ? j : m - 1;
}

/* RMSCBE of each grid point's theta (K, G): sqrt(||R theta + h||^2). */
static void metric(const Model *m, const float *restrict th, int G, float *restrict out) {
    const float *restrict R = m->R, *restrict h = m->h;
    for (int g = 0; g < G; g++) out[g] = 0.0f;
    for (int r = 0; r < ROWS; r++) {  /* rows outside: the grid loop is the vector loop */
#pragma omp simd
        for (int g = 0; g < G; g++) {
            float e = h[r];
            for (int i = 0; i < K; i++) e += R[r * K + i] * th[i * G + g];
            out[g] += e * e;
        }
    }
    for (int g = 0; g < G; g++) out[g] = sqrtf(out[g]);
}

typedef struct { float r, p, gam, f[K], f2[K]; } Step;

/* One step of every grid point of one seed (the transition `st` is the seed's):
 * bec_jax.algorithms.ctdc.update. With `save`, the state before the step goes to
 * (th0, uu0, om0); with `last`, ok[g] says whether the new state is within the
 * bound and out[g] gets its RMSCBE. Inlined with constant flags, so each form is
 * its own loop. */
static inline __attribute__((always_inline)) void step_grid(
        const Step *st, int G, float *restrict th, float *restrict uu, float *restrict om,
        const float *restrict alpha, const float *restrict beta, const float *restrict zeta,
        const int save, const int last, float *restrict th0, float *restrict uu0, float *restrict om0,
        const Model *m, float bound, float *restrict out, int *restrict ok) {
    const float r = st->r, p = st->p, gam = st->gam;
    const float *restrict R = m->R, *restrict h = m->h;
#pragma omp simd
    for (int g = 0; g < G; g++) {
        float v = 0.0f, v2 = 0.0f, pu = 0.0f;
#pragma GCC unroll 16
        for (int i = 0; i < K; i++) {
            if (save) { th0[i * G + g] = th[i * G + g]; uu0[i * G + g] = uu[i * G + g]; }
            v += th[i * G + g] * st->f[i];
            v2 += th[i * G + g] * st->f2[i];
            pu += uu[i * G + g] * st->f[i];
        }
        if (save) om0[g] = om[g];
        const float err = (r + gam * v2 - v) - om[g];
        const float ca = alpha[g] * p, cz = zeta[g] * p * (err - pu), gpu = gam * pu;
        float nt[K];
        int okg = 1;
#pragma GCC unroll 16
        for (int i = 0; i < K; i++) {
            nt[i] = th[i * G + g] + ca * (err * st->f[i] - gpu * st->f2[i]);
            const float nu = uu[i * G + g] + cz * st->f[i];
            th[i * G + g] = nt[i];
            uu[i * G + g] = nu;
            if (last) okg &= (fabsf(nt[i]) <= bound) & (fabsf(nu) <= bound);  /* NaN fails */
        }
        const float no = om[g] + beta[g] * p * err;
        om[g] = no;
        if (last) {
            ok[g] = okg & (fabsf(no) <= bound);
            float ss = 0.0f;
#pragma GCC unroll 16
            for (int q = 0; q < ROWS; q++) {
                float e = h[q];
#pragma GCC unroll 16
                for (int i = 0; i < K; i++) e += R[q * K + i] * nt[i];
                ss += e * e;
            }
            out[g] = sqrtf(ss);
        }
    }
}

/* Runs seeds [n0, n1) of a G-point grid for `steps` steps, logging every
 * `log_every`. `uniforms` (N, steps + 1) replaces the counter stream when not
 * NULL. Writes vals (L + 1, N, G), each run's metric at each log point (a
 * diverged run keeps its frozen value), and dstep (N, G): -1, or the step of
 * the log block at whose end the run first left `bound` (it is then reverted to
 * the block's start state and frozen, as the engine does). `frame` = 0 runs the
 * bare update loop only (no check, no metric): the prototype's own bare loop. */
void ctdc_sweep(const Model *m, int G, int N, int n0, int n1, int steps, int log_every,
                const float *alpha, const float *beta, const float *zeta, const float *theta0,
                float bound, const float *uniforms, uint64_t seed0, int frame,
                float *vals, int32_t *dstep, float *theta_out, float *u_out, float *omega_out,
                float *work /* (4 K + 3) G floats */) {
    float *restrict th = work, *restrict uu = work + K * G, *restrict om = work + 2 * K * G;
    float *restrict th0 = work + (2 * K + 1) * G, *restrict uu0 = th0 + K * G, *restrict om0 = th0 + 2 * K * G;
    int *restrict okv = (int *)(om0 + G);  /* G flags: within the bound after the block */
    const int L = steps / log_every;
    for (int n = n0; n < n1; n++) {
        const float *un = uniforms ? uniforms + (size_t)n * (steps + 1) : NULL;
        int32_t *restrict ds = dstep + (size_t)n * G;
        for (int i = 0; i < K; i++)
            for (int g = 0; g < G; g++) { th[i * G + g] = theta0[i]; uu[i * G + g] = 0.0f; }
        for (int g = 0; g < G; g++) { om[g] = 0.0f; ds[g] = -1; }
        int dead = 0;
        if (frame) metric(m, th, G, vals + (size_t)n * G);
        int s = pick(m->start_cdf, m->S, un ? un[0] : uniform(seed0 + n, 0));
        for (int l = 1; l <= L; l++) {
            for (int t = (l - 1) * log_every + 1; t <= l * log_every; t++) {
                const float u = un ? un[t] : uniform(seed0 + n, (uint64_t)t);
                const int j = pick(m->cdf + s * m->M, m->M, u);
                const int s2 = m->next[s * m->M + j];
                Step st = {m->reward[s * m->M + j], m->rho[s * m->M + j], m->discount[s * m->M + j]};
                for (int i = 0; i < K; i++) { st.f[i] = m->phi[s * K + i]; st.f2[i] = m->phi[s2 * K + i]; }
                s = s2;
                /* With the frame, the block's first step also keeps the start state
                 * (for the revert) and its last one checks the bound and takes the
                 * metric, in the same pass over the state: forms of one loop (the
                 * fourth, both at once, for blocks of one step). */
                if (!frame || (t != l * log_every && t != (l - 1) * log_every + 1))
                    step_grid(&st, G, th, uu, om, alpha, beta, zeta, 0, 0, NULL, NULL, NULL, m, bound, NULL, NULL);
                else if (t == (l - 1) * log_every + 1 && t != l * log_every)
                    step_grid(&st, G, th, uu, om, alpha, beta, zeta, 1, 0, th0, uu0, om0, m, bound, NULL, NULL);
                else if (t == l * log_every && t != (l - 1) * log_every + 1)
                    step_grid(&st, G, th, uu, om, alpha, beta, zeta, 0, 1, NULL, NULL, NULL, m, bound,
                              vals + ((size_t)l * N + n) * G, okv);
                else
                    step_grid(&st, G, th, uu, om, alpha, beta, zeta, 1, 1, th0, uu0, om0, m, bound,
                              vals + ((size_t)l * N + n) * G, okv);
            }
            if (!frame) continue;
            float *restrict out = vals + ((size_t)l * N + n) * G;
            const float *restrict before = vals + ((size_t)(l - 1) * N + n) * G;
#pragma omp simd reduction(+ : dead)
            for (int g = 0; g < G; g++) {
                const int newly = (ds[g] < 0) & !okv[g];
                ds[g] = newly ? l * log_every : ds[g];
                dead += newly;
            }
            /* Rare: a diverged run goes back to its block's start, and stays; its
             * metric is then the one logged at the block's start. */
            if (dead)
                for (int g = 0; g < G; g++)
                    if (ds[g] >= 0) {
                        for (int i = 0; i < K; i++) { th[i * G + g] = th0[i * G + g]; uu[i * G + g] = uu0[i * G + g]; }
                        om[g] = om0[g];
                        out[g] = before[g];
                    }
        }
        for (int i = 0; i < K; i++)
            for (int g = 0; g < G; g++) {
                theta_out[((size_t)n * K + i) * G + g] = th[i * G + g];
                u_out[((size_t)n * K + i) * G + g] = uu[i * G + g];
            }
        for (int g = 0; g < G; g++) omega_out[(size_t)n * G + g] = om[g];
    }
}

/* Mean, std (ddof 0) and sem (ddof 1) over the seeds of every (log point, grid
 * point) among the runs alive there (not yet flagged by `dstep`), and their
 * count: the engine's report, in double precision, for log points [l0, l1)
 * (a thread's share). `acc`: 3 * G doubles. */
void seed_stats(const float *vals, const int32_t *dstep, int l0, int l1, int N, int G, int log_every,
                float *mean, float *std, float *sem, int32_t *count, double *acc) {
    double *restrict s = acc, *restrict ss = acc + G, *restrict c = acc + 2 * G;
    for (int l = l0; l < l1; l++) {
        const int32_t step = l * log_every;
        for (int g = 0; g < G; g++) s[g] = ss[g] = c[g] = 0.0;
        for (int n = 0; n < N; n++) {  /* one pass; grid points contiguous: the vector loop */
            const float *restrict v = vals + ((size_t)l * N + n) * G;
            const int32_t *restrict d = dstep + (size_t)n * G;
#pragma omp simd
            for (int g = 0; g < G; g++) {
                const double x = ((d[g] < 0) | (d[g] > step)) ? (double)v[g] : 0.0;
                s[g] += x;
                ss[g] += x * x;
                c[g] += (d[g] < 0) | (d[g] > step);
            }
        }
        for (int g = 0; g < G; g++) {  /* the sum of squared deviations, from the two sums */
            const double mu = c[g] > 0 ? s[g] / c[g] : NAN;
            ss[g] = c[g] > 0 ? fmax(ss[g] - s[g] * mu, 0.0) : NAN;
            s[g] = mu;
        }
        for (int g = 0; g < G; g++) {
            const size_t o = (size_t)l * G + g;
            const double n_ = c[g];
            mean[o] = (float)s[g];
            std[o] = n_ > 0 ? (float)sqrt(ss[g] / n_) : NAN;
            sem[o] = n_ > 1 ? (float)sqrt(ss[g] / ((n_ - 1) * n_)) : (n_ > 0 ? 0.0f : NAN);
            count[o] = (int32_t)n_;
        }
    }
}

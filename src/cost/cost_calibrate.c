/* cost_calibrate.c - fitting the cost model's device constants to an ALLOY_PROFILE table measured on a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/cost.h"

/* Values collected for one constant. */
typedef struct sample {
    double *v;
    int n, cap;
    bool oom;
} sample;

static void add(sample *s, double v)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *p = al_realloc(s->v, sizeof *p * (size_t)cap);
        if (!p) {
            s->oom = true;
            return;
        }
        s->v = p, s->cap = cap;
    }
    s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The 25th and 75th percentiles of s into *lo and *hi (scaled); unchanged when s is empty. */
static void quartiles(sample *s, double scale, double *lo, double *hi)
{
    if (!s->n) return;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_double);
    *lo = s->v[(s->n - 1) / 4] * scale;
    *hi = s->v[(3 * (s->n - 1) + 3) / 4] * scale;
}

/* Whether a GEMM's profile name "gemm.[Bx]MxNxK.DT" has an M, N or K that is not a multiple of 8. */
static bool odd_dims(const char *name)
{
    const char *p = strchr(name, '.');
    long long v[4];
    int n = 0;
    for (p = p ? p + 1 : NULL; p && n < 4;) {
        char *end;
        v[n++] = strtoll(p, &end, 10);
        if (end == p) return false;
        if (*end != 'x') break;
        p = end + 1;
    }
    for (int i = n - 3; n >= 3 && i < n; i++)
        if (v[i] % 8) return true;
    return false;
}

/* The bytes m's kernel `name` moves, or -1 when m has no such kernel. */
static int64_t model_bytes(const cost_model *m, const char *name)
{
    for (int i = 0; m && i < m->n; i++)
        if (m->launches[i].action == COST_KERNEL && strcmp(m->launches[i].name, name) == 0)
            return m->launches[i].read + m->launches[i].written + m->launches[i].spill;
    return -1;
}

/* Whether m's GEMM `name` has an odd leading dimension (1), an aligned one (0: a padded row
 * stride makes an odd M, N or K aligned), or -1 when m has no such GEMM. */
static int model_odd(const cost_model *m, const char *name)
{
    for (int i = 0; m && i < m->n; i++)
        if (m->launches[i].action == COST_GEMM && strcmp(m->launches[i].name, name) == 0) return m->launches[i].odd;
    return -1;
}

alloy_status cost_calibrate(const char *text, const cost_device *base, const cost_model *m, cost_device *out,
                            cost_fit *fit, char *err, size_t errlen)
{
    *out = *base;
    memset(fit, 0, sizeof *fit);
    sample eff = {0}, aligned = {0}, odd = {0}, f32 = {0}, floor = {0};
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            int idx, step;
            char kind[16], action[16], tflops[32], name[128];
            double us, gbs;
            long long bytes;
            if (sscanf(buf, "# %d %d %15s %15s %lf %lld %lf %31s %127s", &idx, &step, kind, action, &us, &bytes,
                       &gbs, tflops, name) == 9 && us > 0) {
                fit->rows++;
                bool gemm = strcmp(action, "gemm") == 0, kernel = strcmp(action, "kernel") == 0;
                int64_t mine = kernel ? model_bytes(m, name) : -1;
                if (mine >= 0) bytes = mine, fit->matched++;
                if (!gemm && (double)bytes >= 8.0 * (1 << 20)) add(&eff, (double)bytes / (us * 1e-6) / base->hbm), fit->bw_rows++;
                if (kernel && bytes < 64 * 1024) add(&floor, us * 1e-6), fit->floor_rows++;
                double tf = strtod(tflops, NULL);
                if (gemm && tf > 0 && tf * us * 1e6 >= 1e9) {
                    size_t n = strlen(name);
                    bool low = n > 4 && (strcmp(name + n - 4, ".f16") == 0 || strcmp(name + n - 5, ".bf16") == 0);
                    if (!low) add(&f32, tf * 1e12);
                    else if (model_odd(m, name) == 1 || (model_odd(m, name) < 0 && odd_dims(name)))
                        add(&odd, tf * 1e12), fit->odd_rows++;
                    else add(&aligned, tf * 1e12), fit->gemm_rows++;
                }
            }
        }
        line = end ? end + 1 : NULL;
    }
    alloy_status st = ALLOY_OK;
    if (eff.oom || aligned.oom || odd.oom || f32.oom || floor.oom) {
        al_fmt(err, errlen, "out of memory reading the profile");
        st = ALLOY_ERR_OOM;
    } else if (!fit->rows) {
        al_fmt(err, errlen, "no profile rows (lines '#   idx step kind action time_us bytes GB/s TFLOP/s name' of "
                            "an ALLOY_PROFILE table)");
        st = ALLOY_ERR_INVALID;
    } else {
        quartiles(&eff, 1, &out->eff_lo, &out->eff_hi);
        quartiles(&aligned, 1, &out->tensor_lo, &out->tensor_hi);
        quartiles(&odd, 1, &out->odd_lo, &out->odd_hi);
        quartiles(&f32, 1, &out->f32_lo, &out->f32_hi);
        quartiles(&floor, 1, &out->floor_lo, &out->floor_hi);
    }
    al_free(eff.v), al_free(aligned.v), al_free(odd.v), al_free(f32.v), al_free(floor.v);
    return st;
}

/* compare_safetensors.c - test helper: compares every tensor of an expected safetensors file with an actual one, within a relative tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"

static const char usage_text[] =
    "usage: compare_safetensors EXPECTED ACTUAL TOL\n"
    "Every tensor of EXPECTED must be in ACTUAL with the same shape (dtypes may\n"
    "differ; values compare as doubles). Prints per tensor the max abs error and\n"
    "the rel error = max abs error / max |expected| (1 if that is 0 and the abs\n"
    "error is not); NaN must meet NaN. Exit 0 if every rel error <= TOL, 1 if\n"
    "not or a tensor is missing or a file cannot be read, 2 on a usage error.\n";

static double half_to_double(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0) return sign * ldexp(mant, -24);
    if (exp == 31) return mant ? NAN : sign * INFINITY;
    return sign * ldexp(mant | 0x400, exp - 25);
}

static double bf16_to_double(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of t as a double (little-endian host assumed, as safetensors is). */
static double element(const alloy_host_tensor *t, int64_t i)
{
    const unsigned char *p = (const unsigned char *)t->data + (size_t)i * alloy_dtype_size(t->dtype);
    switch (t->dtype) {
    case ALLOY_F32: { float v; memcpy(&v, p, sizeof v); return v; }
    case ALLOY_F64: { double v; memcpy(&v, p, sizeof v); return v; }
    case ALLOY_F16: { uint16_t v; memcpy(&v, p, sizeof v); return half_to_double(v); }
    case ALLOY_BF16: { uint16_t v; memcpy(&v, p, sizeof v); return bf16_to_double(v); }
    case ALLOY_I32: { int32_t v; memcpy(&v, p, sizeof v); return v; }
    case ALLOY_I64: { int64_t v; memcpy(&v, p, sizeof v); return (double)v; }
    case ALLOY_BOOL: return *p ? 1.0 : 0.0;
    default: return NAN;
    }
}

static void fmt_shape(const alloy_host_tensor *t, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "%s[", alloy_dtype_name(t->dtype));
    for (int d = 0; d < t->rank && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? "," : "", (long long)t->dims[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

/* Compares one tensor; prints its line and returns true when within tol. */
static bool compare(const alloy_host_tensor *want, const alloy_host_tensor *got, double tol)
{
    char ws[128], gs[128];
    fmt_shape(want, ws, sizeof ws);
    fmt_shape(got, gs, sizeof gs);
    if (want->rank != got->rank ||
        memcmp(want->dims, got->dims, sizeof(int64_t) * (size_t)want->rank) != 0) {
        printf("%-24s FAIL shape: expected %s, actual %s\n", want->name, ws, gs);
        return false;
    }
    int64_t n = alloy_host_tensor_numel(want);
    double max_abs = 0, max_ref = 0;
    int64_t worst = 0;
    bool nan_mismatch = false;
    for (int64_t i = 0; i < n; i++) {
        double e = element(want, i), a = element(got, i);
        if (isnan(e) || isnan(a)) {
            if (isnan(e) != isnan(a) && !nan_mismatch) nan_mismatch = true, worst = i;
            continue;
        }
        double err = e == a ? 0.0 : fabs(a - e); /* equal infinities agree */
        if (isnan(err)) err = INFINITY;
        if (err > max_abs) max_abs = err, worst = i;
        if (fabs(e) > max_ref) max_ref = fabs(e);
    }
    double rel = nan_mismatch ? INFINITY : max_abs == 0 ? 0 : max_ref > 0 ? max_abs / max_ref : 1;
    bool ok = rel <= tol;
    printf("%-24s %s %s max_abs=%.3e rel=%.3e tol=%.1e", want->name, ok ? "ok  " : "FAIL", ws,
           max_abs, rel, tol);
    if (!ok && n)
        printf(" (element %lld: expected %.9g, actual %.9g)", (long long)worst,
               element(want, worst), element(got, worst));
    printf("\n");
    return ok;
}

/* compare_safetensors EXPECTED ACTUAL TOL; see usage_text. */
int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        fputs(usage_text, stdout);
        return 0;
    }
    char *end = NULL;
    double tol = argc == 4 ? strtod(argv[3], &end) : -1;
    if (argc != 4 || !end || *end || !(tol >= 0)) {
        fprintf(stderr, "compare_safetensors: want EXPECTED ACTUAL TOL (TOL a number >= 0)\n");
        return 2;
    }
    alloy_safetensors *want = NULL, *got = NULL;
    char err[1024];
    if (alloy_safetensors_load(argv[1], &want, err, sizeof err) ||
        alloy_safetensors_load(argv[2], &got, err, sizeof err)) {
        fprintf(stderr, "compare_safetensors: %s\n", err);
        alloy_safetensors_free(want);
        return 1;
    }
    int failed = 0, count = alloy_safetensors_count(want);
    for (int i = 0; i < count; i++) {
        const alloy_host_tensor *w = alloy_safetensors_get(want, i);
        const alloy_host_tensor *g = alloy_safetensors_find(got, w->name);
        if (!g) {
            printf("%-24s FAIL missing from %s\n", w->name, argv[2]);
            failed++;
        } else if (!compare(w, g, tol)) {
            failed++;
        }
    }
    for (int i = 0; i < alloy_safetensors_count(got); i++) {
        const alloy_host_tensor *g = alloy_safetensors_get(got, i);
        if (!alloy_safetensors_find(want, g->name))
            printf("%-24s (only in %s, not compared)\n", g->name, argv[2]);
    }
    if (count == 0) {
        printf("%s holds no tensor to compare\n", argv[1]);
        failed++;
    }
    alloy_safetensors_free(want);
    alloy_safetensors_free(got);
    printf("%s: %d of %d tensors failed\n", failed ? "FAIL" : "ok", failed, count);
    return failed ? 1 : 0;
}

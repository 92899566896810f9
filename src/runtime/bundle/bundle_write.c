/* bundle_write.c - the bytes of a bundle: header, checksum, sections (docs/bundle.md). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloy_config.h"
#include "base/sha256.h"
#include "runtime/bundle/bundle.h"
#include "base/file.h"

/* A growing byte buffer; oom sticks. */
typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} wbuf;

static void put(wbuf *b, const void *data, size_t n)
{
    if (b->oom || !n) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = al_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u32(wbuf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 4);
}

static void put_u64(wbuf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 8);
}

static void put_i32(wbuf *b, int v) { put_u32(b, (uint32_t)v); }
static void put_i64(wbuf *b, int64_t v) { put_u64(b, (uint64_t)v); }

static void put_type(wbuf *b, const ir_type *t)
{
    put_i32(b, (int)t->dtype);
    put_i32(b, t->rank);
    for (int d = 0; d < t->rank; d++) put_i64(b, t->dims[d]);
}

/* A section: tag, a reserved zero word, its length, its bytes. */
static void put_section(wbuf *b, uint32_t tag, const wbuf *body)
{
    put_u32(b, tag);
    put_u32(b, 0);
    put_u64(b, body->len);
    put(b, body->p, body->len);
    if (body->oom) b->oom = true;
}

static void encode_meta(wbuf *w, const bundle_contents *c)
{
    char line[512];
    al_fmt(line, sizeof line,
           "graph=%s\nseed=%" PRIu64 "\ntraining=%d\nscaler=%d\ngrowth_interval=%d\noptimizer=%d\n"
           "accumulation_steps=%d\n",
           c->graph_name, c->seed, c->training ? 1 : 0, c->scaler_kind, c->growth_interval, c->optimizer_kind,
           c->accumulation_steps);
    put(w, line, strlen(line));
    if (c->hysteresis > 1) { /* written only when set: a bundle without them is as before */
        al_fmt(line, sizeof line, "hysteresis=%d\n", c->hysteresis);
        put(w, line, strlen(line));
    }
    if (c->max_consecutive_skips > 0) {
        al_fmt(line, sizeof line, "max_consecutive_skips=%d\n", c->max_consecutive_skips);
        put(w, line, strlen(line));
    }
}

static void encode_schedule(wbuf *w, const schedule *s)
{
    put_i32(w, s->nnodes), put_i32(w, s->nsteps), put_i32(w, s->nmembers), put_i32(w, s->nparts);
    put_i32(w, s->ninputs);
    for (int i = 0; i < s->nsteps; i++) {
        const sched_step *t = &s->steps[i];
        put_i32(w, (int)t->kind), put_i32(w, t->pos), put_i32(w, t->first), put_i32(w, t->n);
        put_i32(w, t->first_part), put_i32(w, t->nparts), put_i32(w, t->first_in), put_i32(w, t->nin);
        put_type(w, &t->space);
    }
    for (int i = 0; i < s->nmembers; i++) put_i32(w, s->members[i].node), put_i32(w, s->members[i].flags);
    for (int i = 0; i < s->nparts; i++) {
        const sched_part *p = &s->parts[i];
        put_i32(w, (int)p->kind), put_i32(w, p->wide ? 1 : 0), put_i32(w, p->first), put_i32(w, p->n);
    }
    for (int i = 0; i < s->ninputs; i++) put_i32(w, s->inputs[i]);
    for (int i = 0; i < s->nnodes; i++) put_i32(w, s->step_of[i]), put_i32(w, s->member_of[i]);
    put(w, s->kept, (size_t)s->nnodes);
}

static void encode_plan(wbuf *w, const mem_plan *p)
{
    put_i32(w, p->nnodes);
    put_u64(w, p->arena_bytes), put_u64(w, p->peak_live_bytes), put_i32(w, p->inplace);
    put_u64(w, p->scratch_offset), put_u64(w, p->scratch_bytes);
    put_i32(w, ALLOY_DTYPE_COUNT);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++) put_u64(w, p->bytes_by_dtype[d]);
    for (int i = 0; i < p->nnodes; i++) /* -2 - t: an update written into state leaf t */
        put_i64(w, p->state_of && p->state_of[i] >= 0 ? -2 - (int64_t)p->state_of[i] : p->offset[i]);
}

/* The layout: every param and state node of the compiled graph, in node order. */
static void encode_state(wbuf *w, const ir_graph *g)
{
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i]->op == IR_OP_param || g->nodes[i]->op == IR_OP_state;
    put_i32(w, n);
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *node = g->nodes[i];
        if (node->op != IR_OP_param && node->op != IR_OP_state) continue;
        size_t len = strlen(node->name);
        put_u32(w, (uint32_t)len);
        put(w, node->name, len);
        put_type(w, &node->type);
    }
}

/* The CUDA executable (read_cuda's layout). */
static void encode_cuda(wbuf *w, const bundle_cuda *x)
{
    put_u32(w, x->min_driver), put_u32(w, x->nmodules), put_i32(w, x->nimages);
    for (int i = 0; i < x->nimages; i++) {
        const bundle_image *im = &x->images[i];
        put_u32(w, im->kind), put_u32(w, im->arch), put_u32(w, im->module), put_u32(w, 0);
        put_u64(w, im->size);
        put(w, im->data, im->size);
    }
}

/* The kernel table (read_kernels' layout). */
static void encode_kernels(wbuf *w, const bundle_cuda *x)
{
    const cg_program *prog = &x->prog;
    put_i32(w, prog->nkernels), put_i32(w, prog->nskipped);
    for (int q = 0; q < prog->nkernels; q++) {
        const cg_kernel *k = &prog->kernels[q];
        put_u32(w, (uint32_t)strlen(k->name));
        put(w, k->name, strlen(k->name));
        put_u32(w, x->module_of[q]), put_i32(w, k->step), put_i32(w, (int)k->kind);
        put_u32(w, k->grid), put_u32(w, k->block), put_i32(w, k->nparams);
        for (int i = 0; i < k->nparams; i++) {
            const cg_param *pa = &k->params[i];
            put_u32(w, (uint32_t)pa->kind), put_i32(w, pa->node), put_u32(w, pa->written), put_u64(w, (uint64_t)pa->count);
        }
    }
    for (int i = 0; i < prog->nskipped; i++) {
        put_i32(w, prog->skipped[i]);
        put_u32(w, (uint32_t)strlen(prog->why[i]));
        put(w, prog->why[i], strlen(prog->why[i]));
    }
}

/* The header: magic, version, header size, alloy version, payload size,
 * section count, a reserved word, the payload's SHA-256. */
static void encode_header(uint8_t *h, size_t payload, uint32_t nsections)
{
    memset(h, 0, BUNDLE_HEADER_BYTES);
    memcpy(h, BUNDLE_MAGIC, 8);
    for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(BUNDLE_VERSION >> (8 * i));
    for (int i = 0; i < 4; i++) h[12 + i] = (uint8_t)(BUNDLE_HEADER_BYTES >> (8 * i));
    al_fmt((char *)h + 16, 16, "%s", ALLOY_VERSION);
    for (int i = 0; i < 8; i++) h[32 + i] = (uint8_t)((uint64_t)payload >> (8 * i));
    for (int i = 0; i < 4; i++) h[40 + i] = (uint8_t)(nsections >> (8 * i));
    al_sha256(h + BUNDLE_HEADER_BYTES, payload, h + 48);
}

bool bundle_resign(uint8_t *bytes, size_t len)
{
    if (len < BUNDLE_HEADER_BYTES) return false;
    al_sha256(bytes + BUNDLE_HEADER_BYTES, len - BUNDLE_HEADER_BYTES, bytes + 48);
    return true;
}

alloy_status bundle_encode(const bundle_contents *c, uint8_t **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL, *len = 0;
    wbuf file = {0}, body[9] = {{0}};
    uint8_t zeros[BUNDLE_HEADER_BYTES] = {0};
    put(&file, zeros, sizeof zeros); /* the header, filled last */
    encode_meta(&body[0], c);
    char *ir = ir_print_string(c->ir);
    if (ir) put(&body[1], ir, strlen(ir));
    else body[1].oom = true;
    al_free(ir);
    encode_schedule(&body[2], &c->comp.sched);
    encode_plan(&body[3], &c->comp.plan);
    encode_state(&body[4], c->ir);
    if (c->options) put(&body[5], c->options, strlen(c->options));
    /* the optional sections, in tag order after the six required ones */
    uint32_t tags[9] = {BUNDLE_SEC_META,  BUNDLE_SEC_IR,      BUNDLE_SEC_SCHEDULE, BUNDLE_SEC_PLAN,
                        BUNDLE_SEC_STATE, BUNDLE_SEC_OPTIONS};
    int nsections = 6;
    if (c->init_state) {
        put(&body[nsections], c->init_state, c->init_state_len);
        tags[nsections++] = BUNDLE_SEC_INIT_STATE;
    }
    if (c->cuda.nimages) {
        encode_cuda(&body[nsections], &c->cuda);
        tags[nsections++] = BUNDLE_SEC_CUDA_EXEC;
        if (c->cuda.has_kernels) {
            encode_kernels(&body[nsections], &c->cuda);
            tags[nsections++] = BUNDLE_SEC_CUDA_KERNELS;
        }
    }
    for (int i = 0; i < nsections; i++) {
        put_section(&file, tags[i], &body[i]);
        al_free(body[i].p);
    }
    if (file.oom) {
        al_free(file.p);
        al_fmt(err, errlen, "bundle of graph '%s': out of memory", c->graph_name);
        return ALLOY_ERR_OOM;
    }
    encode_header(file.p, file.len - BUNDLE_HEADER_BYTES, (uint32_t)nsections);
    *out = file.p, *len = file.len;
    return ALLOY_OK;
}

alloy_status bundle_write_file(const char *path, const bundle_contents *c, char *err, size_t errlen)
{
    uint8_t *bytes;
    size_t len;
    alloy_status st = bundle_encode(c, &bytes, &len, err, errlen);
    if (st) return st;
    const void *parts[1] = {bytes};
    st = al_file_write(path, parts, &len, 1, AL_FILE_DURABLE, err, errlen);
    al_free(bytes);
    return st;
}

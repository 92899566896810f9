/* bundle_read.c - reading a bundle: the header, the section table and the IR, state, initial state and meta sections, every byte checked before it is trusted (docs/bundle.md); the cursor, schedule, plan and CUDA sections in bundle_read_*.c. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/sha256.h"
#include "runtime/io/checksum.h"
#include "runtime/io/safetensors_memory.h"
#include "runtime/bundle/bundle_read.h"

static bool read_state(bundle_rd *r, const ir_graph *g, bundle_contents *c)
{
    int n = bundle_rd_count(r, "state count", 12);
    if (r->bad) return false;
    c->state = al_calloc((size_t)n + 1, sizeof *c->state);
    if (!c->state) return bundle_rd_oom(r, "state", n);
    c->nstate = n; /* only with the array that bundle_contents_free walks */
    for (int i = 0; i < c->nstate && !r->bad; i++) {
        size_t len = bundle_rd_u32(r, "name length");
        if (!bundle_rd_need(r, len, "name")) break;
        if (memchr(r->p + r->pos, 0, len)) return bundle_rd_fail(r, "%s: a NUL inside tensor name %" PRId64, "state", i);
        c->state[i].name = al_malloc(len + 1);
        if (!c->state[i].name) return bundle_rd_oom(r, "state name", i);
        memcpy(c->state[i].name, r->p + r->pos, len);
        c->state[i].name[len] = '\0';
        r->pos += len;
        c->state[i].type = bundle_rd_type(r, "state type");
        int node = r->bad ? -1 : ir_find_name(g, c->state[i].name);
        if (!r->bad && (node < 0 || (g->nodes[node]->op != IR_OP_param && g->nodes[node]->op != IR_OP_state)))
            return bundle_rd_fail(r, "%s: tensor %" PRId64 " names no param or state of the IR", "state", i);
        if (!r->bad && !ir_type_eq(&c->state[i].type, &g->nodes[node]->type))
            return bundle_rd_fail(r, "%s: tensor %" PRId64 "'s dtype or shape differs from the IR's", "state", i);
    }
    int want = 0;
    for (int i = 0; i < g->nnodes; i++) want += g->nodes[i]->op == IR_OP_param || g->nodes[i]->op == IR_OP_state;
    if (!r->bad && want != c->nstate)
        return bundle_rd_fail(r, "%s: %" PRId64 " tensors, but the IR has a different number of params and state", "state",
                              c->nstate);
    return bundle_rd_done(r);
}

/* INIT_STATE: a safetensors file (its own header and offsets checked as
 * alloy_safetensors_load checks a file) holding every tensor of the state
 * layout with its dtype and shape and nothing else, with alloy's checksum
 * when it has one. The bytes are kept for the load. */
static alloy_status read_init_state(const uint8_t *p, size_t len, const char *where, size_t at, bundle_contents *c,
                                    char *err, size_t errlen)
{
    char sec[600];
    al_fmt(sec, sizeof sec, "%s: section initial state at byte %zu", where, at);
    alloy_safetensors *file = NULL;
    alloy_status st = io_safetensors_load_memory(p, len, sec, &file, err, errlen);
    if (st) return st == ALLOY_ERR_OOM ? st : ALLOY_ERR_FORMAT;
    int n = alloy_safetensors_count(file);
    if (n != c->nstate) {
        al_fmt(err, errlen, "%s: %d tensors, the state layout has %d", sec, n, c->nstate);
        st = ALLOY_ERR_FORMAT;
    }
    for (int i = 0; !st && i < c->nstate; i++) {
        const alloy_host_tensor *t = alloy_safetensors_find(file, c->state[i].name);
        const ir_type *want = &c->state[i].type;
        bool same = t && t->dtype == want->dtype && t->rank == want->rank;
        for (int d = 0; same && d < want->rank; d++) same = t->dims[d] == want->dims[d];
        if (!same) {
            al_fmt(err, errlen, "%s: state '%s' is %s", sec, c->state[i].name,
                   t ? "there with another dtype or shape than the layout's" : "missing");
            st = ALLOY_ERR_FORMAT;
        }
    }
    const char *want = alloy_safetensors_metadata(file, IO_CHECKSUM_KEY);
    if (!st && want) {
        const alloy_host_tensor **ts = al_calloc((size_t)n + 1, sizeof *ts);
        char got[IO_CHECKSUM_LEN] = "";
        for (int i = 0; ts && i < n; i++) ts[i] = alloy_safetensors_get(file, i);
        st = ts ? io_tensors_checksum(ts, n, got) : ALLOY_ERR_OOM;
        al_free(ts);
        if (st) al_fmt(err, errlen, "%s: out of memory", sec);
        else if (strcmp(got, want) != 0) {
            al_fmt(err, errlen, "%s: the tensors' checksum is %s, the file's says %.40s", sec, got, want);
            st = ALLOY_ERR_FORMAT;
        }
    }
    alloy_safetensors_free(file);
    if (!st && !(c->init_state = al_malloc(len))) {
        al_fmt(err, errlen, "%s: out of memory", sec);
        st = ALLOY_ERR_OOM;
    }
    if (!st) memcpy(c->init_state, p, len), c->init_state_len = len;
    return st;
}

/* META: key=value lines; every key required, none unknown. */
static bool read_meta(bundle_rd *r, bundle_contents *c)
{
    /* the first NREQUIRED keys are in every bundle; the scaler's stop rules
     * and hysteresis only where set (a bundle without them reads as before) */
    enum { NREQUIRED = 7, NKEYS = 9 };
    static const char *const keys[NKEYS] = {"graph", "seed", "training", "scaler", "growth_interval", "optimizer",
                                            "accumulation_steps", "hysteresis", "max_consecutive_skips"};
    bool seen[NKEYS] = {0};
    char line[256];
    while (!r->bad && r->pos < r->len) {
        const uint8_t *nl = memchr(r->p + r->pos, '\n', r->len - r->pos);
        size_t n = nl ? (size_t)(nl - (r->p + r->pos)) : r->len - r->pos;
        if (!nl || n >= sizeof line) return bundle_rd_fail(r, "%s: a line without its newline or over %" PRId64 " bytes",
                                                           "meta", (int64_t)sizeof line);
        memcpy(line, r->p + r->pos, n);
        line[n] = '\0';
        char *eq = strchr(line, '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < NKEYS; i++)
                if (strcmp(line, keys[i]) == 0) k = i;
        }
        if (k < 0 || seen[k]) return bundle_rd_fail(r, "%s: an unknown or repeated key (line of %" PRId64 " bytes)", "meta",
                                                    (int64_t)n);
        seen[k] = true;
        const char *v = eq + 1;
        char *end;
        errno = 0;
        if (k == 0) {
            if (strlen(v) >= sizeof c->graph_name) return bundle_rd_fail(r, "%s: graph name over %" PRId64 " bytes", "meta", 127);
            al_fmt(c->graph_name, sizeof c->graph_name, "%s", v);
        } else {
            unsigned long long x = strtoull(v, &end, 10);
            if (!*v || *end || errno || (k > 1 && x > INT_MAX))
                return bundle_rd_fail(r, "%s: a bad number for key %" PRId64 " (graph, seed, training, ...)", "meta", k);
            if (k == 1) c->seed = x;
            else if (k == 2) c->training = x != 0;
            else if (k == 3) c->scaler_kind = (int)x;
            else if (k == 4) c->growth_interval = (int)x;
            else if (k == 5) c->optimizer_kind = (int)x;
            else if (k == 6) c->accumulation_steps = (int)x;
            else if (k == 7) c->hysteresis = (int)x;
            else c->max_consecutive_skips = (int)x;
        }
        r->pos += n + 1;
    }
    for (int i = 0; i < NREQUIRED && !r->bad; i++)
        if (!seen[i]) return bundle_rd_fail(r, "%s: key %" PRId64 " missing (graph, seed, training, ...)", "meta", i);
    return !r->bad;
}

const char *bundle_tag_name(uint32_t tag)
{
    static const char *const names[] = {"?", "meta", "ir", "schedule", "plan", "state", "options", "initial state",
                                        "cuda executable", "cuda kernels"};
    return tag >= 1 && tag <= BUNDLE_SEC_LAST ? names[tag] : "unknown";
}

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* The header: magic, version, sizes, checksum. */
static alloy_status check_header(const uint8_t *b, size_t len, const char *where, char *err, size_t errlen)
{
    if (len < 8 || memcmp(b, BUNDLE_MAGIC, 8) != 0) {
        al_fmt(err, errlen, "%s: not an alloy bundle (the file does not start with \"" BUNDLE_MAGIC "\")", where);
        return ALLOY_ERR_FORMAT;
    }
    if (len < BUNDLE_HEADER_BYTES) {
        al_fmt(err, errlen, "%s: truncated: %zu bytes, shorter than the %u-byte header", where, len, BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    uint32_t version = le32(b + 8), hbytes = le32(b + 12);
    if (version > BUNDLE_VERSION) {
        al_fmt(err, errlen, "%s: bundle format version %u is newer than this alloy reads (%u); written by alloy %.15s",
               where, version, BUNDLE_VERSION, (const char *)b + 16);
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (version >= 1 && version < BUNDLE_VERSION) {
        al_fmt(err, errlen,
               "%s: bundle format version %u is older than this alloy reads (%u: the memory plan changed); "
               "written by alloy %.15s: compile the step again (alloyc compile ... -o BUNDLE)",
               where, version, BUNDLE_VERSION, (const char *)b + 16);
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (version == 0 || hbytes != BUNDLE_HEADER_BYTES || memchr(b + 16, 0, 16) == NULL || le32(b + 44) != 0) {
        al_fmt(err, errlen, "%s: header: bad version %u, header size %u, alloy version or reserved word", where,
               version, hbytes);
        return ALLOY_ERR_FORMAT;
    }
    uint64_t payload = le64(b + 32);
    if (payload != len - BUNDLE_HEADER_BYTES) {
        al_fmt(err, errlen, "%s: %s: the header gives %" PRIu64 " payload bytes, the file has %zu", where,
               payload > len - BUNDLE_HEADER_BYTES ? "truncated" : "trailing bytes", payload, len - BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    uint8_t sum[32];
    al_sha256(b + BUNDLE_HEADER_BYTES, payload, sum);
    if (memcmp(sum, b + 48, 32) != 0) {
        al_fmt(err, errlen, "%s: checksum mismatch: the payload's SHA-256 is not the header's; the file is damaged",
               where);
        return ALLOY_ERR_FORMAT;
    }
    return ALLOY_OK;
}

alloy_status bundle_decode(const uint8_t *bytes, size_t len, const char *where, bundle_contents *out, char *err,
                           size_t errlen)
{
    memset(out, 0, sizeof *out);
    alloy_status st = check_header(bytes, len, where, err, errlen);
    if (st) return st;
    bundle_contents c = {0};
    memcpy(c.alloy_version, bytes + 16, 16);
    uint32_t nsections = le32(bytes + 40);
    /* the sections: each tag once, in order; the ones this reader needs all present */
    const uint8_t *sec[BUNDLE_SEC_LAST + 1] = {0};
    size_t sec_len[BUNDLE_SEC_LAST + 1] = {0}, sec_at[BUNDLE_SEC_LAST + 1] = {0};
    size_t pos = BUNDLE_HEADER_BYTES;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nsections; i++) {
        if (len - pos < 16) {
            al_fmt(err, errlen, "%s: section %u at byte %zu: its 16-byte heading runs past the end", where, i, pos);
            return ALLOY_ERR_FORMAT;
        }
        uint32_t tag = le32(bytes + pos), zero = le32(bytes + pos + 4);
        uint64_t n = le64(bytes + pos + 8);
        if (tag <= last || tag > BUNDLE_SEC_LAST || zero) {
            al_fmt(err, errlen, "%s: section %u at byte %zu: tag %u (%s) unknown, repeated or out of order", where, i,
                   pos, tag, bundle_tag_name(tag));
            return ALLOY_ERR_FORMAT;
        }
        if (n > len - pos - 16) {
            al_fmt(err, errlen, "%s: section %s at byte %zu: length %" PRIu64 " runs past the end of the file", where,
                   bundle_tag_name(tag), pos, n);
            return ALLOY_ERR_FORMAT;
        }
        sec[tag] = bytes + pos + 16, sec_len[tag] = (size_t)n, sec_at[tag] = pos + 16;
        last = tag;
        pos += 16 + (size_t)n;
    }
    if (pos != len) {
        al_fmt(err, errlen, "%s: %zu bytes after the last of %u sections", where, len - pos, nsections);
        return ALLOY_ERR_FORMAT;
    }
    for (uint32_t t = BUNDLE_SEC_META; t <= BUNDLE_SEC_OPTIONS; t++)
        if (!sec[t]) {
            al_fmt(err, errlen, "%s: section %s missing", where, bundle_tag_name(t));
            return ALLOY_ERR_FORMAT;
        }
#define RD(tag) (bundle_rd){sec[tag], sec_len[tag], 0, sec_at[tag], where, bundle_tag_name(tag), err, errlen, false, false}
    bundle_rd r = RD(BUNDLE_SEC_META);
    bool ok = read_meta(&r, &c);
    if (ok) {
        char perr[512];
        c.ir = ir_parse((const char *)sec[BUNDLE_SEC_IR], sec_len[BUNDLE_SEC_IR], "bundle ir", perr, sizeof perr);
        if (!c.ir) {
            al_fmt(err, errlen, "%s: section ir at byte %zu: %s", where, sec_at[BUNDLE_SEC_IR], perr);
            ok = false;
            /* the parser gives no status: "FILE:LINE:COL: out of memory ..." is a failed allocation */
            r.oom = strstr(perr, ": out of memory") != NULL;
        } else if (ir_verify(c.ir)) {
            al_fmt(err, errlen, "%s: section ir at byte %zu: %s", where, sec_at[BUNDLE_SEC_IR], c.ir->error);
            ok = false;
            r.oom = c.ir->status == ALLOY_ERR_OOM;
        }
    }
    if (ok) r = RD(BUNDLE_SEC_SCHEDULE), ok = bundle_read_schedule(&r, c.ir, &c.comp.sched);
    if (ok) r = RD(BUNDLE_SEC_PLAN), ok = bundle_read_plan(&r, c.ir, &c.comp.sched, &c.comp.plan);
    if (ok) r = RD(BUNDLE_SEC_STATE), ok = read_state(&r, c.ir, &c);
    if (ok && sec[BUNDLE_SEC_INIT_STATE]) {
        alloy_status ist = read_init_state(sec[BUNDLE_SEC_INIT_STATE], sec_len[BUNDLE_SEC_INIT_STATE], where,
                                           sec_at[BUNDLE_SEC_INIT_STATE], &c, err, errlen);
        ok = !ist;
        r.oom = ist == ALLOY_ERR_OOM;
    }
    if (ok && sec[BUNDLE_SEC_CUDA_EXEC]) r = RD(BUNDLE_SEC_CUDA_EXEC), ok = bundle_read_cuda(&r, &c.cuda);
    if (ok && sec[BUNDLE_SEC_CUDA_KERNELS] && !sec[BUNDLE_SEC_CUDA_EXEC]) {
        al_fmt(err, errlen, "%s: section cuda kernels at byte %zu: a kernel table without a cuda executable", where,
               sec_at[BUNDLE_SEC_CUDA_KERNELS]);
        ok = false;
    }
    if (ok && sec[BUNDLE_SEC_CUDA_KERNELS])
        r = RD(BUNDLE_SEC_CUDA_KERNELS), ok = bundle_read_kernels(&r, c.ir, &c.comp.sched, &c.cuda);
#undef RD
    if (ok) {
        size_t n = sec_len[BUNDLE_SEC_OPTIONS];
        c.options = al_malloc(n + 1);
        if (!c.options) {
            al_fmt(err, errlen, "%s: out of memory", where);
            bundle_contents_free(&c);
            return ALLOY_ERR_OOM;
        }
        memcpy(c.options, sec[BUNDLE_SEC_OPTIONS], n);
        c.options[n] = '\0';
        if (strlen(c.options) != n) {
            al_fmt(err, errlen, "%s: section options at byte %zu: a NUL inside the text", where,
                   sec_at[BUNDLE_SEC_OPTIONS]);
            ok = false;
        }
    }
    if (!ok) {
        bundle_contents_free(&c);
        return r.oom ? ALLOY_ERR_OOM : ALLOY_ERR_FORMAT;
    }
    *out = c;
    return ALLOY_OK;
}

/* Reads n bytes from fd at its position; 0 or an errno (EIO: the file ended). */
static int read_all(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r, n -= (size_t)r;
    }
    return 0;
}

alloy_status bundle_read_file(const char *path, bundle_contents *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t size;
    alloy_status st = al_file_open_read(path, 0, &fd, &size, err, errlen);
    if (st) return st;
    /* the header first: a file that is no bundle, or not the size its
     * header gives, is refused from its first 80 bytes, whatever its size */
    uint8_t head[BUNDLE_HEADER_BYTES], *bytes = NULL;
    size_t n = size < sizeof head ? (size_t)size : sizeof head;
    int e = read_all(fd, head, n);
    if (!e && (n < sizeof head || memcmp(head, BUNDLE_MAGIC, 8) != 0)) {
        close(fd);
        return bundle_decode(head, n, path, out, err, errlen);
    }
    uint64_t payload = e ? 0 : le64(head + 32);
    if (!e && payload != size - BUNDLE_HEADER_BYTES) {
        close(fd);
        al_fmt(err, errlen, "%s: %s: the header gives %" PRIu64 " payload bytes, the file has %" PRIu64, path,
               payload > size - BUNDLE_HEADER_BYTES ? "truncated" : "trailing bytes", payload,
               size - BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    if (!e && !(bytes = size < SIZE_MAX ? al_malloc((size_t)size) : NULL)) {
        close(fd);
        al_fmt(err, errlen, "%s: out of memory reading its %" PRIu64 " bytes", path, size);
        return ALLOY_ERR_OOM;
    }
    if (!e) {
        memcpy(bytes, head, sizeof head);
        e = read_all(fd, bytes + sizeof head, (size_t)size - sizeof head);
    }
    close(fd);
    if (e) {
        al_free(bytes);
        al_fmt(err, errlen, "%s: cannot read: %s", path, e == EIO ? "the file ended early (cut while read?)" : strerror(e));
        return ALLOY_ERR_IO;
    }
    st = bundle_decode(bytes, (size_t)size, path, out, err, errlen);
    al_free(bytes);
    return st;
}

void bundle_contents_free(bundle_contents *c)
{
    ir_graph_free(c->ir);
    sched_free(&c->comp.sched);
    plan_free(&c->comp.plan);
    al_free(c->options);
    for (int i = 0; c->state && i < c->nstate; i++) al_free(c->state[i].name);
    al_free(c->state);
    al_free(c->init_state);
    bundle_cuda_free(&c->cuda);
    memset(c, 0, sizeof *c);
}

/* memory_svg.c - the memory plan as an SVG picture: every value's lifetime (schedule steps) against its arena bytes, the peak marked. */
#include <math.h>
#include <string.h>

#include "passes/inspect.h"

/* The plot's frame, in SVG user units. */
enum { LEFT = 90, TOP = 78, WIDTH = 1000, HEIGHT = 480, RIGHT = 30, BOTTOM = 46 };

static const char *const part_fill[] = {"#74c0fc", "#ffa94d", "#8ce99a"}; /* forward, backward, update */


static int64_t slot_bytes(const ir_node *n)
{
    size_t b = ir_nbytes(&n->type);
    return (int64_t)((b + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN);
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving at most about `ticks` ticks over span. */
static double tick_step(double span, int ticks)
{
    double raw = span / ticks, p = pow(10, floor(log10(raw > 0 ? raw : 1)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

/* bytes in a short human unit: "512 B", "1.5 KiB", "12 MiB". */
static void fmt_bytes(char *buf, size_t len, double bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    al_fmt(buf, len, bytes == floor(bytes) ? "%.0f %s" : "%.1f %s", bytes, units[u]);
}

/* The value owning node i's arena bytes: i, or the value i is a view of. */
static int owner(const mem_plan *p, int i) { return p->view_of && p->view_of[i] >= 0 ? p->view_of[i] : i; }

/* Lifetimes: first[i] / last[i] step of every value with arena bytes of
 * its own (first -1 for the others: views are drawn as their owner, which
 * lives until the last use of any of them), and the live bytes per step
 * into live[0..nsteps) (a value written in place over its operand or a step
 * input shares its bytes: counted once). */
static void lifetimes(const ir_graph *g, const schedule *s, const mem_plan *p, int *first, int *last, int64_t *live)
{
    int n = g->nnodes, last_step = s->nsteps - 1;
    for (int i = 0; i < n; i++) {
        first[i] = last[i] = -1;
        if (p->offset[i] < 0 || s->step_of[i] < 0 || slot_bytes(g->nodes[i]) == 0 || owner(p, i) != i) continue;
        first[i] = last[i] = s->step_of[i];
    }
    for (int i = 0; i < n; i++) {
        int o = owner(p, i);
        if (s->kept[i] && first[o] >= 0) last[o] = last_step;
        /* a gathered concat's slot is live from its first piece's step */
        if (o != i && first[o] >= 0 && s->step_of[i] >= 0 && s->step_of[i] < first[o]) first[o] = s->step_of[i];
    }
    for (int j = 0; j < n; j++) {
        const ir_node *c = g->nodes[j];
        for (int k = 0; k < c->nin; k++) {
            int i = owner(p, c->in[k]);
            if (first[i] >= 0 && s->step_of[j] > last[i]) last[i] = s->step_of[j];
        }
    }
    memset(live, 0, sizeof *live * ((size_t)s->nsteps + 1));
    for (int i = 0; i < n; i++) {
        if (first[i] < 0) continue;
        int64_t b = slot_bytes(g->nodes[i]);
        live[first[i]] += b, live[last[i] + 1] -= b;
        /* in place: the slot of an operand, or of an input of the step (a
         * row step's member over a row input, plan.c's row_aliases), handed
         * over at this step */
        const ir_node *c = g->nodes[i];
        const sched_step *st = &s->steps[s->step_of[i]];
        for (int k = 0; k < c->nin + st->nin; k++) {
            int j = owner(p, k < c->nin ? c->in[k] : s->inputs[st->first_in + k - c->nin]);
            if (first[j] >= 0 && j != i && p->offset[j] == p->offset[i] && last[j] == first[i]) {
                live[first[i]] -= b, live[first[i] + 1] += b;
                break;
            }
        }
    }
    for (int k = 1; k < s->nsteps; k++) live[k] += live[k - 1];
}

/* The axes: step ticks below the plot, byte ticks at its left. */
static void put_axes(FILE *out, int nsteps, double arena, double xs, double ys)
{
    fprintf(out, "<g class=\"axes\" font-size=\"11\" fill=\"#495057\">\n");
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#adb5bd\"/>\n", LEFT, TOP,
            WIDTH, HEIGHT);
    double dx = tick_step(nsteps, 12);
    for (double k = 0; k <= nsteps; k += dx) {
        double x = LEFT + k * xs;
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#adb5bd\"/>", x, TOP + HEIGHT, x,
                TOP + HEIGHT + 5);
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", x, TOP + HEIGHT + 18, k);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">schedule step</text>\n", LEFT + WIDTH / 2,
            TOP + HEIGHT + 36);
    double unit = 1; /* byte ticks at round numbers of the unit the labels use */
    while (arena / unit >= 1024 && unit < 1e12) unit *= 1024;
    double dy = tick_step(arena / unit, 8) * unit;
    for (double b = 0; b <= arena; b += dy) {
        double y = TOP + HEIGHT - b * ys;
        char label[32];
        fmt_bytes(label, sizeof label, b);
        fprintf(out, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#adb5bd\"/>", LEFT - 5, y, LEFT, y);
        fprintf(out, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", LEFT - 8, y + 4, label);
    }
    fprintf(out, "<text transform=\"translate(16,%d) rotate(-90)\" text-anchor=\"middle\">arena offset</text>\n",
            TOP + HEIGHT / 2);
    fputs("</g>\n", out);
}

/* The title and the colour legend above the plot. */
static void put_header(FILE *out, const ir_graph *g, const schedule *s, const mem_plan *p, int nslots, int peak_step,
                       int64_t peak)
{
    char arena[32], peak_text[32];
    fmt_bytes(arena, sizeof arena, (double)p->arena_bytes);
    fmt_bytes(peak_text, sizeof peak_text, (double)peak);
    fputs("<text x=\"16\" y=\"24\" font-size=\"15\" font-weight=\"bold\">memory plan of ", out);
    ins_put_markup(out, g->name ? g->name : "graph", true);
    fprintf(out, "</text>\n<text x=\"16\" y=\"44\" font-size=\"12\">arena %zu bytes (%s), peak live %lld bytes (%s) "
                 "at step %d; %d steps, %d values in the arena, %d in place",
            p->arena_bytes, arena, (long long)peak, peak_text, peak_step, s->nsteps, nslots, p->inplace);
    if (p->scratch_bytes) fprintf(out, ", scratch %zu bytes", p->scratch_bytes);
    fputs("</text>\n<g font-size=\"11\">\n", out);
    static const char *const names[] = {"forward", "backward", "update"};
    for (int k = 0; k < 3; k++) {
        fprintf(out, "<rect x=\"%d\" y=\"54\" width=\"12\" height=\"12\" fill=\"%s\"/>", 16 + k * 110, part_fill[k]);
        fprintf(out, "<text x=\"%d\" y=\"64\">%s</text>\n", 32 + k * 110, names[k]);
    }
    fputs("<rect x=\"346\" y=\"54\" width=\"12\" height=\"12\" fill=\"#dee2e6\"/><text x=\"362\" y=\"64\">scratch"
          "</text>\n<line x1=\"456\" y1=\"60\" x2=\"476\" y2=\"60\" stroke=\"#e03131\" stroke-width=\"2\" "
          "stroke-dasharray=\"4 3\"/><text x=\"482\" y=\"64\">peak of live bytes</text>\n<line x1=\"616\" y1=\"60\" "
          "x2=\"636\" y2=\"60\" stroke=\"#343a40\"/><text x=\"642\" y=\"64\">live bytes</text>\n</g>\n",
          out);
}

alloy_status insp_memory_svg(const ir_graph *g, const schedule *s, const mem_plan *p, FILE *out, char *err,
                             size_t errlen)
{
    if (!s->steps || !p->offset) {
        al_fmt(err, errlen, "graph '%s' has no memory plan (the schedule or plan pass did not run)",
               g->name ? g->name : "");
        return ALLOY_ERR_INVALID;
    }
    size_t n = (size_t)g->nnodes;
    int *first = al_calloc(n + 1, sizeof(int)), *last = al_calloc(n + 1, sizeof(int));
    int64_t *live = al_calloc((size_t)s->nsteps + 2, sizeof(int64_t));
    uint8_t *part = al_calloc(n + 1, 1);
    if (!first || !last || !live || !part || insp_parts(g, part)) {
        al_free(first), al_free(last), al_free(live), al_free(part);
        al_fmt(err, errlen, "out of memory drawing the memory plan of graph '%s'", g->name ? g->name : "");
        return ALLOY_ERR_OOM;
    }
    lifetimes(g, s, p, first, last, live);
    int peak_step = 0, nslots = 0;
    for (int k = 1; k < s->nsteps; k++)
        if (live[k] > live[peak_step]) peak_step = k;
    for (size_t i = 0; i < n; i++) nslots += first[i] >= 0;
    int64_t peak = s->nsteps ? live[peak_step] : 0;
    double arena = p->arena_bytes ? (double)p->arena_bytes : 1;
    double xs = (double)WIDTH / (s->nsteps ? s->nsteps : 1), ys = HEIGHT / arena;
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                 "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\">\n",
            LEFT + WIDTH + RIGHT, TOP + HEIGHT + BOTTOM, LEFT + WIDTH + RIGHT, TOP + HEIGHT + BOTTOM);
    fputs("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", out);
    put_header(out, g, s, p, nslots, peak_step, peak);
    put_axes(out, s->nsteps, arena, xs, ys);
    if (p->scratch_bytes)
        fprintf(out, "<rect class=\"scratch\" x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" fill=\"#dee2e6\">"
                     "<title>scratch: %zu bytes at %zu (the f32 product of the largest GEMM step)</title></rect>\n",
                LEFT, TOP + HEIGHT - (double)(p->scratch_offset + p->scratch_bytes) * ys, WIDTH,
                (double)p->scratch_bytes * ys, p->scratch_bytes, p->scratch_offset);
    fputs("<g class=\"slots\" stroke=\"#ffffff\" stroke-width=\"0.3\">\n", out);
    for (size_t i = 0; i < n; i++) {
        if (first[i] < 0) continue;
        const ir_node *node = g->nodes[i];
        int64_t off = p->offset[i], bytes = slot_bytes(node);
        double h = (double)bytes * ys;
        char type[96];
        ir_fmt_type(type, sizeof type, &node->type);
        fprintf(out, "<rect class=\"slot\" data-node=\"%zu\" data-first=\"%d\" data-last=\"%d\" data-offset=\"%lld\" "
                     "data-bytes=\"%lld\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>",
                i, first[i], last[i], (long long)off, (long long)bytes, LEFT + first[i] * xs,
                TOP + HEIGHT - (double)(off + bytes) * ys, (last[i] - first[i] + 1) * xs, h < 0.5 ? 0.5 : h,
                part_fill[part[i] <= INSP_UPDATE ? part[i] : 0]);
        if (node->name) fputc('%', out), ins_put_markup(out, node->name, true);
        else fprintf(out, "%%%zu", i);
        fprintf(out, " %s %s (%s): %lld bytes at %lld, steps %d to %d</title></rect>\n", ir_ops[node->op].name, type,
                insp_part_name((insp_part)part[i]), (long long)bytes, (long long)off, first[i], last[i]);
    }
    fputs("</g>\n", out);
    /* the live bytes per step, as a step curve over the slots */
    fputs("<polyline class=\"live\" data-live=\"", out);
    for (int k = 0; k < s->nsteps; k++) fprintf(out, "%s%lld", k ? " " : "", (long long)live[k]);
    fputs("\" fill=\"none\" stroke=\"#343a40\" stroke-width=\"1\" points=\"", out);
    for (int k = 0; k < s->nsteps; k++) {
        double y = TOP + HEIGHT - (double)live[k] * ys;
        fprintf(out, "%s%.2f,%.2f %.2f,%.2f", k ? " " : "", LEFT + k * xs, y, LEFT + (k + 1) * xs, y);
    }
    fputs("\"/>\n", out);
    double px = LEFT + (peak_step + 0.5) * xs, py = TOP + HEIGHT - (double)peak * ys;
    fprintf(out, "<g class=\"marks\" font-size=\"11\">\n<line class=\"peak\" data-step=\"%d\" data-bytes=\"%lld\" "
                 "x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#e03131\" stroke-width=\"1.5\" "
                 "stroke-dasharray=\"4 3\"/>\n",
            peak_step, (long long)peak, px, TOP, px, TOP + HEIGHT);
    fprintf(out, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#e03131\" stroke-width=\"1\" "
                 "stroke-dasharray=\"4 3\"/>\n",
            LEFT, py, LEFT + WIDTH, py);
    fprintf(out, "<text x=\"%.2f\" y=\"%d\" fill=\"#e03131\" text-anchor=\"%s\">peak %lld bytes live at step %d"
                 "</text>\n",
            px + (px < LEFT + WIDTH / 2 ? 4 : -4), TOP + 12, px < LEFT + WIDTH / 2 ? "start" : "end", (long long)peak,
            peak_step);
    fprintf(out, "</g>\n</svg>\n");
    al_free(first), al_free(last), al_free(live), al_free(part);
    if (ferror(out)) {
        al_fmt(err, errlen, "writing the memory picture of graph '%s' failed", g->name ? g->name : "");
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

void ins_put_markup(FILE *out, const char *s, bool apos)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '&') fputs("&amp;", out);
        else if (c == '<') fputs("&lt;", out);
        else if (c == '>') fputs("&gt;", out);
        else if (c == '"') fputs("&quot;", out);
        else if (c == '\'' && apos) fputs("&apos;", out);
        else fputc(c < 0x20 || c == 0x7f ? '?' : c, out);
    }
}

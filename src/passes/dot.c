/* dot.c - a compiled graph as Graphviz DOT: nodes coloured by AMP class and shaped by part, typed edges, fused steps as clusters. */
#include <string.h>

#include "passes/inspect.h"

/* Fill colours by AMP class (ir_amp_class order: none, allow, deny, infer, clear). */
static const char *const amp_fill[] = {"#ffffff", "#8ce99a", "#ffa8a8", "#ffe066", "#a5d8ff"};
static const char *const amp_label[] = {"no AMP", "allow (low precision)", "deny (f32)", "infer", "clear"};
#define INSERTED_COLOR "#e8590c"

/* s inside a DOT double-quoted string: '"' and '\' escaped, control characters as '?'. */
static void put_dot_text(FILE *out, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fputc('\\', out), fputc(c, out);
        else fputc(c < 0x20 || c == 0x7f ? '?' : c, out);
    }
}


static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

/* Shape and style of node n of part `part`. */
static void node_shape(const ir_node *n, insp_part part, const char **shape, const char **style)
{
    *style = "filled";
    if (n->op == IR_OP_input) *shape = "invhouse";
    else if (n->op == IR_OP_param || n->op == IR_OP_state) *shape = "cylinder";
    else if (n->op == IR_OP_constant) *shape = "ellipse";
    else if (part == INSP_BACKWARD) *shape = "box", *style = "filled,dashed";
    else if (part == INSP_UPDATE) *shape = "octagon";
    else *shape = "box", *style = "rounded,filled";
}

/* One node statement: n<id> [label, tooltip, shape, colours]. */
static void put_node(FILE *out, const ir_graph *g, const ir_node *n, insp_part part, const char *indent)
{
    char type[96];
    ir_fmt_type(type, sizeof type, &n->type);
    const char *shape, *style;
    node_shape(n, part, &shape, &style);
    int amp = n->amp <= AMP_CLEAR ? n->amp : AMP_NONE;
    bool inserted = n->flags & IR_NODE_INSERTED;
    fprintf(out, "%sn%d [label=\"", indent, n->id);
    if (n->name) fputc('%', out), put_dot_text(out, n->name);
    else fprintf(out, "%%%d", n->id);
    fprintf(out, " %s%s", ir_ops[n->op].name, inserted ? " (inserted)" : "");
    if (is_leaf(n)) fprintf(out, "\\n%s", type);
    for (int o = 0; o < g->noutputs; o++)
        if (g->outputs[o].node == n->id) fputs("\\noutput ", out), put_dot_text(out, g->outputs[o].name);
    for (int u = 0; u < g->nupdates; u++)
        if (g->updates[u].node == n->id) fputs("\\nupdates ", out), put_dot_text(out, g->updates[u].name);
    if (g->loss == n->id) fputs("\\nloss", out);
    fprintf(out, "\", tooltip=\"%%%d %s %s %s%s%s\", shape=%s, style=\"%s\", fillcolor=\"%s\"", n->id,
            ir_ops[n->op].name, type, insp_part_name(part), amp ? " !amp=" : "", amp ? amp_label[amp] : "", shape,
            style, amp_fill[amp]);
    if (inserted) fputs(", color=\"" INSERTED_COLOR "\", penwidth=3", out);
    fputs("];\n", out);
}

/* The legend, as the graph's HTML-like label. */
static void put_legend(FILE *out, const ir_graph *g, int nclusters)
{
    fputs("  label=<<table border=\"0\" cellborder=\"1\" cellspacing=\"0\" cellpadding=\"4\">\n", out);
    fputs("    <tr><td colspan=\"5\"><b>", out);
    ins_put_markup(out, g->name ? g->name : "graph", false);
    fprintf(out, "</b>: %d nodes, %d fused steps</td></tr>\n    <tr>", g->nnodes, nclusters);
    for (int a = AMP_ALLOW; a <= AMP_CLEAR; a++) fprintf(out, "<td bgcolor=\"%s\">%s</td>", amp_fill[a], amp_label[a]);
    fprintf(out, "<td bgcolor=\"%s\">%s</td></tr>\n", amp_fill[AMP_NONE], amp_label[AMP_NONE]);
    fputs("    <tr><td>rounded box: forward</td><td>dashed box: backward</td><td>octagon: update</td>"
          "<td><font color=\"" INSERTED_COLOR "\">orange border: inserted cast</font></td>"
          "<td>frame: one fused step</td></tr>\n",
          out);
    fputs("    <tr><td colspan=\"5\">inputs: house; parameters and state: cylinders; constants: ellipses; "
          "edges: the operand's dtype and shape</td></tr>\n  </table>>;\n",
          out);
}

alloy_status insp_dot(const ir_graph *g, const schedule *s, FILE *out, char *err, size_t errlen)
{
    uint8_t *part = al_calloc((size_t)g->nnodes + 1, 1);
    if (!part || insp_parts(g, part)) {
        al_free(part);
        al_fmt(err, errlen, "out of memory drawing graph '%s'", g->name ? g->name : "");
        return ALLOY_ERR_OOM;
    }
    int nclusters = 0;
    for (int k = 0; s && k < s->nsteps; k++) nclusters += s->steps[k].n >= 2;
    fputs("digraph \"", out);
    put_dot_text(out, g->name ? g->name : "graph");
    fputs("\" {\n  graph [rankdir=TB, labelloc=t, fontname=\"Helvetica\", fontsize=11, nodesep=0.2, ranksep=0.3];\n"
          "  node [fontname=\"Helvetica\", fontsize=9, margin=\"0.08,0.03\", height=0.3];\n"
          "  edge [fontname=\"Helvetica\", fontsize=7, color=\"#495057\", fontcolor=\"#495057\", arrowsize=0.5];\n",
          out);
    put_legend(out, g, nclusters);
    /* the fused steps first, their members declared inside (a node belongs to the cluster it is first named in) */
    for (int k = 0; s && k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        if (st->n < 2) continue;
        char space[96];
        ir_fmt_type(space, sizeof space, &st->space);
        fprintf(out, "  subgraph cluster_step%d {\n    label=\"step %d %s %s\"; fontsize=9; style=\"rounded\"; "
                     "color=\"#868e96\";\n",
                k, k, sched_kind_name(st->kind), space);
        for (int m = 0; m < st->n; m++) {
            int id = s->members[st->first + m].node;
            put_node(out, g, g->nodes[id], (insp_part)part[id], "    ");
        }
        fputs("  }\n", out);
    }
    for (int i = 0; i < g->nnodes; i++) {
        int k = s && i < s->nnodes ? s->step_of[i] : -1;
        if (k < 0 || s->steps[k].n < 2) put_node(out, g, g->nodes[i], (insp_part)part[i], "  ");
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            char type[96];
            ir_fmt_type(type, sizeof type, &g->nodes[n->in[k]]->type);
            fprintf(out, "  n%d -> n%d [xlabel=\"%s\"];\n", n->in[k], i, type);
        }
    }
    fputs("}\n", out);
    al_free(part);
    if (ferror(out)) {
        al_fmt(err, errlen, "writing the DOT text of graph '%s' failed", g->name ? g->name : "");
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

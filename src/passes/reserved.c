/* reserved.c - the names the training passes make (pass.h), which the builder refuses for the user's inputs, params, nodes and outputs. */
#include <string.h>

#include "passes/pass.h"

/* Names no user name may start with: each pass's names for any graph. */
static const struct {
    const char *prefix, *what;
} namespaces[] = {
    {GRAD_PREFIX, "autodiff names the gradient outputs " GRAD_PREFIX "<name>"},
    {SCALER_NS, "the loss scaler names its state and outputs " SCALER_NS "* (" STATE_SCALE ", ...)"},
    {STEP_NS, "the training step names its state and outputs " STEP_NS "* (" OUT_LR ", ...)"},
    {OPTIM_NS, "the optimizer names its state " OPTIM_NS "* (" STATE_COUNT ", " STATE_BASE_LR ")"},
};

/* The state the passes make per trainable tensor "<p>": names a user's
 * node may not take while p is a param (or, inputs_too, an input whose
 * gradient was asked for), and the reverse. */
static const struct {
    const char *suffix, *what;
    bool inputs_too;
} per_tensor[] = {
    {SUFFIX_MOMENT1, "the optimizer's state: Adam's first moment", false},
    {SUFFIX_MOMENT2, "the optimizer's state: Adam's second moment", false},
    {SUFFIX_MOMENTUM, "the optimizer's state: SGD's momentum buffer", false},
    {SUFFIX_GRAD_ACC, "gradient accumulation's state: the gradient summed over micro-batches", true},
};

/* Whether ir has a param (or, inputs_too, an input) named name[0..len). */
static bool is_trainable(const ir_graph *ir, const char *name, size_t len, bool inputs_too)
{
    char base[256];
    if (len >= sizeof base) return false;
    memcpy(base, name, len);
    base[len] = '\0';
    int id = ir_find_name(ir, base);
    return id >= 0 && (ir->nodes[id]->op == IR_OP_param || (inputs_too && ir->nodes[id]->op == IR_OP_input));
}

bool pass_reserved_name(const ir_graph *ir, const char *name, pass_name_use use, char *why, size_t whylen)
{
    if (!name) return false;
    for (size_t i = 0; i < sizeof namespaces / sizeof *namespaces; i++)
        if (strncmp(name, namespaces[i].prefix, strlen(namespaces[i].prefix)) == 0) {
            al_fmt(why, whylen, "the name '%s' is reserved: %s", name, namespaces[i].what);
            return true;
        }
    if (use == PASS_NAME_OUTPUT) return false;
    size_t len = strlen(name);
    for (size_t i = 0; i < sizeof per_tensor / sizeof *per_tensor; i++) {
        size_t sl = strlen(per_tensor[i].suffix);
        if (len > sl && strcmp(name + len - sl, per_tensor[i].suffix) == 0 &&
            is_trainable(ir, name, len - sl, per_tensor[i].inputs_too)) {
            al_fmt(why, whylen, "the name '%s' is reserved for %s of '%.*s'", name, per_tensor[i].what,
                   (int)(len - sl), name);
            return true;
        }
        char derived[300];
        al_fmt(derived, sizeof derived, "%s%s", name, per_tensor[i].suffix);
        if (use == PASS_NAME_LEAF && ir_find_name(ir, derived) >= 0) {
            al_fmt(why, whylen, "'%s' would own %s, named '%s', and a node already has that name", name,
                   per_tensor[i].what, derived);
            return true;
        }
    }
    return false;
}

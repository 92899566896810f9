/* profile.c - printing the profile option's table (profile.h). */
#include <string.h>

#include "runtime/profile.h"

bool rt_profile_due(int every, long run) { return every > 0 && run > 0 && run % every == 0; }

void rt_profile_print(FILE *out, const char *graph, const char *device, const char *clock, long run,
                      const rt_profile_row *rows, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++) total += rows[i].us;
    bool steps = n > 0 && strcmp(rows[0].action, "step") == 0;
    fprintf(out, "# profile: graph '%s', run %ld on %s: %d %s, %.2f us (%s)\n", graph, run, device, n,
            steps ? "steps" : "launches", total, clock);
    fprintf(out, "#   idx  step kind   action     time_us        bytes      GB/s  TFLOP/s  name\n");
    for (int i = 0; i < n; i++) {
        const rt_profile_row *r = &rows[i];
        double gbs = r->us > 0 ? (double)r->bytes / (r->us * 1e3) : 0;
        char tflops[32] = "-";
        if (r->flops > 0) al_fmt(tflops, sizeof tflops, "%.3f", r->us > 0 ? r->flops / (r->us * 1e6) : 0.0);
        fprintf(out, "# %5d %5d %-6s %-8s %10.2f %12lld %9.2f %8s  %s\n", i, r->step, r->kind, r->action, r->us,
                (long long)r->bytes, gbs, tflops, r->name);
    }
    /* one summary line: time per action, in the order actions first appear */
    const char *seen[8];
    int nseen = 0;
    for (int i = 0; i < n && nseen < 8; i++) {
        bool known = false;
        for (int j = 0; j < nseen; j++) known = known || strcmp(seen[j], rows[i].action) == 0;
        if (!known) seen[nseen++] = rows[i].action;
    }
    fputs("# total by action:", out);
    for (int j = 0; j < nseen; j++) {
        double us = 0, bytes = 0, flops = 0;
        int count = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(rows[i].action, seen[j]) == 0) us += rows[i].us, bytes += (double)rows[i].bytes,
                                                       flops += rows[i].flops, count++;
        fprintf(out, "%s %s %d x %.2f us (%.0f%%", j ? ";" : "", seen[j], count, us, total > 0 ? 100 * us / total : 0.0);
        if (flops > 0 && us > 0) fprintf(out, ", %.3f TFLOP/s", flops / (us * 1e6));
        else if (us > 0) fprintf(out, ", %.2f GB/s", bytes / (us * 1e3));
        fputc(')', out);
    }
    fputc('\n', out);
    fflush(out);
}

/* TLLM_CL_PROFILE: per-kernel device times (events), and per-phase grid-barrier times (phases). */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

static const char *const kind_names[K_COUNT] = {"embed", "qkv", "attention", "attn_out", "gate_up", "down", "token", "lm_head", "argmax"};

void tllm_cl_print_profile(const struct tllm_cl *cl) {
    if (!cl->prof_steps) return;
    double steps = cl->prof_steps, busy = 0;
    for (int k = 0; k < K_COUNT; k++) busy += cl->prof_ns[k];
    fprintf(stderr, "opencl profile, %s, %d steps (per token):\n", cl->name, cl->prof_steps);
    if (cl->persistent)
        fprintf(stderr, "  one `token` launch of %d work-groups x %d threads\n", cl->persist_groups, cl->t.mv_lws);
    if (cl->phases)
        fprintf(stderr, "  (phases: the work of the first and the last work-group to arrive at the grid barrier "
                        "that ends it; the rest is the barrier)\n");
    fprintf(stderr, "  %-10s %9s %10s %7s%s\n", "kernel", "launches", "us", "share", cl->phases ? "   first    last" : "");
    for (int k = 0; k < K_COUNT; k++) {
        if (!cl->prof_count[k]) continue;
        fprintf(stderr, "  %-10s %9.1f %10.1f %6.1f%%", kind_names[k], cl->prof_count[k] / steps,
                cl->prof_ns[k] / steps / 1e3, 100 * cl->prof_ns[k] / busy);
        if (cl->phases && k != K_ARGMAX)
            fprintf(stderr, " %7.1f %7.1f", cl->prof_first_ns[k] / steps / 1e3, cl->prof_last_ns[k] / steps / 1e3);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "  kernels busy %.1f us, first start to last end %.1f us (gaps %.1f us), host wall %.1f us\n",
            busy / steps / 1e3, cl->prof_span_ns / steps / 1e3, (cl->prof_span_ns - busy) / steps / 1e3,
            cl->prof_wall_s / steps * 1e6);
    if (cl->profile)
        fprintf(stderr, "  an empty kernel: %.1f us, %.1f us between two back to back\n", cl->floor_ns / 1e3, cl->floor_gap_ns / 1e3);
}

/* TLLM_CL_PROFILE=phases: the step's barrier times into the per-kernel sums (each phase counted with
 * the grid barrier that ends it). */
void tllm_cl_collect_phases(struct tllm_cl *cl, double wall) {
    int L = cl->m->cfg.n_layers, n = 4 + 5 * L, G = cl->persist_groups;
    cl_ulong *t = cl->times_host;
    if (clEnqueueReadBuffer(cl->q, cl->times, CL_TRUE, 0, tllm_cl_phase_times_len(cl) * sizeof *t, t, 0, NULL, NULL) != CL_SUCCESS)
        return;
    static const int layer_kind[5] = {K_QKV, K_ATTN, K_ATTN_OUT, K_GATE_UP, K_DOWN};
    for (int i = 0; i + 1 < n; i++) {
        int k = i == 0 ? K_EMBED : i <= 5 * L ? layer_kind[(i - 1) % 5] : i == 5 * L + 1 ? K_LM_HEAD : K_ARGMAX;
        cl->prof_ns[k] += (double)(t[i + 1] - t[i]);
        cl->prof_count[k]++;
        if (i + 1 >= n - 1) continue; /* the argmax phase ends with no grid barrier */
        const cl_ulong *arr = t + n + (size_t)(i + 1) * G; /* each group's arrival at the barrier ending phase i */
        cl_ulong first = arr[0], last = arr[0];
        for (int g = 1; g < G; g++) first = arr[g] < first ? arr[g] : first, last = arr[g] > last ? arr[g] : last;
        /* groups with no work in a phase can arrive before group 0 has passed the previous barrier */
        cl->prof_first_ns[k] += first > t[i] ? (double)(first - t[i]) : 0.0;
        cl->prof_last_ns[k] += last > t[i] ? (double)(last - t[i]) : 0.0;
    }
    cl->prof_span_ns += (double)(t[n - 1] - t[0]);
    cl->prof_wall_s += wall;
    cl->prof_steps++;
}

/* After a step: add its kernels' device times to the profile. */
void tllm_cl_collect_profile(struct tllm_cl *cl, double wall) {
    cl_ulong first = 0, last = 0;
    for (int i = 0; i < cl->n_events; i++) {
        cl_ulong t0 = 0, t1 = 0;
        clGetEventProfilingInfo(cl->events[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        clGetEventProfilingInfo(cl->events[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(cl->events[i]);
        cl->prof_ns[cl->event_kind[i]] += (double)(t1 - t0);
        cl->prof_count[cl->event_kind[i]]++;
        if (i == 0 || t0 < first) first = t0;
        if (t1 > last) last = t1;
    }
    if (cl->n_events) {
        cl->prof_span_ns += (double)(last - first);
        cl->prof_wall_s += wall;
        cl->prof_steps++;
    }
    cl->n_events = 0;
}

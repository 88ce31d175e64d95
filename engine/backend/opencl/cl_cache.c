/* Built programs kept on disk, so only a device's first run compiles the kernels (PoCL's first
 * compile took 53 s). A file per (platform, device, driver, build options, kernel source) hash under
 * $TLLM_CL_CACHE, else $XDG_CACHE_HOME/tllm/opencl, else ~/.cache/tllm/opencl; TLLM_CL_CACHE=0 turns it
 * off. The cache is optional: a file that does not load or build is compiled again and replaced. For
 * CPU devices the file is empty: only the mark that this program was built (see cl_device.c). */
#include "engine/backend/opencl/cl_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/json_util.h"

#define CACHE_MAX_BYTES (256u << 20)

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s) { return fnv(h, s, strlen(s) + 1); }

static uint64_t fnv_info(uint64_t h, cl_device_id dev, cl_platform_id plat, cl_uint what, int of_platform) {
    char buf[512] = "";
    if (of_platform) clGetPlatformInfo(plat, what, sizeof buf - 1, buf, NULL);
    else clGetDeviceInfo(dev, what, sizeof buf - 1, buf, NULL);
    return fnv_str(h, buf);
}

/* mkdir -p of path's folders */
static int make_dirs(char *path) {
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
            *p = '/';
            if (bad) return -1;
        }
    return 0;
}

int tllm_cl_cache_path(const struct tllm_cl *cl, const char *const *src, int n_src, const char *opts, char *out, size_t cap) {
    const char *dir = getenv("TLLM_CL_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && !strcmp(dir, "0")) return 0;
    cl_platform_id plat = NULL;
    clGetDeviceInfo(cl->dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL);
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv_info(h, cl->dev, plat, CL_PLATFORM_NAME, 1);
    h = fnv_info(h, cl->dev, plat, CL_PLATFORM_VERSION, 1);
    h = fnv_info(h, cl->dev, plat, CL_DEVICE_NAME, 0);
    h = fnv_info(h, cl->dev, plat, CL_DEVICE_VERSION, 0);
    h = fnv_info(h, cl->dev, plat, CL_DRIVER_VERSION, 0);
    h = fnv_str(h, opts);
    for (int i = 0; i < n_src; i++) h = fnv_str(h, src[i]);
    int n;
    if (dir && *dir) n = snprintf(out, cap, "%s/%016llx.bin", dir, (unsigned long long)h);
    else if (xdg && *xdg) n = snprintf(out, cap, "%s/tllm/opencl/%016llx.bin", xdg, (unsigned long long)h);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/tllm/opencl/%016llx.bin", home, (unsigned long long)h);
    else return 0;
    return n > 0 && (size_t)n < cap;
}

int tllm_cl_cache_load(struct tllm_cl *cl, const char *path, const char *opts) {
    char *bin;
    size_t n;
    if (tllm_read_file(path, CACHE_MAX_BYTES, &bin, &n)) {
        tllm_clear_error(); /* no file yet: not a failure */
        return 0;
    }
    const unsigned char *b = (const unsigned char *)bin;
    cl_int status = CL_SUCCESS, e;
    cl_program p = clCreateProgramWithBinary(cl->cx, 1, &cl->dev, &n, &b, &status, &e);
    free(bin);
    if (e != CL_SUCCESS || status != CL_SUCCESS) {
        if (p) clReleaseProgram(p);
        return 0;
    }
    if (clBuildProgram(p, 1, &cl->dev, opts, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(p);
        return 0;
    }
    cl->prog = p;
    return 1;
}

int tllm_cl_cache_seen(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void tllm_cl_cache_store(const struct tllm_cl *cl, const char *path, int binary) {
    size_t n = 0;
    if (binary && (clGetProgramInfo(cl->prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || !n)) return;
    unsigned char *bin = malloc(n ? n : 1);
    char *dir = strdup(path), *tmp = malloc(strlen(path) + 32);
    if (bin && dir && tmp && (!binary || clGetProgramInfo(cl->prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) &&
        make_dirs(dir) == 0) {
        snprintf(tmp, strlen(path) + 32, "%s.tmp%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        int ok = f && fwrite(bin, 1, n, f) == n;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok || rename(tmp, path) != 0) unlink(tmp); /* written whole, or not at all */
    }
    free(bin);
    free(dir);
    free(tmp);
}

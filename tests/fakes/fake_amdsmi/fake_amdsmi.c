/*
 * Fake libamd_smi.so for gpu-exporter's tests: serves a "fleet" of AMD GPUs read from a
 * key=value file named by $FAKE_AMDSMI_FLEET (format: tests/fakes/fakeamdsmi.py). Built by
 * tests/fakes/fakeamdsmi.py together with the generated weak stubs (amdsmi_stubs.c) and the
 * generated layout header (amdsmi_layout.h), both derived from the installed wrapper.
 *
 * Results are written at the byte offsets the wrapper's ctypes structures use
 * (OFF_<struct>__<field> from amdsmi_layout.h), never through hand-written structs.
 *
 * Semantics kept from the real library:
 * - calls before amdsmi_init or after amdsmi_shut_down return AMDSMI_STATUS_NOT_INIT;
 * - a key missing from the fleet makes the call return AMDSMI_STATUS_NOT_SUPPORTED; a
 *   missing field of a struct that is otherwise present reads as the all-ones "N/A" value;
 * - temperatures in degrees C, power in W, power cap in uW, clocks in MHz, PCIe speed in MT/s.
 * Error injection: "init_status=N" (amdsmi_init), "fail_all=N" (every call after init),
 * "gpu.<i>.fail.all=N" (every call on GPU i), "gpu.<i>.fail.<call>=N" (one call, name
 * without the "amdsmi_" prefix), "fail.<call>=N" (one call about no GPU: get_socket_handles,
 * get_processor_handles). The file is re-read whenever it changes (inode, size or
 * mtime), so a test can change the fleet between two collections.
 * Hangs: N = 65536 (FAKE_HANG) in any of these keys (init_status too) blocks the call, the
 * library's lock released, until the file no longer says so; the call then goes on with what the
 * file says. fakeAmdsmiHanging() counts calls blocked now; fakeAmdsmiDeviceCalls(i) counts every
 * call made on GPU i, so a test sees whether calls are sent to a hung GPU.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "amdsmi_layout.h"

#define MAX_KV 4096
#define MAX_LINE 1024
#define GPU_HANDLE_BASE ((uintptr_t)0x5a000)
#define SOCKET_HANDLE_BASE ((uintptr_t)0x6b000)

typedef unsigned int status_t;

static char *g_keys[MAX_KV];
static char *g_vals[MAX_KV];
static int g_nkv;
static struct stat g_seen;
static bool g_loaded;
static bool g_initialised;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void unlock_cleanup(int *unused) {
    (void)unused;
    pthread_mutex_unlock(&g_lock);
}
#define LOCKED                                                                \
    pthread_mutex_lock(&g_lock);                                              \
    int lock_guard_ __attribute__((cleanup(unlock_cleanup))) = 0;             \
    (void)lock_guard_

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

static void clear_fleet(void) {
    for (int i = 0; i < g_nkv; i++) {
        free(g_keys[i]);
        free(g_vals[i]);
    }
    g_nkv = 0;
}

/* Re-read the fleet file if it changed since the last read. Caller holds g_lock. */
static void reload(void) {
    const char *path = getenv("FAKE_AMDSMI_FLEET");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        clear_fleet();
        g_loaded = false;
        return;
    }
    if (g_loaded && st.st_ino == g_seen.st_ino && st.st_size == g_seen.st_size &&
        st.st_mtim.tv_sec == g_seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == g_seen.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    clear_fleet();
    char line[MAX_LINE];
    while (fgets(line, sizeof line, f) && g_nkv < MAX_KV) {
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = 0;
        g_keys[g_nkv] = strdup(trim(s));
        g_vals[g_nkv] = strdup(trim(eq + 1));
        g_nkv++;
    }
    fclose(f);
    g_seen = st;
    g_loaded = true;
}

static const char *kv(const char *key) {
    for (int i = g_nkv - 1; i >= 0; i--)  /* last one wins */
        if (strcmp(g_keys[i], key) == 0) return g_vals[i];
    return NULL;
}

static const char *gkv(int gpu, const char *key) {
    char full[256];
    snprintf(full, sizeof full, "gpu.%d.%s", gpu, key);
    return kv(full);
}

static bool parse_u64(const char *v, uint64_t *out) {
    if (!v || !*v) return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static bool gnum(int gpu, const char *key, uint64_t *out) { return parse_u64(gkv(gpu, key), out); }

static uint64_t gnum_or(int gpu, const char *key, uint64_t dflt) {
    uint64_t v;
    return gnum(gpu, key, &v) ? v : dflt;
}

static int gpu_count(void) {
    uint64_t n;
    return parse_u64(kv("gpus"), &n) ? (int)n : 0;
}

/* Little-endian store of an integer field of `size` bytes at `off`. */
static void put(void *base, size_t off, size_t size, uint64_t v) {
    unsigned char *p = (unsigned char *)base + off;
    switch (size) {
        case 1: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
        case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
        case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
        default: memcpy(p, &v, 8); break;
    }
}
#define PUT(base, rec, field, v) put((base), OFF_##rec##__##field, SIZE_##rec##__##field, (uint64_t)(v))
/* Field from the fleet, or the all-ones "N/A" value of its width. */
#define PUT_KEY(base, rec, field, gpu, key) PUT(base, rec, field, gnum_or((gpu), (key), UINT64_MAX))

static void put_str(void *base, size_t off, size_t size, const char *s) {
    char *p = (char *)base + off;
    memset(p, 0, size);
    if (s) strncpy(p, s, size - 1);
}
#define PUT_STR(base, rec, field, s) put_str((base), OFF_##rec##__##field, SIZE_##rec##__##field, (s))

#define FAKE_HANG 65536u
#define MAX_COUNTED_GPUS 64
static int g_hanging;                                   /* calls blocked in a FAKE_HANG now */
static unsigned long g_device_calls[MAX_COUNTED_GPUS];  /* calls made on each GPU */

int fakeAmdsmiHanging(void) { return __atomic_load_n(&g_hanging, __ATOMIC_RELAXED); }
unsigned long fakeAmdsmiDeviceCalls(int i) {
    return i >= 0 && i < MAX_COUNTED_GPUS ? __atomic_load_n(&g_device_calls[i], __ATOMIC_RELAXED) : 0;
}

/* The code `key` injects (GPU `gpu`'s, or top-level for gpu < 0; 0: none). While it is FAKE_HANG,
 * wait with g_lock released, re-reading the fleet. Caller holds g_lock; holds it again on return. */
static uint64_t injected(int gpu, const char *key) {
    uint64_t v = 0;
    bool counted = false;
    for (;;) {
        bool has = gpu < 0 ? parse_u64(kv(key), &v) : gnum(gpu, key, &v);
        if (!has) v = 0;
        if (v != FAKE_HANG) break;
        if (!counted) {
            __atomic_add_fetch(&g_hanging, 1, __ATOMIC_RELAXED);
            counted = true;
        }
        struct timespec ts = {0, 2000000L};
        pthread_mutex_unlock(&g_lock);
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_lock);
        reload();
    }
    if (counted) __atomic_sub_fetch(&g_hanging, 1, __ATOMIC_RELAXED);
    return v;
}

/* Common entry checks; returns 0 and the GPU index, or the status to return. */
static status_t enter(const char *call) {
    reload();
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    uint64_t fail = injected(-1, "fail_all");
    if (fail) return (status_t)fail;
    char key[128];
    snprintf(key, sizeof key, "fail.%s", call);
    fail = injected(-1, key);
    if (fail) return (status_t)fail;
    return AMDSMI_STATUS_SUCCESS;
}

static status_t enter_gpu(void *handle, const char *call, int *gpu) {
    status_t st = enter(call);
    if (st) return st;
    uintptr_t h = (uintptr_t)handle;
    if (h < GPU_HANDLE_BASE || h >= GPU_HANDLE_BASE + (uintptr_t)gpu_count()) return AMDSMI_STATUS_INVAL;
    *gpu = (int)(h - GPU_HANDLE_BASE);
    if (*gpu < MAX_COUNTED_GPUS) __atomic_add_fetch(&g_device_calls[*gpu], 1, __ATOMIC_RELAXED);
    uint64_t fail = injected(*gpu, "fail.all");
    if (fail) return (status_t)fail;
    char key[128];
    snprintf(key, sizeof key, "fail.%s", call);
    fail = injected(*gpu, key);
    if (fail) return (status_t)fail;
    return AMDSMI_STATUS_SUCCESS;
}

#define GPU_CALL(handle, call)                              \
    LOCKED;                                                 \
    int gpu = -1;                                           \
    {                                                       \
        status_t st_ = enter_gpu((handle), (call), &gpu);   \
        if (st_) return st_;                                \
    }

/* ---- library ------------------------------------------------------------------------ */

status_t amdsmi_init(uint64_t flags) {
    (void)flags;
    LOCKED;
    reload();
    uint64_t st = injected(-1, "init_status");
    if (st) return (status_t)st;
    g_initialised = true;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_shut_down(void) {
    LOCKED;
    g_initialised = false;
    return AMDSMI_STATUS_SUCCESS;
}

/* One socket per GPU, one processor per socket (SPX); partitions are modelled as GPUs. */
status_t amdsmi_get_socket_handles(uint32_t *count, void **handles) {
    LOCKED;
    status_t st = enter("get_socket_handles");
    if (st) return st;
    if (!count) return AMDSMI_STATUS_INVAL;
    uint32_t n = (uint32_t)gpu_count();
    if (handles) {
        for (uint32_t i = 0; i < n && i < *count; i++) handles[i] = (void *)(SOCKET_HANDLE_BASE + i);
        if (*count < n) {
            *count = n;
            return AMDSMI_STATUS_INSUFFICIENT_SIZE;
        }
    }
    *count = n;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_processor_handles(void *socket, uint32_t *count, void **handles) {
    LOCKED;
    status_t st = enter("get_processor_handles");
    if (st) return st;
    uintptr_t s = (uintptr_t)socket;
    if (!count || s < SOCKET_HANDLE_BASE || s >= SOCKET_HANDLE_BASE + (uintptr_t)gpu_count())
        return AMDSMI_STATUS_INVAL;
    if (handles && *count >= 1) handles[0] = (void *)(GPU_HANDLE_BASE + (s - SOCKET_HANDLE_BASE));
    *count = 1;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_processor_type(void *handle, uint32_t *type) {
    GPU_CALL(handle, "get_processor_type");
    *type = AMDSMI_PROCESSOR_TYPE_AMD_GPU;
    return AMDSMI_STATUS_SUCCESS;
}

/* ---- identity ----------------------------------------------------------------------- */

status_t amdsmi_get_gpu_asic_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_asic_info");
    if (!gkv(gpu, "market_name") && !gkv(gpu, "device_id")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_asic_info_t);
    PUT_STR(out, amdsmi_asic_info_t, market_name, gkv(gpu, "market_name"));
    PUT(out, amdsmi_asic_info_t, vendor_id, 0x1002);
    PUT_STR(out, amdsmi_asic_info_t, vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    PUT(out, amdsmi_asic_info_t, subvendor_id, 0x1002);
    PUT(out, amdsmi_asic_info_t, device_id, gnum_or(gpu, "device_id", 0));
    PUT(out, amdsmi_asic_info_t, rev_id, 0);
    PUT_STR(out, amdsmi_asic_info_t, asic_serial, gkv(gpu, "asic_serial"));
    PUT(out, amdsmi_asic_info_t, oam_id, gnum_or(gpu, "oam_id", UINT32_MAX));
    PUT(out, amdsmi_asic_info_t, num_of_compute_units, gnum_or(gpu, "compute_units", UINT32_MAX));
    PUT(out, amdsmi_asic_info_t, target_graphics_version, gnum_or(gpu, "gfx_version", 0x942));
    PUT(out, amdsmi_asic_info_t, subsystem_id, UINT32_MAX);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_device_uuid(void *handle, uint32_t *len, char *uuid) {
    GPU_CALL(handle, "get_gpu_device_uuid");
    const char *v = gkv(gpu, "uuid");
    if (!v) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (!len || !uuid || *len < 37) return AMDSMI_STATUS_INVAL;
    memset(uuid, 0, *len);
    strncpy(uuid, v, *len - 1);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_device_bdf(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_device_bdf");
    unsigned dom, bus, dev, fn;
    const char *v = gkv(gpu, "bdf");
    if (!v || sscanf(v, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return AMDSMI_STATUS_NOT_SUPPORTED;
    /* amdsmi_bdf_t bit fields from the low bit: function 3, device 5, bus 8, domain 48. */
    uint64_t as_uint = ((uint64_t)dom << 16) | ((uint64_t)bus << 8) | ((uint64_t)dev << 3) | fn;
    PUT(out, amdsmi_bdf_t, as_uint, as_uint);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_driver_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_driver_info");
    if (!gkv(gpu, "driver_version")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_driver_info_t);
    PUT_STR(out, amdsmi_driver_info_t, driver_version, gkv(gpu, "driver_version"));
    PUT_STR(out, amdsmi_driver_info_t, driver_date, "2015/01/01 00:00");
    PUT_STR(out, amdsmi_driver_info_t, driver_name, "amdgpu");
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_vbios_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_vbios_info");
    if (!gkv(gpu, "vbios_version")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_vbios_info_t);
    PUT_STR(out, amdsmi_vbios_info_t, name, "fake vbios");
    PUT_STR(out, amdsmi_vbios_info_t, version, gkv(gpu, "vbios_version"));
    PUT_STR(out, amdsmi_vbios_info_t, part_number, gkv(gpu, "vbios_version"));
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_board_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_board_info");
    if (!gkv(gpu, "product_serial") && !gkv(gpu, "product_name")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_board_info_t);
    PUT_STR(out, amdsmi_board_info_t, product_serial, gkv(gpu, "product_serial"));
    PUT_STR(out, amdsmi_board_info_t, product_name, gkv(gpu, "product_name"));
    PUT_STR(out, amdsmi_board_info_t, manufacturer_name, "AMD");
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_kfd_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_kfd_info");
    if (!gkv(gpu, "partition_id")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_kfd_info_t);
    PUT(out, amdsmi_kfd_info_t, kfd_id, 1000 + (uint64_t)gpu);
    PUT(out, amdsmi_kfd_info_t, node_id, 1 + (uint64_t)gpu);
    PUT(out, amdsmi_kfd_info_t, current_partition_id, gnum_or(gpu, "partition_id", UINT32_MAX));
    return AMDSMI_STATUS_SUCCESS;
}

static status_t copy_string_key(int gpu, const char *key, char *buf, uint32_t len) {
    const char *v = gkv(gpu, key);
    if (!v) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (!buf || len == 0) return AMDSMI_STATUS_INVAL;
    memset(buf, 0, len);
    strncpy(buf, v, len - 1);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_compute_partition(void *handle, char *buf, uint32_t len) {
    GPU_CALL(handle, "get_gpu_compute_partition");
    return copy_string_key(gpu, "compute_partition", buf, len);
}

status_t amdsmi_get_gpu_memory_partition(void *handle, char *buf, uint32_t len) {
    GPU_CALL(handle, "get_gpu_memory_partition");
    return copy_string_key(gpu, "memory_partition", buf, len);
}

/* ---- readings ----------------------------------------------------------------------- */

status_t amdsmi_get_gpu_activity(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_activity");
    if (!gkv(gpu, "gfx_activity") && !gkv(gpu, "umc_activity")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_engine_usage_t);
    /* The wrapper reads 0xFFFF as "N/A". */
    PUT(out, amdsmi_engine_usage_t, gfx_activity, gnum_or(gpu, "gfx_activity", 0xFFFF));
    PUT(out, amdsmi_engine_usage_t, umc_activity, gnum_or(gpu, "umc_activity", 0xFFFF));
    PUT(out, amdsmi_engine_usage_t, mm_activity, gnum_or(gpu, "mm_activity", 0xFFFF));
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_memory_total(void *handle, uint32_t type, uint64_t *out) {
    GPU_CALL(handle, "get_gpu_memory_total");
    if (type != AMDSMI_MEM_TYPE_VRAM || !gnum(gpu, "vram_total", out)) return AMDSMI_STATUS_NOT_SUPPORTED;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_memory_usage(void *handle, uint32_t type, uint64_t *out) {
    GPU_CALL(handle, "get_gpu_memory_usage");
    if (type != AMDSMI_MEM_TYPE_VRAM || !gnum(gpu, "vram_used", out)) return AMDSMI_STATUS_NOT_SUPPORTED;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_temp_metric(void *handle, uint32_t sensor, uint32_t metric, int64_t *out) {
    GPU_CALL(handle, "get_temp_metric");
    const char *key = NULL;
    if (sensor == AMDSMI_TEMPERATURE_TYPE_EDGE) key = "temp.edge";
    else if (sensor == AMDSMI_TEMPERATURE_TYPE_HOTSPOT) key = "temp.hotspot";
    else if (sensor == AMDSMI_TEMPERATURE_TYPE_VRAM) key = "temp.vram";
    /* CURRENT: temp.<sensor>; CRITICAL: temp.<sensor>.critical (0 where the board has no such sensor) */
    char crit[64];
    if (key && metric == AMDSMI_TEMP_CRITICAL) {
        snprintf(crit, sizeof crit, "%s.critical", key);
        key = crit;
    } else if (metric != AMDSMI_TEMP_CURRENT) {
        key = NULL;
    }
    uint64_t v;
    if (!key || !gnum(gpu, key, &v)) return AMDSMI_STATUS_NOT_SUPPORTED;
    *out = (int64_t)v;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_power_info(void *handle, void *out) {
    GPU_CALL(handle, "get_power_info");
    if (!gkv(gpu, "current_socket_power") && !gkv(gpu, "average_socket_power")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_power_info_t);
    /* The wrapper reads 0xFFFF as "N/A" in this struct. */
    PUT(out, amdsmi_power_info_t, socket_power, gnum_or(gpu, "current_socket_power", 0xFFFF));
    PUT(out, amdsmi_power_info_t, current_socket_power, gnum_or(gpu, "current_socket_power", 0xFFFF));
    PUT(out, amdsmi_power_info_t, average_socket_power, gnum_or(gpu, "average_socket_power", 0xFFFF));
    PUT(out, amdsmi_power_info_t, gfx_voltage, 0xFFFF);
    PUT(out, amdsmi_power_info_t, soc_voltage, 0xFFFF);
    PUT(out, amdsmi_power_info_t, mem_voltage, 0xFFFF);
    PUT(out, amdsmi_power_info_t, power_limit, gnum_or(gpu, "power_cap_uw", 0xFFFF * 1000000ULL) / 1000000);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_power_cap_info(void *handle, uint32_t sensor, void *out) {
    GPU_CALL(handle, "get_power_cap_info");
    (void)sensor;
    uint64_t cap;
    if (!gnum(gpu, "power_cap_uw", &cap)) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_power_cap_info_t);
    PUT(out, amdsmi_power_cap_info_t, power_cap, cap);
    PUT(out, amdsmi_power_cap_info_t, default_power_cap, gnum_or(gpu, "default_power_cap_uw", cap));
    PUT(out, amdsmi_power_cap_info_t, min_power_cap, 0);
    PUT(out, amdsmi_power_cap_info_t, max_power_cap, gnum_or(gpu, "max_power_cap_uw", cap));
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_energy_count(void *handle, uint64_t *acc, float *resolution, uint64_t *timestamp) {
    GPU_CALL(handle, "get_energy_count");
    const char *res = gkv(gpu, "energy_resolution_uj");
    if (!gnum(gpu, "energy_accumulator", acc) || !res) return AMDSMI_STATUS_NOT_SUPPORTED;
    *resolution = strtof(res, NULL);
    *timestamp = 1700000000000000000ULL;
    return AMDSMI_STATUS_SUCCESS;
}

static const char *clk_name(uint32_t type) {
    switch (type) {
        case AMDSMI_CLK_TYPE_GFX: return "gfx";
        case AMDSMI_CLK_TYPE_MEM: return "mem";
        case AMDSMI_CLK_TYPE_SOC: return "soc";
        case AMDSMI_CLK_TYPE_VCLK0: return "vclk0";
        default: return NULL;
    }
}

status_t amdsmi_get_clock_info(void *handle, uint32_t type, void *out) {
    GPU_CALL(handle, "get_clock_info");
    const char *name = clk_name(type);
    char key[64], key_max[64], key_min[64];
    if (!name) return AMDSMI_STATUS_NOT_SUPPORTED;
    snprintf(key, sizeof key, "clk.%s", name);
    snprintf(key_max, sizeof key_max, "clk.%s.max", name);
    snprintf(key_min, sizeof key_min, "clk.%s.min", name);
    if (!gkv(gpu, key)) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_clk_info_t);
    PUT_KEY(out, amdsmi_clk_info_t, clk, gpu, key);
    PUT_KEY(out, amdsmi_clk_info_t, max_clk, gpu, key_max);
    PUT_KEY(out, amdsmi_clk_info_t, min_clk, gpu, key_min);
    PUT(out, amdsmi_clk_info_t, clk_locked, UINT8_MAX);
    PUT(out, amdsmi_clk_info_t, clk_deep_sleep, UINT8_MAX);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_pcie_info(void *handle, void *out) {
    GPU_CALL(handle, "get_pcie_info");
    if (!gkv(gpu, "pcie.width") && !gkv(gpu, "pcie.max_width")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_pcie_info_t);
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_static__max_pcie_width, gpu, "pcie.max_width");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_static__max_pcie_speed, gpu, "pcie.max_speed");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_static__pcie_interface_version, gpu, "pcie.version");
    PUT(out, amdsmi_pcie_info_t, pcie_static__slot_type, 0);
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_width, gpu, "pcie.width");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_speed, gpu, "pcie.speed");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_bandwidth, gpu, "pcie.bandwidth");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_replay_count, gpu, "pcie.replay");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_l0_to_recovery_count, gpu, "pcie.l0_to_recovery");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_replay_roll_over_count, gpu, "pcie.replay_rollover");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_nak_sent_count, gpu, "pcie.nak_sent");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_nak_received_count, gpu, "pcie.nak_received");
    PUT_KEY(out, amdsmi_pcie_info_t, pcie_metric__pcie_lc_perf_other_end_recovery_count, gpu,
            "pcie.other_end_recovery");
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_pci_replay_counter(void *handle, uint64_t *out) {
    GPU_CALL(handle, "get_gpu_pci_replay_counter");
    return gnum(gpu, "pci_replay_counter", out) ? AMDSMI_STATUS_SUCCESS : AMDSMI_STATUS_NOT_SUPPORTED;
}

status_t amdsmi_get_gpu_total_ecc_count(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_total_ecc_count");
    if (!gkv(gpu, "ecc.correctable") && !gkv(gpu, "ecc.uncorrectable")) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_error_count_t);
    PUT(out, amdsmi_error_count_t, correctable_count, gnum_or(gpu, "ecc.correctable", 0));
    PUT(out, amdsmi_error_count_t, uncorrectable_count, gnum_or(gpu, "ecc.uncorrectable", 0));
    PUT(out, amdsmi_error_count_t, deferred_count, gnum_or(gpu, "ecc.deferred", 0));
    return AMDSMI_STATUS_SUCCESS;
}

/* RAS (amdsmi.h: amdsmi_get_gpu_ecc_enabled, amdsmi_get_gpu_ecc_status, amdsmi_get_gpu_ecc_count):
 * "ras.enabled" is the mask of blocks with ECC/RAS on (amdsmi_gpu_block_t bits: UMC 1, SDMA 2, GFX 4,
 * MMHUB 8, ..., MPIO 1<<18); "ras.<block bit>.state" the block's amdsmi_ras_err_state_t (NONE 0,
 * DISABLED 1, PARITY 2, SING_C 3, MULT_UC 4, POISON 5, ENABLED 6; absent: ENABLED for an enabled
 * block, DISABLED otherwise); "ras.<block bit>.correctable" / ".uncorrectable" / ".deferred" its
 * counts. No "ras.enabled": NOT_SUPPORTED, as on a GPU without RAS. */
status_t amdsmi_get_gpu_ecc_enabled(void *handle, uint64_t *out) {
    GPU_CALL(handle, "get_gpu_ecc_enabled");
    return gnum(gpu, "ras.enabled", out) ? AMDSMI_STATUS_SUCCESS : AMDSMI_STATUS_NOT_SUPPORTED;
}

static bool ras_block(int gpu, uint64_t block, uint64_t *enabled) {
    if (!gnum(gpu, "ras.enabled", enabled)) return false;
    return block && !(block & (block - 1));  /* one block: one bit */
}

status_t amdsmi_get_gpu_ecc_status(void *handle, uint64_t block, uint32_t *out) {
    GPU_CALL(handle, "get_gpu_ecc_status");
    uint64_t enabled, state;
    char key[64];
    if (!ras_block(gpu, block, &enabled)) return AMDSMI_STATUS_NOT_SUPPORTED;
    snprintf(key, sizeof key, "ras.%" PRIu64 ".state", block);
    *out = (uint32_t)(gnum(gpu, key, &state) ? state : (enabled & block) ? 6 : 1);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_ecc_count(void *handle, uint64_t block, void *out) {
    GPU_CALL(handle, "get_gpu_ecc_count");
    uint64_t enabled;
    char key[64];
    if (!ras_block(gpu, block, &enabled) || !(enabled & block)) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_error_count_t);
    snprintf(key, sizeof key, "ras.%" PRIu64 ".correctable", block);
    PUT(out, amdsmi_error_count_t, correctable_count, gnum_or(gpu, key, 0));
    snprintf(key, sizeof key, "ras.%" PRIu64 ".uncorrectable", block);
    PUT(out, amdsmi_error_count_t, uncorrectable_count, gnum_or(gpu, key, 0));
    snprintf(key, sizeof key, "ras.%" PRIu64 ".deferred", block);
    PUT(out, amdsmi_error_count_t, deferred_count, gnum_or(gpu, key, 0));
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_xgmi_link_status(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_xgmi_link_status");
    const char *v = gkv(gpu, "xgmi.links");  /* e.g. "U,U,D,X": up, down, disabled */
    if (!v) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(out, 0, SIZEOF_amdsmi_xgmi_link_status_t);
    uint32_t n = 0;
    for (const char *p = v; *p && n < COUNT_amdsmi_xgmi_link_status_t__status; p++) {
        uint64_t st;
        if (*p == 'U') st = AMDSMI_XGMI_LINK_UP;
        else if (*p == 'D') st = AMDSMI_XGMI_LINK_DOWN;
        else if (*p == 'X') st = AMDSMI_XGMI_LINK_DISABLE;
        else continue;
        put(out, OFF_amdsmi_xgmi_link_status_t__status + n * ELEM_amdsmi_xgmi_link_status_t__status,
            ELEM_amdsmi_xgmi_link_status_t__status, st);
        n++;
    }
    PUT(out, amdsmi_xgmi_link_status_t, total_links, n);
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_fan_speed(void *handle, uint32_t sensor, int64_t *out) {
    GPU_CALL(handle, "get_gpu_fan_speed");
    uint64_t v;
    if (sensor != 0 || !gnum(gpu, "fan.speed", &v)) return AMDSMI_STATUS_NOT_SUPPORTED;
    *out = (int64_t)v;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_get_gpu_fan_speed_max(void *handle, uint32_t sensor, uint64_t *out) {
    GPU_CALL(handle, "get_gpu_fan_speed_max");
    if (sensor != 0 || !gnum(gpu, "fan.max", out)) return AMDSMI_STATUS_NOT_SUPPORTED;
    return AMDSMI_STATUS_SUCCESS;
}

/* An array field from "v0,v1,...": element i from the i-th number; "-" or a missing element
 * keeps the all-ones "N/A" value (an unused link or engine slot). */
static void put_list(void *base, size_t off, size_t elem, size_t count, const char *v) {
    if (!v) return;
    char buf[MAX_LINE], *save = NULL;
    snprintf(buf, sizeof buf, "%s", v);
    size_t i = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok && i < count; tok = strtok_r(NULL, ",", &save), i++) {
        uint64_t x;
        if (parse_u64(trim(tok), &x)) put(base, off + i * elem, elem, x);
    }
}
#define PUT_LIST(base, rec, field, gpu, key)                                                      \
    put_list((base), OFF_##rec##__##field, ELEM_##rec##__##field, COUNT_##rec##__##field, gkv((gpu), (key)))

/* gpu_metrics: every field "N/A" (all ones) except the ones the fleet sets (as the kernel fills
 * the fields its table version lacks). */
status_t amdsmi_get_gpu_metrics_info(void *handle, void *out) {
    GPU_CALL(handle, "get_gpu_metrics_info");
    memset(out, 0xff, SIZEOF_amdsmi_gpu_metrics_t);
    PUT(out, amdsmi_gpu_metrics_t, common_header__structure_size, SIZEOF_amdsmi_gpu_metrics_t);
    PUT(out, amdsmi_gpu_metrics_t, common_header__format_revision, 1);
    PUT(out, amdsmi_gpu_metrics_t, common_header__content_revision, 6);
    PUT_KEY(out, amdsmi_gpu_metrics_t, throttle_status, gpu, "metrics.throttle_status");
    PUT_KEY(out, amdsmi_gpu_metrics_t, indep_throttle_status, gpu, "metrics.indep_throttle_status");
    PUT_KEY(out, amdsmi_gpu_metrics_t, accumulation_counter, gpu, "metrics.accumulation_counter");
    PUT_KEY(out, amdsmi_gpu_metrics_t, prochot_residency_acc, gpu, "metrics.prochot_residency_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, ppt_residency_acc, gpu, "metrics.ppt_residency_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, socket_thm_residency_acc, gpu, "metrics.socket_thm_residency_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, vr_thm_residency_acc, gpu, "metrics.vr_thm_residency_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, hbm_thm_residency_acc, gpu, "metrics.hbm_thm_residency_acc");
    /* activity (%), data accumulators (KB; PCIe: GB/s summed once per firmware iteration), clocks */
    PUT_KEY(out, amdsmi_gpu_metrics_t, average_gfx_activity, gpu, "metrics.average_gfx_activity");
    PUT_KEY(out, amdsmi_gpu_metrics_t, average_umc_activity, gpu, "metrics.average_umc_activity");
    PUT_KEY(out, amdsmi_gpu_metrics_t, average_mm_activity, gpu, "metrics.average_mm_activity");
    PUT_LIST(out, amdsmi_gpu_metrics_t, vcn_activity, gpu, "metrics.vcn_activity");
    PUT_LIST(out, amdsmi_gpu_metrics_t, xgmi_read_data_acc, gpu, "metrics.xgmi_read_data_acc");
    PUT_LIST(out, amdsmi_gpu_metrics_t, xgmi_write_data_acc, gpu, "metrics.xgmi_write_data_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, pcie_bandwidth_acc, gpu, "metrics.pcie_bandwidth_acc");
    PUT_KEY(out, amdsmi_gpu_metrics_t, firmware_timestamp, gpu, "metrics.firmware_timestamp");
    PUT_KEY(out, amdsmi_gpu_metrics_t, system_clock_counter, gpu, "metrics.system_clock_counter");
    return AMDSMI_STATUS_SUCCESS;
}

/* "processes=pid:vram_bytes:name[:gfx_ns],..."  gfx_ns: cumulative GFX engine time (engine_usage.gfx) */
status_t amdsmi_get_gpu_process_list(void *handle, uint32_t *max, void *list) {
    GPU_CALL(handle, "get_gpu_process_list");
    const char *v = gkv(gpu, "processes");
    if (!v) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (!max) return AMDSMI_STATUS_INVAL;
    uint32_t n = 0;
    char buf[MAX_LINE];
    strncpy(buf, v, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned pid;
        unsigned long long vram, gfx = 0;
        char name[128] = "";
        if (sscanf(tok, "%u:%llu:%127[^:]:%llu", &pid, &vram, name, &gfx) < 2) continue;
        if (list && n < *max) {
            char *rec = (char *)list + (size_t)n * SIZEOF_amdsmi_proc_info_t;
            memset(rec, 0, SIZEOF_amdsmi_proc_info_t);
            PUT_STR(rec, amdsmi_proc_info_t, name, name);
            PUT(rec, amdsmi_proc_info_t, pid, pid);
            PUT(rec, amdsmi_proc_info_t, mem, vram);
            PUT(rec, amdsmi_proc_info_t, memory_usage__vram_mem, vram);
            PUT(rec, amdsmi_proc_info_t, engine_usage__gfx, gfx);
            PUT(rec, amdsmi_proc_info_t, cu_occupancy, UINT32_MAX);
        }
        n++;
    }
    status_t st = (list && n > *max) ? AMDSMI_STATUS_OUT_OF_RESOURCES : AMDSMI_STATUS_SUCCESS;
    *max = n;
    return st;
}

/* ---- topology ----------------------------------------------------------------------- */

static const char *pair_kv(const char *prefix, int a, int b, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%d.%d%s", prefix, a, b, suffix);
    const char *v = kv(key);
    if (v) return v;
    snprintf(key, sizeof key, "%s.%d.%d%s", prefix, b, a, suffix);
    return kv(key);
}

status_t amdsmi_topo_get_numa_node_number(void *handle, uint32_t *out) {
    GPU_CALL(handle, "topo_get_numa_node_number");
    uint64_t v;
    if (!gnum(gpu, "numa_node", &v)) return AMDSMI_STATUS_NOT_SUPPORTED;
    *out = (uint32_t)v;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_topo_get_link_type(void *src, void *dst, uint64_t *hops, uint32_t *type) {
    GPU_CALL(src, "topo_get_link_type");
    int peer = -1;
    status_t st = enter_gpu(dst, "topo_get_link_type", &peer);
    if (st) return st;
    const char *t = pair_kv("link", gpu, peer, ".type");
    if (!t) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (strcmp(t, "xgmi") == 0) *type = AMDSMI_LINK_TYPE_XGMI;
    else if (strcmp(t, "pcie") == 0) *type = AMDSMI_LINK_TYPE_PCIE;
    else *type = AMDSMI_LINK_TYPE_UNKNOWN;
    uint64_t h = 0;
    *hops = parse_u64(pair_kv("link", gpu, peer, ".hops"), &h) ? h : 1;
    return AMDSMI_STATUS_SUCCESS;
}

status_t amdsmi_is_P2P_accessible(void *src, void *dst, bool *accessible) {
    GPU_CALL(src, "is_P2P_accessible");
    int peer = -1;
    status_t st = enter_gpu(dst, "is_P2P_accessible", &peer);
    if (st) return st;
    uint64_t v;
    if (!parse_u64(pair_kv("p2p", gpu, peer, ""), &v)) return AMDSMI_STATUS_NOT_SUPPORTED;
    *accessible = v != 0;
    return AMDSMI_STATUS_SUCCESS;
}

/* ---- librocm-core.so (the same file, linked under that name too) -------------------- */

unsigned int getROCmVersion(uint32_t *major, uint32_t *minor, uint32_t *patch) {
    LOCKED;
    reload();
    const char *v = kv("rocm_version");
    if (!v || sscanf(v, "%u.%u.%u", major, minor, patch) != 3) return 1;
    return 0;
}

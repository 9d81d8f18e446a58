/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for gpu-exporter's test suite.
 *
 * The real pynvml (nvidia-ml-py) loads this library instead of NVIDIA's driver
 * library, so tests exercise our NVML code through the genuine Python bindings
 * with no GPU.  Build it with tests/fakes/fakenvml.py:build_library(), which compiles
 *   gcc -std=c11 -shared -fPIC -O2 -fvisibility=hidden -pthread
 *       -Wl,-soname,libnvidia-ml.so.1 [-DOMIT_<symbol> ...]
 * Each exported NVML function sits in `#ifndef OMIT_<name>`, so a build can
 * leave any of them out and pynvml raises NVMLError_FunctionNotFound.
 *
 * FLEET FILE
 * ----------
 * nvmlInit_v2 / nvmlInitWithFlags read getenv("FAKE_NVML_CONFIG") on every
 * call.  The file holds `key=value` lines ('#' starts a comment line; only the
 * first '=' splits).  It is parsed once and re-parsed only when stat() shows a
 * new inode, size or mtime, so a value written by a test is visible to the
 * next call without re-init.  Change detection on each call:
 *   - if `<config>.gen` (8 bytes, a native-endian u64 the writer increments
 *     after each rename) exists at init, it is mmap'd and the library stat()s
 *     the config only when the counter moved: one memory load per call;
 *   - otherwise every call stat()s the config (about 1 us here).
 * No call parses or allocates unless the file changed.  Numbers are decimal or
 * 0x-hex, in NVML's raw units (mW, mJ, MHz, percent, bytes, celsius, KB/s, ns).
 *
 *   fleet=<token>            delivery state of XID events resets when it changes
 *   generation=<n>           informational (the writer bumps it)
 *   count=<n>                nvmlDeviceGetCount (default: highest gpu index + 1)
 *   driver_version=550.54.15 nvml_version=12.550.54.15 cuda_version=12040
 *   fail.<function>=<code>   injected return code for every call of <function>
 *   field_fail.<fieldId>=<code>  per-field nvmlReturn in nvmlDeviceGetFieldValues
 *   topo.<i>.<j>=<level>     nvmlDeviceGetTopologyCommonAncestor override
 *                            (default: 0 for i==j, 40 NODE when gpu.<i>.numa ==
 *                            gpu.<j>.numa, else 50 SYSTEM)
 *   p2p.<i>.<j>.<index>=<st> nvmlDeviceGetP2PStatus override (default 0 = OK)
 *   xid.<seq>=<gpu>:<xid>    a queued XID event (seq 1..65535, unique); each is
 *                            delivered once per process by nvmlEventSetWait*
 *   gpu.<i>.<scalar>=<value> see gpu_scalars[] below (name, uuid, power_mw, ...)
 *   gpu.<i>.delay_ms=<ms>    every device call on this GPU sleeps that long (a hung driver)
 *   gpu.<i>.fail.<function>=<code>   injected code for this GPU only
 *   fail.<function>=65536 / gpu.<i>.fail.<function>=65536   (FAKE_HANG) the call blocks, as
 *                            NVML does while a GPU falls off the bus, until the file no longer
 *                            says so; it then goes on with whatever the file says (a new code, or
 *                            success).  fakeNvmlHanging() counts calls blocked now;
 *                            fakeNvmlDeviceCalls(i) counts every call made on GPU i (its MIG
 *                            handles included), hung or not, so a test sees calls sent to it.
 *   gpu.<i>.field_fail.<fieldId>=<code>
 *   gpu.<i>.unsupported=<function>,...   these return NVML_ERROR_NOT_SUPPORTED
 *   gpu.<i>.violation.<policy>=<ns>      nvmlDeviceGetViolationStatus
 *   gpu.<i>.nvlink_active=1,1,0,...      per link (missing entries: active)
 *   gpu.<i>.nvlink_err.<link>.<counter>=<n>
 *   gpu.<i>.retired_sbe=<addr>@<ts>,...  (also retired_dbe)
 *   gpu.<i>.procs=<pid>:<bytes>[:<gi>:<ci>],...  ('-' bytes = not available;
 *   gpu.<i>.graphics_procs=...                     gi/ci default 0xFFFFFFFF)
 *   gpu.<i>.mig.<slot>.<key>=<value>     key: profile uuid gi ci mem_total
 *                                        mem_reserved mem_used (slot 0..7)
 *   gpu.<i>.gpm_supported=0|1            nvmlGpmQueryDeviceSupport's isSupportedDevice
 *   gpu.<i>.gpm.<metricId>=<double>      GPM metric value (percent, MiB/s) over any two
 *                                        samples of the GPU; not set: per-metric 3
 *   gpu.<i>.gpm_fail.<metricId>=<code>   per-metric nvmlReturn in nvmlGpmMetricsGet
 *   gpu.<i>.mig.<slot>.gpm.<metricId>=<double>  the same for the slot's GPU instance
 *                                        (nvmlGpmMigSampleGet); an instance carries only
 *                                        the metrics set on its slot
 *
 * Missing config variable or file: init returns 9 (driver not loaded).
 * Memory: mem_total/mem_reserved/mem_used use the v2 meaning (used excludes
 * reserved).  v1 reports used = used + reserved; both report
 * free = total - reserved - used.
 *
 * CALL ORDER
 * ----------
 * Every function checks, in order: initialised (else 1)? valid handle (else 2)?
 * injected failure for (function, gpu) then (function, all)?  GPU lost (15)?
 * function in the GPU's `unsupported` list (3)?  then fills its output.  A
 * MIG handle uses its parent GPU for these checks; functions that do not
 * accept MIG handles return 3, as real NVML does for utilisation.
 * An init failing with 9 drops the reference count to 0, so every function
 * returns 1 until an init succeeds.
 *
 * GPM (GPU performance monitoring, R520+)
 * ---------------------------------------
 * A sample (nvmlGpmSampleAlloc, from a pool of MAX_GPM_SAMPLES) is filled by
 * nvmlGpmSampleGet (whole GPU) or nvmlGpmMigSampleGet (one GPU instance) with
 * a snapshot of that GPU's or instance's gpm.* values and gpm_fail.* codes,
 * and a sequence number.  nvmlGpmMetricsGet(version 1) needs two filled
 * samples of the same GPU or instance, sample2 taken after sample1, else 2;
 * each metric then gets the value (or code) of sample2's snapshot: "the rate
 * over the interval".  Calls on a GPU with gpm_supported=0 return 3 (as do
 * MIG handles); nvmlGpmMigSampleGet needs MIG mode (else 3) and an existing
 * instance (else 6).  fakeNvmlGpmLiveSamples() counts allocated samples, so a
 * test can catch a leak.
 *
 * ADDING A SYMBOL
 * ---------------
 * 1. Add X(nvmlFooBar) to FAKE_FUNCS (this gives it an id for fail./unsupported).
 * 2. Write it inside `#ifndef OMIT_nvmlFooBar ... #endif`, starting with
 *    DEV(nvmlFooBar, device, flags) (device functions) or SYS(nvmlFooBar), and
 *    leave through OUT(code): the prologue holds the config read lock.
 * 3. New per-GPU value: add a uint64_t to struct gpu and U(field) to
 *    gpu_scalars[]; add its default to _default_gpu() in tests/fakes/fakenvml.py.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_MIG 8
#define MAX_LINKS 36
#define NVLINK_COUNTERS 5
#define MAX_PAGES 64
#define MAX_PROCS 64
#define MAX_FIELD_FAILS 32
#define MAX_EVENTS 1024
#define MAX_SEQ 65536
#define MAX_SETS 32
#define NPOLICY 12
#define P2P_INDICES 5
#define NOT_AVAILABLE_U32 0xFFFFFFFFu
#define GPM_METRIC_MAX 477      /* NVML_GPM_METRIC_MAX of nvidia-ml-py 13.615 (R525's nvml.h: 98) */
#define MAX_GPM_VALS 48         /* gpm.<id> values per GPU */
#define MAX_MIG_GPM_VALS 24     /* ... per MIG slot */
#define MAX_GPM_SAMPLES 4096

/* Every exported NVML function: the id indexes fail[] and unsupported[]. */
#define FAKE_FUNCS(X) \
    X(nvmlInit_v2) X(nvmlInitWithFlags) X(nvmlShutdown) X(nvmlErrorString) \
    X(nvmlSystemGetDriverVersion) X(nvmlSystemGetNVMLVersion) \
    X(nvmlSystemGetCudaDriverVersion) X(nvmlSystemGetCudaDriverVersion_v2) \
    X(nvmlDeviceGetCount) X(nvmlDeviceGetCount_v2) \
    X(nvmlDeviceGetHandleByIndex) X(nvmlDeviceGetHandleByIndex_v2) \
    X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetHandleByPciBusId) X(nvmlDeviceGetHandleByPciBusId_v2) \
    X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetSerial) X(nvmlDeviceGetIndex) \
    X(nvmlDeviceGetMinorNumber) X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetPciInfoExt) \
    X(nvmlDeviceGetBrand) X(nvmlDeviceGetArchitecture) \
    X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2) \
    X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetFieldValues) \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetPowerManagementLimit) \
    X(nvmlDeviceGetTotalEnergyConsumption) X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo) \
    X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkGeneration) \
    X(nvmlDeviceGetCurrPcieLinkWidth) X(nvmlDeviceGetMaxPcieLinkWidth) \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) \
    X(nvmlDeviceGetFanSpeed) X(nvmlDeviceGetNumFans) X(nvmlDeviceGetFanSpeed_v2) \
    X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetPowerState) \
    X(nvmlDeviceGetEccMode) X(nvmlDeviceGetTotalEccErrors) \
    X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPages_v2) X(nvmlDeviceGetRetiredPagesPendingStatus) \
    X(nvmlDeviceGetRemappedRows) \
    X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetCurrentClocksThrottleReasons) \
    X(nvmlDeviceGetSupportedClocksEventReasons) X(nvmlDeviceGetSupportedClocksThrottleReasons) \
    X(nvmlDeviceGetViolationStatus) X(nvmlDeviceGetPcieReplayCounter) X(nvmlDeviceGetPcieThroughput) \
    X(nvmlDeviceGetP2PStatus) X(nvmlDeviceGetTopologyCommonAncestor) \
    X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkErrorCounter) \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization) \
    X(nvmlDeviceGetJpgUtilization) X(nvmlDeviceGetOfaUtilization) \
    X(nvmlDeviceGetComputeRunningProcesses) \
    X(nvmlDeviceGetComputeRunningProcesses_v2) X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2) X(nvmlDeviceGetGraphicsRunningProcesses_v3) \
    X(nvmlDeviceGetMigMode) X(nvmlDeviceGetMaxMigDeviceCount) X(nvmlDeviceGetMigDeviceHandleByIndex) \
    X(nvmlDeviceIsMigDeviceHandle) X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) \
    X(nvmlDeviceGetGpuInstanceId) X(nvmlDeviceGetComputeInstanceId) \
    X(nvmlEventSetCreate) X(nvmlDeviceGetSupportedEventTypes) X(nvmlDeviceRegisterEvents) \
    X(nvmlEventSetWait) X(nvmlEventSetWait_v2) X(nvmlEventSetFree) \
    X(nvmlGpmQueryDeviceSupport) X(nvmlGpmSampleAlloc) X(nvmlGpmSampleFree) \
    X(nvmlGpmSampleGet) X(nvmlGpmMigSampleGet) X(nvmlGpmMetricsGet) \
    X(nvmlGpmSetStreamingEnabled) X(nvmlGpmQueryIfStreamingEnabled) \
    X(nvmlDeviceGetProcessUtilization) X(nvmlDeviceGetProcessesUtilizationInfo) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2) X(nvmlDeviceGetMPSComputeRunningProcesses_v3) \
    X(nvmlDeviceGetPowerManagementDefaultLimit) X(nvmlDeviceGetComputeMode) X(nvmlDeviceGetVbiosVersion) \
    X(nvmlDeviceGetGpuFabricInfo)

#define AS_ENUM(n) F_##n,
enum { FAKE_FUNCS(AS_ENUM) F_COUNT };
#define AS_NAME(n) #n,
static const char *const func_names[F_COUNT] = { FAKE_FUNCS(AS_NAME) };

/* ---- public structs (layouts as in nvml.h / pynvml) ---- */
typedef struct nvmlDevice_st { char opaque; } *nvmlDevice_t;
typedef struct nvmlEventSet_st { int in_use; uint64_t mask[MAX_GPUS]; } *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[32];
} nvmlPciInfoExt_t;
#define nvmlPciInfoExt_v1 0x1000040u

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 0x02000028u
typedef struct { unsigned int version, sensorType; int temperature; } nvmlTemperature_t;
#define nvmlTemperature_v1 0x100000Cu
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* GPM (nvml.h R520+; pynvml c_nvmlGpmMetric_t, c_nvmlGpmMetricsGet_t, c_nvmlGpmSupport_t) */
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
#define NVML_GPM_METRICS_GET_VERSION 1u
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
#define NVML_GPM_SUPPORT_VERSION 1u

_Static_assert(sizeof(nvmlMemory_v2_t) == 0x28, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t layout");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t layout");
_Static_assert(sizeof(nvmlGpmSupport_t) == 8, "nvmlGpmSupport_t layout");
_Static_assert(sizeof(nvmlPciInfoExt_t) == 0x40, "nvmlPciInfoExt_t layout");
_Static_assert(sizeof(nvmlTemperature_t) == 0x0C, "nvmlTemperature_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");

enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULONG = 2, VT_ULL = 3 };
#define EVENT_XID 0x8ull

/* ---- fleet model ---- */
struct page { uint64_t addr, ts; };
struct proc { uint32_t pid, gi, ci; uint64_t used; };
struct field_fail { uint32_t id; int code; };
struct gpm_val { uint32_t id; double v; };
struct mig {
    int present;
    char profile[32], uuid[96];
    uint64_t gi, ci, mem_total, mem_reserved, mem_used;
    int n_gpm;
    struct gpm_val gpm[MAX_MIG_GPM_VALS];
};

struct gpu {
    char name[96], uuid[96], serial[32], bus_id[32];
    uint64_t minor, pci_device_id, pci_subsystem_id, pci_class, brand, arch, numa;
    uint64_t util_gpu, util_mem, mem_total, mem_reserved, mem_used, temp_gpu, temp_mem;
    uint64_t power_mw, power_limit_mw, enforced_limit_mw, energy_mj;
    uint64_t clock_graphics, clock_sm, clock_mem, clock_video;
    uint64_t max_clock_graphics, max_clock_sm, max_clock_mem, max_clock_video;
    uint64_t pcie_gen, pcie_max_gen, pcie_gpu_max_gen, pcie_width, pcie_max_width;
    uint64_t pcie_replay, pcie_tx_kbps, pcie_rx_kbps;
    uint64_t fans, fan_speed, pstate;
    uint64_t ecc_mode, ecc_pending, ecc_corrected_volatile, ecc_corrected_aggregate;
    uint64_t ecc_uncorrected_volatile, ecc_uncorrected_aggregate, retired_pending;
    uint64_t remap_corr, remap_unc, remap_pending, remap_failure;
    uint64_t clocks_event_reasons, supported_clocks_event_reasons, violation_ref;
    uint64_t nvlinks, enc_util, enc_period_us, dec_util, dec_period_us;
    uint64_t jpg_util, jpg_period_us, ofa_util, ofa_period_us;  /* R535+ */
    uint64_t mig_mode, mig_pending, mig_max, supported_events, lost;
    uint64_t delay_ms;  /* every device call on this GPU sleeps this long (a hung driver) */
    uint64_t gpm_supported;
    /* issue 28: nvidia_gpu_exporter's compat series */
    uint64_t default_limit_mw, compute_mode, fabric_state, fabric_status, recovery_action;
    char vbios_version[32];

    unsigned int pci_domain, pci_bus, pci_dev, pci_fn; /* parsed from bus_id */
    uint64_t violation[NPOLICY];
    uint8_t nvlink_active[MAX_LINKS];
    uint64_t nvlink_err[MAX_LINKS][NVLINK_COUNTERS];
    int n_sbe, n_dbe, n_procs, n_gprocs, n_field_fail;
    struct page sbe[MAX_PAGES], dbe[MAX_PAGES];
    struct proc procs[MAX_PROCS], gprocs[MAX_PROCS];
    struct mig mig[MAX_MIG];
    struct field_fail field_fail[MAX_FIELD_FAILS];
    int n_gpm, n_gpm_fail;
    struct gpm_val gpm[MAX_GPM_VALS];
    struct field_fail gpm_fail[MAX_FIELD_FAILS];
    int fail[F_COUNT];
    uint8_t unsupported[F_COUNT];
};

struct event { uint32_t seq, gpu; uint64_t xid; };

struct config {
    char fleet[64], driver_version[80], nvml_version[80];
    uint64_t count, cuda_version;
    int fail[F_COUNT];
    int n_field_fail;
    struct field_fail field_fail[MAX_FIELD_FAILS];
    int8_t topo[MAX_GPUS][MAX_GPUS];
    int8_t p2p[MAX_GPUS][MAX_GPUS][P2P_INDICES];
    int n_events;
    struct event events[MAX_EVENTS];
    struct gpu gpus[MAX_GPUS];
};

enum { T_U64, T_STR };
struct scalar { const char *name; size_t off, size; int type; };
#define U(f) { #f, offsetof(struct gpu, f), sizeof(uint64_t), T_U64 }
#define S(f) { #f, offsetof(struct gpu, f), sizeof(((struct gpu *)0)->f), T_STR }
static const struct scalar gpu_scalars[] = {
    S(name), S(uuid), S(serial), S(bus_id),
    U(minor), U(pci_device_id), U(pci_subsystem_id), U(pci_class), U(brand), U(arch), U(numa),
    U(util_gpu), U(util_mem), U(mem_total), U(mem_reserved), U(mem_used), U(temp_gpu), U(temp_mem),
    U(power_mw), U(power_limit_mw), U(enforced_limit_mw), U(energy_mj),
    U(clock_graphics), U(clock_sm), U(clock_mem), U(clock_video),
    U(max_clock_graphics), U(max_clock_sm), U(max_clock_mem), U(max_clock_video),
    U(pcie_gen), U(pcie_max_gen), U(pcie_gpu_max_gen), U(pcie_width), U(pcie_max_width),
    U(pcie_replay), U(pcie_tx_kbps), U(pcie_rx_kbps),
    U(fans), U(fan_speed), U(pstate),
    U(ecc_mode), U(ecc_pending), U(ecc_corrected_volatile), U(ecc_corrected_aggregate),
    U(ecc_uncorrected_volatile), U(ecc_uncorrected_aggregate), U(retired_pending),
    U(remap_corr), U(remap_unc), U(remap_pending), U(remap_failure),
    U(clocks_event_reasons), U(supported_clocks_event_reasons), U(violation_ref),
    U(nvlinks), U(enc_util), U(enc_period_us), U(dec_util), U(dec_period_us),
    U(jpg_util), U(jpg_period_us), U(ofa_util), U(ofa_period_us),
    U(mig_mode), U(mig_pending), U(mig_max), U(supported_events), U(lost), U(delay_ms),
    U(default_limit_mw), U(compute_mode), U(fabric_state), U(fabric_status), U(recovery_action), S(vbios_version),
    U(gpm_supported),
};

/* ---- process state ---- */
static struct config cfg;
static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;  /* guards everything below */
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;   /* event sets + delivered[] */
static char cfg_path[4096];
static struct { int valid; dev_t dev; ino_t ino; off_t size; struct timespec mtim; } cfg_id;
static int refcount;
static uint64_t *gen_ptr;   /* mmap of <config>.gen, or NULL: stat() on every call */
static uint64_t seen_gen;   /* counter value whose file we already checked */
static unsigned long parse_count;
static uint8_t delivered[MAX_SEQ / 8];
static struct nvmlDevice_st gpu_handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG];
static struct nvmlEventSet_st event_sets[MAX_SETS];

#define FAKE_HANG 65536     /* an injected "code" that blocks the call instead (see the header) */
static int hanging;         /* calls blocked in FAKE_HANG now */
static unsigned long device_calls[MAX_GPUS];

/* Test hooks (not NVML): calls blocked in an injected hang now; calls made on GPU i. */
API int fakeNvmlHanging(void) { return __atomic_load_n(&hanging, __ATOMIC_RELAXED); }
API unsigned long fakeNvmlDeviceCalls(int i)
{
    return i >= 0 && i < MAX_GPUS ? __atomic_load_n(&device_calls[i], __ATOMIC_RELAXED) : 0;
}

/* Test hook (not NVML): how many times the fleet file was parsed. */
API unsigned long fakeNvmlParseCount(void) { return __atomic_load_n(&parse_count, __ATOMIC_RELAXED); }

/* ---- parsing (only when the file changed; never on the hot path) ---- */
static void warn(const char *what, const char *key, int lineno)
{
    fprintf(stderr, "fake_nvml: %s:%d: %s '%s'\n", cfg_path, lineno, what, key);
}

static int func_id(const char *name)
{
    for (int i = 0; i < F_COUNT; i++)
        if (!strcmp(func_names[i], name)) return i;
    return -1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s) return -1;
    *out = strtoull(s, &end, 0);
    return *end ? -1 : 0;
}

/* "a.b.c" -> numbers; returns how many were read, *rest points after them. */
static int parse_indices(const char *s, long *idx, int n, const char **rest)
{
    int got = 0;
    while (got < n) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0) break;
        idx[got++] = v;
        s = end;
        if (*s == '.') s++;
        else break;
    }
    *rest = s;
    return got;
}

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static void add_field_fail(struct field_fail *arr, int *n, uint32_t id, int code)
{
    for (int i = 0; i < *n; i++)
        if (arr[i].id == id) { arr[i].code = code; return; }
    if (*n < MAX_FIELD_FAILS) { arr[*n].id = id; arr[*n].code = code; (*n)++; }
}

/* "gpm.<id>=<double>" into a sparse table of at most `max` entries. */
static void add_gpm_val(struct gpm_val *arr, int *n, int max, const char *id_text, const char *val,
                        const char *key, int lineno)
{
    char *id_end, *end;
    unsigned long id = strtoul(id_text, &id_end, 10);
    double v = strtod(val, &end);
    if (*id_end || id == 0 || id >= GPM_METRIC_MAX || !*val || *end) { warn("bad GPM value", key, lineno); return; }
    for (int i = 0; i < *n; i++)
        if (arr[i].id == id) { arr[i].v = v; return; }
    if (*n < max) { arr[*n].id = (uint32_t)id; arr[*n].v = v; (*n)++; }
    else warn("too many GPM values", key, lineno);
}

static int parse_pages(char *val, struct page *pages)
{
    int n = 0;
    char *save, *tok;
    for (tok = strtok_r(val, ",", &save); tok && n < MAX_PAGES; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        if (at) *at = 0;
        pages[n].addr = strtoull(tok, NULL, 0);
        pages[n].ts = at ? strtoull(at + 1, NULL, 0) : 0;
        n++;
    }
    return n;
}

static int parse_procs(char *val, struct proc *procs)
{
    int n = 0;
    char *save, *tok;
    for (tok = strtok_r(val, ",", &save); tok && n < MAX_PROCS; tok = strtok_r(NULL, ",", &save)) {
        char *f[4] = { 0 }, *s2, *p;
        int k = 0;
        for (p = strtok_r(tok, ":", &s2); p && k < 4; p = strtok_r(NULL, ":", &s2)) f[k++] = p;
        if (k < 1) continue;
        procs[n].pid = (uint32_t)strtoul(f[0], NULL, 0);
        procs[n].used = (k > 1 && strcmp(f[1], "-")) ? strtoull(f[1], NULL, 0) : UINT64_MAX;
        procs[n].gi = (k > 2 && strcmp(f[2], "-")) ? (uint32_t)strtoul(f[2], NULL, 0) : NOT_AVAILABLE_U32;
        procs[n].ci = (k > 3 && strcmp(f[3], "-")) ? (uint32_t)strtoul(f[3], NULL, 0) : NOT_AVAILABLE_U32;
        n++;
    }
    return n;
}

static int parse_shared_key(int gpu, const char *key, char *val); /* per-process block, at the end */
static void reset_shared(void);

static void parse_gpu_key(struct gpu *g, const char *key, char *val, int lineno)
{
    for (size_t i = 0; i < sizeof gpu_scalars / sizeof gpu_scalars[0]; i++) {
        const struct scalar *s = &gpu_scalars[i];
        if (strcmp(s->name, key)) continue;
        if (s->type == T_STR) copy_str((char *)g + s->off, s->size, val);
        else if (parse_u64(val, (uint64_t *)((char *)g + s->off))) warn("bad number for", key, lineno);
        return;
    }
    long idx[2];
    const char *rest;
    if (!strncmp(key, "fail.", 5)) {
        int id = func_id(key + 5);
        if (id < 0) warn("unknown function in", key, lineno);
        else g->fail[id] = atoi(val);
    } else if (!strncmp(key, "field_fail.", 11)) {
        add_field_fail(g->field_fail, &g->n_field_fail, (uint32_t)strtoul(key + 11, NULL, 10), atoi(val));
    } else if (!strncmp(key, "gpm.", 4)) {
        add_gpm_val(g->gpm, &g->n_gpm, MAX_GPM_VALS, key + 4, val, key, lineno);
    } else if (!strncmp(key, "gpm_fail.", 9)) {
        add_field_fail(g->gpm_fail, &g->n_gpm_fail, (uint32_t)strtoul(key + 9, NULL, 10), atoi(val));
    } else if (!strcmp(key, "unsupported")) {
        char *save, *tok;
        for (tok = strtok_r(val, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int id = func_id(tok);
            if (id < 0) warn("unknown function in unsupported list:", tok, lineno);
            else g->unsupported[id] = 1;
        }
    } else if (!strncmp(key, "violation.", 10) && parse_indices(key + 10, idx, 1, &rest) == 1
               && !*rest && idx[0] < NPOLICY) {
        parse_u64(val, &g->violation[idx[0]]);
    } else if (!strcmp(key, "nvlink_active")) {
        char *save, *tok;
        int l = 0;
        for (tok = strtok_r(val, ",", &save); tok && l < MAX_LINKS; tok = strtok_r(NULL, ",", &save))
            g->nvlink_active[l++] = (uint8_t)(atoi(tok) != 0);
    } else if (!strncmp(key, "nvlink_err.", 11) && parse_indices(key + 11, idx, 2, &rest) == 2
               && !*rest && idx[0] < MAX_LINKS && idx[1] < NVLINK_COUNTERS) {
        parse_u64(val, &g->nvlink_err[idx[0]][idx[1]]);
    } else if (!strcmp(key, "retired_sbe")) {
        g->n_sbe = parse_pages(val, g->sbe);
    } else if (!strcmp(key, "retired_dbe")) {
        g->n_dbe = parse_pages(val, g->dbe);
    } else if (!strcmp(key, "procs")) {
        g->n_procs = parse_procs(val, g->procs);
    } else if (!strcmp(key, "graphics_procs")) {
        g->n_gprocs = parse_procs(val, g->gprocs);
    } else if (parse_shared_key((int)(g - cfg.gpus), key, val)) {
        /* proc_util, mps_procs */
    } else if (!strncmp(key, "mig.", 4) && parse_indices(key + 4, idx, 1, &rest) == 1 && idx[0] < MAX_MIG) {
        struct mig *m = &g->mig[idx[0]];
        m->present = 1;
        if (!strcmp(rest, "profile")) copy_str(m->profile, sizeof m->profile, val);
        else if (!strcmp(rest, "uuid")) copy_str(m->uuid, sizeof m->uuid, val);
        else if (!strcmp(rest, "gi")) parse_u64(val, &m->gi);
        else if (!strcmp(rest, "ci")) parse_u64(val, &m->ci);
        else if (!strcmp(rest, "mem_total")) parse_u64(val, &m->mem_total);
        else if (!strcmp(rest, "mem_reserved")) parse_u64(val, &m->mem_reserved);
        else if (!strcmp(rest, "mem_used")) parse_u64(val, &m->mem_used);
        else if (!strncmp(rest, "gpm.", 4)) add_gpm_val(m->gpm, &m->n_gpm, MAX_MIG_GPM_VALS, rest + 4, val, key, lineno);
        else warn("unknown MIG key", key, lineno);
    } else {
        warn("unknown key", key, lineno);
    }
}

static void set_defaults(void)
{
    memset(&cfg, 0, sizeof cfg);
    reset_shared();
    copy_str(cfg.driver_version, sizeof cfg.driver_version, "550.54.15");
    copy_str(cfg.nvml_version, sizeof cfg.nvml_version, "12.550.54.15");
    cfg.cuda_version = 12040;
    cfg.count = UINT64_MAX; /* "not given" */
    memset(cfg.topo, -1, sizeof cfg.topo);
    memset(cfg.p2p, -1, sizeof cfg.p2p);
    for (int i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &cfg.gpus[i];
        copy_str(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
        snprintf(g->uuid, sizeof g->uuid, "GPU-00000000-0000-0000-0000-%012d", i);
        snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x10 + i);
        g->pci_class = 0x030200;
        memset(g->nvlink_active, 1, sizeof g->nvlink_active);
        for (int s = 0; s < MAX_MIG; s++) {
            g->mig[s].gi = NOT_AVAILABLE_U32;
            g->mig[s].ci = 0;
        }
    }
}

static void parse_line(char *line, int lineno, uint64_t *max_gpu)
{
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = 0;
    while (*line == ' ') line++;
    if (!*line || *line == '#') return;
    char *eq = strchr(line, '=');
    if (!eq) { warn("line without '=':", line, lineno); return; }
    *eq = 0;
    char *key = line, *val = eq + 1;
    long idx[3];
    const char *rest;

    if (!strncmp(key, "gpu.", 4)) {
        if (parse_indices(key + 4, idx, 1, &rest) != 1 || idx[0] >= MAX_GPUS || rest[-1] != '.') {
            warn("bad GPU key", key, lineno);
            return;
        }
        if ((uint64_t)idx[0] + 1 > *max_gpu) *max_gpu = (uint64_t)idx[0] + 1;
        parse_gpu_key(&cfg.gpus[idx[0]], rest, val, lineno);
    } else if (!strcmp(key, "fleet")) {
        copy_str(cfg.fleet, sizeof cfg.fleet, val);
    } else if (!strcmp(key, "generation")) {
        /* informational only */
    } else if (!strcmp(key, "count")) {
        if (parse_u64(val, &cfg.count) || cfg.count > MAX_GPUS) { warn("bad count", val, lineno); cfg.count = 0; }
    } else if (!strcmp(key, "driver_version")) {
        copy_str(cfg.driver_version, sizeof cfg.driver_version, val);
    } else if (!strcmp(key, "nvml_version")) {
        copy_str(cfg.nvml_version, sizeof cfg.nvml_version, val);
    } else if (!strcmp(key, "cuda_version")) {
        parse_u64(val, &cfg.cuda_version);
    } else if (!strncmp(key, "fail.", 5)) {
        int id = func_id(key + 5);
        if (id < 0) warn("unknown function in", key, lineno);
        else cfg.fail[id] = atoi(val);
    } else if (!strncmp(key, "field_fail.", 11)) {
        add_field_fail(cfg.field_fail, &cfg.n_field_fail, (uint32_t)strtoul(key + 11, NULL, 10), atoi(val));
    } else if (!strncmp(key, "topo.", 5) && parse_indices(key + 5, idx, 2, &rest) == 2 && !*rest
               && idx[0] < MAX_GPUS && idx[1] < MAX_GPUS) {
        cfg.topo[idx[0]][idx[1]] = (int8_t)atoi(val);
    } else if (!strncmp(key, "p2p.", 4) && parse_indices(key + 4, idx, 3, &rest) == 3 && !*rest
               && idx[0] < MAX_GPUS && idx[1] < MAX_GPUS && idx[2] < P2P_INDICES) {
        cfg.p2p[idx[0]][idx[1]][idx[2]] = (int8_t)atoi(val);
    } else if (!strncmp(key, "xid.", 4)) {
        unsigned long seq = strtoul(key + 4, NULL, 10);
        unsigned int gpu;
        unsigned long long xid;
        if (seq == 0 || seq >= MAX_SEQ || sscanf(val, "%u:%llu", &gpu, &xid) != 2 || cfg.n_events >= MAX_EVENTS) {
            warn("bad XID event", key, lineno);
            return;
        }
        cfg.events[cfg.n_events++] = (struct event){ (uint32_t)seq, gpu, xid };
    } else {
        warn("unknown key", key, lineno);
    }
}

static int same_id(const struct stat *st)
{
    return cfg_id.valid && cfg_id.dev == st->st_dev && cfg_id.ino == st->st_ino && cfg_id.size == st->st_size
        && cfg_id.mtim.tv_sec == st->st_mtim.tv_sec && cfg_id.mtim.tv_nsec == st->st_mtim.tv_nsec;
}

/* Caller holds the write lock.  Returns 0 when a config is loaded. */
static int load_locked(void)
{
    FILE *f = fopen(cfg_path, "r");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && same_id(&st)) { fclose(f); return 0; }

    char old_fleet[sizeof cfg.fleet];
    memcpy(old_fleet, cfg.fleet, sizeof old_fleet);
    set_defaults();
    static char line[16384];
    int lineno = 0;
    uint64_t max_gpu = 0;
    while (fgets(line, sizeof line, f)) parse_line(line, ++lineno, &max_gpu);
    fclose(f);
    if (cfg.count == UINT64_MAX) cfg.count = max_gpu;
    for (int i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &cfg.gpus[i];
        if (sscanf(g->bus_id, "%x:%x:%x.%x", &g->pci_domain, &g->pci_bus, &g->pci_dev, &g->pci_fn) != 4)
            g->pci_domain = g->pci_bus = g->pci_dev = g->pci_fn = 0;
    }
    if (strcmp(old_fleet, cfg.fleet)) {
        pthread_mutex_lock(&ev_mu);
        memset(delivered, 0, sizeof delivered);
        pthread_mutex_unlock(&ev_mu);
    }
    cfg_id.valid = 1;
    cfg_id.dev = st.st_dev;
    cfg_id.ino = st.st_ino;
    cfg_id.size = st.st_size;
    cfg_id.mtim = st.st_mtim;
    __atomic_add_fetch(&parse_count, 1, __ATOMIC_RELAXED);
    return 0;
}

/* Take the read lock, re-parsing first if the file changed (one stat() per call). */
static void enter_read(void)
{
    struct stat st;
    uint64_t gen = 0;
    pthread_rwlock_rdlock(&lock);
    if (!cfg_path[0]) return;
    if (gen_ptr) {
        gen = __atomic_load_n(gen_ptr, __ATOMIC_ACQUIRE);
        if (gen == __atomic_load_n(&seen_gen, __ATOMIC_RELAXED)) return;
    }
    /* Read the counter before stat(): a write racing with us only causes one more stat(). */
    if (stat(cfg_path, &st) == 0 && !same_id(&st)) {
        pthread_rwlock_unlock(&lock);
        pthread_rwlock_wrlock(&lock);
        load_locked();
        pthread_rwlock_unlock(&lock);
        pthread_rwlock_rdlock(&lock);
    }
    if (gen_ptr) __atomic_store_n(&seen_gen, gen, __ATOMIC_RELAXED);
}

/* (Re)map <config>.gen at init; write lock held, so no reader is using gen_ptr. */
static void map_gen(void)
{
    char p[sizeof cfg_path + 8];
    struct stat st;
    if (gen_ptr) munmap(gen_ptr, sizeof *gen_ptr);
    gen_ptr = NULL;
    snprintf(p, sizeof p, "%s.gen", cfg_path);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof *gen_ptr) {
        void *m = mmap(NULL, sizeof *gen_ptr, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) gen_ptr = m;
    }
    close(fd);
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_rwlock_unlock(&lock);
    return rc;
}

#define OUT(rc) return leave(rc)

/* ---- handles ---- */
/* Decode a handle: returns 0 and sets gpu/slot (slot -1 for a full GPU), or -1. */
static int decode(nvmlDevice_t dev, int *gpu, int *slot)
{
    uintptr_t p = (uintptr_t)dev;
    uintptr_t g0 = (uintptr_t)&gpu_handles[0], m0 = (uintptr_t)&mig_handles[0][0];
    if (p >= g0 && p < g0 + sizeof gpu_handles) {
        *gpu = (int)((p - g0) / sizeof gpu_handles[0]);
        *slot = -1;
        return 0;
    }
    if (p >= m0 && p < m0 + sizeof mig_handles) {
        size_t k = (p - m0) / sizeof mig_handles[0][0];
        *gpu = (int)(k / MAX_MIG);
        *slot = (int)(k % MAX_MIG);
        return 0;
    }
    return -1;
}

static int injected(int fid, const struct gpu *g)
{
    if (g && g->fail[fid]) return g->fail[fid];
    return cfg.fail[fid];
}

/* An injected FAKE_HANG: block, the read lock released, until the file no longer injects it for
 * (fid, g); return the code it injects then, with the read lock held again. */
static int hang_while_injected(int fid, const struct gpu *g)
{
    int rc = injected(fid, g);
    if (rc != FAKE_HANG) return rc;
    __atomic_add_fetch(&hanging, 1, __ATOMIC_RELAXED);
    while (rc == FAKE_HANG) {
        struct timespec ts = { 0, 2000000L };
        pthread_rwlock_unlock(&lock);
        nanosleep(&ts, NULL);
        enter_read();  /* re-parses a changed file; g points into cfg, which stays put */
        rc = injected(fid, g);
    }
    __atomic_sub_fetch(&hanging, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Checks common to every call about one GPU; read lock held, not released. */
static nvmlReturn_t check_gpu(int fid, const struct gpu *g)
{
    int rc = hang_while_injected(fid, g);
    if (rc) return rc;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->unsupported[fid]) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

enum { MIG_OK = 1, MIG_ONLY = 2 };

/* Device prologue: 0 with the read lock held, or an NVML code with no lock held. */
static nvmlReturn_t enter_dev(int fid, nvmlDevice_t dev, int flags, struct gpu **gp, struct mig **mp, int *index)
{
    int gpu, slot;
    enter_read();
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    if (decode(dev, &gpu, &slot) || (uint64_t)gpu >= cfg.count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct gpu *g = &cfg.gpus[gpu];
    __atomic_add_fetch(&device_calls[gpu], 1, __ATOMIC_RELAXED);
    if (slot >= 0 && (!g->mig_mode || !g->mig[slot].present)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = check_gpu(fid, g);
    if (rc) return leave(rc);
    if (g->delay_ms) {
        struct timespec ts = { (time_t)(g->delay_ms / 1000), (long)(g->delay_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    if (slot >= 0 && !(flags & (MIG_OK | MIG_ONLY))) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (slot < 0 && (flags & MIG_ONLY)) return leave(NVML_ERROR_NOT_SUPPORTED);
    *gp = g;
    *mp = slot >= 0 ? &g->mig[slot] : NULL;
    *index = gpu;
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_sys(int fid)
{
    enter_read();
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    int rc = hang_while_injected(fid, NULL);
    if (rc) return leave(rc);
    return NVML_SUCCESS;
}

#define DEV(fn, dev, flags)                                                      \
    struct gpu *g;                                                               \
    struct mig *m;                                                               \
    int gidx;                                                                    \
    do {                                                                         \
        nvmlReturn_t rc_ = enter_dev(F_##fn, (dev), (flags), &g, &m, &gidx);     \
        if (rc_) return rc_;                                                     \
        (void)m; (void)gidx;                                                     \
    } while (0)

#define SYS(fn)                                                                  \
    do {                                                                         \
        nvmlReturn_t rc_ = enter_sys(F_##fn);                                    \
        if (rc_) return rc_;                                                     \
    } while (0)

#define NEED(p) do { if (!(p)) OUT(NVML_ERROR_INVALID_ARGUMENT); } while (0)

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s)
{
    size_t n = strlen(s);
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if ((size_t)len < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

/* One-value getters: `name(device, T *out)` returning a per-GPU scalar. */
#define U32_GETTER(fn, field)                                                    \
    API nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *out)                     \
    {                                                                            \
        DEV(fn, dev, 0);                                                         \
        NEED(out);                                                               \
        *out = (unsigned int)g->field;                                           \
        OUT(NVML_SUCCESS);                                                       \
    }
#define U64_GETTER(fn, field)                                                    \
    API nvmlReturn_t fn(nvmlDevice_t dev, unsigned long long *out)               \
    {                                                                            \
        DEV(fn, dev, 0);                                                         \
        NEED(out);                                                               \
        *out = g->field;                                                         \
        OUT(NVML_SUCCESS);                                                       \
    }

/* ================= init / system ================= */

static nvmlReturn_t do_init(int fid)
{
    const char *p = getenv("FAKE_NVML_CONFIG");
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_rwlock_wrlock(&lock);
    if (!p || !*p || strlen(p) >= sizeof cfg_path) {
        refcount = 0;
        rc = NVML_ERROR_DRIVER_NOT_LOADED;
        goto out;
    }
    if (strcmp(p, cfg_path)) {
        copy_str(cfg_path, sizeof cfg_path, p);
        cfg_id.valid = 0;
    }
    map_gen();
    seen_gen = gen_ptr ? __atomic_load_n(gen_ptr, __ATOMIC_ACQUIRE) : 0;
    if (load_locked() != 0) {
        refcount = 0;
        rc = NVML_ERROR_DRIVER_NOT_LOADED;
        goto out;
    }
    rc = cfg.fail[fid];
    if (rc == FAKE_HANG) {  /* init hangs: wait with no lock held, as hang_while_injected does */
        pthread_rwlock_unlock(&lock);
        enter_read();
        rc = hang_while_injected(fid, NULL);
        pthread_rwlock_unlock(&lock);
        pthread_rwlock_wrlock(&lock);
    }
    if (rc == NVML_ERROR_DRIVER_NOT_LOADED) refcount = 0;
    if (!rc) refcount++;
out:
    pthread_rwlock_unlock(&lock);
    return rc;
}

#ifndef OMIT_nvmlInit_v2
API nvmlReturn_t nvmlInit_v2(void) { return do_init(F_nvmlInit_v2); }
#endif

#ifndef OMIT_nvmlInitWithFlags
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(F_nvmlInitWithFlags);
}
#endif

#ifndef OMIT_nvmlShutdown
API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc;
    pthread_rwlock_wrlock(&lock);
    if (!refcount) rc = NVML_ERROR_UNINITIALIZED;
    else if ((rc = cfg.fail[F_nvmlShutdown]) == 0) refcount--;
    pthread_rwlock_unlock(&lock);
    return rc;
}
#endif

#ifndef OMIT_nvmlErrorString
API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error (fake NVML: unmapped code)";
    }
}
#endif

#ifndef OMIT_nvmlSystemGetDriverVersion
API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SYS(nvmlSystemGetDriverVersion);
    OUT(put_str(version, length, cfg.driver_version));
}
#endif

#ifndef OMIT_nvmlSystemGetNVMLVersion
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    SYS(nvmlSystemGetNVMLVersion);
    OUT(put_str(version, length, cfg.nvml_version));
}
#endif

#ifndef OMIT_nvmlSystemGetCudaDriverVersion
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    SYS(nvmlSystemGetCudaDriverVersion);
    NEED(v);
    *v = (int)cfg.cuda_version;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlSystemGetCudaDriverVersion_v2
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    SYS(nvmlSystemGetCudaDriverVersion_v2);
    NEED(v);
    *v = (int)cfg.cuda_version;
    OUT(NVML_SUCCESS);
}
#endif

static nvmlReturn_t get_count(int fid, unsigned int *count)
{
    nvmlReturn_t rc = enter_sys(fid);
    if (rc) return rc;
    NEED(count);
    *count = (unsigned int)cfg.count;
    OUT(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetCount
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return get_count(F_nvmlDeviceGetCount, c); }
#endif
#ifndef OMIT_nvmlDeviceGetCount_v2
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return get_count(F_nvmlDeviceGetCount_v2, c); }
#endif

static nvmlReturn_t handle_by_index(int fid, unsigned int index, nvmlDevice_t *dev)
{
    enter_read();
    if (!refcount) OUT(NVML_ERROR_UNINITIALIZED);
    if (index >= cfg.count) {
        int rc = injected(fid, NULL);
        OUT(rc ? rc : NVML_ERROR_INVALID_ARGUMENT);
    }
    nvmlReturn_t rc = check_gpu(fid, &cfg.gpus[index]);
    if (rc) OUT(rc);
    NEED(dev);
    *dev = &gpu_handles[index];
    OUT(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetHandleByIndex
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d)
{
    return handle_by_index(F_nvmlDeviceGetHandleByIndex, i, d);
}
#endif
#ifndef OMIT_nvmlDeviceGetHandleByIndex_v2
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    return handle_by_index(F_nvmlDeviceGetHandleByIndex_v2, i, d);
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByUUID
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
    SYS(nvmlDeviceGetHandleByUUID);
    NEED(uuid && dev);
    for (uint64_t i = 0; i < cfg.count; i++) {
        struct gpu *g = &cfg.gpus[i];
        if (!strcmp(g->uuid, uuid)) {
            nvmlReturn_t rc = check_gpu(F_nvmlDeviceGetHandleByUUID, g);
            if (rc) OUT(rc);
            *dev = &gpu_handles[i];
            OUT(NVML_SUCCESS);
        }
        for (int s = 0; g->mig_mode && s < MAX_MIG; s++) {
            if (g->mig[s].present && !strcmp(g->mig[s].uuid, uuid)) {
                nvmlReturn_t rc = check_gpu(F_nvmlDeviceGetHandleByUUID, g);
                if (rc) OUT(rc);
                *dev = &mig_handles[i][s];
                OUT(NVML_SUCCESS);
            }
        }
    }
    OUT(NVML_ERROR_NOT_FOUND);
}
#endif

static nvmlReturn_t handle_by_pci(int fid, const char *bus_id, nvmlDevice_t *dev)
{
    nvmlReturn_t rc = enter_sys(fid);
    if (rc) return rc;
    NEED(bus_id && dev);
    unsigned int d = 0, b, s, f;
    if (sscanf(bus_id, "%x:%x:%x.%x", &d, &b, &s, &f) != 4) {
        d = 0;
        if (sscanf(bus_id, "%x:%x.%x", &b, &s, &f) != 3) OUT(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (uint64_t i = 0; i < cfg.count; i++) {
        struct gpu *g = &cfg.gpus[i];
        if (g->pci_domain == d && g->pci_bus == b && g->pci_dev == s && g->pci_fn == f) {
            rc = check_gpu(fid, g);
            if (rc) OUT(rc);
            *dev = &gpu_handles[i];
            OUT(NVML_SUCCESS);
        }
    }
    OUT(NVML_ERROR_NOT_FOUND);
}

#ifndef OMIT_nvmlDeviceGetHandleByPciBusId
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *dev)
{
    return handle_by_pci(F_nvmlDeviceGetHandleByPciBusId, bus_id, dev);
}
#endif
#ifndef OMIT_nvmlDeviceGetHandleByPciBusId_v2
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *dev)
{
    return handle_by_pci(F_nvmlDeviceGetHandleByPciBusId_v2, bus_id, dev);
}
#endif

/* ================= identity ================= */

#ifndef OMIT_nvmlDeviceGetName
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length)
{
    DEV(nvmlDeviceGetName, dev, MIG_OK);
    NEED(name);
    if (!m) OUT(put_str(name, length, g->name));
    int n = snprintf(NULL, 0, "%s MIG %s", g->name, m->profile);
    if (n < 0 || (unsigned int)n + 1 > length) OUT(NVML_ERROR_INSUFFICIENT_SIZE);
    snprintf(name, length, "%s MIG %s", g->name, m->profile);
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetUUID
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length)
{
    DEV(nvmlDeviceGetUUID, dev, MIG_OK);
    OUT(put_str(uuid, length, m ? m->uuid : g->uuid));
}
#endif

#ifndef OMIT_nvmlDeviceGetSerial
API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *serial, unsigned int length)
{
    DEV(nvmlDeviceGetSerial, dev, 0);
    OUT(put_str(serial, length, g->serial));
}
#endif

#ifndef OMIT_nvmlDeviceGetIndex
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
    DEV(nvmlDeviceGetIndex, dev, 0);
    NEED(index);
    *index = (unsigned int)gidx;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMinorNumber
U32_GETTER(nvmlDeviceGetMinorNumber, minor)
#endif

#ifndef OMIT_nvmlDeviceGetPciInfo_v3
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    DEV(nvmlDeviceGetPciInfo_v3, dev, 0);
    NEED(pci);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
             g->pci_domain & 0xFFFF, g->pci_bus & 0xFF, g->pci_dev & 0xFF, g->pci_fn & 0xF);
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_dev;
    pci->pciDeviceId = (unsigned int)g->pci_device_id;
    pci->pciSubSystemId = (unsigned int)g->pci_subsystem_id;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPciInfoExt
API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t dev, nvmlPciInfoExt_t *pci)
{
    DEV(nvmlDeviceGetPciInfoExt, dev, 0);
    NEED(pci);
    if (pci->version != nvmlPciInfoExt_v1) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_dev;
    pci->pciDeviceId = (unsigned int)g->pci_device_id;
    pci->pciSubSystemId = (unsigned int)g->pci_subsystem_id;
    pci->baseClass = (unsigned int)(g->pci_class >> 16) & 0xFF;
    pci->subClass = (unsigned int)(g->pci_class >> 8) & 0xFF;
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetBrand
U32_GETTER(nvmlDeviceGetBrand, brand)
#endif
#ifndef OMIT_nvmlDeviceGetArchitecture
U32_GETTER(nvmlDeviceGetArchitecture, arch)
#endif

/* ================= telemetry ================= */

#ifndef OMIT_nvmlDeviceGetUtilizationRates
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u)
{
    DEV(nvmlDeviceGetUtilizationRates, dev, 0);
    NEED(u);
    u->gpu = (unsigned int)g->util_gpu;
    u->memory = (unsigned int)g->util_mem;
    OUT(NVML_SUCCESS);
}
#endif

static void mem_of(const struct gpu *g, const struct mig *m, uint64_t *total, uint64_t *reserved, uint64_t *used)
{
    *total = m ? m->mem_total : g->mem_total;
    *reserved = m ? m->mem_reserved : g->mem_reserved;
    *used = m ? m->mem_used : g->mem_used;
}

#ifndef OMIT_nvmlDeviceGetMemoryInfo
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    DEV(nvmlDeviceGetMemoryInfo, dev, MIG_OK);
    NEED(mem);
    uint64_t total, reserved, used;
    mem_of(g, m, &total, &reserved, &used);
    mem->total = total;
    mem->used = used + reserved; /* v1 counts the driver's reservation as used */
    mem->free = total - reserved - used;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    DEV(nvmlDeviceGetMemoryInfo_v2, dev, MIG_OK);
    NEED(mem);
    if (mem->version != nvmlMemory_v2) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    uint64_t total, reserved, used;
    mem_of(g, m, &total, &reserved, &used);
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = total - reserved - used;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperature
API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp)
{
    DEV(nvmlDeviceGetTemperature, dev, 0);
    NEED(temp && sensor == 0);
    *temp = (unsigned int)g->temp_gpu;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperatureV
API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_t *t)
{
    DEV(nvmlDeviceGetTemperatureV, dev, 0);
    NEED(t);
    if (t->version != nvmlTemperature_v1) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    NEED(t->sensorType == 0);
    t->temperature = (int)g->temp_gpu;
    OUT(NVML_SUCCESS);
}
#endif

static uint64_t nvlink_sum(const struct gpu *g, int counter)
{
    uint64_t s = 0;
    for (uint64_t l = 0; l < g->nvlinks && l < MAX_LINKS; l++) s += g->nvlink_err[l][counter];
    return s;
}

/* Value of one field id: NVML_SUCCESS and (type, value), or an NVML code. */
static nvmlReturn_t field_value(const struct gpu *g, unsigned int id, unsigned int *type, uint64_t *v)
{
    *type = VT_ULL;
    switch (id) {
    case 3: case 4: case 5: case 6: /* ECC totals: SBE/DBE x volatile/aggregate */
        if (!g->ecc_mode) return NVML_ERROR_NOT_SUPPORTED;
        *v = id == 3 ? g->ecc_corrected_volatile : id == 4 ? g->ecc_uncorrected_volatile
           : id == 5 ? g->ecc_corrected_aggregate : g->ecc_uncorrected_aggregate;
        return NVML_SUCCESS;
    case 29: *type = VT_UINT; *v = (uint64_t)g->n_sbe; return NVML_SUCCESS;
    case 30: *type = VT_UINT; *v = (uint64_t)g->n_dbe; return NVML_SUCCESS;
    case 31: *type = VT_UINT; *v = g->retired_pending; return NVML_SUCCESS;
    case 38: case 45: case 52: case 59: case 160: /* NVLink error totals over all links */
        if (!g->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
        *v = nvlink_sum(g, id == 38 ? 2 : id == 45 ? 3 : id == 52 ? 0 : id == 59 ? 1 : 4);
        return NVML_SUCCESS;
    case 74: case 75: case 76: case 77: case 78: case 79: /* perf policy violation time, ns */
        *v = g->violation[id - 74];
        return NVML_SUCCESS;
    case 80: *v = g->violation[10]; return NVML_SUCCESS;
    case 81: *v = g->violation[11]; return NVML_SUCCESS;
    case 82: *type = VT_UINT; *v = g->temp_mem; return NVML_SUCCESS;
    case 83: case 191: *v = g->energy_mj; return NVML_SUCCESS;
    case 91: *type = VT_UINT; *v = g->nvlinks; return NVML_SUCCESS;
    case 94: *type = VT_UINT; *v = g->pcie_replay; return NVML_SUCCESS;
    case 95: *type = VT_UINT; *v = 0; return NVML_SUCCESS;
    case 142: *type = VT_UINT; *v = g->remap_corr; return NVML_SUCCESS;
    case 143: *type = VT_UINT; *v = g->remap_unc; return NVML_SUCCESS;
    case 144: *type = VT_UINT; *v = g->remap_pending; return NVML_SUCCESS;
    case 145: *type = VT_UINT; *v = g->remap_failure; return NVML_SUCCESS;
    case 185: case 186: *type = VT_UINT; *v = g->power_mw; return NVML_SUCCESS;
    case 190: *type = VT_UINT; *v = g->power_limit_mw; return NVML_SUCCESS;
    case 230: *type = VT_ULL; *v = g->recovery_action; return NVML_SUCCESS; /* GET_GPU_RECOVERY_ACTION */
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

static int field_failure(const struct gpu *g, unsigned int id)
{
    for (int i = 0; i < g->n_field_fail; i++)
        if (g->field_fail[i].id == id) return g->field_fail[i].code;
    for (int i = 0; i < cfg.n_field_fail; i++)
        if (cfg.field_fail[i].id == id) return cfg.field_fail[i].code;
    return 0;
}

#ifndef OMIT_nvmlDeviceGetFieldValues
API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values)
{
    DEV(nvmlDeviceGetFieldValues, dev, 0);
    NEED(count >= 0 && (count == 0 || values));
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long now_us = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *fv = &values[i];
        uint64_t v = 0;
        unsigned int type = VT_ULL;
        nvmlReturn_t rc = field_failure(g, fv->fieldId);
        if (!rc) rc = field_value(g, fv->fieldId, &type, &v);
        fv->timestamp = now_us;
        fv->latencyUsec = 0;
        fv->nvmlReturn = rc;
        fv->valueType = type;
        /* Zero-extended: reading uiVal or ullVal gives the same number. */
        fv->value.ullVal = rc ? 0 : v;
    }
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPowerUsage
U32_GETTER(nvmlDeviceGetPowerUsage, power_mw)
#endif
#ifndef OMIT_nvmlDeviceGetEnforcedPowerLimit
U32_GETTER(nvmlDeviceGetEnforcedPowerLimit, enforced_limit_mw)
#endif
#ifndef OMIT_nvmlDeviceGetPowerManagementLimit
U32_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit_mw)
#endif
#ifndef OMIT_nvmlDeviceGetTotalEnergyConsumption
U64_GETTER(nvmlDeviceGetTotalEnergyConsumption, energy_mj)
#endif

static nvmlReturn_t clock_of(const struct gpu *g, int type, int max, unsigned int *out)
{
    const uint64_t cur[4] = { g->clock_graphics, g->clock_sm, g->clock_mem, g->clock_video };
    const uint64_t top[4] = { g->max_clock_graphics, g->max_clock_sm, g->max_clock_mem, g->max_clock_video };
    if (!out || type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)(max ? top[type] : cur[type]);
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlDeviceGetClockInfo
API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz)
{
    DEV(nvmlDeviceGetClockInfo, dev, 0);
    OUT(clock_of(g, type, 0, mhz));
}
#endif

#ifndef OMIT_nvmlDeviceGetMaxClockInfo
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz)
{
    DEV(nvmlDeviceGetMaxClockInfo, dev, 0);
    OUT(clock_of(g, type, 1, mhz));
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrPcieLinkGeneration
U32_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
#endif
#ifndef OMIT_nvmlDeviceGetMaxPcieLinkGeneration
U32_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
#endif
#ifndef OMIT_nvmlDeviceGetGpuMaxPcieLinkGeneration
U32_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gpu_max_gen)
#endif
#ifndef OMIT_nvmlDeviceGetCurrPcieLinkWidth
U32_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
#endif
#ifndef OMIT_nvmlDeviceGetMaxPcieLinkWidth
U32_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
#endif
#ifndef OMIT_nvmlDeviceGetNumFans
U32_GETTER(nvmlDeviceGetNumFans, fans)
#endif

#ifndef OMIT_nvmlDeviceGetFanSpeed
API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int *speed)
{
    DEV(nvmlDeviceGetFanSpeed, dev, 0);
    if (!g->fans) OUT(NVML_ERROR_NOT_SUPPORTED); /* passively cooled (SXM) boards */
    NEED(speed);
    *speed = (unsigned int)g->fan_speed;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetFanSpeed_v2
API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t dev, unsigned int fan, unsigned int *speed)
{
    DEV(nvmlDeviceGetFanSpeed_v2, dev, 0);
    if (!g->fans) OUT(NVML_ERROR_NOT_SUPPORTED);
    NEED(speed && fan < g->fans);
    *speed = (unsigned int)g->fan_speed;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPerformanceState
U32_GETTER(nvmlDeviceGetPerformanceState, pstate)
#endif
#ifndef OMIT_nvmlDeviceGetPowerState
U32_GETTER(nvmlDeviceGetPowerState, pstate)
#endif

/* ================= health depth ================= */

#ifndef OMIT_nvmlDeviceGetEccMode
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending)
{
    DEV(nvmlDeviceGetEccMode, dev, 0);
    NEED(current && pending);
    *current = (unsigned int)g->ecc_mode;
    *pending = (unsigned int)g->ecc_pending;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTotalEccErrors
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int error_type, int counter_type,
                                             unsigned long long *count)
{
    DEV(nvmlDeviceGetTotalEccErrors, dev, 0);
    NEED(count && (error_type == 0 || error_type == 1) && (counter_type == 0 || counter_type == 1));
    if (!g->ecc_mode) OUT(NVML_ERROR_NOT_SUPPORTED);
    if (error_type == 0) *count = counter_type ? g->ecc_corrected_aggregate : g->ecc_corrected_volatile;
    else *count = counter_type ? g->ecc_uncorrected_aggregate : g->ecc_uncorrected_volatile;
    OUT(NVML_SUCCESS);
}
#endif

static nvmlReturn_t retired(const struct gpu *g, int cause, unsigned int *count, unsigned long long *addrs,
                            unsigned long long *times)
{
    if (!count || (cause != 0 && cause != 1)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct page *pages = cause ? g->dbe : g->sbe;
    unsigned int n = (unsigned int)(cause ? g->n_dbe : g->n_sbe);
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !addrs) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        addrs[i] = pages[i].addr;
        if (times) times[i] = pages[i].ts;
    }
    *count = n;
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlDeviceGetRetiredPages
API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *count,
                                           unsigned long long *addresses)
{
    DEV(nvmlDeviceGetRetiredPages, dev, 0);
    OUT(retired(g, cause, count, addresses, NULL));
}
#endif

#ifndef OMIT_nvmlDeviceGetRetiredPages_v2
API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, int cause, unsigned int *count,
                                              unsigned long long *addresses, unsigned long long *timestamps)
{
    DEV(nvmlDeviceGetRetiredPages_v2, dev, 0);
    OUT(retired(g, cause, count, addresses, timestamps));
}
#endif

#ifndef OMIT_nvmlDeviceGetRetiredPagesPendingStatus
U32_GETTER(nvmlDeviceGetRetiredPagesPendingStatus, retired_pending)
#endif

#ifndef OMIT_nvmlDeviceGetRemappedRows
API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                           unsigned int *pending, unsigned int *failure)
{
    DEV(nvmlDeviceGetRemappedRows, dev, 0);
    NEED(corr && unc && pending && failure);
    *corr = (unsigned int)g->remap_corr;
    *unc = (unsigned int)g->remap_unc;
    *pending = (unsigned int)g->remap_pending;
    *failure = (unsigned int)g->remap_failure;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
U64_GETTER(nvmlDeviceGetCurrentClocksEventReasons, clocks_event_reasons)
#endif
#ifndef OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
U64_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, clocks_event_reasons)
#endif
#ifndef OMIT_nvmlDeviceGetSupportedClocksEventReasons
U64_GETTER(nvmlDeviceGetSupportedClocksEventReasons, supported_clocks_event_reasons)
#endif
#ifndef OMIT_nvmlDeviceGetSupportedClocksThrottleReasons
U64_GETTER(nvmlDeviceGetSupportedClocksThrottleReasons, supported_clocks_event_reasons)
#endif

#ifndef OMIT_nvmlDeviceGetViolationStatus
API nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t dev, int policy, nvmlViolationTime_t *v)
{
    DEV(nvmlDeviceGetViolationStatus, dev, 0);
    NEED(v && ((policy >= 0 && policy <= 5) || policy == 10 || policy == 11));
    v->referenceTime = g->violation_ref;
    v->violationTime = g->violation[policy];
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPcieReplayCounter
U32_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay)
#endif

#ifndef OMIT_nvmlDeviceGetPcieThroughput
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kbps)
{
    DEV(nvmlDeviceGetPcieThroughput, dev, 0);
    NEED(kbps && (counter == 0 || counter == 1));
    *kbps = (unsigned int)(counter ? g->pcie_rx_kbps : g->pcie_tx_kbps);
    OUT(NVML_SUCCESS);
}
#endif

/* Second device of a pair call: a full GPU, present, not lost. Read lock held. */
static nvmlReturn_t second_gpu(nvmlDevice_t dev, int *index)
{
    int slot;
    if (decode(dev, index, &slot) || slot >= 0 || (uint64_t)*index >= cfg.count) return NVML_ERROR_INVALID_ARGUMENT;
    return cfg.gpus[*index].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

#ifndef OMIT_nvmlDeviceGetP2PStatus
API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t dev1, nvmlDevice_t dev2, int index, int *status)
{
    DEV(nvmlDeviceGetP2PStatus, dev1, 0);
    int j;
    nvmlReturn_t rc = second_gpu(dev2, &j);
    if (rc) OUT(rc);
    NEED(status && index >= 0 && index < P2P_INDICES);
    int8_t v = cfg.p2p[gidx][j][index];
    *status = v < 0 ? 0 : v;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTopologyCommonAncestor
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t dev1, nvmlDevice_t dev2, int *level)
{
    DEV(nvmlDeviceGetTopologyCommonAncestor, dev1, 0);
    int j;
    nvmlReturn_t rc = second_gpu(dev2, &j);
    if (rc) OUT(rc);
    NEED(level);
    int8_t v = cfg.topo[gidx][j];
    if (v >= 0) *level = v;
    else if (gidx == j) *level = 0;
    else *level = g->numa == cfg.gpus[j].numa ? 40 : 50;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetNvLinkState
API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active)
{
    DEV(nvmlDeviceGetNvLinkState, dev, 0);
    if (!g->nvlinks) OUT(NVML_ERROR_NOT_SUPPORTED);
    NEED(active && link < g->nvlinks && link < MAX_LINKS);
    *active = g->nvlink_active[link];
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetNvLinkErrorCounter
API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, int counter,
                                                 unsigned long long *value)
{
    DEV(nvmlDeviceGetNvLinkErrorCounter, dev, 0);
    if (!g->nvlinks) OUT(NVML_ERROR_NOT_SUPPORTED);
    NEED(value && link < g->nvlinks && link < MAX_LINKS && counter >= 0 && counter < NVLINK_COUNTERS);
    *value = g->nvlink_err[link][counter];
    OUT(NVML_SUCCESS);
}
#endif

/* An engine's utilisation: (percent, sampling period in us); the JPEG decoder (NVJPG) and optical flow (OFA)
 * engines since R535 */
#define ENGINE_UTIL(name, u, per) \
API nvmlReturn_t name(nvmlDevice_t dev, unsigned int *util, unsigned int *period_us) \
{ \
    DEV(name, dev, 0); \
    NEED(util && period_us); \
    *util = (unsigned int)g->u; \
    *period_us = (unsigned int)g->per; \
    OUT(NVML_SUCCESS); \
}
#ifndef OMIT_nvmlDeviceGetEncoderUtilization
ENGINE_UTIL(nvmlDeviceGetEncoderUtilization, enc_util, enc_period_us)
#endif
#ifndef OMIT_nvmlDeviceGetDecoderUtilization
ENGINE_UTIL(nvmlDeviceGetDecoderUtilization, dec_util, dec_period_us)
#endif
#ifndef OMIT_nvmlDeviceGetJpgUtilization
ENGINE_UTIL(nvmlDeviceGetJpgUtilization, jpg_util, jpg_period_us)
#endif
#ifndef OMIT_nvmlDeviceGetOfaUtilization
ENGINE_UTIL(nvmlDeviceGetOfaUtilization, ofa_util, ofa_period_us)
#endif

/* Process lists: `*count` too small (or NULL array) -> INSUFFICIENT_SIZE with the
 * needed count; no processes -> SUCCESS with count 0.  A MIG handle sees only
 * the processes of its GPU/compute instance. */
static nvmlReturn_t proc_list(const struct proc *procs, int n, const struct mig *m, unsigned int *count,
                              nvmlProcessInfo_t *infos)
{
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int want = 0;
    for (int i = 0; i < n; i++)
        if (!m || (procs[i].gi == m->gi && procs[i].ci == m->ci)) want++;
    if (*count < want || (want && !infos)) {
        *count = want;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < n; i++) {
        if (m && (procs[i].gi != m->gi || procs[i].ci != m->ci)) continue;
        infos[k].pid = procs[i].pid;
        infos[k].usedGpuMemory = procs[i].used;
        infos[k].gpuInstanceId = procs[i].gi;
        infos[k].computeInstanceId = procs[i].ci;
        k++;
    }
    *count = k;
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses
/* The unversioned (v1) symbol of drivers before R470: nvmlProcessInfo_v1_t is {pid, usedGpuMemory}. */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int *count,
                                                      nvmlProcessInfo_v1_t *infos)
{
    DEV(nvmlDeviceGetComputeRunningProcesses, dev, MIG_OK);
    nvmlProcessInfo_t full[MAX_PROCS];
    unsigned int n = infos ? (*count < MAX_PROCS ? *count : MAX_PROCS) : 0;
    nvmlReturn_t rc = proc_list(g->procs, g->n_procs, m, &n, infos ? full : NULL);
    if (rc == NVML_SUCCESS)
        for (unsigned int i = 0; i < n; i++) {
            infos[i].pid = full[i].pid;
            infos[i].usedGpuMemory = full[i].usedGpuMemory;
        }
    *count = n;
    OUT(rc);
}
#endif
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count,
                                                         nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetComputeRunningProcesses_v2, dev, MIG_OK);
    OUT(proc_list(g->procs, g->n_procs, m, count, infos));
}
#endif
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                         nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetComputeRunningProcesses_v3, dev, MIG_OK);
    OUT(proc_list(g->procs, g->n_procs, m, count, infos));
}
#endif
#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count,
                                                          nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetGraphicsRunningProcesses_v2, dev, MIG_OK);
    OUT(proc_list(g->gprocs, g->n_gprocs, m, count, infos));
}
#endif
#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                          nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetGraphicsRunningProcesses_v3, dev, MIG_OK);
    OUT(proc_list(g->gprocs, g->n_gprocs, m, count, infos));
}
#endif

/* ================= MIG ================= */

#ifndef OMIT_nvmlDeviceGetMigMode
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending)
{
    DEV(nvmlDeviceGetMigMode, dev, 0);
    NEED(current && pending);
    *current = (unsigned int)g->mig_mode;
    *pending = (unsigned int)g->mig_pending;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMaxMigDeviceCount
U32_GETTER(nvmlDeviceGetMaxMigDeviceCount, mig_max)
#endif

#ifndef OMIT_nvmlDeviceGetMigDeviceHandleByIndex
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig)
{
    DEV(nvmlDeviceGetMigDeviceHandleByIndex, dev, 0);
    NEED(mig && index < g->mig_max && index < MAX_MIG);
    if (!g->mig_mode || !g->mig[index].present) OUT(NVML_ERROR_NOT_FOUND);
    *mig = &mig_handles[gidx][index];
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceIsMigDeviceHandle
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig)
{
    DEV(nvmlDeviceIsMigDeviceHandle, dev, MIG_OK);
    NEED(is_mig);
    *is_mig = m != NULL;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetDeviceHandleFromMigDeviceHandle
API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *dev)
{
    DEV(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, mig, MIG_OK);
    NEED(m && dev);
    *dev = &gpu_handles[gidx];
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetGpuInstanceId
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    DEV(nvmlDeviceGetGpuInstanceId, dev, MIG_ONLY);
    NEED(id);
    *id = (unsigned int)m->gi;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeInstanceId
API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    DEV(nvmlDeviceGetComputeInstanceId, dev, MIG_ONLY);
    NEED(id);
    *id = (unsigned int)m->ci;
    OUT(NVML_SUCCESS);
}
#endif

/* ================= events ================= */

static struct nvmlEventSet_st *valid_set(nvmlEventSet_t set)
{
    uintptr_t p = (uintptr_t)set, s0 = (uintptr_t)&event_sets[0];
    if (p < s0 || p >= s0 + sizeof event_sets || (p - s0) % sizeof event_sets[0]) return NULL;
    return set->in_use ? set : NULL;
}

#ifndef OMIT_nvmlEventSetCreate
API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    SYS(nvmlEventSetCreate);
    NEED(set);
    pthread_mutex_lock(&ev_mu);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!event_sets[i].in_use) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].in_use = 1;
            *set = &event_sets[i];
            pthread_mutex_unlock(&ev_mu);
            OUT(NVML_SUCCESS);
        }
    }
    pthread_mutex_unlock(&ev_mu);
    OUT(NVML_ERROR_MEMORY);
}
#endif

#ifndef OMIT_nvmlEventSetFree
API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    SYS(nvmlEventSetFree);
    pthread_mutex_lock(&ev_mu);
    struct nvmlEventSet_st *s = valid_set(set);
    if (s) s->in_use = 0;
    pthread_mutex_unlock(&ev_mu);
    OUT(s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}
#endif

#ifndef OMIT_nvmlDeviceGetSupportedEventTypes
U64_GETTER(nvmlDeviceGetSupportedEventTypes, supported_events)
#endif

#ifndef OMIT_nvmlDeviceRegisterEvents
API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set)
{
    DEV(nvmlDeviceRegisterEvents, dev, 0);
    if (types & ~g->supported_events) OUT(NVML_ERROR_NOT_SUPPORTED);
    pthread_mutex_lock(&ev_mu);
    struct nvmlEventSet_st *s = valid_set(set);
    if (s) s->mask[gidx] |= types;
    pthread_mutex_unlock(&ev_mu);
    OUT(s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}
#endif

/* One poll of the queue. Read lock held. SUCCESS (event written), TIMEOUT (none yet) or an error. */
static nvmlReturn_t poll_events(int fid, nvmlEventSet_t set, nvmlEventData_t *data, int v2)
{
    if (!refcount) return NVML_ERROR_UNINITIALIZED;
    int rc = hang_while_injected(fid, NULL);  /* FAKE_HANG: the wait never returns while injected */
    if (rc) return rc;
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&ev_mu);
    struct nvmlEventSet_st *s = valid_set(set);
    if (!s) { pthread_mutex_unlock(&ev_mu); return NVML_ERROR_INVALID_ARGUMENT; }
    for (int i = 0; i < cfg.n_events; i++) {
        const struct event *e = &cfg.events[i];
        if (e->gpu >= cfg.count || !(s->mask[e->gpu] & EVENT_XID)) continue;
        if (delivered[e->seq / 8] & (1u << (e->seq % 8))) continue;
        delivered[e->seq / 8] |= (uint8_t)(1u << (e->seq % 8));
        pthread_mutex_unlock(&ev_mu);
        data->device = &gpu_handles[e->gpu];
        data->eventType = EVENT_XID;
        data->eventData = e->xid;
        if (v2) data->gpuInstanceId = data->computeInstanceId = NOT_AVAILABLE_U32;
        return NVML_SUCCESS;
    }
    /* Real NVML reports a fallen-off GPU from the wait itself. */
    for (uint64_t gpu = 0; gpu < cfg.count; gpu++) {
        if (s->mask[gpu] && cfg.gpus[gpu].lost) { pthread_mutex_unlock(&ev_mu); return NVML_ERROR_GPU_IS_LOST; }
    }
    pthread_mutex_unlock(&ev_mu);
    return NVML_ERROR_TIMEOUT;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* Wait in 2 ms steps, re-reading the fleet file each step (no lock held while asleep). */
static nvmlReturn_t event_wait(int fid, nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms, int v2)
{
    uint64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        enter_read();
        nvmlReturn_t rc = poll_events(fid, set, data, v2);
        pthread_rwlock_unlock(&lock);
        if (rc != NVML_ERROR_TIMEOUT) return rc;
        uint64_t now = now_ms();
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        uint64_t step = deadline - now < 2 ? deadline - now : 2;
        struct timespec ts = { 0, (long)step * 1000000L };
        nanosleep(&ts, NULL);
    }
}

#ifndef OMIT_nvmlEventSetWait_v2
API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    return event_wait(F_nvmlEventSetWait_v2, set, data, timeout_ms, 1);
}
#endif

#ifndef OMIT_nvmlEventSetWait
/* The v1 struct ends after eventData: gpuInstanceId/computeInstanceId are not written. */
API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    return event_wait(F_nvmlEventSetWait, set, data, timeout_ms, 0);
}
#endif

/* ================= GPM ================= */

struct nvmlGpmSample_st {
    int in_use, filled, gpu;
    uint32_t gi;             /* GPU instance, or NOT_AVAILABLE_U32 for the whole GPU */
    uint64_t seq;            /* order of the sample-get calls */
    int n, n_fail;
    struct gpm_val val[MAX_GPM_VALS];
    struct field_fail fail[MAX_FIELD_FAILS];
};
static struct nvmlGpmSample_st gpm_samples[MAX_GPM_SAMPLES];
static pthread_mutex_t gpm_mu = PTHREAD_MUTEX_INITIALIZER;  /* gpm_samples, gpm_seq, gpm_live */
static uint64_t gpm_seq;
static unsigned long gpm_live;
static uint8_t gpm_streaming[MAX_GPUS];

/* Test hook (not NVML): samples allocated and not yet freed. */
API unsigned long fakeNvmlGpmLiveSamples(void)
{
    pthread_mutex_lock(&gpm_mu);
    unsigned long n = gpm_live;
    pthread_mutex_unlock(&gpm_mu);
    return n;
}

/* A sample handle from our pool that is allocated; gpm_mu held. */
static struct nvmlGpmSample_st *valid_sample(nvmlGpmSample_t s)
{
    uintptr_t p = (uintptr_t)s, s0 = (uintptr_t)&gpm_samples[0];
    if (p < s0 || p >= s0 + sizeof gpm_samples || (p - s0) % sizeof gpm_samples[0]) return NULL;
    return s->in_use ? s : NULL;
}

struct gpm_info { uint32_t id; char *short_name, *long_name, *unit; };
static const struct gpm_info gpm_infos[] = {
    { 1, "GR_UTIL", "graphics/compute engine active", "%" },
    { 2, "SM_UTIL", "SMs busy", "%" },
    { 3, "SM_OCCUPANCY", "warps resident vs theoretical maximum", "%" },
    { 4, "INTEGER_UTIL", "SM integer pipe active", "%" },
    { 5, "ANY_TENSOR_UTIL", "SM any tensor pipe active", "%" },
    { 6, "DFMA_TENSOR_UTIL", "SM DFMA tensor pipe active", "%" },
    { 7, "HMMA_TENSOR_UTIL", "SM HMMA tensor pipe active", "%" },
    { 8, "DMMA_TENSOR_UTIL", "SM DMMA tensor pipe active", "%" },
    { 9, "IMMA_TENSOR_UTIL", "SM IMMA tensor pipe active", "%" },
    { 10, "DRAM_BW_UTIL", "DRAM bandwidth vs theoretical maximum", "%" },
    { 11, "FP64_UTIL", "SM non-tensor FP64 pipe active", "%" },
    { 12, "FP32_UTIL", "SM non-tensor FP32 pipe active", "%" },
    { 13, "FP16_UTIL", "SM non-tensor FP16 pipe active", "%" },
    { 20, "PCIE_TX_PER_SEC", "PCIe traffic from the GPU", "MiB/sec" },
    { 21, "PCIE_RX_PER_SEC", "PCIe traffic to the GPU", "MiB/sec" },
    { 60, "NVLINK_TOTAL_RX_PER_SEC", "NVLink read bandwidth, all links", "MiB/sec" },
    { 61, "NVLINK_TOTAL_TX_PER_SEC", "NVLink write bandwidth, all links", "MiB/sec" },
};

static const struct gpm_info *gpm_info_of(uint32_t id)
{
    for (size_t i = 0; i < sizeof gpm_infos / sizeof gpm_infos[0]; i++)
        if (gpm_infos[i].id == id) return &gpm_infos[i];
    return NULL;
}

/* Device functions that need a GPM-capable full GPU; read lock held. */
static nvmlReturn_t gpm_capable(const struct gpu *g) { return g->gpm_supported ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED; }

#ifndef OMIT_nvmlGpmQueryDeviceSupport
API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support)
{
    DEV(nvmlGpmQueryDeviceSupport, dev, 0);
    NEED(support);
    if (support->version != NVML_GPM_SUPPORT_VERSION) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = g->gpm_supported ? 1 : 0;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleAlloc
API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample)
{
    SYS(nvmlGpmSampleAlloc);
    NEED(sample);
    pthread_mutex_lock(&gpm_mu);
    for (int i = 0; i < MAX_GPM_SAMPLES; i++) {
        if (!gpm_samples[i].in_use) {
            memset(&gpm_samples[i], 0, sizeof gpm_samples[i]);
            gpm_samples[i].in_use = 1;
            gpm_live++;
            *sample = &gpm_samples[i];
            pthread_mutex_unlock(&gpm_mu);
            OUT(NVML_SUCCESS);
        }
    }
    pthread_mutex_unlock(&gpm_mu);
    OUT(NVML_ERROR_MEMORY);
}
#endif

#ifndef OMIT_nvmlGpmSampleFree
API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample)
{
    SYS(nvmlGpmSampleFree);
    pthread_mutex_lock(&gpm_mu);
    struct nvmlGpmSample_st *s = valid_sample(sample);
    if (s) {
        s->in_use = 0;
        gpm_live--;
    }
    pthread_mutex_unlock(&gpm_mu);
    OUT(s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}
#endif

/* Fill a sample from a value table (read lock held); INVALID_ARGUMENT for a bad handle. */
static nvmlReturn_t fill_sample(nvmlGpmSample_t sample, int gpu, uint32_t gi, const struct gpm_val *vals, int n,
                                const struct gpu *g)
{
    pthread_mutex_lock(&gpm_mu);
    struct nvmlGpmSample_st *s = valid_sample(sample);
    if (!s) { pthread_mutex_unlock(&gpm_mu); return NVML_ERROR_INVALID_ARGUMENT; }
    s->filled = 1;
    s->gpu = gpu;
    s->gi = gi;
    s->seq = ++gpm_seq;
    s->n = n;
    memcpy(s->val, vals, (size_t)n * sizeof *vals);
    s->n_fail = g->n_gpm_fail;
    memcpy(s->fail, g->gpm_fail, (size_t)g->n_gpm_fail * sizeof *g->gpm_fail);
    pthread_mutex_unlock(&gpm_mu);
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlGpmSampleGet
API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample)
{
    DEV(nvmlGpmSampleGet, dev, 0);
    nvmlReturn_t rc = gpm_capable(g);
    if (rc) OUT(rc);
    OUT(fill_sample(sample, gidx, NOT_AVAILABLE_U32, g->gpm, g->n_gpm, g));
}
#endif

#ifndef OMIT_nvmlGpmMigSampleGet
API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned int gpu_instance_id, nvmlGpmSample_t sample)
{
    DEV(nvmlGpmMigSampleGet, dev, 0);
    nvmlReturn_t rc = gpm_capable(g);
    if (rc) OUT(rc);
    if (!g->mig_mode) OUT(NVML_ERROR_NOT_SUPPORTED);
    for (int slot = 0; slot < MAX_MIG; slot++) {
        const struct mig *mi = &g->mig[slot];
        if (mi->present && mi->gi == gpu_instance_id)
            OUT(fill_sample(sample, gidx, gpu_instance_id, mi->gpm, mi->n_gpm, g));
    }
    OUT(NVML_ERROR_NOT_FOUND);
}
#endif

#ifndef OMIT_nvmlGpmMetricsGet
API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg)
{
    SYS(nvmlGpmMetricsGet);
    NEED(mg);
    if (mg->version != NVML_GPM_METRICS_GET_VERSION) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    NEED(mg->numMetrics <= GPM_METRIC_MAX);
    /* Copy sample2 under the pool lock: another thread may refill it meanwhile. */
    static __thread struct nvmlGpmSample_st b;
    pthread_mutex_lock(&gpm_mu);
    const struct nvmlGpmSample_st *s1 = valid_sample(mg->sample1), *s2 = valid_sample(mg->sample2);
    int ok = s1 && s2 && s1->filled && s2->filled && s1->gpu == s2->gpu && s1->gi == s2->gi && s2->seq > s1->seq;
    if (ok) b = *s2;
    pthread_mutex_unlock(&gpm_mu);
    if (!ok) OUT(NVML_ERROR_INVALID_ARGUMENT);
    if ((uint64_t)b.gpu >= cfg.count) OUT(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = check_gpu(F_nvmlGpmMetricsGet, &cfg.gpus[b.gpu]);
    if (rc) OUT(rc);
    for (unsigned int i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *mt = &mg->metrics[i];
        const struct gpm_info *info = gpm_info_of(mt->metricId);
        mt->value = 0;
        mt->metricInfo.shortName = info ? info->short_name : NULL;
        mt->metricInfo.longName = info ? info->long_name : NULL;
        mt->metricInfo.unit = info ? info->unit : NULL;
        if (mt->metricId == 0 || mt->metricId >= GPM_METRIC_MAX) { mt->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; continue; }
        mt->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (int k = 0; k < b.n; k++)
            if (b.val[k].id == mt->metricId) { mt->nvmlReturn = NVML_SUCCESS; mt->value = b.val[k].v; }
        for (int k = 0; k < b.n_fail; k++)
            if (b.fail[k].id == mt->metricId) { mt->nvmlReturn = b.fail[k].code; mt->value = 0; }
    }
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSetStreamingEnabled
API nvmlReturn_t nvmlGpmSetStreamingEnabled(nvmlDevice_t dev, unsigned int state)
{
    DEV(nvmlGpmSetStreamingEnabled, dev, 0);
    nvmlReturn_t rc = gpm_capable(g);
    if (rc) OUT(rc);
    NEED(state <= 1);
    __atomic_store_n(&gpm_streaming[gidx], (uint8_t)state, __ATOMIC_RELAXED);
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmQueryIfStreamingEnabled
API nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t dev, unsigned int *state)
{
    DEV(nvmlGpmQueryIfStreamingEnabled, dev, 0);
    nvmlReturn_t rc = gpm_capable(g);
    if (rc) OUT(rc);
    NEED(state);
    *state = __atomic_load_n(&gpm_streaming[gidx], __ATOMIC_RELAXED);
    OUT(NVML_SUCCESS);
}
#endif

/* ================= per-process utilisation and MPS clients (shared GPUs, issue 25) =================
 * Fleet keys, per GPU:
 *   gpu.<i>.proc_util=<pid>:<sm>[:<mem>:<enc>:<dec>[:<ts_us>]],...  utilisation samples (percent).
 *        Without ts a sample is stamped "now" at each call, so it is always newer than the caller's
 *        lastSeenTimeStamp; with ts it is returned only while ts > lastSeenTimeStamp. No sample left:
 *        NVML_ERROR_NOT_FOUND, as NVML answers when no sample is newer.
 *   gpu.<i>.mps_procs=<pid>:<bytes>,...   MPS client processes (nvmlDeviceGetMPSComputeRunningProcesses_v3/_v2);
 *        on an MPS GPU the compute list holds the MPS server (nvidia-cuda-mps-server) only.
 * Utilisation samples on a MIG handle, or on a GPU in MIG mode: NOT_SUPPORTED.
 * Size query: a NULL array (or a count too small) gets INSUFFICIENT_SIZE and the count needed.
 */
struct putil { uint32_t pid, sm, mem, enc, dec; uint64_t ts; };
static struct putil putils[MAX_GPUS][MAX_PROCS];
static int n_putils[MAX_GPUS];
static struct proc mps[MAX_GPUS][MAX_PROCS];
static int n_mps[MAX_GPUS];

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;
typedef struct {
    unsigned int version, processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t layout");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_t) == 0x18, "nvmlProcessesUtilizationInfo_t layout");
#define PROCESSES_UTILIZATION_INFO_V1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_t) | (1u << 24)))

static void reset_shared(void)
{
    memset(n_putils, 0, sizeof n_putils);
    memset(n_mps, 0, sizeof n_mps);
}

static int parse_shared_key(int gpu, const char *key, char *val)
{
    if (gpu < 0 || gpu >= MAX_GPUS) return 0;
    if (!strcmp(key, "mps_procs")) {
        n_mps[gpu] = parse_procs(val, mps[gpu]);
        return 1;
    }
    if (strcmp(key, "proc_util")) return 0;
    int n = 0;
    char *save, *tok;
    for (tok = strtok_r(val, ",", &save); tok && n < MAX_PROCS; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long f[6] = { 0, 0, 0, 0, 0, 0 };
        char *s2, *p;
        int k = 0;
        for (p = strtok_r(tok, ":", &s2); p && k < 6; p = strtok_r(NULL, ":", &s2)) f[k++] = strtoull(p, NULL, 0);
        if (k < 2) continue;
        putils[gpu][n++] = (struct putil){ (uint32_t)f[0], (uint32_t)f[1], (uint32_t)f[2], (uint32_t)f[3],
                                           (uint32_t)f[4], k > 5 ? f[5] : 0 };
    }
    n_putils[gpu] = n;
    return 1;
}

static unsigned long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

/* The samples of GPU gidx newer than `since` (each stamped), at most MAX_PROCS. */
static int newer_samples(int gidx, unsigned long long since, struct putil *out)
{
    unsigned long long now = now_us();
    int k = 0;
    for (int i = 0; i < n_putils[gidx]; i++) {
        struct putil u = putils[gidx][i];
        if (!u.ts) u.ts = now;
        if (u.ts > since) out[k++] = u;
    }
    return k;
}

#ifndef OMIT_nvmlDeviceGetProcessUtilization
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp)
{
    DEV(nvmlDeviceGetProcessUtilization, dev, 0);
    NEED(processSamplesCount);
    if (g->mig_mode) OUT(NVML_ERROR_NOT_SUPPORTED);
    struct putil got[MAX_PROCS];
    int n = newer_samples(gidx, lastSeenTimeStamp, got);
    if (!n) OUT(NVML_ERROR_NOT_FOUND);
    if (!utilization || *processSamplesCount < (unsigned int)n) {
        *processSamplesCount = (unsigned int)n;
        OUT(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (int i = 0; i < n; i++)
        utilization[i] = (nvmlProcessUtilizationSample_t){ got[i].pid, got[i].ts, got[i].sm, got[i].mem,
                                                           got[i].enc, got[i].dec };
    *processSamplesCount = (unsigned int)n;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetProcessesUtilizationInfo
API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t dev, nvmlProcessesUtilizationInfo_t *info)
{
    DEV(nvmlDeviceGetProcessesUtilizationInfo, dev, 0);
    NEED(info);
    if (info->version != PROCESSES_UTILIZATION_INFO_V1) OUT(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->mig_mode) OUT(NVML_ERROR_NOT_SUPPORTED);
    struct putil got[MAX_PROCS];
    int n = newer_samples(gidx, info->lastSeenTimeStamp, got);
    if (!n) OUT(NVML_ERROR_NOT_FOUND);
    if (!info->procUtilArray || info->processSamplesCount < (unsigned int)n) {
        info->processSamplesCount = (unsigned int)n;
        OUT(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (int i = 0; i < n; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){ got[i].ts, got[i].pid, got[i].sm, got[i].mem,
                                                                    got[i].enc, got[i].dec, 0, 0 };
    info->processSamplesCount = (unsigned int)n;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMPSComputeRunningProcesses_v2
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetMPSComputeRunningProcesses_v2, dev, MIG_OK);
    OUT(proc_list(mps[gidx], n_mps[gidx], m, count, infos));
}
#endif
#ifndef OMIT_nvmlDeviceGetMPSComputeRunningProcesses_v3
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    DEV(nvmlDeviceGetMPSComputeRunningProcesses_v3, dev, MIG_OK);
    OUT(proc_list(mps[gidx], n_mps[gidx], m, count, infos));
}
#endif

/* ---- issue 28: default power limit, compute mode, VBIOS version, fabric state ----
 * (the recovery action is field 230 of nvmlDeviceGetFieldValues, above). */
#ifndef OMIT_nvmlDeviceGetPowerManagementDefaultLimit
U32_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, default_limit_mw)
#endif

#ifndef OMIT_nvmlDeviceGetComputeMode
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode)  /* nvmlComputeMode_t */
{
    DEV(nvmlDeviceGetComputeMode, dev, 0);
    NEED(mode);
    *mode = (int)g->compute_mode;
    OUT(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetVbiosVersion
API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *version, unsigned int length)
{
    DEV(nvmlDeviceGetVbiosVersion, dev, 0);
    OUT(put_str(version, length, g->vbios_version));
}
#endif

#ifndef OMIT_nvmlDeviceGetGpuFabricInfo
/* nvmlGpuFabricInfo_t (nvml.h, R525+): nvmlGpuFabricState_t is an unsigned char. */
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info)
{
    DEV(nvmlDeviceGetGpuFabricInfo, dev, 0);
    NEED(info);
    memset(info, 0, sizeof *info);
    info->status = (nvmlReturn_t)g->fabric_status;
    info->cliqueId = 1;
    info->state = (unsigned char)g->fabric_state;
    OUT(NVML_SUCCESS);
}
#endif

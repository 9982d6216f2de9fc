/* A stand-in for Iluvatar's libixml.so, for tests: the same exported symbols and calling
 * conventions (NVML names plus ixmlDeviceGetBoardPosition / ixmlDeviceGetHealth /
 * ixmlDeviceGetEccErros), serving devices
 * scripted in the text file named by $FAKE_IXML_SCRIPT, re-read on every nvmlDeviceGetCount_v2.
 * Without that variable the script is the file "fake-ixml-devices" in the directory above the
 * library's own (<driver root>/fake-ixml-devices for <driver root>/lib64/libixml.so), so a process
 * that only has the driver root mounted, as a device plugin container does, finds its devices.
 *
 * Script lines:  <uuid> <minor> <board> <position> <health-hex> <memory-MiB> <pci-bus-hex> [word...]
 *                fail <code>     -- nvmlDeviceGetCount_v2 returns <code> (library failing)
 *                name <product>  -- the product name every chip reports (default Iluvatar BI-V150)
 * Words: "lost" makes every query of that chip fail with NVML_ERROR_GPU_IS_LOST (15); telemetry
 * as key=value: util=<gpu %> memutil=<memory %> used=<MiB> temp=<C> power=<mW> sm=<MHz>
 * memclk=<MHz> sbe=<single-bit ECC errors> dbe=<double-bit ECC errors> (both or neither). A
 * telemetry call whose value the line does not give fails with
 * NVML_ERROR_NOT_SUPPORTED (3).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

enum { UTIL, MEMUTIL, USED, TEMP, POWER, SM, MEMCLK, SBE, DBE, NFIGURES };
static const char *figure_keys[NFIGURES] = {"util", "memutil", "used", "temp", "power", "sm", "memclk", "sbe", "dbe"};

typedef struct {
    char uuid[80];
    unsigned int minor, board, position, bus, lost;
    unsigned long long health, memory_mib;
    int has[NFIGURES];
    unsigned long long value[NFIGURES];
} fake_dev;

static fake_dev devs[64];
static unsigned int ndevs;
static int initialised;
static int fail_code;
static char product[96];

static void load(void);

/* <dir of this library>/../fake-ixml-devices */
static FILE *open_default_script(void) {
    Dl_info info;
    char path[4096];
    char *slash;
    if (!dladdr((void *)load, &info) || !info.dli_fname) return NULL;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    for (int up = 0; up < 2; up++) {
        slash = strrchr(path, '/');
        if (!slash) return NULL;
        *slash = '\0';
    }
    strncat(path, "/fake-ixml-devices", sizeof path - strlen(path) - 1);
    return fopen(path, "r");
}

static void load(void) {
    const char *path = getenv("FAKE_IXML_SCRIPT");
    FILE *f = path ? fopen(path, "r") : open_default_script();
    char line[512];
    ndevs = 0;
    fail_code = 0;
    snprintf(product, sizeof product, "Iluvatar BI-V150");
    if (!f) return;
    while (fgets(line, sizeof line, f) && ndevs < 64) {
        fake_dev *d = &devs[ndevs];
        if (strncmp(line, "name ", 5) == 0) {
            snprintf(product, sizeof product, "%s", line + 5);
            product[strcspn(product, "\r\n")] = '\0';
            continue;
        }
        if (sscanf(line, "fail %d", &fail_code) == 1) continue;
        int used = 0;
        memset(d, 0, sizeof *d);
        if (sscanf(line, "%79s %u %u %u %llx %llu %x%n", d->uuid, &d->minor, &d->board, &d->position,
                   &d->health, &d->memory_mib, &d->bus, &used) >= 7) {
            for (char *word = strtok(line + used, " \t\r\n"); word; word = strtok(NULL, " \t\r\n")) {
                if (strcmp(word, "lost") == 0) { d->lost = 1; continue; }
                for (int k = 0; k < NFIGURES; k++) {
                    size_t n = strlen(figure_keys[k]);
                    if (strncmp(word, figure_keys[k], n) == 0 && word[n] == '=') {
                        d->value[k] = strtoull(word + n + 1, NULL, 10);
                        d->has[k] = 1;
                    }
                }
            }
            ndevs++;
        }
    }
    fclose(f);
}

#define DEV(h) ((fake_dev *)(h))
#define CHECK(h) do { if (!initialised) return 1; if (DEV(h)->lost) return 15; } while (0)

nvmlReturn_t nvmlInit_v2(void) { initialised = 1; load(); return 0; }
nvmlReturn_t nvmlShutdown(void) { initialised = 0; return 0; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 15: return "GPU is lost";
    case 999: return "Unknown Error";
    default: return "Fake error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return 1;
    load();
    if (fail_code) return fail_code;
    *count = ndevs;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (!initialised) return 1;
    if (index >= ndevs) return 2;
    if (devs[index].lost) return 15;
    *handle = &devs[index];
    return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(void *h, char *buf, unsigned int len) {
    CHECK(h); snprintf(buf, len, "%s", DEV(h)->uuid); return 0;
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *buf, unsigned int len) {
    CHECK(h); snprintf(buf, len, "%s", product); return 0;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned int *minor) {
    CHECK(h); *minor = DEV(h)->minor; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    CHECK(h);
    m->total = DEV(h)->memory_mib * 1024ULL * 1024ULL;
    m->used = DEV(h)->has[USED] ? DEV(h)->value[USED] * 1024ULL * 1024ULL : 0;
    m->free = m->total - m->used;
    return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    CHECK(h);
    if (!DEV(h)->has[UTIL] || !DEV(h)->has[MEMUTIL]) return 3;
    u->gpu = DEV(h)->value[UTIL]; u->memory = DEV(h)->value[MEMUTIL]; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) {
    CHECK(h); if (sensor != 0 || !DEV(h)->has[TEMP]) return 3; *t = DEV(h)->value[TEMP]; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
    CHECK(h); if (!DEV(h)->has[POWER]) return 3; *mw = DEV(h)->value[POWER]; return 0;
}
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned int *mhz) {
    int k = type == 1 ? SM : type == 2 ? MEMCLK : -1;
    CHECK(h); if (k < 0 || !DEV(h)->has[k]) return 3; *mhz = DEV(h)->value[k]; return 0;
}
nvmlReturn_t nvmlDeviceGetPciInfo(void *h, nvmlPciInfo_t *p) {
    CHECK(h);
    memset(p, 0, sizeof *p);
    p->domain = 0; p->bus = DEV(h)->bus; p->device = 0; p->pciDeviceId = 0x00011e3e;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", DEV(h)->bus);
    return 0;
}
nvmlReturn_t nvmlDeviceOnSameBoard(void *a, void *b, int *same) {
    CHECK(a); CHECK(b); *same = DEV(a)->board == DEV(b)->board; return 0;
}
nvmlReturn_t ixmlDeviceGetBoardPosition(void *h, unsigned int *position) {
    CHECK(h); *position = DEV(h)->position; return 0;
}
nvmlReturn_t ixmlDeviceGetHealth(void *h, unsigned long long *health) {
    CHECK(h); *health = DEV(h)->health; return 0;
}
nvmlReturn_t ixmlDeviceGetEccErros(void *h, unsigned int *single_error, unsigned int *double_error) {
    CHECK(h);
    if (!DEV(h)->has[SBE] || !DEV(h)->has[DBE]) return 3;
    *single_error = DEV(h)->value[SBE]; *double_error = DEV(h)->value[DBE]; return 0;
}

/* A stand-in for Iluvatar's libixml.so, for tests: the same exported symbols and calling
 * conventions (NVML names plus ixmlDeviceGetBoardPosition / ixmlDeviceGetHealth), serving devices
 * scripted in the text file named by $FAKE_IXML_SCRIPT, re-read on every nvmlDeviceGetCount_v2.
 * Without that variable the script is the file "fake-ixml-devices" in the directory above the
 * library's own (<driver root>/fake-ixml-devices for <driver root>/lib64/libixml.so), so a process
 * that only has the driver root mounted, as a device plugin container does, finds its devices.
 *
 * Script lines:  <uuid> <minor> <board> <position> <health-hex> <memory-MiB> <pci-bus-hex> [lost]
 *                fail <code>     -- nvmlDeviceGetCount_v2 returns <code> (library failing)
 *                name <product>  -- the product name every chip reports (default Iluvatar BI-V150)
 * "lost" makes every query of that chip fail with NVML_ERROR_GPU_IS_LOST (15).
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

typedef struct {
    char uuid[80];
    unsigned int minor, board, position, bus, lost;
    unsigned long long health, memory_mib;
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
    char line[256];
    ndevs = 0;
    fail_code = 0;
    snprintf(product, sizeof product, "Iluvatar BI-V150");
    if (!f) return;
    while (fgets(line, sizeof line, f) && ndevs < 64) {
        fake_dev *d = &devs[ndevs];
        char lost[16] = "";
        if (strncmp(line, "name ", 5) == 0) {
            snprintf(product, sizeof product, "%s", line + 5);
            product[strcspn(product, "\r\n")] = '\0';
            continue;
        }
        if (sscanf(line, "fail %d", &fail_code) == 1) continue;
        if (sscanf(line, "%79s %u %u %u %llx %llu %x %15s", d->uuid, &d->minor, &d->board, &d->position,
                   &d->health, &d->memory_mib, &d->bus, lost) >= 7) {
            d->lost = strcmp(lost, "lost") == 0;
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
    CHECK(h); m->total = DEV(h)->memory_mib * 1024ULL * 1024ULL; m->used = 0; m->free = m->total; return 0;
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

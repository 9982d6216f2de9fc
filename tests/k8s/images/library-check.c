/* The entrypoint of the library-check image: an application image that finds a library of its own
 * through its image's ENV LD_LIBRARY_PATH (/opt/imglib), run with a GPU. It prints the variable as
 * the container got it, whether its own library and the driver's (libixml.so, which only the
 * node's linker-cache hook or the webhook's variable can point to) load by name, and from where;
 * then "done", and it waits to be deleted. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void load(const char *label, const char *name) {
    void *handle = dlopen(name, RTLD_NOW);
    struct link_map *map = NULL;
    if (handle == NULL) {
        printf("%s: failed %s\n", label, dlerror());
    } else if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL) {
        printf("%s: %s\n", label, map->l_name);
    } else {
        printf("%s: loaded\n", label);
    }
}

int main(void) {
    const char *path = getenv("LD_LIBRARY_PATH");
    printf("LD_LIBRARY_PATH=%s\n", path ? path : "");
    load("image library", "libimg.so");
    load("driver library", "libixml.so");
    printf("done\n");
    fflush(stdout);
    for (;;) pause();
}

/* The pod sandbox's process: it holds the pod's namespaces open and does nothing else.
 *
 * It sleeps until SIGINT or SIGTERM, and reaps any zombie re-parented to it (it is PID 1 of the pod
 * when the pod shares its PID namespace). Built static so the image needs nothing but this binary.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) { _exit(sig == SIGTERM ? 0 : 2); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        printf("ix-gpu test pause\n");
        return 0;
    }
    struct sigaction stop = {.sa_handler = leave}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}

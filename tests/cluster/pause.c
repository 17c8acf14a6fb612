/*
 * The real test node's sandbox ("pause") image: PID 1 of every Pod sandbox.
 *
 * Holds the Pod's namespaces open, reaps children that get re-parented to it, and
 * exits on SIGTERM or SIGINT. Built with `gcc -static` by tests/cluster/images.py and
 * packed as a one-layer OCI image; its hash is part of that image's cache key.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fputs("pause: takes no arguments\n", stderr);
        return 2;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not PID 1\n", stderr);
    }
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
    return 42;
}

/* What a hostile image puts where a careless hook would execute it: its /bin/sh (the interpreter of
 * a "#!/bin/sh" script, such as Ubuntu's /sbin/ldconfig wrapper) and its program loader (the
 * PT_INTERP of a dynamic program). Freestanding (no libc) and position-independent, so the kernel
 * runs it either as a program or as another program's loader (a libc's start-up code would take
 * the loaded program's headers for its own and crash there).
 *
 * If it runs, it appends one line to /ix-gpu-payload-ran in whatever root it runs in (the image's
 * root when the hook ran it after its chroot, the host's otherwise): its argv[0], real and
 * effective uid, effective capabilities and no_new_privs bit, so a test can say how much privilege
 * the image's code got. The tests look for the file: any line in it is a failure.
 *
 * Build: gcc -O2 -nostdlib -static-pie -fPIE -fno-stack-protector -o payload payload.c
 */
#include <linux/capability.h>
#include <sys/syscall.h>

#define O_WRONLY 01
#define O_CREAT 0100
#define O_APPEND 02000
#define O_NOFOLLOW 0400000
#define AT_FDCWD -100
#define PR_GET_NO_NEW_PRIVS 39

#if defined(__x86_64__)
__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call payload_main\n hlt\n");
static long sys(long n, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = 0; /* the fifth argument, which prctl checks is zero */
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
__asm__(".globl _start\n_start:\n mov x0, sp\n bl payload_main\n");
static long sys(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = 0; /* the fifth argument, which prctl checks is zero */
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#else
#error "payload.c knows x86_64 and aarch64"
#endif

static char *put(char *out, const char *text) {
    while (*text) *out++ = *text++;
    return out;
}

static char *put_number(char *out, unsigned long value, unsigned base, int width) {
    char digits[32];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value || n < width);
    while (n) *out++ = digits[--n];
    return out;
}

void payload_main(long *stack) {
    const char *name = stack[0] > 0 ? (const char *)stack[1] : "?";
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    sys(SYS_capget, (long)&header, (long)data, 0, 0);
    char line[512];
    char *out = put(line, "ran as ");
    for (int i = 0; name[i] && i < 200; i++) *out++ = name[i];
    out = put(out, ": uid=");
    out = put_number(out, (unsigned long)sys(SYS_getuid, 0, 0, 0, 0), 10, 1);
    out = put(out, " euid=");
    out = put_number(out, (unsigned long)sys(SYS_geteuid, 0, 0, 0, 0), 10, 1);
    out = put(out, " capeff=");
    out = put_number(out, data[1].effective, 16, 8);
    out = put_number(out, data[0].effective, 16, 8);
    out = put(out, " nnp=");
    out = put_number(out, (unsigned long)sys(SYS_prctl, PR_GET_NO_NEW_PRIVS, 0, 0, 0), 10, 1);
    *out++ = '\n';
    long fd = sys(SYS_openat, AT_FDCWD, (long)"/ix-gpu-payload-ran", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644);
    if (fd >= 0) {
        sys(SYS_write, fd, (long)line, out - line, 0);
        sys(SYS_close, fd, 0, 0, 0);
    }
    sys(SYS_exit_group, 0, 0, 0, 0);
}

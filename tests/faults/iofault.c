/*
 * I/O fault injection for statestore's fault tests: an LD_PRELOAD library that
 * puts libfiu failure points on the system calls statestore, RocksDB (linked
 * statically into the extension, calling libc through the PLT) and rocksdict
 * make on the files of one directory tree, and fails them with EIO or ENOSPC.
 *
 * Why not libfiu's own fiu_posix_preload.so: it fails every call of the
 * process, so Python's imports, its pipes to the parent and malloc's mmap
 * fail as well (a Rust allocation failure aborts the process), and it cannot
 * say how many faults it injected. Here only calls on files under
 * STATESTORE_FAULT_ROOT are eligible (paths for open/rename/unlink, tracked
 * file descriptors for read/write/sync/mmap), every injected fault is logged,
 * and the decision is libfiu's: each call site is a failure point named as in
 * libfiu's POSIX preload (posix/io/rw/pwrite, ...), enabled with
 * fiu_enable_external() and a callback that draws from a seeded generator.
 *
 * Environment (read once, at load):
 *   STATESTORE_FAULT_ROOT   only files under this absolute path are faulted
 *   STATESTORE_FAULT_LOG    file to append "<site> <errno> <path>" per injected fault
 *   STATESTORE_FAULT_CALLS  file to append "<site> <calls>" per site at exit (eligible calls)
 *   STATESTORE_FAULT_PROB   probability of failing an eligible call, 0..1
 *   STATESTORE_FAULT_ERRNOS comma-separated errno values to choose from (default 5 = EIO)
 *   STATESTORE_FAULT_MAX    most faults this process injects (default 1)
 *   STATESTORE_FAULT_SEED   seed of the generator
 *   STATESTORE_FAULT_SITES  comma-separated site names to enable (default: all)
 *   STATESTORE_FAULT_SKIP   eligible calls to let through, once armed, before any may fail (default 0)
 * Faults start disarmed: the process arms them with statestore_fault_arm(1)
 * (ctypes.CDLL(None).statestore_fault_arm) once it has imported what it needs.
 */
#define _GNU_SOURCE
#define FIU_ENABLE 1 /* fiu.h turns fiu_init and fiu_fail into no-ops without it */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fiu.h>
#include <fiu-control.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum site { S_OPEN, S_READ, S_PREAD, S_WRITE, S_PWRITE, S_FSYNC, S_FDATASYNC, S_RENAME, S_UNLINK, S_MMAP, S_SYNCFS, NSITES };
static const char *const SITE_NAMES[NSITES] = {
    "posix/io/oc/open",    "posix/io/rw/read",      "posix/io/rw/pread",  "posix/io/rw/write", "posix/io/rw/pwrite",
    "posix/io/sync/fsync", "posix/io/sync/fdatasync", "posix/io/dir/rename", "posix/io/dir/unlink", "posix/mm/mmap",
    "posix/io/sync/syncfs",
};

#define MAX_FDS 65536
static char *fd_path[MAX_FDS]; /* path of each tracked descriptor, NULL when not under the root */
static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;

static char root[PATH_MAX];
static size_t root_len;
static int log_fd = -1;
static char calls_path[PATH_MAX];
static double probability;
static int errnos[8] = {EIO};
static int n_errnos = 1;
static long max_faults = 1;
static long skip_calls;
static volatile int armed;
static long faults;
static uint64_t calls[NSITES];
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static pthread_mutex_t rng_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int chosen_errno;
static __thread int inside; /* our own calls (logging) are never faulted */

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static uint64_t next_random(void) {
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* libfiu's external callback: fail this call? (called with the point's name) */
static int decide(const char *name, int *failnum, void **failinfo, unsigned int *flags) {
    (void)name; (void)failnum; (void)failinfo; (void)flags;
    if (!armed) return 0;
    pthread_mutex_lock(&rng_lock);
    int fail = 0;
    if (skip_calls > 0) {
        skip_calls--;
    } else if (faults < max_faults && (double)(next_random() >> 11) / 9007199254740992.0 < probability) {
        faults++;
        chosen_errno = errnos[next_random() % (uint64_t)n_errnos];
        fail = 1;
    }
    pthread_mutex_unlock(&rng_lock);
    return fail;
}

static int under_root(const char *path) {
    return path && root_len && strncmp(path, root, root_len) == 0 && (path[root_len] == '/' || path[root_len] == 0);
}

/* The absolute form of `path` relative to `dirfd` (AT_FDCWD or a tracked descriptor); "" if unknown. */
static void resolve(int dirfd, const char *path, char *out) {
    out[0] = 0;
    if (!path) return;
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
    } else if (dirfd == AT_FDCWD) {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd)) snprintf(out, PATH_MAX, "%s/%s", cwd, path);
    } else if (dirfd >= 0 && dirfd < MAX_FDS) {
        pthread_mutex_lock(&fd_lock);
        if (fd_path[dirfd]) snprintf(out, PATH_MAX, "%s/%s", fd_path[dirfd], path);
        pthread_mutex_unlock(&fd_lock);
    }
}

static void log_fault(int site, const char *path) {
    if (log_fd < 0) return;
    char line[PATH_MAX + 64];
    int n = snprintf(line, sizeof line, "%s %d %s\n", SITE_NAMES[site], chosen_errno, path ? path : "?");
    REAL(write);
    inside++;
    if (n > 0) (void)!real_write(log_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    inside--;
}

/* Should this eligible call fail? Counts the call; on a fault logs it and sets errno. */
static int inject(int site, const char *path) {
    if (inside) return 0;
    __atomic_fetch_add(&calls[site], 1, __ATOMIC_RELAXED);
    if (!fiu_fail(SITE_NAMES[site])) return 0;
    log_fault(site, path);
    errno = chosen_errno;
    return 1;
}

static int fd_inject(int site, int fd) {
    if (inside || fd < 0 || fd >= MAX_FDS || !armed) return 0;
    char path[PATH_MAX];
    pthread_mutex_lock(&fd_lock);
    int tracked = fd_path[fd] != NULL;
    if (tracked) snprintf(path, sizeof path, "%s", fd_path[fd]);
    pthread_mutex_unlock(&fd_lock);
    return tracked && inject(site, path);
}

static int path_inject(int site, int dirfd, const char *p) {
    if (inside || !armed) return 0;
    char abs[PATH_MAX];
    resolve(dirfd, p, abs);
    return under_root(abs) && inject(site, abs);
}

static void track(int fd, const char *abs) {
    if (fd < 0 || fd >= MAX_FDS) return;
    pthread_mutex_lock(&fd_lock);
    free(fd_path[fd]);
    fd_path[fd] = under_root(abs) ? strdup(abs) : NULL;
    pthread_mutex_unlock(&fd_lock);
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode, int at) {
    REAL(open);
    REAL(openat);
    char abs[PATH_MAX];
    resolve(dirfd, path, abs);
    if (armed && !inside && under_root(abs) && inject(S_OPEN, abs)) return -1;
    int fd = at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    if (fd >= 0) track(fd, abs);
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}
int open64(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}
int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}
int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}
/* the _FORTIFY_SOURCE entry points */
int __open_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 0); }
int __open64_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 1); }
int __openat64_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 1); }
int creat(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int creat64(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }

int close(int fd) {
    REAL(close);
    if (fd >= 0 && fd < MAX_FDS) {
        pthread_mutex_lock(&fd_lock);
        free(fd_path[fd]);
        fd_path[fd] = NULL;
        pthread_mutex_unlock(&fd_lock);
    }
    return real_close(fd);
}

ssize_t read(int fd, void *buf, size_t n) {
    REAL(read);
    return fd_inject(S_READ, fd) ? -1 : real_read(fd, buf, n);
}
ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    REAL(pread);
    return fd_inject(S_PREAD, fd) ? -1 : real_pread(fd, buf, n, off);
}
ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    REAL(pread64);
    return fd_inject(S_PREAD, fd) ? -1 : real_pread64(fd, buf, n, off);
}
ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write);
    return fd_inject(S_WRITE, fd) ? -1 : real_write(fd, buf, n);
}
ssize_t writev(int fd, const struct iovec *iov, int n) {
    REAL(writev);
    return fd_inject(S_WRITE, fd) ? -1 : real_writev(fd, iov, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite);
    return fd_inject(S_PWRITE, fd) ? -1 : real_pwrite(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64);
    return fd_inject(S_PWRITE, fd) ? -1 : real_pwrite64(fd, buf, n, off);
}
int fsync(int fd) {
    REAL(fsync);
    return fd_inject(S_FSYNC, fd) ? -1 : real_fsync(fd);
}
int fdatasync(int fd) {
    REAL(fdatasync);
    return fd_inject(S_FDATASYNC, fd) ? -1 : real_fdatasync(fd);
}
int syncfs(int fd) {
    REAL(syncfs);
    return fd_inject(S_SYNCFS, fd) ? -1 : real_syncfs(fd);
}
int rename(const char *a, const char *b) {
    REAL(rename);
    return path_inject(S_RENAME, AT_FDCWD, b) ? -1 : real_rename(a, b);
}
int renameat(int da, const char *a, int db, const char *b) {
    REAL(renameat);
    return path_inject(S_RENAME, db, b) ? -1 : real_renameat(da, a, db, b);
}
int unlink(const char *p) {
    REAL(unlink);
    return path_inject(S_UNLINK, AT_FDCWD, p) ? -1 : real_unlink(p);
}
int unlinkat(int dirfd, const char *p, int flags) {
    REAL(unlinkat);
    return path_inject(S_UNLINK, dirfd, p) ? -1 : real_unlinkat(dirfd, p, flags);
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    REAL(mmap);
    return !(flags & MAP_ANONYMOUS) && fd_inject(S_MMAP, fd) ? MAP_FAILED : real_mmap(addr, len, prot, flags, fd, off);
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    REAL(mmap64);
    return !(flags & MAP_ANONYMOUS) && fd_inject(S_MMAP, fd) ? MAP_FAILED : real_mmap64(addr, len, prot, flags, fd, off);
}

/* Arm (1) or disarm (0) the faults; returns how many were injected so far. */
long statestore_fault_arm(int on) {
    armed = on;
    return faults;
}

static void write_calls(void) {
    if (!calls_path[0]) return;
    REAL(open);
    REAL(write);
    REAL(close);
    inside++;
    uint64_t any = 0;
    for (int i = 0; i < NSITES; i++) any |= calls[i];
    if (!any) {
        inside--;
        return;
    }
    int fd = real_open(calls_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        char line[128];
        for (int i = 0; i < NSITES; i++) {
            int n = snprintf(line, sizeof line, "%s %llu\n", SITE_NAMES[i], (unsigned long long)calls[i]);
            (void)!real_write(fd, line, (size_t)n);
        }
        real_close(fd);
    }
    inside--;
}

/* Python exits through exit(); a process killed by a signal leaves no call counts (faults are logged as they happen). */
long statestore_fault_finish(void) {
    armed = 0;
    write_calls();
    calls_path[0] = 0;
    return faults;
}

__attribute__((constructor)) static void init(void) {
    const char *r = getenv("STATESTORE_FAULT_ROOT");
    if (r && r[0] == '/') {
        snprintf(root, sizeof root, "%s", r);
        root_len = strlen(root);
        while (root_len > 1 && root[root_len - 1] == '/') root[--root_len] = 0;
    }
    const char *v;
    if ((v = getenv("STATESTORE_FAULT_PROB"))) probability = atof(v);
    if ((v = getenv("STATESTORE_FAULT_MAX"))) max_faults = atol(v);
    if ((v = getenv("STATESTORE_FAULT_SKIP"))) skip_calls = atol(v);
    if ((v = getenv("STATESTORE_FAULT_SEED"))) rng_state ^= strtoull(v, NULL, 10) * 0x2545F4914F6CDD1DULL;
    if ((v = getenv("STATESTORE_FAULT_ERRNOS"))) {
        n_errnos = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n_errnos < 8; t = strtok_r(NULL, ",", &save))
            errnos[n_errnos++] = atoi(t);
        if (!n_errnos) errnos[n_errnos++] = EIO;
    }
    if ((v = getenv("STATESTORE_FAULT_CALLS"))) snprintf(calls_path, sizeof calls_path, "%s", v);
    if ((v = getenv("STATESTORE_FAULT_LOG"))) {
        REAL(open);
        log_fd = real_open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    fiu_init(0);
    const char *sites = getenv("STATESTORE_FAULT_SITES");
    for (int i = 0; i < NSITES; i++) {
        if (sites && sites[0]) {
            const char *short_name = strrchr(SITE_NAMES[i], '/') + 1;
            char want[512];
            snprintf(want, sizeof want, ",%s,", sites);
            char needle[64];
            snprintf(needle, sizeof needle, ",%s,", short_name);
            if (!strstr(want, needle)) continue;
        }
        fiu_enable_external(SITE_NAMES[i], 1, NULL, 0, decide);
    }
    atexit(write_calls);
    /* Processes this one starts run without faults. */
    unsetenv("LD_PRELOAD");
    unsetenv("STATESTORE_FAULT_LOG");
    unsetenv("STATESTORE_FAULT_CALLS");
}

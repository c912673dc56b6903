/* The checks of scripts/ninep-vm.sh that the guest's busybox cannot do:
 * extended attributes copied as `cp -a` copies them, and POSIX byte-range
 * locks (fcntl F_SETLK/F_SETLKW/F_GETLK) from two processes. Linked
 * statically by scripts/conformance.sh and run in the kcmvm guest.
 *
 *   ninep-vm-check mktree DIR         a tree with user.* xattrs (several per
 *                                     file, 4 KiB and 16 KiB values, an empty
 *                                     one, a directory's own)
 *   ninep-vm-check copy SRC DST       copy SRC to DST as `cp -a` does: bytes,
 *                                     every xattr (listxattr/getxattr/
 *                                     setxattr), mode, mtime; symlinks as links
 *   ninep-vm-check compare A B [seconds]
 *                                     every name, xattr name and value, byte,
 *                                     mode and mtime (to the second with
 *                                     `seconds`) alike, or say what differs
 *   ninep-vm-check locks PATH_A PATH_B [remote-view]
 *                                     process A (this one) opens PATH_A,
 *                                     process B (a child) opens PATH_B (the
 *                                     same file, maybe by another path or
 *                                     mount); prints "PASS name" or
 *                                     "FAIL name (what happened)" per step and
 *                                     "INFO ..." for what a caller may compare
 *                                     between runs. remote-view: A may see
 *                                     B's lock with pid -1 or 0 (B's lock is
 *                                     held by a server as an open file
 *                                     description's lock, which has no pid).
 *
 * Exit status 0 when everything matched, 1 when something did not, 2 on
 * wrong usage. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define XMAX 65536

static int bad;
/* Compare mtimes to the second only (Linux 6.1's 9P client keeps its
 * inodes' times to the second: its super block's time granularity). */
static int whole_seconds;

static void differ(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("DIFF ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    bad = 1;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "ninep-vm-check: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

/* ------------------------------------------------------------ the tree */

static void put_file(const char *path, size_t size, unsigned seed, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("create", path);
    char buf[4096];
    size_t done = 0;
    while (done < size) {
        size_t n = size - done < sizeof buf ? size - done : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (char)((done + i) * 31 + seed);
        if (write(fd, buf, n) != (ssize_t)n) die("write", path);
        done += n;
    }
    if (fchmod(fd, mode) < 0) die("chmod", path);
    close(fd);
}

static void put_xattr(const char *path, const char *name, size_t size, unsigned seed) {
    static char v[XMAX];
    for (size_t i = 0; i < size; i++) v[i] = (char)('a' + (i * 7 + seed) % 26);
    if (lsetxattr(path, name, v, size, 0) < 0) die("setxattr", path);
}

static int mktree(const char *dir) {
    char p[4096];
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) die("mkdir", dir);
    snprintf(p, sizeof p, "%s/a", dir);
    put_file(p, 1000, 1, 0640);
    put_xattr(p, "user.one", 1, 1);
    put_xattr(p, "user.two", 100, 2);
    put_xattr(p, "user.four-kib", 4096, 3);
    put_xattr(p, "user.empty", 0, 4);
    snprintf(p, sizeof p, "%s/big", dir);
    put_file(p, 300000, 2, 0604);
    put_xattr(p, "user.sixteen-kib", 16384, 5);
    snprintf(p, sizeof p, "%s/none", dir);
    put_file(p, 0, 3, 0755);
    snprintf(p, sizeof p, "%s/sub", dir);
    if (mkdir(p, 0750) < 0) die("mkdir", p);
    put_xattr(p, "user.dir", 50, 6);
    put_xattr(p, "user.dir2", 4096, 7);
    snprintf(p, sizeof p, "%s/sub/deep", dir);
    put_file(p, 5000, 4, 0600);
    put_xattr(p, "user.deep", 300, 8);
    snprintf(p, sizeof p, "%s/sub/link", dir);
    if (symlink("deep", p) < 0) die("symlink", p);
    /* Old enough mtimes to be told apart from the copy's own. */
    struct timespec ts[2] = {{1000000000, 123456789}, {1000000000, 123456789}};
    const char *names[] = {"a", "big", "none", "sub/deep", "sub"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        ts[1].tv_sec += 1000;
        if (utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW) < 0) die("utimensat", p);
    }
    return 0;
}

/* ------------------------------------------------------------ copy */

static void copy_xattrs(const char *src, const char *dst) {
    static char list[XMAX], val[XMAX];
    ssize_t n = llistxattr(src, list, sizeof list);
    if (n < 0) die("listxattr", src);
    for (char *name = list; name < list + n; name += strlen(name) + 1) {
        if (strncmp(name, "user.", 5) != 0) continue;
        ssize_t v = lgetxattr(src, name, val, sizeof val);
        if (v < 0) die("getxattr", src);
        if (lsetxattr(dst, name, val, (size_t)v, 0) < 0) die("setxattr", dst);
    }
}

static int copy(const char *src, const char *dst) {
    struct stat st;
    if (lstat(src, &st) < 0) die("lstat", src);
    if (S_ISLNK(st.st_mode)) {
        char t[4096];
        ssize_t n = readlink(src, t, sizeof t - 1);
        if (n < 0) die("readlink", src);
        t[n] = 0;
        if (symlink(t, dst) < 0) die("symlink", dst);
    } else if (S_ISDIR(st.st_mode)) {
        if (mkdir(dst, 0700) < 0) die("mkdir", dst);
        DIR *d = opendir(src);
        if (!d) die("opendir", src);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char s[4096], t[4096];
            snprintf(s, sizeof s, "%s/%s", src, e->d_name);
            snprintf(t, sizeof t, "%s/%s", dst, e->d_name);
            copy(s, t);
        }
        closedir(d);
        copy_xattrs(src, dst);
        if (chmod(dst, st.st_mode & 07777) < 0) die("chmod", dst);
    } else if (S_ISREG(st.st_mode)) {
        int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (in < 0) die("open", src);
        if (out < 0) die("create", dst);
        char buf[65536];
        ssize_t n;
        while ((n = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)n) != n) die("write", dst);
        if (n < 0) die("read", src);
        close(in);
        if (close(out) < 0) die("close", dst);
        copy_xattrs(src, dst);
        if (chmod(dst, st.st_mode & 07777) < 0) die("chmod", dst);
    } else {
        fprintf(stderr, "ninep-vm-check: %s: not a file, directory or symlink\n", src);
        exit(1);
    }
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    /* A symlink's own times are best effort (compare does not look). */
    if (utimensat(AT_FDCWD, dst, ts, AT_SYMLINK_NOFOLLOW) < 0 && !S_ISLNK(st.st_mode)) die("utimensat", dst);
    return 0;
}

/* ------------------------------------------------------------ compare */

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The sorted user.* names of `path`'s xattrs, in `list`. */
static size_t names_of(const char *path, char *list, char **out, size_t max) {
    ssize_t n = llistxattr(path, list, XMAX);
    if (n < 0) die("listxattr", path);
    size_t k = 0;
    for (char *name = list; name < list + n && k < max; name += strlen(name) + 1)
        if (!strncmp(name, "user.", 5)) out[k++] = name;
    qsort(out, k, sizeof *out, cmp_names);
    return k;
}

/* As many bytes as fit, short only at the end of the file. */
static ssize_t read_full(int fd, char *buf, size_t size) {
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0) return -1;
        if (n == 0) break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

static void compare(const char *a, const char *b, int *seen) {
    struct stat sa, sb;
    if (lstat(a, &sa) < 0) die("lstat", a);
    if (lstat(b, &sb) < 0) {
        differ("%s: missing (%s)", b, strerror(errno));
        return;
    }
    (*seen)++;
    if (sa.st_mode != sb.st_mode) differ("%s: mode %o, %s: %o", a, sa.st_mode, b, sb.st_mode);
    if (!S_ISLNK(sa.st_mode) && (sa.st_mtim.tv_sec != sb.st_mtim.tv_sec || (!whole_seconds && sa.st_mtim.tv_nsec != sb.st_mtim.tv_nsec)))
        differ("%s: mtime %ld.%09ld, %s: %ld.%09ld", a, (long)sa.st_mtim.tv_sec, sa.st_mtim.tv_nsec, b,
               (long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
    if (S_ISLNK(sa.st_mode)) {
        char ta[4096] = {0}, tb[4096] = {0};
        if (readlink(a, ta, sizeof ta - 1) < 0 || readlink(b, tb, sizeof tb - 1) < 0 || strcmp(ta, tb))
            differ("%s: link target %s, %s: %s", a, ta, b, tb);
        return;
    }
    static char la[XMAX], lb[XMAX], va[XMAX], vb[XMAX];
    char *na[256], *nb[256];
    size_t ka = names_of(a, la, na, 256), kb = names_of(b, lb, nb, 256);
    if (ka != kb) differ("%s: %zu xattrs, %s: %zu", a, ka, b, kb);
    for (size_t i = 0; i < ka && i < kb; i++) {
        if (strcmp(na[i], nb[i])) {
            differ("%s: xattr %s, %s: %s", a, na[i], b, nb[i]);
            continue;
        }
        ssize_t x = lgetxattr(a, na[i], va, sizeof va), y = lgetxattr(b, nb[i], vb, sizeof vb);
        if (x < 0 || y < 0 || x != y || memcmp(va, vb, (size_t)x))
            differ("%s %s: %zd bytes, %s: %zd bytes or other bytes", a, na[i], x, b, y);
    }
    if (S_ISREG(sa.st_mode)) {
        int fa = open(a, O_RDONLY), fb = open(b, O_RDONLY);
        if (fa < 0) die("open", a);
        if (fb < 0) die("open", b);
        static char ba[65536], bb[65536];
        for (;;) {
            ssize_t x = read_full(fa, ba, sizeof ba), y = read_full(fb, bb, sizeof bb);
            if (x < 0 || y < 0) die("read", a);
            if (x != y || memcmp(ba, bb, (size_t)x)) {
                differ("%s and %s: other bytes", a, b);
                break;
            }
            if (x == 0) break;
        }
        close(fa);
        close(fb);
    } else if (S_ISDIR(sa.st_mode)) {
        DIR *d = opendir(a);
        if (!d) die("opendir", a);
        struct dirent *e;
        int n = 0;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char s[4096], t[4096];
            snprintf(s, sizeof s, "%s/%s", a, e->d_name);
            snprintf(t, sizeof t, "%s/%s", b, e->d_name);
            compare(s, t, seen);
            n++;
        }
        closedir(d);
        d = opendir(b);
        if (!d) die("opendir", b);
        int m = 0;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) m++;
        closedir(d);
        if (n != m) differ("%s: %d entries, %s: %d", a, n, b, m);
    }
}

/* ------------------------------------------------------------ locks */

/* A request to process B and its answer, over pipes. */
struct req {
    char op; /* 'S' F_SETLK, 'W' F_SETLKW, 'G' F_GETLK, 'X' exit holding its locks */
    short type;
    long start, len;
};
struct rep {
    int rc, err;
    short type;
    long start, len;
    int pid;
};

static int lk(int fd, char op, short type, long start, long len, struct flock *out) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    int cmd = op == 'S' ? F_SETLK : op == 'W' ? F_SETLKW : F_GETLK;
    int rc = fcntl(fd, cmd, &fl);
    if (out) *out = fl;
    return rc;
}

static void serve_b(const char *path, int in, int out) {
    int fd = open(path, O_RDWR);
    struct rep r = {0};
    if (fd < 0) {
        r.rc = -1;
        r.err = errno;
    }
    if (write(out, &r, sizeof r) != sizeof r) _exit(3);
    struct req q;
    while (read(in, &q, sizeof q) == sizeof q) {
        if (q.op == 'X') _exit(0);
        struct flock fl;
        memset(&r, 0, sizeof r);
        r.rc = lk(fd, q.op, q.type, q.start, q.len, &fl);
        r.err = r.rc < 0 ? errno : 0;
        r.type = fl.l_type;
        r.start = (long)fl.l_start;
        r.len = (long)fl.l_len;
        r.pid = fl.l_pid;
        if (write(out, &r, sizeof r) != sizeof r) _exit(3);
    }
    _exit(0);
}

static int to_b, from_b;
static pid_t pid_b;

static void ask(char op, short type, long start, long len) {
    struct req q = {op, type, start, len};
    if (write(to_b, &q, sizeof q) != sizeof q) die("write to", "B");
}

/* B's answer within `ms` milliseconds; 0 when none came. */
static int answer(struct rep *r, int ms) {
    fd_set s;
    FD_ZERO(&s);
    FD_SET(from_b, &s);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (select(from_b + 1, &s, 0, 0, &tv) <= 0) return 0;
    return read(from_b, r, sizeof *r) == sizeof *r;
}

static struct rep b_does(char op, short type, long start, long len) {
    struct rep r = {.rc = -2};
    ask(op, type, start, len);
    if (!answer(&r, 60000)) r.rc = -2;
    return r;
}

static void check(const char *name, int ok, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL %s (", name);
        vprintf(fmt, ap);
        printf(")\n");
        va_end(ap);
        bad = 1;
    }
    fflush(stdout);
}

static const char *err_name(int e) {
    return e == EAGAIN ? "EAGAIN" : e == EACCES ? "EACCES" : e == EDEADLK ? "EDEADLK" : strerror(e);
}

/* How the pid a F_GETLK reported names the holder: "pid" as a local disk
 * says, "-pid" as a remote lock (Linux's 9P client reports the proc_id the
 * server gave, negated), "none" (-1 or 0: an open file description's lock),
 * or "other". */
static const char *pid_form(int got, int holder) {
    return got == holder ? "pid" : got == -holder ? "-pid" : got == -1 || got == 0 ? "none" : "other";
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int locks(const char *pa, const char *pb, int remote_view) {
    int fd = open(pa, O_RDWR | O_CREAT, 0644);
    if (fd < 0) die("open", pa);
    if (ftruncate(fd, 100) < 0) die("ftruncate", pa);
    int p1[2], p2[2];
    if (pipe(p1) < 0 || pipe(p2) < 0) die("pipe", "");
    pid_b = fork();
    if (pid_b < 0) die("fork", "");
    if (pid_b == 0) {
        close(fd);
        close(p1[1]);
        close(p2[0]);
        serve_b(pb, p1[0], p2[1]);
    }
    close(p1[0]);
    close(p2[1]);
    to_b = p1[1];
    from_b = p2[0];
    /* A bound on the whole sequence: a lock that never comes back is a
     * failure, not a stuck run. */
    alarm(120);
    struct rep r;
    if (!answer(&r, 30000) || r.rc < 0) {
        check("B opens the file", 0, "%s", r.rc < 0 ? strerror(r.err) : "no answer");
        kill(pid_b, SIGKILL);
        return 1;
    }
    struct flock fl;
    int rc = lk(fd, 'S', F_WRLCK, 0, 10, 0);
    check("A write-locks 0-9", rc == 0, "%s", strerror(errno));
    r = b_does('S', F_WRLCK, 20, 10);
    check("B write-locks 20-29 beside it", r.rc == 0, "rc %d %s", r.rc, strerror(r.err));
    r = b_does('S', F_WRLCK, 5, 10);
    check("B's overlapping write lock 5-14 refused", r.rc < 0 && (r.err == EAGAIN || r.err == EACCES), "rc %d %s",
          r.rc, strerror(r.err));
    if (r.rc < 0) printf("INFO overlapping F_SETLK: %s\n", err_name(r.err));
    r = b_does('S', F_RDLCK, 9, 1);
    check("B's read lock of byte 9 refused", r.rc < 0 && (r.err == EAGAIN || r.err == EACCES), "rc %d %s", r.rc,
          strerror(r.err));
    r = b_does('G', F_WRLCK, 5, 10);
    check("B's F_GETLK names A's write lock 0-9",
          r.rc == 0 && r.type == F_WRLCK && r.start == 0 && r.len == 10 && (r.pid == getpid() || r.pid == -getpid()),
          "rc %d type %d %ld+%ld pid %d, A is %d", r.rc, r.type, r.start, r.len, r.pid, (int)getpid());
    printf("INFO B's F_GETLK: pid as %s\n", pid_form(r.pid, getpid()));
    rc = lk(fd, 'G', F_WRLCK, 25, 100, &fl);
    int pid_ok = fl.l_pid == pid_b || fl.l_pid == -pid_b || (remote_view && (fl.l_pid == -1 || fl.l_pid == 0));
    check("A's F_GETLK names B's write lock 20-29",
          rc == 0 && fl.l_type == F_WRLCK && fl.l_start == 20 && fl.l_len == 10 && pid_ok,
          "rc %d type %d %ld+%ld pid %d, B is %d", rc, fl.l_type, (long)fl.l_start, (long)fl.l_len, fl.l_pid,
          (int)pid_b);
    printf("INFO A's F_GETLK: pid as %s\n", pid_form(fl.l_pid, pid_b));
    rc = lk(fd, 'G', F_WRLCK, 40, 10, &fl);
    check("F_GETLK of a free range: F_UNLCK", rc == 0 && fl.l_type == F_UNLCK, "rc %d type %d", rc, fl.l_type);
    /* Read locks are shared; a write lock over them is refused. */
    rc = lk(fd, 'S', F_RDLCK, 40, 10, 0);
    r = b_does('S', F_RDLCK, 45, 10);
    check("read locks 40-49 (A) and 45-54 (B) shared", rc == 0 && r.rc == 0, "A %d, B %d %s", rc, r.rc,
          strerror(r.err));
    rc = lk(fd, 'S', F_WRLCK, 50, 1, 0);
    check("A's write lock over B's read lock refused", rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d %s",
          rc, strerror(errno));
    /* F_SETLKW waits for the holder's unlock. */
    ask('W', F_WRLCK, 5, 10);
    int early = answer(&r, 500);
    check("B's F_SETLKW on 5-14 waits while A holds 0-9", !early, "answered rc %d %s", r.rc, strerror(r.err));
    double t0 = now();
    rc = lk(fd, 'S', F_UNLCK, 0, 10, 0);
    int got = early || answer(&r, 60000);
    check("... and takes it once A unlocks", rc == 0 && got && r.rc == 0, "unlock %d, answer %d rc %d %s", rc, got,
          r.rc, strerror(r.err));
    printf("INFO F_SETLKW took %.2f s after the unlock\n", now() - t0);
    rc = lk(fd, 'S', F_WRLCK, 0, 10, 0);
    check("A's lock 0-9 refused while B holds 5-14", rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d %s",
          rc, strerror(errno));
    /* A process that exits lets go of its locks. */
    ask('X', 0, 0, 0);
    int st;
    if (waitpid(pid_b, &st, 0) < 0) die("waitpid", "B");
    rc = lk(fd, 'S', F_WRLCK, 0, 30, 0);
    check("B exits holding 5-14 and 20-29: A locks 0-29", rc == 0, "%s", strerror(errno));
    rc = lk(fd, 'S', F_WRLCK, 45, 10, 0);
    check("... and writes over B's read lock 45-54", rc == 0, "%s", strerror(errno));
    /* Locks are the process's, not an open's: a second open of the file
     * locks over what the first holds. */
    int fd2 = open(pa, O_RDWR);
    if (fd2 < 0) die("open", pa);
    rc = lk(fd2, 'S', F_WRLCK, 5, 30, 0);
    check("A's second open write-locks 5-34 over its first's 0-29", rc == 0, "%s", strerror(errno));
    close(fd2);
    alarm(0);
    close(fd);
    return bad;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL the lock sequence did not finish within 120 s\n";
    if (write(1, m, sizeof m - 1) < 0) _exit(1);
    if (pid_b > 0) kill(pid_b, SIGKILL);
    _exit(1);
}

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IOLBF, 0);
    signal(SIGALRM, on_alarm);
    if (argc == 3 && !strcmp(argv[1], "mktree")) return mktree(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "copy")) return copy(argv[2], argv[3]);
    if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "seconds"))) && !strcmp(argv[1], "compare")) {
        int seen = 0;
        whole_seconds = argc == 5;
        compare(argv[2], argv[3], &seen);
        printf("INFO compared %d entries: %s\n", seen, bad ? "DIFFERENT" : "alike");
        return bad;
    }
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "locks"))
        return locks(argv[2], argv[3], argc == 5 && !strcmp(argv[4], "remote-view"));
    fprintf(stderr, "usage: ninep-vm-check mktree DIR | copy SRC DST | compare A B [seconds] | locks PATH_A PATH_B [remote-view]\n");
    return 2;
}

/*
 * What the C check programs (unit.c, backend.c, service.c) share: the
 * check macros and their counts, and loopback TCP helpers bounded in time.
 * Each program prints its own summary from `passed` and `failed`.
 *
 * CHECK(cond), EQ(a, b): count a pass, or print "FAIL file:line: ..." with
 * connmux_last_error() and count a failure. MUST(call): a step the rest
 * needs; a negative result prints "FATAL ..." and exits 2.
 */
#ifndef CONNMUX_TEST_CHECK_H
#define CONNMUX_TEST_CHECK_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "connmux.h"

static int passed, failed;

#define CHECK(cond)                                                                                  \
	do {                                                                                         \
		if (cond) {                                                                          \
			passed++;                                                                    \
		} else {                                                                             \
			failed++;                                                                    \
			const char *le_ = connmux_last_error();                                      \
			printf("FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,       \
			       le_ ? le_ : "none");                                                  \
		}                                                                                    \
	} while (0)

#define EQ(a, b)                                                                                     \
	do {                                                                                         \
		long long a_ = (long long)(a), b_ = (long long)(b);                                  \
		if (a_ == b_) {                                                                      \
			passed++;                                                                    \
		} else {                                                                             \
			failed++;                                                                    \
			const char *le_ = connmux_last_error();                                      \
			printf("FAIL %s:%d: %s == %s: %lld != %lld (last error: %s)\n", __FILE__,    \
			       __LINE__, #a, #b, a_, b_, le_ ? le_ : "none");                        \
		}                                                                                    \
	} while (0)

#define MUST(call)                                                                                   \
	do {                                                                                         \
		long long r_ = (long long)(call);                                                    \
		if (r_ < 0) {                                                                        \
			printf("FATAL %s:%d: %s = %lld (%s)\n", __FILE__, __LINE__, #call, r_,       \
			       connmux_last_error());                                                \
			exit(2);                                                                     \
		}                                                                                    \
	} while (0)

static inline int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A connected TCP pair on loopback: *peer is the far end, *near is attached. */
static inline void tcp_pair(int *peer, int *near)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof a;
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0 ||
	    getsockname(l, (struct sockaddr *)&a, &al) < 0) {
		perror("listen");
		exit(2);
	}
	*peer = socket(AF_INET, SOCK_STREAM, 0);
	if (*peer < 0 || connect(*peer, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("connect");
		exit(2);
	}
	*near = accept(l, NULL, NULL);
	if (*near < 0) {
		perror("accept");
		exit(2);
	}
	close(l);
}

/* One "l4" frame: 4-byte big-endian body length, then the body. */
static inline size_t frame(uint8_t *out, const char *body)
{
	uint32_t n = (uint32_t)strlen(body);
	uint32_t be = htonl(n);
	memcpy(out, &be, 4);
	memcpy(out + 4, body, n);
	return 4 + n;
}

static inline void write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k <= 0) {
			perror("write");
			exit(2);
		}
		p += k;
		n -= (size_t)k;
	}
}

static inline void send_frame(int fd, const char *body)
{
	uint8_t buf[1024];
	write_all(fd, buf, frame(buf, body));
}

/* Read exactly n bytes within 5 s; returns 0, or -1 (timeout, end or error). */
static inline int read_exact(int fd, void *buf, size_t n)
{
	size_t got = 0;
	int64_t end = now_ms() + 5000;
	while (got < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = (int)(end - now_ms());
		if (left <= 0 || poll(&p, 1, left) <= 0)
			return -1;
		ssize_t k = read(fd, (char *)buf + got, n - got);
		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

#endif

/*
 * A service from C (connmux_service_start): a listener whose connections
 * are attached and answered by a C handler on the mux's workers, over real
 * TCP on loopback. The handler's answer depends on the request's first body
 * byte:
 *   'E' echo (the reply is the request),   'N' no reply,
 *   'C' close the connection,               'B' a bad answer (closes, counted),
 *   'H' echo after 300 us of CPU (heavy: the lanes take these).
 * With a directory of certificates (tests/c_api.rs makes it), the same
 * handler behind TLS too:   service [TLS_DIR]
 * Prints "FAIL file:line: condition" for each failed check and ends with
 * "CAPI SUMMARY passed=N failed=M"; exits 1 if any failed, 2 if it could not
 * run.
 */
#define _GNU_SOURCE
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stddef.h>

#include "check.h"

static int64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* What the handler saw. */
struct seen {
	atomic_long calls, heavy, none;
};

/* The handler: see the top of this file. Requests are "l4" frames (a 4-byte
 * big-endian body length, then the body), so an echo is a whole reply. */
static ptrdiff_t handle(void *ctx, const uint8_t *req, size_t len, connmux_psock_id from, uint8_t *reply,
			size_t cap)
{
	struct seen *s = ctx;
	atomic_fetch_add(&s->calls, 1);
	if (from == CONNMUX_PSOCK_NONE || len < 5)
		return CONNMUX_REPLY_CLOSE;
	switch (req[4]) {
	case 'N':
		atomic_fetch_add(&s->none, 1);
		return CONNMUX_REPLY_NONE;
	case 'C':
		return CONNMUX_REPLY_CLOSE;
	case 'B':
		return (ptrdiff_t)cap + 1;
	case 'H': {
		atomic_fetch_add(&s->heavy, 1);
		int64_t t0 = thread_cpu_ns();
		while (thread_cpu_ns() - t0 < 300000)
			;
		break;
	}
	default:
		break;
	}
	if (len > cap)
		return CONNMUX_REPLY_CLOSE;
	memcpy(reply, req, len);
	return (ptrdiff_t)len;
}

static int connect_to(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("connect");
		exit(2);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* Request `i` of kind `k`: "l4" frame of body k + 8 digits. */
static size_t request(uint8_t *out, char k, unsigned i)
{
	char body[16];
	int n = snprintf(body, sizeof body, "%c%08u", k, i);
	uint32_t be = htonl((uint32_t)n);
	memcpy(out, &be, 4);
	memcpy(out + 4, body, (size_t)n);
	return 4 + (size_t)n;
}

/* Whether the connection is closed (end of stream or reset) within 5 s. */
static int closed_soon(int fd)
{
	int64_t end = now_ms() + 5000;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = (int)(end - now_ms());
		if (left <= 0 || poll(&p, 1, left) <= 0)
			return 0;
		char b[64];
		ssize_t k = read(fd, b, sizeof b);
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			return 1;
		if (k < 0)
			return 0;
	}
}

/* Wait up to 5 s for a counter of the service to reach `want`. */
static uint64_t stat_reaches(connmux_service *svc, size_t offset, uint64_t want)
{
	connmux_service_stats st;
	uint64_t v = 0;
	int64_t end = now_ms() + 5000;
	while (now_ms() < end) {
		MUST(connmux_service_get_stats(svc, &st));
		memcpy(&v, (const char *)&st + offset, sizeof v);
		if (v >= want)
			break;
		struct timespec ms = { 0, 1000000 };
		nanosleep(&ms, NULL);
	}
	return v;
}

/* Whether the mux's attached connections fall to `n` within 5 s. */
static int attached_falls_to(connmux_mux *m, uint64_t n)
{
	connmux_mux_stats st;
	int64_t end = now_ms() + 5000;
	while (now_ms() < end) {
		MUST(connmux_mux_get_stats(m, &st));
		if (st.psocks <= n)
			return 1;
		struct timespec ms = { 0, 1000000 };
		nanosleep(&ms, NULL);
	}
	return 0;
}

/* Four connections, 2,000 echoes each, 64 in flight: every reply comes back
 * once, in order, on the connection of its request. */
static void echoes(int port)
{
	enum { CONNS = 4, EACH = 2000, WINDOW = 64 };
	int fds[CONNS];
	unsigned sent[CONNS] = { 0 }, got[CONNS] = { 0 };
	for (int c = 0; c < CONNS; c++)
		fds[c] = connect_to(port);
	int ok = 1;
	int64_t end = now_ms() + 30000;
	for (int done = 0; done < CONNS && ok && now_ms() < end;) {
		done = 0;
		for (int c = 0; c < CONNS && ok; c++) {
			uint8_t buf[WINDOW * 16];
			size_t n = 0;
			while (sent[c] < EACH && sent[c] - got[c] < WINDOW)
				n += request(buf + n, 'E', sent[c]++ + (unsigned)c * 100000);
			if (n)
				write_all(fds[c], buf, n);
			if (got[c] < sent[c]) {
				uint8_t want[16], have[16];
				size_t k = request(want, 'E', got[c] + (unsigned)c * 100000);
				ok = read_exact(fds[c], have, k) == 0 && memcmp(want, have, k) == 0;
				got[c]++;
			}
			done += got[c] == EACH;
		}
	}
	CHECK(ok);
	for (int c = 0; c < CONNS; c++) {
		EQ(got[c], EACH);
		close(fds[c]);
	}
}

static const char *in_dir(const char *dir, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", dir, name);
	return buf;
}

/*
 * The same handler behind TLS (connmux_service_start_tls): a client mux
 * attaches its connection with TLS and sends 200 echoes through a KCM
 * socket; each comes back whole. A client that speaks plain TCP to it is
 * reset (its handshake fails). `dir` holds ca.pem, server.pem, server.key.
 */
static void tls_service(const char *dir, struct seen *seen)
{
	char a[512], b[512];
	connmux_tls *srv, *cli;
	MUST(connmux_tls_server_new(in_dir(dir, "server.pem", a, sizeof a), in_dir(dir, "server.key", b, sizeof b), NULL,
				    &srv));
	MUST(connmux_tls_client_new(in_dir(dir, "ca.pem", a, sizeof a), "localhost", NULL, NULL, &cli));
	connmux_mux *sm, *cm;
	MUST(connmux_mux_new(NULL, &sm));
	MUST(connmux_mux_new(NULL, &cm));
	connmux_parser *p;
	MUST(connmux_parser_from_spec("l4", &p));
	connmux_service *svc = (connmux_service *)1;
	/* A client's configuration cannot serve. */
	EQ(connmux_service_start_tls(sm, "127.0.0.1:0", p, cli, handle, seen, 0, &svc), -EINVAL);
	CHECK(svc == NULL);
	MUST(connmux_service_start_tls(sm, "127.0.0.1:0", p, srv, handle, seen, 0, &svc));
	connmux_tls_free(srv);
	int port = connmux_service_port(svc);

	int fd = connect_to(port);
	MUST(connmux_attach_tls(cm, fd, p, cli, NULL));
	close(fd);
	connmux_sock *s;
	MUST(connmux_socket(cm, CONNMUX_SOCK_DGRAM, &s));
	MUST(connmux_set_timeouts(s, 5000, 5000));
	enum { N = 200 };
	int ok = 1;
	for (unsigned i = 0; i < N && ok; i++) {
		uint8_t req[16], got[64];
		size_t n = request(req, 'E', i);
		ok = connmux_send(s, req, n, 0) == (ptrdiff_t)n;
		connmux_msg m = { .buf = got, .len = sizeof got };
		ok = ok && connmux_recvmsg(s, &m, 0) == (ptrdiff_t)n && (m.flags & CONNMUX_MSG_EOR) &&
		     memcmp(got, req, n) == 0;
	}
	CHECK(ok);
	connmux_tls_stats ts;
	MUST(connmux_tls_get_stats(sm, &ts));
	EQ(ts.handshakes, 1);

	/* Plain TCP to the TLS service: not TLS, reset. */
	fd = connect_to(port);
	uint8_t buf[16];
	write_all(fd, buf, request(buf, 'E', 1));
	CHECK(closed_soon(fd));
	close(fd);
	MUST(connmux_tls_get_stats(sm, &ts));
	EQ(ts.handshake_failures, 1);

	connmux_sock_close(s);
	connmux_service_free(svc);
	connmux_parser_free(p);
	connmux_tls_free(cli);
	connmux_mux_free(cm);
	connmux_mux_free(sm);
}

int main(int argc, char **argv)
{
	struct seen seen = { 0 };
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	cfg.workers = 2;
	cfg.pin_workers = 0;
	connmux_mux *m;
	MUST(connmux_mux_new(&cfg, &m));
	connmux_parser *p;
	MUST(connmux_parser_from_spec("l4", &p));

	/* Refused: a bad address, a NULL handler, too much reply room. */
	connmux_service *svc = (connmux_service *)1;
	EQ(connmux_service_start(m, "localhost", p, handle, &seen, 0, &svc), -EINVAL);
	CHECK(svc == NULL);
	EQ(connmux_service_start(m, "127.0.0.1:0", p, NULL, &seen, 0, &svc), -EFAULT);
	EQ(connmux_service_start(m, "127.0.0.1:0", p, handle, &seen, (size_t)1 << 40, &svc), -EINVAL);

	MUST(connmux_service_start(m, "127.0.0.1:0", p, handle, &seen, 256, &svc));
	int port = connmux_service_port(svc);
	CHECK(port > 0);
	/* One handler a mux. */
	connmux_service *again = NULL;
	EQ(connmux_service_start(m, "127.0.0.1:0", p, handle, &seen, 0, &again), -EEXIST);
	CHECK(again == NULL);
	/* The service makes each connection's parser from its own copy. */
	connmux_parser_free(p);

	echoes(port);

	/* No reply: the next request's reply is the next thing read. */
	int fd = connect_to(port);
	uint8_t buf[64], want[16];
	size_t n = request(buf, 'N', 1);
	n += request(buf + n, 'E', 2);
	write_all(fd, buf, n);
	size_t k = request(want, 'E', 2);
	CHECK(read_exact(fd, buf, k) == 0 && memcmp(buf, want, k) == 0);
	n = request(buf, 'E', 3);
	write_all(fd, buf, n);
	k = request(want, 'E', 3);
	CHECK(read_exact(fd, buf, k) == 0 && memcmp(buf, want, k) == 0);
	EQ(atomic_load(&seen.none), 1);

	/* Close: the connection ends, after the reply made before it. */
	n = request(buf, 'E', 4);
	n += request(buf + n, 'C', 5);
	write_all(fd, buf, n);
	k = request(want, 'E', 4);
	CHECK(read_exact(fd, buf, k) == 0 && memcmp(buf, want, k) == 0);
	CHECK(closed_soon(fd));
	close(fd);

	/* A bad answer (more than the room given) closes too, and is counted. */
	fd = connect_to(port);
	n = request(buf, 'B', 6);
	write_all(fd, buf, n);
	CHECK(closed_soon(fd));
	close(fd);
	EQ(stat_reaches(svc, offsetof(connmux_service_stats, handler_errors), 1), 1);

	/* Bad framing from the peer (a length over the mux's limit): closed. */
	fd = connect_to(port);
	uint32_t big = htonl(64u << 20);
	write_all(fd, &big, 4);
	CHECK(closed_soon(fd));
	close(fd);

	/* Heavy requests: all answered, once each (any order: the lanes). */
	enum { HEAVY = 64 };
	fd = connect_to(port);
	uint8_t hb[HEAVY * 16];
	n = 0;
	for (unsigned i = 0; i < HEAVY; i++)
		n += request(hb + n, 'H', i);
	write_all(fd, hb, n);
	int answered[HEAVY] = { 0 }, ok = 1;
	for (unsigned i = 0; i < HEAVY && ok; i++) {
		k = request(want, 'H', 0);
		ok = read_exact(fd, buf, k) == 0 && memcmp(buf, want, 5) == 0;
		unsigned at = (unsigned)strtoul((const char *)buf + 5, NULL, 10);
		ok = ok && at < HEAVY && !answered[at];
		if (ok)
			answered[at] = 1;
	}
	CHECK(ok);
	EQ(atomic_load(&seen.heavy), HEAVY);
	close(fd);

	/* The counters: 4 + 4 connections accepted, the 3 closed by the handler
	 * or the framing (and those the clients closed) counted. */
	connmux_service_stats st;
	EQ(stat_reaches(svc, offsetof(connmux_service_stats, accepted), 8), 8);
	CHECK(stat_reaches(svc, offsetof(connmux_service_stats, closed), 3) >= 3);
	MUST(connmux_service_get_stats(svc, &st));
	EQ(st.attach_errors, 0);
	EQ(st.refused, 0);

	/* A cap on connections: past it, a newcomer is reset at once. First
	 * every connection above is let go (the clients closed them). */
	CHECK(attached_falls_to(m, 0));
	MUST(connmux_service_set_max_conns(svc, 1));
	int keep = connect_to(port);
	n = request(buf, 'E', 7);
	write_all(keep, buf, n);
	k = request(want, 'E', 7);
	CHECK(read_exact(keep, buf, k) == 0 && memcmp(buf, want, k) == 0);
	fd = connect_to(port);
	CHECK(closed_soon(fd));
	close(fd);
	EQ(stat_reaches(svc, offsetof(connmux_service_stats, refused), 1), 1);

	/* Once `keep` has been idle for a second, a newcomer at the cap takes
	 * its place: `keep` is reset and counted in `evicted`, the newcomer
	 * answered. Tried every 100 ms for at most 5 s; those
	 * that come too early are refused (a reset, and `refused`). */
	MUST(connmux_service_get_stats(svc, &st));
	EQ(st.evicted, 0);
	int64_t until = now_ms() + 5000;
	int in = -1;
	while (in < 0 && now_ms() < until) {
		fd = connect_to(port);
		n = request(buf, 'E', 8);
		k = request(want, 'E', 8);
		if (send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n && read_exact(fd, buf, k) == 0 &&
		    memcmp(buf, want, k) == 0) {
			in = fd;
			break;
		}
		close(fd);
		struct timespec pause = { 0, 100000000 };
		nanosleep(&pause, NULL);
	}
	CHECK(in >= 0);
	CHECK(closed_soon(keep));
	EQ(stat_reaches(svc, offsetof(connmux_service_stats, evicted), 1), 1);
	close(keep);
	if (in >= 0)
		close(in);

	connmux_service_free(svc);
	EQ(connmux_service_port(NULL), -EFAULT);
	connmux_mux_free(m);
	if (argc > 1)
		tls_service(argv[1], &seen);
	printf("handler calls %ld\n", atomic_load(&seen.calls));
	printf("CAPI SUMMARY passed=%d failed=%d\n", passed, failed);
	return failed ? 1 : 0;
}

/*
 * The C API on each backend: `connmux_config.backend` and `.driver`, what
 * `connmux_mux_backend` and `connmux_mux_driver` report, and the same
 * messages over real TCP on loopback through connmux's runtime and through
 * the kernel's AF_KCM, with the calls the kernel backend refuses.
 *
 *   backend here     this machine: the kernel backend works or is refused
 *                    with -EOPNOTSUPP (then AUTO is the userspace one);
 *                    messages on every backend and driver that runs here
 *   backend kernel   the kernel backend must work (the kcmvm VM, whose
 *                    kernel has AF_KCM); messages on it and on userspace
 *
 * Prints "FAIL file:line: condition" for each failed check and ends with
 * "CAPI SUMMARY passed=N failed=M"; exits 1 if any failed, 2 if it could not
 * run.
 */
#define _GNU_SOURCE
#include "check.h"

/* Whether the peer reads exactly the frame of `body` next. */
static int peer_reads(int peer, const char *body)
{
	uint8_t want[256], got[256];
	size_t n = frame(want, body);
	return read_exact(peer, got, n) == 0 && memcmp(want, got, n) == 0;
}

/* Whether a received message is the frame of `body`, whole. */
static int is_frame(const connmux_msg *m, const char *body)
{
	uint8_t want[256];
	size_t n = frame(want, body);
	return m->n == n && (m->flags & CONNMUX_MSG_EOR) && !(m->flags & CONNMUX_MSG_TRUNC) &&
	       memcmp(m->buf, want, n) == 0;
}

/* A handler for the service the kernel backend refuses: never called. */
static ptrdiff_t no_reply(void *ctx, const uint8_t *req, size_t len, connmux_psock_id from, uint8_t *reply,
			  size_t cap)
{
	(void)ctx, (void)req, (void)len, (void)from, (void)reply, (void)cap;
	return CONNMUX_REPLY_NONE;
}

static const char *backend_name(int b)
{
	return b == CONNMUX_BACKEND_KERNEL ? "kernel" : b == CONNMUX_BACKEND_USERSPACE ? "userspace" : "auto";
}

static const char *driver_name(int d)
{
	return d == CONNMUX_DRIVER_EPOLL ? "epoll" : d == CONNMUX_DRIVER_URING ? "io_uring" : "auto";
}

/* The configuration's defaults and the values it refuses. */
static void config_checks(void)
{
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	EQ(cfg.backend, CONNMUX_BACKEND_USERSPACE);
	EQ(cfg.driver, CONNMUX_DRIVER_AUTO);
	connmux_mux *m = (connmux_mux *)1;
	cfg.backend = 7;
	EQ(connmux_mux_new(&cfg, &m), -EINVAL);
	CHECK(m == NULL);
	CHECK(strstr(connmux_last_error(), "backend") != NULL);
	cfg.backend = CONNMUX_BACKEND_USERSPACE;
	cfg.driver = -1;
	EQ(connmux_mux_new(&cfg, &m), -EINVAL);
	CHECK(strstr(connmux_last_error(), "driver") != NULL);
	EQ(connmux_mux_backend(NULL), -EFAULT);
	EQ(connmux_mux_driver(NULL), -EFAULT);
	/* NULL configuration: the defaults, so connmux's own runtime. */
	MUST(connmux_mux_new(NULL, &m));
	EQ(connmux_mux_backend(m), CONNMUX_BACKEND_USERSPACE);
	connmux_mux_free(m);
}

/*
 * The same conversation on a mux of `backend` (with `driver`), which must
 * run on `expect`: messages received whole from the peer (alone, several
 * at once, peeked), sent back (one, in parts, a batch), the calls that name
 * a connection (refused on the kernel backend), a message over the size
 * limit (the connection fails with EMSGSIZE) and the counters.
 */
static void messages(int backend, int driver, int expect)
{
	printf("messages: backend %s (runs %s), driver %s\n", backend_name(backend), backend_name(expect),
	       driver_name(driver));
	int kernel = expect == CONNMUX_BACKEND_KERNEL;
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	cfg.backend = backend;
	cfg.driver = driver;
	cfg.max_msg_size = 4096;
	connmux_mux *m;
	MUST(connmux_mux_new(&cfg, &m));
	EQ(connmux_mux_backend(m), expect);
	int d = connmux_mux_driver(m);
	if (kernel) {
		EQ(d, CONNMUX_DRIVER_AUTO);
		EQ(connmux_mux_workers(m), 0);
	} else {
		/* Auto: each worker decides at its first use (none came yet). */
		CHECK(d == driver);
		CHECK(connmux_mux_workers(m) >= 1);
	}
	connmux_sock *s;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	MUST(connmux_set_timeouts(s, 5000, 5000));
	int peer, near;
	tcp_pair(&peer, &near);
	connmux_psock_id id = CONNMUX_PSOCK_NONE;
	MUST(connmux_attach_spec(m, near, "l4", &id));
	CHECK(id != CONNMUX_PSOCK_NONE);
	close(near);

	/* One message, whole; the kernel does not say which connection. */
	uint8_t buf[256];
	connmux_msg msg = { .buf = buf, .len = sizeof buf };
	send_frame(peer, "alpha");
	EQ(connmux_recvmsg(s, &msg, 0), 9);
	CHECK(is_frame(&msg, "alpha"));
	EQ(msg.psock, kernel ? CONNMUX_PSOCK_NONE : id);

	/* Three in one write, split mid-header by a second: three messages. */
	uint8_t wire[64];
	size_t n = frame(wire, "c1");
	n += frame(wire + n, "c22");
	n += frame(wire + n, "c333");
	write_all(peer, wire, 3);
	write_all(peer, wire + 3, n - 3);
	uint8_t bufs[3][64];
	connmux_msg batch[3];
	const char *want[3] = { "c1", "c22", "c333" };
	int got = 0;
	int64_t end = now_ms() + 5000;
	while (got < 3 && now_ms() < end) {
		for (int i = got; i < 3; i++)
			batch[i] = (connmux_msg){ .buf = bufs[i], .len = sizeof bufs[i] };
		ptrdiff_t k = connmux_recv_batch(s, &batch[got], (size_t)(3 - got), 0);
		if (k <= 0)
			break;
		got += (int)k;
	}
	EQ(got, 3);
	for (int i = 0; i < got; i++)
		CHECK(is_frame(&batch[i], want[i]));

	/* PEEK leaves the message for the next receive. */
	send_frame(peer, "peek");
	msg = (connmux_msg){ .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(s, &msg, CONNMUX_MSG_PEEK), 8);
	msg = (connmux_msg){ .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(s, &msg, 0), 8);
	CHECK(is_frame(&msg, "peek"));
	msg = (connmux_msg){ .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(s, &msg, CONNMUX_MSG_DONTWAIT), -EAGAIN);

	/* Sends: one message; one in two parts (MORE); a batch of two. */
	n = frame(wire, "reply");
	EQ(connmux_send(s, wire, n, 0), (long long)n);
	CHECK(peer_reads(peer, "reply"));
	n = frame(wire, "in parts");
	EQ(connmux_send(s, wire, 6, CONNMUX_MSG_MORE), 6);
	EQ(connmux_send(s, wire + 6, n - 6, 0), (long long)(n - 6));
	CHECK(peer_reads(peer, "in parts"));
	uint8_t b1[32], b2[32];
	connmux_msg out[2] = { { .buf = b1, .len = frame(b1, "first") }, { .buf = b2, .len = frame(b2, "second") } };
	EQ(connmux_send_batch(s, out, 2, 0), 2);
	CHECK(peer_reads(peer, "first"));
	CHECK(peer_reads(peer, "second"));

	/* The calls that name a connection, flush, and a service (no workers
	 * to run a handler on): refused by AF_KCM. */
	n = frame(wire, "to");
	if (kernel) {
		EQ(connmux_send_to(s, wire, n, id, 0), -EOPNOTSUPP);
		CHECK(strstr(connmux_last_error(), "kernel backend") != NULL);
		EQ(connmux_sock_flush(s, 1000), -EOPNOTSUPP);
		connmux_parser *p;
		MUST(connmux_parser_from_spec("l4", &p));
		connmux_service *svc = NULL;
		EQ(connmux_service_start(m, "127.0.0.1:0", p, no_reply, NULL, 0, &svc), -EOPNOTSUPP);
		CHECK(svc == NULL);
		connmux_parser_free(p);
	} else {
		EQ(connmux_send_to(s, wire, n, id, 0), (long long)n);
		CHECK(peer_reads(peer, "to"));
		EQ(connmux_sock_flush(s, 5000), 0);
	}

	/* The counters saw the five messages received and the five sent (four
	 * on the kernel backend, where they are the network namespace's: at
	 * least as many). */
	connmux_mux_stats st;
	MUST(connmux_mux_get_stats(m, &st));
	if (kernel) {
		CHECK(st.rx_msgs >= 5);
		CHECK(st.tx_msgs >= 4);
	} else {
		EQ(st.rx_msgs, 5);
		EQ(st.tx_msgs, 5);
	}

	/* A message over the size limit fails the connection: EMSGSIZE. */
	uint32_t big = htonl(100000);
	write_all(peer, &big, 4);
	connmux_event ev;
	EQ(connmux_next_event(m, &ev, 5000), 1);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_RX);
	EQ(ev.err, EMSGSIZE);
	EQ(ev.psock, id);
	MUST(connmux_unattach_psock(m, id));

	connmux_sock_close(s);
	connmux_mux_free(m);
	close(peer);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "here";
	int must_kernel = strcmp(mode, "kernel") == 0;
	if (!must_kernel && strcmp(mode, "here") != 0) {
		fprintf(stderr, "usage: backend [here|kernel]\n");
		return 2;
	}
	config_checks();

	/* The kernel backend: it works, or it is refused with -EOPNOTSUPP
	 * saying why, and AUTO then runs the userspace one. */
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	cfg.backend = CONNMUX_BACKEND_KERNEL;
	connmux_mux *m = NULL;
	int r = connmux_mux_new(&cfg, &m);
	int have_kcm = r == 0;
	if (have_kcm) {
		connmux_mux_free(m);
	} else {
		EQ(r, -EOPNOTSUPP);
		CHECK(strstr(connmux_last_error(), "AF_KCM") != NULL);
		CHECK(m == NULL);
	}
	printf("AF_KCM here: %s\n", have_kcm ? "yes" : "no");
	if (must_kernel)
		CHECK(have_kcm);
	int auto_runs = have_kcm ? CONNMUX_BACKEND_KERNEL : CONNMUX_BACKEND_USERSPACE;
	cfg.backend = CONNMUX_BACKEND_AUTO;
	MUST(connmux_mux_new(&cfg, &m));
	EQ(connmux_mux_backend(m), auto_runs);
	connmux_mux_free(m);

	if (have_kcm)
		messages(CONNMUX_BACKEND_KERNEL, CONNMUX_DRIVER_AUTO, CONNMUX_BACKEND_KERNEL);
	messages(CONNMUX_BACKEND_AUTO, CONNMUX_DRIVER_AUTO, auto_runs);
	messages(CONNMUX_BACKEND_USERSPACE, CONNMUX_DRIVER_EPOLL, CONNMUX_BACKEND_USERSPACE);
	/* io_uring where it works here (the VM's kernel may refuse it). */
	cfg.backend = CONNMUX_BACKEND_USERSPACE;
	cfg.driver = CONNMUX_DRIVER_URING;
	if (connmux_mux_new(&cfg, &m) == 0) {
		connmux_mux_free(m);
		messages(CONNMUX_BACKEND_USERSPACE, CONNMUX_DRIVER_URING, CONNMUX_BACKEND_USERSPACE);
	} else {
		printf("io_uring: not here (%s)\n", connmux_last_error());
	}
	printf("CAPI SUMMARY passed=%d failed=%d\n", passed, failed);
	return failed ? 1 : 0;
}

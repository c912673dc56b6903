/*
 * C-level checks of libconnmux through include/connmux.h, over real TCP on
 * loopback. Run by tests/c_api.rs:  unit [BPF_OBJECT [TLS_DIR]]
 * (BPF_OBJECT: bpf/len_prefix.c built with clang -target bpf; TLS_DIR: the
 * certificates and keys tests/c_api.rs makes for test_tls).
 * Prints "FAIL file:line: condition" (check.h) for each failed check and
 * ends with "N passed, M failed"; exits 1 if any failed.
 */
#define _GNU_SOURCE
#include "check.h"
#include <sched.h>

/* Read one l4 frame from the peer; returns 1 if its body equals `body`. */
static int peer_gets(int fd, const char *body)
{
	uint8_t hdr[4], data[1024];
	if (read_exact(fd, hdr, 4) < 0)
		return 0;
	uint32_t n = ntohl(*(uint32_t *)hdr);
	if (n > sizeof data || read_exact(fd, data, n) < 0)
		return 0;
	return n == strlen(body) && memcmp(data, body, n) == 0;
}

/* Wait until the socket's descriptor is readable; returns poll's answer. */
static int wait_readable(connmux_sock *s, int ms)
{
	struct pollfd p = { .fd = connmux_sock_fd(s), .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* Wait until `n` messages are queued on s (bounded). */
static int wait_queued(connmux_sock *s, ptrdiff_t n)
{
	for (int i = 0; i < 500; i++) {
		if (connmux_sock_queued(s) >= n)
			return 1;
		struct timespec t = { 0, 10 * 1000 * 1000 };
		nanosleep(&t, NULL);
	}
	return 0;
}

static connmux_mux *new_mux(void)
{
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	cfg.pin_workers = 0;
	cfg.workers = 1; /* the checks below count one worker */
	connmux_mux *m;
	MUST(connmux_mux_new(&cfg, &m));
	return m;
}

static void test_errors(void)
{
	connmux_mux *m = NULL;
	EQ(connmux_mux_new(NULL, NULL), -EFAULT);
	CHECK(connmux_last_error() != NULL && strstr(connmux_last_error(), "null") != NULL);

	connmux_config cfg;
	EQ(connmux_config_init(&cfg), 0);
	/* The library's default: a worker per CPU this thread may run on. */
	cpu_set_t cpus;
	CPU_ZERO(&cpus);
	EQ(sched_getaffinity(0, sizeof cpus, &cpus), 0);
	EQ(cfg.workers, (uint32_t)CPU_COUNT(&cpus));
	EQ(cfg.steering, CONNMUX_STEER_AFFINITY);
	cfg.workers = 0;
	EQ(connmux_mux_new(&cfg, &m), -EINVAL);
	CHECK(m == NULL);
	connmux_config_init(&cfg);
	cfg.steering = 42;
	EQ(connmux_mux_new(&cfg, &m), -EINVAL);

	m = new_mux();
	EQ(connmux_mux_workers(m), 1);
	connmux_sock *s = NULL;
	EQ(connmux_socket(m, 99, &s), -EINVAL);
	CHECK(s == NULL);
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));

	connmux_parser *p = NULL;
	EQ(connmux_parser_from_spec("no-such-parser", &p), -EINVAL);
	CHECK(p == NULL && strstr(connmux_last_error(), "valid forms") != NULL);
	EQ(connmux_parser_from_spec(NULL, &p), -EFAULT);
	EQ(connmux_parser_from_bpf_file("/nonexistent/parser.o", NULL, &p), -ENOENT);
	static const char junk[] = "not an ELF object";
	EQ(connmux_parser_from_bpf_mem(junk, sizeof junk, NULL, &p), -EINVAL);
	MUST(connmux_parser_from_spec("l4", &p));

	/* What AF_KCM's attach refuses. */
	int fds[2];
	MUST(pipe(fds));
	EQ(connmux_attach(m, fds[0], p, NULL), -ENOENT); /* not a socket: as AF_KCM */
	int udp = socket(AF_INET, SOCK_DGRAM, 0);
	EQ(connmux_attach(m, udp, p, NULL), -EOPNOTSUPP);
	close(udp);
	EQ(connmux_attach(m, -1, p, NULL), -ENOENT);
	int unconnected = socket(AF_INET, SOCK_STREAM, 0);
	EQ(connmux_attach(m, unconnected, p, NULL), -EOPNOTSUPP);
	int peer, near;
	tcp_pair(&peer, &near);
	connmux_psock_id id = CONNMUX_PSOCK_NONE;
	EQ(connmux_attach(m, near, p, &id), 0);
	CHECK(id != CONNMUX_PSOCK_NONE);
	EQ(connmux_attach(m, near, p, NULL), -EALREADY);
	EQ(connmux_unattach(m, fds[0]), -ENOENT);
	EQ(connmux_unattach_psock(m, CONNMUX_PSOCK_NONE), -ENOENT);

	/* Receive errors. */
	char buf[64];
	EQ(connmux_recv(s, buf, sizeof buf, CONNMUX_MSG_DONTWAIT), -EAGAIN);
	EQ(connmux_recv(s, buf, sizeof buf, 0x1 /* MSG_OOB */), -EINVAL);
	EQ(connmux_recv(s, NULL, sizeof buf, CONNMUX_MSG_DONTWAIT), -EFAULT);
	EQ(connmux_recv(NULL, buf, sizeof buf, 0), -EFAULT);
	MUST(connmux_set_nonblocking(s, 1));
	EQ(connmux_recv(s, buf, sizeof buf, 0), -EAGAIN);
	MUST(connmux_set_nonblocking(s, 0));
	MUST(connmux_set_timeouts(s, 50, 0));
	int64_t t0 = now_ms();
	EQ(connmux_recv(s, buf, sizeof buf, 0), -EAGAIN);
	CHECK(now_ms() - t0 >= 40);
	MUST(connmux_set_timeouts(s, 0, 0));
	EQ(connmux_send(s, "x", 1, 0x1 /* MSG_OOB */), -EINVAL);
	EQ(connmux_send_to(s, "x", 1, id, CONNMUX_MSG_MORE), -EINVAL);

	/* A stale psock id stays dead. */
	EQ(connmux_unattach_psock(m, id), 0);
	EQ(connmux_unattach_psock(m, id), -ENOENT);
	EQ(connmux_send_to(s, "\0\0\0\1x", 5, id, 0), -ENOENT);
	connmux_psock_stats ps;
	EQ(connmux_psock_get_stats(m, id, &ps), -ENOENT);

	/* The message is per thread and stays until the next failure. */
	connmux_sock *none = NULL;
	EQ(connmux_socket(m, 7, &none), -EINVAL);
	CHECK(strstr(connmux_last_error(), "socket type 7") != NULL);
	EQ(connmux_mux_workers(m), 1);
	CHECK(strstr(connmux_last_error(), "socket type 7") != NULL);

	connmux_sock_close(NULL);
	connmux_mux_free(NULL);
	connmux_parser_free(NULL);
	connmux_parser_free(p);
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(fds[0]);
	close(fds[1]);
	close(unconnected);
	close(peer);
	close(near);
}

static void test_trunc_eor_peek(void)
{
	connmux_mux *m = new_mux();
	connmux_sock *dg, *sp, *keeper;
	/* The connection lives while the mux has a socket: this one, which
	 * receives nothing, keeps it across the closes below. */
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &keeper));
	MUST(connmux_set_recv_disable(keeper, 1));
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &dg));
	int peer, near;
	tcp_pair(&peer, &near);
	MUST(connmux_attach_spec(m, near, "l4", NULL));
	close(near);

	/* DGRAM: a short buffer truncates; the rest is gone, the next message whole. */
	send_frame(peer, "0123456789");
	send_frame(peer, "next");
	uint8_t buf[64];
	connmux_msg msg = { .buf = buf, .len = 6 };
	EQ(connmux_recvmsg(dg, &msg, 0), 6);
	EQ(msg.n, 6);
	CHECK(msg.flags & CONNMUX_MSG_TRUNC);
	CHECK(memcmp(buf + 4, "01", 2) == 0);
	msg = (connmux_msg){ .buf = buf, .len = sizeof buf };
	/* PEEK copies without consuming. */
	EQ(connmux_recvmsg(dg, &msg, CONNMUX_MSG_PEEK), 8);
	CHECK(memcmp(buf + 4, "next", 4) == 0);
	msg = (connmux_msg){ .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(dg, &msg, 0), 8);
	CHECK(msg.flags & CONNMUX_MSG_EOR);
	CHECK(!(msg.flags & CONNMUX_MSG_TRUNC));
	CHECK(memcmp(buf + 4, "next", 4) == 0);
	connmux_sock_close(dg);

	/* SEQPACKET: a short buffer gets the message in parts, EOR on the last. */
	MUST(connmux_socket(m, CONNMUX_SOCK_SEQPACKET, &sp));
	send_frame(peer, "0123456789");
	msg = (connmux_msg){ .buf = buf, .len = 6 };
	EQ(connmux_recvmsg(sp, &msg, 0), 6);
	CHECK(!(msg.flags & (CONNMUX_MSG_EOR | CONNMUX_MSG_TRUNC)));
	msg = (connmux_msg){ .buf = buf + 6, .len = sizeof buf - 6 };
	EQ(connmux_recvmsg(sp, &msg, 0), 8);
	CHECK(msg.flags & CONNMUX_MSG_EOR);
	CHECK(memcmp(buf + 4, "0123456789", 10) == 0);

	/* SEQPACKET send: the message ends only with EOR. */
	uint8_t f[64];
	size_t n = frame(f, "seqpacket");
	EQ(connmux_send(sp, f, 5, 0), 5);
	EQ(connmux_send(sp, f + 5, n - 5, CONNMUX_MSG_EOR), (ptrdiff_t)(n - 5));
	CHECK(peer_gets(peer, "seqpacket"));
	connmux_sock_close(sp);

	/* DGRAM send with MORE: one message from two sends. */
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &dg));
	n = frame(f, "more");
	EQ(connmux_send(dg, f, 4, CONNMUX_MSG_MORE), 4);
	EQ(connmux_send(dg, f + 4, n - 4, 0), (ptrdiff_t)(n - 4));
	CHECK(peer_gets(peer, "more"));
	connmux_sock_close(dg);
	connmux_sock_stats ks;
	MUST(connmux_sock_get_stats(keeper, &ks));
	EQ(ks.rx_msgs, 0);
	connmux_sock_close(keeper);
	connmux_mux_free(m);
	close(peer);
}

static void test_batch_and_addressed(void)
{
	connmux_mux *m = new_mux();
	connmux_sock *s;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	int pa, na, pb, nb;
	tcp_pair(&pa, &na);
	tcp_pair(&pb, &nb);
	connmux_psock_id ia, ib;
	MUST(connmux_attach_spec(m, na, "l4", &ia));
	MUST(connmux_attach_spec(m, nb, "l4", &ib));
	CHECK(ia != ib);

	/* Batch receive: 5 queued messages in one call, each with its source. */
	uint8_t all[256];
	size_t n = 0;
	const char *bodies[5] = { "m0", "m1", "m2", "m3", "m4" };
	for (int i = 0; i < 5; i++)
		n += frame(all + n, bodies[i]);
	EQ(write(pa, all, n), (ssize_t)n);
	CHECK(wait_queued(s, 5));
	uint8_t bufs[8][32];
	connmux_msg msgs[8];
	for (int i = 0; i < 8; i++)
		msgs[i] = (connmux_msg){ .buf = bufs[i], .len = sizeof bufs[i] };
	EQ(connmux_recv_batch(s, msgs, 8, 0), 5);
	for (int i = 0; i < 5; i++) {
		EQ(msgs[i].n, 6);
		CHECK(memcmp(bufs[i] + 4, bodies[i], 2) == 0);
		CHECK(msgs[i].flags & CONNMUX_MSG_EOR);
		EQ(msgs[i].psock, ia);
	}
	EQ(connmux_recv_batch(s, msgs, 8, CONNMUX_MSG_DONTWAIT), -EAGAIN);
	EQ(connmux_recv_batch(s, msgs, 0, 0), 0);

	/* Addressed receive and reply: each peer gets the answer to its message. */
	send_frame(pb, "from-b");
	send_frame(pa, "from-a");
	uint8_t buf[64];
	for (int i = 0; i < 2; i++) {
		connmux_msg msg = { .buf = buf, .len = sizeof buf };
		EQ(connmux_recvmsg(s, &msg, 0), 10);
		uint8_t reply[64];
		size_t rn = frame(reply, msg.psock == ia ? "to-a" : "to-b");
		CHECK(msg.psock == ia || msg.psock == ib);
		CHECK(memcmp(buf + 4, msg.psock == ia ? "from-a" : "from-b", 6) == 0);
		EQ(connmux_send_to(s, reply, rn, msg.psock, 0), (ptrdiff_t)rn);
	}
	CHECK(peer_gets(pa, "to-a"));
	CHECK(peer_gets(pb, "to-b"));

	/* Batch send, unaddressed: all three on one connection, in order. */
	uint8_t out[3][32];
	connmux_msg sm[3];
	const char *sb[3] = { "b0", "b1", "b2" };
	for (int i = 0; i < 3; i++)
		sm[i] = (connmux_msg){ .buf = out[i], .len = frame(out[i], sb[i]) };
	EQ(connmux_send_batch(s, sm, 3, 0), 3);
	EQ(sm[2].n, 6);
	/* Whichever connection the mux picked has them all. */
	struct pollfd pp[2] = { { .fd = pa, .events = POLLIN }, { .fd = pb, .events = POLLIN } };
	CHECK(poll(pp, 2, 5000) >= 1);
	int got = (pp[0].revents & POLLIN) ? pa : pb;
	CHECK(peer_gets(got, "b0") && peer_gets(got, "b1") && peer_gets(got, "b2"));

	/* Batch send, addressed: each to its connection. */
	sm[0] = (connmux_msg){ .buf = out[0], .len = frame(out[0], "ab-a"), .psock = ia };
	sm[1] = (connmux_msg){ .buf = out[1], .len = frame(out[1], "ab-b"), .psock = ib };
	EQ(connmux_send_batch(s, sm, 2, 0), 2);
	CHECK(peer_gets(pa, "ab-a"));
	CHECK(peer_gets(pb, "ab-b"));

	/* Statistics. */
	connmux_mux_stats ms;
	MUST(connmux_mux_get_stats(m, &ms));
	EQ(ms.rx_msgs, 7);
	EQ(ms.psocks, 2);
	EQ(ms.kcms, 1);
	EQ(ms.psock_attach, 2);
	connmux_psock_stats ps;
	MUST(connmux_psock_get_stats(m, ib, &ps));
	EQ(ps.rx_msgs, 1);
	connmux_sock_stats ss;
	MUST(connmux_sock_get_stats(s, &ss));
	EQ(ss.rx_msgs, 7);
	EQ(ss.rx_queued, 0);
	CHECK(ss.tx_msgs >= 7);

	connmux_sock_close(s);
	connmux_mux_free(m);
	close(pa);
	close(pb);
	close(na);
	close(nb);
}

static void test_recv_disable_and_poll(void)
{
	connmux_mux *m = new_mux();
	connmux_sock *s, *c;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	int peer, near;
	tcp_pair(&peer, &near);
	MUST(connmux_attach_spec(m, near, "l4", NULL));
	close(near);

	/* The pollable descriptor: not readable while empty, readable with a message. */
	CHECK(connmux_sock_fd(s) >= 0);
	CHECK(!wait_readable(s, 0));
	send_frame(peer, "poll");
	CHECK(wait_readable(s, 5000));
	uint8_t buf[64];
	EQ(connmux_recv(s, buf, sizeof buf, 0), 8);
	CHECK(!wait_readable(s, 0));

	/* Receive disabled: nothing delivered until enabled again. */
	MUST(connmux_set_recv_disable(s, 1));
	send_frame(peer, "held");
	CHECK(!wait_readable(s, 200));
	EQ(connmux_recv(s, buf, sizeof buf, CONNMUX_MSG_DONTWAIT), -EAGAIN);
	MUST(connmux_set_recv_disable(s, 0));
	CHECK(wait_readable(s, 5000));
	EQ(connmux_recv(s, buf, sizeof buf, 0), 8);
	CHECK(memcmp(buf + 4, "held", 4) == 0);

	/* With a clone: a disabled socket's messages go to the clone. */
	MUST(connmux_sock_clone(s, &c));
	MUST(connmux_set_recv_disable(s, 1));
	send_frame(peer, "clone");
	CHECK(wait_readable(c, 5000));
	EQ(connmux_recv(c, buf, sizeof buf, CONNMUX_MSG_DONTWAIT), 9);
	CHECK(memcmp(buf + 4, "clone", 5) == 0);
	EQ(connmux_recv(s, buf, sizeof buf, CONNMUX_MSG_DONTWAIT), -EAGAIN);

	connmux_sock_close(c);
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(peer);
}

static void test_events(void)
{
	connmux_mux *m = new_mux();
	connmux_sock *s;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	int pa, na, pb, nb;
	tcp_pair(&pa, &na);
	tcp_pair(&pb, &nb);
	connmux_psock_id ia, ib;
	MUST(connmux_attach_spec(m, na, "l4", &ia));
	MUST(connmux_attach_spec(m, nb, "9p", &ib));
	connmux_event ev = { 0 };
	EQ(connmux_next_event(m, &ev, 0), 0);

	/* A peer that closes: CLOSED, EPIPE. */
	close(pa);
	EQ(connmux_next_event(m, &ev, 5000), 1);
	EQ(ev.psock, ia);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_CLOSED);
	EQ(ev.err, EPIPE);
	int err = 0;
	EQ(connmux_psock_error(m, ia, &err), 1);
	EQ(err, EPIPE);
	EQ(connmux_psock_error(m, ib, &err), 0);
	MUST(connmux_unattach_psock(m, ia));

	/* A peer that breaks the framing (9P size below 7): RX with an errno. */
	static const uint8_t bad[7] = { 3, 0, 0, 0, 100, 0, 0 };
	EQ(write(pb, bad, sizeof bad), 7);
	EQ(connmux_next_event(m, &ev, 5000), 1);
	EQ(ev.psock, ib);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_RX);
	CHECK(ev.err > 0);
	MUST(connmux_abort_psock(m, ib));
	connmux_psock_stats ps;
	EQ(connmux_psock_get_stats(m, ib, &ps), -ENOENT);
	connmux_mux_stats ms;
	MUST(connmux_mux_get_stats(m, &ms));
	EQ(ms.psocks, 0);
	EQ(ms.psock_unattach, 2);
	EQ(ms.psock.rx_aborts, 1);

	connmux_sock_close(s);
	connmux_mux_free(m);
	close(pb);
	close(na);
	close(nb);
}

/* Per-attach options: one connection's size limit and assembly timeout, the
 * mux's defaults beside it; the least-outstanding transmit policy. */
static void test_attach_opts(void)
{
	connmux_attach_opts o;
	EQ(connmux_attach_opts_init(NULL), -EFAULT);
	EQ(connmux_attach_opts_init(&o), 0);
	CHECK(o.parser == NULL);
	EQ(o.max_msg_size, 0);
	EQ(o.assembly_timeout_ms, CONNMUX_ATTACH_MUX_DEFAULT);
	EQ(o.worker, CONNMUX_ATTACH_MUX_DEFAULT);

	connmux_mux *m = new_mux();
	connmux_sock *s;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	connmux_parser *l4;
	MUST(connmux_parser_from_spec("l4", &l4));
	int ps, ns, pt, nt, pd, nd;
	tcp_pair(&ps, &ns);
	tcp_pair(&pt, &nt);
	tcp_pair(&pd, &nd);
	connmux_psock_id is, it, id;
	EQ(connmux_attach_with(m, ns, &o, &is), -EINVAL); /* no parser */
	o.parser = l4;
	o.assembly_timeout_ms = -5;
	EQ(connmux_attach_with(m, ns, &o, &is), -EINVAL);
	o.assembly_timeout_ms = CONNMUX_ATTACH_MUX_DEFAULT;
	o.max_msg_size = 16;
	EQ(connmux_attach_with(m, ns, &o, &is), 0);
	o.max_msg_size = 0;
	o.assembly_timeout_ms = 100;
	EQ(connmux_attach_with(m, nt, &o, &it), 0);
	EQ(connmux_attach(m, nd, l4, &id), 0);

	/* Over 16 bytes on the limited connection: RX, EMSGSIZE. */
	send_frame(ps, "twenty bytes of body");
	connmux_event ev = { 0 };
	EQ(connmux_next_event(m, &ev, 5000), 1);
	EQ(ev.psock, is);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_RX);
	EQ(ev.err, EMSGSIZE);
	/* The same message on the connection with the mux's limit arrives. */
	send_frame(pd, "twenty bytes of body");
	uint8_t buf[64];
	connmux_msg msg = { .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(s, &msg, 0), 24);
	EQ(msg.psock, id);
	/* Half a message on the connection with a 100 ms timeout: RX, ETIMEDOUT. */
	uint8_t half[12];
	frame(half, "abcdefgh");
	EQ(write(pt, half, 6), 6);
	EQ(connmux_next_event(m, &ev, 5000), 1);
	EQ(ev.psock, it);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_RX);
	EQ(ev.err, ETIMEDOUT);
	connmux_psock_stats st;
	MUST(connmux_psock_get_stats(m, is, &st));
	EQ(st.rx_msg_too_big, 1);
	MUST(connmux_psock_get_stats(m, it, &st));
	EQ(st.rx_msg_timeouts, 1);
	MUST(connmux_abort_psock(m, is));
	MUST(connmux_abort_psock(m, it));
	EQ(connmux_psock_error(m, id, NULL), 0);
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(ps);
	close(pt);
	close(pd);
	close(ns);
	close(nt);
	close(nd);

	/* Limits of the whole mux: defaults, and an idle connection failing. */
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	EQ(cfg.mem_limit, (size_t)256 << 20);
	EQ(cfg.mem_grace_ms, 1000);
	EQ(cfg.idle_timeout_ms, 0);
	cfg.pin_workers = 0;
	cfg.idle_timeout_ms = 100;
	cfg.mem_limit = 0;
	MUST(connmux_mux_new(&cfg, &m));
	{
		int pi, ni;
		tcp_pair(&pi, &ni);
		connmux_psock_id ii;
		MUST(connmux_attach_spec(m, ni, "l4", &ii));
		connmux_event iev = { 0 };
		EQ(connmux_next_event(m, &iev, 5000), 1);
		EQ(iev.psock, ii);
		EQ(iev.kind, CONNMUX_PSOCK_ERR_RX);
		EQ(iev.err, ETIMEDOUT);
		MUST(connmux_abort_psock(m, ii));
		close(pi);
		close(ni);
	}
	connmux_mux_free(m);

	/* Transmit policies. */
	MUST(connmux_config_init(&cfg));
	EQ(cfg.tx_policy, CONNMUX_TX_ROUND_ROBIN);
	cfg.pin_workers = 0;
	cfg.tx_policy = 7;
	EQ(connmux_mux_new(&cfg, &m), -EINVAL);
	cfg.tx_policy = CONNMUX_TX_LEAST_OUTSTANDING;
	MUST(connmux_mux_new(&cfg, &m));
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	int pa, na, pb, nb;
	tcp_pair(&pa, &na);
	tcp_pair(&pb, &nb);
	connmux_psock_id ia, ib;
	MUST(connmux_attach(m, na, l4, &ia));
	MUST(connmux_attach(m, nb, l4, &ib));
	/* Two calls: one on each connection (ties rotate). */
	uint8_t call[16];
	size_t n = frame(call, "call");
	EQ(connmux_send(s, call, n, 0), (long long)n);
	EQ(connmux_send(s, call, n, 0), (long long)n);
	CHECK(peer_gets(pa, "call"));
	CHECK(peer_gets(pb, "call"));
	/* a answers, b does not: the next two calls both go to a. */
	send_frame(pa, "reply");
	msg.len = sizeof buf;
	EQ(connmux_recvmsg(s, &msg, 0), 9);
	EQ(msg.psock, ia);
	EQ(connmux_send(s, call, n, 0), (long long)n);
	CHECK(peer_gets(pa, "call"));
	send_frame(pa, "reply");
	msg.len = sizeof buf;
	EQ(connmux_recvmsg(s, &msg, 0), 9);
	EQ(connmux_send(s, call, n, 0), (long long)n);
	CHECK(peer_gets(pa, "call"));
	connmux_psock_stats sa, sb;
	MUST(connmux_psock_get_stats(m, ia, &sa));
	MUST(connmux_psock_get_stats(m, ib, &sb));
	EQ(sa.tx_msgs, 3);
	EQ(sb.tx_msgs, 1);
	connmux_parser_free(l4);
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(pa);
	close(pb);
	close(na);
	close(nb);
}

static void test_bpf(const char *obj)
{
	connmux_parser *p;
	EQ(connmux_parser_from_bpf_file(obj, NULL, &p), 0);
	EQ(connmux_parser_from_bpf_file(obj, "no_such_section", &(connmux_parser *){ 0 }), -EINVAL);
	/* The same object from memory. */
	FILE *f = fopen(obj, "rb");
	static uint8_t elf[1 << 16];
	size_t n = f ? fread(elf, 1, sizeof elf, f) : 0;
	if (f)
		fclose(f);
	connmux_parser *pm = NULL;
	EQ(connmux_parser_from_bpf_mem(elf, n, NULL, &pm), 0);
	connmux_parser_free(pm);

	connmux_mux *m = new_mux();
	connmux_sock *s;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	int peer, near;
	tcp_pair(&peer, &near);
	connmux_psock_id id;
	EQ(connmux_attach(m, near, p, &id), 0);
	/* The template may go; the connection keeps its parser. */
	connmux_parser_free(p);
	close(near);
	send_frame(peer, "bpf framed");
	uint8_t buf[64];
	connmux_msg msg = { .buf = buf, .len = sizeof buf };
	EQ(connmux_recvmsg(s, &msg, 0), 14);
	EQ(msg.psock, id);
	CHECK(memcmp(buf + 4, "bpf framed", 10) == 0);
	EQ(connmux_send_to(s, buf, 14, id, 0), 14);
	CHECK(peer_gets(peer, "bpf framed"));
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(peer);
}

/* connmux_sock_flush: with no connection the messages stay unsent and the
 * wait ends at its bound with -ETIMEDOUT; once one is attached they are
 * written and the flush returns 0, so the close drops nothing. */
static void test_flush(void)
{
	connmux_mux *m = new_mux();
	connmux_sock *s, *keeper;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &keeper));
	MUST(connmux_set_recv_disable(keeper, 1));
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	MUST(connmux_set_nonblocking(s, 1));
	uint8_t f[64];
	size_t n = frame(f, "flushed");
	EQ(connmux_send(s, f, n, 0), (ptrdiff_t)n);
	EQ(connmux_send(s, f, n, 0), (ptrdiff_t)n);
	int64_t t0 = now_ms();
	EQ(connmux_sock_flush(s, 50), -ETIMEDOUT);
	CHECK(now_ms() - t0 >= 40);
	int peer, near;
	tcp_pair(&peer, &near);
	MUST(connmux_attach_spec(m, near, "l4", NULL));
	close(near);
	EQ(connmux_sock_flush(s, 5000), 0);
	connmux_sock_close(s);
	CHECK(peer_gets(peer, "flushed"));
	CHECK(peer_gets(peer, "flushed"));
	close(peer);
	connmux_sock_close(keeper);
	connmux_mux_free(m);
}

/* A file of `dir` by name, in a static buffer per call site's use. */
static const char *in_dir(const char *dir, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", dir, name);
	return buf;
}

/* TLS from C: configurations from PEM files (errors typed), a client psock of
 * one mux talking to a server psock of another over loopback with mutual
 * TLS, each side seeing the other's certificate; a client without a
 * certificate refused by that server, alone (a psock failure, counted).
 * `dir` holds what tests/c_api.rs made: ca.pem (the server's CA),
 * server.pem/.key, clientca.pem, client.pem/.key and client.der. */
/* A TCP connection whose ends are attached with TLS: one to `sm` as
 * `srv`'s server (`*sp`), the other to `cm` as `cli`'s client (`*cp`). The
 * muxes hold duplicates of the descriptors: these are closed here. */
static void attach_tls_pair(connmux_mux *sm, connmux_mux *cm, connmux_parser *p, connmux_tls *srv, connmux_tls *cli,
			    connmux_psock_id *sp, connmux_psock_id *cp)
{
	int peer, near;
	tcp_pair(&peer, &near);
	MUST(connmux_attach_tls(sm, near, p, srv, sp));
	MUST(connmux_attach_tls(cm, peer, p, cli, cp));
	close(near);
	close(peer);
}

static void test_tls(const char *dir)
{
	char a[512], b[512], c[512], d[512];
	connmux_tls *srv = NULL, *cli = NULL, *anon = NULL, *bad = (connmux_tls *)1;

	/* Errors: a missing file, a file with no certificate, half a client pair. */
	EQ(connmux_tls_server_new(in_dir(dir, "nope.pem", a, sizeof a), in_dir(dir, "server.key", b, sizeof b), NULL,
				  &bad),
	   -ENOENT);
	CHECK(bad == NULL);
	CHECK(strstr(connmux_last_error(), "nope.pem") != NULL);
	EQ(connmux_tls_server_new(in_dir(dir, "server.key", a, sizeof a), in_dir(dir, "server.key", b, sizeof b), NULL,
				  &bad),
	   -EINVAL);
	EQ(connmux_tls_client_new(in_dir(dir, "ca.pem", a, sizeof a), "localhost", in_dir(dir, "client.pem", b, sizeof b),
				  NULL, &bad),
	   -EINVAL);
	EQ(connmux_tls_client_new(in_dir(dir, "ca.pem", a, sizeof a), "not a name!", NULL, NULL, &bad), -EINVAL);

	MUST(connmux_tls_server_new(in_dir(dir, "server.pem", a, sizeof a), in_dir(dir, "server.key", b, sizeof b),
				    in_dir(dir, "clientca.pem", c, sizeof c), &srv));
	MUST(connmux_tls_client_new(in_dir(dir, "ca.pem", a, sizeof a), "localhost", in_dir(dir, "client.pem", b, sizeof b),
				    in_dir(dir, "client.key", d, sizeof d), &cli));
	MUST(connmux_tls_client_new(in_dir(dir, "ca.pem", a, sizeof a), "localhost", NULL, NULL, &anon));

	connmux_mux *sm = new_mux(), *cm = new_mux();
	connmux_parser *l4;
	MUST(connmux_parser_from_spec("l4", &l4));
	connmux_sock *ss, *cs;
	MUST(connmux_socket(sm, CONNMUX_SOCK_DGRAM, &ss));
	MUST(connmux_socket(cm, CONNMUX_SOCK_DGRAM, &cs));
	MUST(connmux_set_timeouts(ss, 5000, 5000));
	MUST(connmux_set_timeouts(cs, 5000, 5000));
	connmux_psock_id sp, cp;
	attach_tls_pair(sm, cm, l4, srv, cli, &sp, &cp);
	/* Both configurations serve any number of connections: freed here. */
	connmux_tls_free(srv);
	connmux_tls_free(cli);

	uint8_t msg[64], got[2048];
	size_t n = frame(msg, "over TLS from C");
	EQ(connmux_send(cs, msg, n, 0), (long long)n);
	EQ(connmux_recv(ss, got, sizeof got, 0), (long long)n);
	CHECK(memcmp(got, msg, n) == 0);

	/* Who the client is: its certificate, byte for byte. */
	uint8_t want[2048];
	FILE *f = fopen(in_dir(dir, "client.der", a, sizeof a), "rb");
	size_t wn = f ? fread(want, 1, sizeof want, f) : 0;
	if (f)
		fclose(f);
	CHECK(wn > 0);
	EQ(connmux_tls_peer_certificate(sm, sp, NULL, 0), (long long)wn);
	EQ(connmux_tls_peer_certificate(sm, sp, got, sizeof got), (long long)wn);
	CHECK(memcmp(got, want, wn) == 0);
	n = frame(msg, "and back");
	EQ(connmux_send_to(ss, msg, n, sp, 0), (long long)n);
	EQ(connmux_recv(cs, got, sizeof got, 0), (long long)n);
	CHECK(memcmp(got, msg, n) == 0);
	/* The client sees the server's certificate; a plain psock has none. */
	CHECK(connmux_tls_peer_certificate(cm, cp, NULL, 0) > 0);
	int pp, pn;
	tcp_pair(&pp, &pn);
	connmux_psock_id plain;
	EQ(connmux_attach_tls(sm, pn, l4, NULL, &plain), -EFAULT);
	MUST(connmux_attach(sm, pn, l4, &plain));
	EQ(connmux_tls_peer_certificate(sm, plain, NULL, 0), -ENOENT);
	MUST(connmux_unattach_psock(sm, plain));
	close(pp);
	close(pn);

	/* A client with no certificate: its handshake fails on the server, alone. */
	connmux_tls *srv2;
	MUST(connmux_tls_server_new(in_dir(dir, "server.pem", a, sizeof a), in_dir(dir, "server.key", b, sizeof b),
				    in_dir(dir, "clientca.pem", c, sizeof c), &srv2));
	connmux_psock_id sp2, cp2;
	attach_tls_pair(sm, cm, l4, srv2, anon, &sp2, &cp2);
	connmux_tls_free(srv2);
	connmux_tls_free(anon);
	n = frame(msg, "let me in");
	connmux_send_to(cs, msg, n, cp2, 0);
	connmux_event ev = { 0 };
	EQ(connmux_next_event(sm, &ev, 5000), 1);
	EQ(ev.psock, sp2);
	EQ(ev.kind, CONNMUX_PSOCK_ERR_RX);
	EQ(ev.err, EBADMSG);
	connmux_tls_stats st;
	MUST(connmux_tls_get_stats(sm, &st));
	EQ(st.attached, 2);
	EQ(st.handshakes, 1);
	EQ(st.handshake_failures, 1);
	EQ(st.errors, 0);
	MUST(connmux_abort_psock(sm, sp2));
	/* The first pair goes on. */
	n = frame(msg, "still here");
	EQ(connmux_send_to(cs, msg, n, cp, 0), (long long)n);
	EQ(connmux_recv(ss, got, sizeof got, 0), (long long)n);
	CHECK(memcmp(got, msg, n) == 0);

	connmux_tls_free(NULL);
	connmux_parser_free(l4);
	connmux_sock_close(ss);
	connmux_sock_close(cs);
	connmux_mux_free(sm);
	connmux_mux_free(cm);
}

/* A stand-alone socket: its connections are read by the thread that
 * receives on it (here, this one), in the receive call; one slot only. */
static void test_stand_alone(void)
{
	connmux_config cfg;
	MUST(connmux_config_init(&cfg));
	EQ(cfg.stand_alone, 0);
	cfg.pin_workers = 0;
	cfg.workers = 1;
	cfg.stand_alone = 1;
	connmux_mux *m;
	MUST(connmux_mux_new(&cfg, &m));
	connmux_sock *s, *a, *b = NULL;
	MUST(connmux_socket(m, CONNMUX_SOCK_DGRAM, &s));
	MUST(connmux_set_recv_disable(s, 1));
	MUST(connmux_sock_stand_alone(s, &a));
	EQ(connmux_sock_stand_alone(s, &b), -ENOMEM);
	CHECK(b == NULL);
	int peer, near;
	tcp_pair(&peer, &near);
	connmux_psock_id id;
	MUST(connmux_sock_attach_spec(a, near, "l4", &id));
	close(near);
	uint8_t buf[64];
	/* Nothing sent: one look at its connection, then -EAGAIN. */
	EQ(connmux_recv(a, buf, sizeof buf, CONNMUX_MSG_DONTWAIT), -EAGAIN);
	send_frame(peer, "alone");
	EQ(connmux_recv(a, buf, sizeof buf, 0), 9);
	CHECK(memcmp(buf + 4, "alone", 5) == 0);
	connmux_sock_close(a);
	/* Its connection stays attached (the slot's own thread reads it), so
	 * the slot stays taken until it is unattached; then it is free again
	 * (within a bounded wait: the slot's thread looks every 50 ms). */
	EQ(connmux_sock_stand_alone(s, &b), -ENOMEM);
	MUST(connmux_unattach_psock(m, id));
	int r = -ENOMEM;
	for (int i = 0; i < 500 && r == -ENOMEM; i++) {
		r = connmux_sock_stand_alone(s, &b);
		if (r == -ENOMEM) {
			struct timespec t = { 0, 10 * 1000 * 1000 };
			nanosleep(&t, NULL);
		}
	}
	MUST(r);
	connmux_sock_close(b);
	connmux_sock_close(s);
	connmux_mux_free(m);
	close(peer);
}

int main(int argc, char **argv)
{
	CHECK(strlen(connmux_version()) > 0);
	test_errors();
	test_trunc_eor_peek();
	test_batch_and_addressed();
	test_recv_disable_and_poll();
	test_stand_alone();
	test_events();
	test_flush();
	test_attach_opts();
	if (argc > 1)
		test_bpf(argv[1]);
	if (argc > 2)
		test_tls(argv[2]);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

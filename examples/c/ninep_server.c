/*
 * ninep_server: a 9P2000-framed server on connmux's C API.
 *
 *   ninep_server [-p PORT] [-w WORKERS] [-m MUX_WORKERS] [-b BPF_OBJECT]
 *
 * The main thread listens on 127.0.0.1:PORT (0: any free port), attaches each
 * accepted connection to one mux with the built-in "9p" parser (or, with -b,
 * a BPF parser program from an ELF object, e.g. bpf/ninep.c built by
 * bpf/build.sh), and unattaches connections that fail. WORKERS threads each
 * own a clone of one KCM socket: they wait on the socket's pollable
 * descriptor, take a batch of whole 9P messages (each with the connection it
 * came from), and answer each on its connection with one batched send.
 *
 * It answers Tversion, Tattach, Twalk (of zero names), Tclunk and Tflush;
 * anything else gets an Rerror. Replies carry the request's tag, so a client
 * may pipeline; replies to one connection may come back in any order.
 *
 * The first line on stdout is "port N". The server stops when stdin reaches
 * end of file (or on SIGINT/SIGTERM) and then prints one line per worker,
 * "worker I requests N", and a line of mux totals, "total rx_msgs N tx_msgs N
 * failed N". Build: see the Makefile beside this file.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "connmux.h"

enum {
	BATCH = 16,
	MAX_MSG = 8192,      /* largest request taken (and msize offered) */
	MAX_WORKERS = 64,
};

/* 9P2000 message types. */
enum {
	Tversion = 100, Rversion = 101,
	Tattach = 104, Rattach = 105,
	Rerror = 107,
	Tflush = 108, Rflush = 109,
	Twalk = 110, Rwalk = 111,
	Tclunk = 120, Rclunk = 121,
};

static volatile sig_atomic_t stop_signal;
static int stop_pipe[2] = { -1, -1 }; /* written once to stop the workers */

struct worker {
	pthread_t thread;
	int index;
	connmux_sock *sock;
	uint64_t requests;
	int error; /* a negative errno if the worker stopped on an error */
};

static void die(const char *what, int err)
{
	const char *msg = connmux_last_error();
	fprintf(stderr, "ninep_server: %s: %s (%s)\n", what, strerror(-err), msg ? msg : "");
	exit(1);
}

/* ---- little-endian encoding, as 9P has it ---- */

static uint32_t get4(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t get2(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void put4(uint8_t *p, uint32_t v) { p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24; }
static void put2(uint8_t *p, uint16_t v) { p[0] = v; p[1] = v >> 8; }

/* Append a 9P string (length[2] bytes) at out+*n; returns 0 or -1 if it does not fit. */
static int put_str(uint8_t *out, size_t cap, size_t *n, const char *s, size_t len)
{
	if (len > 0xffff || *n + 2 + len > cap)
		return -1;
	put2(out + *n, (uint16_t)len);
	memcpy(out + *n + 2, s, len);
	*n += 2 + len;
	return 0;
}

/* Start a reply: size[4] (filled by finish) type[1] tag[2]. */
static size_t begin(uint8_t *out, uint8_t type, uint16_t tag)
{
	out[4] = type;
	put2(out + 5, tag);
	return 7;
}

static size_t finish(uint8_t *out, size_t n)
{
	put4(out, (uint32_t)n);
	return n;
}

static size_t rerror(uint8_t *out, size_t cap, uint16_t tag, const char *ename)
{
	size_t n = begin(out, Rerror, tag);
	if (put_str(out, cap, &n, ename, strlen(ename)) < 0)
		n = 7;
	return finish(out, n);
}

/*
 * Answer one request (`len` bytes, a whole message as the parser framed it:
 * size[4] type[1] tag[2] ...) into `out` (`cap` bytes); returns the reply's length.
 */
static size_t answer(const uint8_t *req, size_t len, uint8_t *out, size_t cap)
{
	if (len < 7 || get4(req) != len)
		return rerror(out, cap, 0xffff, "malformed message");
	uint8_t type = req[4];
	uint16_t tag = get2(req + 5);
	size_t n;

	switch (type) {
	case Tversion: { /* msize[4] version[s] */
		if (len < 13 || 13 + (size_t)get2(req + 11) > len)
			return rerror(out, cap, tag, "malformed Tversion");
		uint32_t msize = get4(req + 7);
		const char *v = (const char *)req + 13;
		size_t vlen = get2(req + 11);
		int ok = vlen >= 6 && memcmp(v, "9P2000", 6) == 0;
		n = begin(out, Rversion, tag);
		put4(out + n, msize < MAX_MSG ? msize : MAX_MSG);
		n += 4;
		put_str(out, cap, &n, ok ? "9P2000" : "unknown", ok ? 6 : 7);
		return finish(out, n);
	}
	case Tattach: /* fid[4] afid[4] uname[s] aname[s] -> qid[13] */
		if (len < 19)
			return rerror(out, cap, tag, "malformed Tattach");
		n = begin(out, Rattach, tag);
		memset(out + n, 0, 13);
		out[n] = 0x80; /* QTDIR: the root is a directory */
		n += 13;
		return finish(out, n);
	case Twalk: /* fid[4] newfid[4] nwname[2] wname[s]... -> nwqid[2] qid[13]... */
		if (len < 17)
			return rerror(out, cap, tag, "malformed Twalk");
		if (get2(req + 15) != 0)
			return rerror(out, cap, tag, "file not found");
		n = begin(out, Rwalk, tag);
		put2(out + n, 0);
		return finish(out, n + 2);
	case Tclunk:
		n = begin(out, Rclunk, tag);
		return finish(out, n);
	case Tflush:
		n = begin(out, Rflush, tag);
		return finish(out, n);
	default:
		return rerror(out, cap, tag, "operation not supported");
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint8_t (*in)[MAX_MSG] = malloc(BATCH * MAX_MSG);
	uint8_t (*outb)[MAX_MSG] = malloc(BATCH * MAX_MSG);
	connmux_msg reqs[BATCH], reps[BATCH];
	if (!in || !outb) {
		w->error = -ENOMEM;
		goto out;
	}
	struct pollfd pfd[2] = {
		{ .fd = connmux_sock_fd(w->sock), .events = POLLIN },
		{ .fd = stop_pipe[0], .events = POLLIN },
	};
	int r = connmux_set_nonblocking(w->sock, 1);
	if (r < 0) {
		w->error = r;
		goto out;
	}
	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			w->error = -errno;
			goto out;
		}
		if (pfd[1].revents)
			goto out; /* stop */
		if (!(pfd[0].revents & POLLIN))
			continue;
		for (int i = 0; i < BATCH; i++)
			reqs[i] = (connmux_msg){ .buf = in[i], .len = MAX_MSG };
		ptrdiff_t got = connmux_recv_batch(w->sock, reqs, BATCH, 0);
		if (got == -EAGAIN)
			continue; /* another socket took them */
		if (got < 0) {
			w->error = (int)got;
			goto out;
		}
		for (ptrdiff_t i = 0; i < got; i++) {
			size_t len = reqs[i].n;
			if (reqs[i].flags & CONNMUX_MSG_TRUNC)
				len = 0; /* longer than MAX_MSG: answered as malformed */
			reps[i] = (connmux_msg){
				.buf = outb[i],
				.len = answer(in[i], len, outb[i], MAX_MSG),
				.psock = reqs[i].psock,
			};
		}
		w->requests += (uint64_t)got;
		/* Each reply on the connection its request came from. A connection
		 * that failed meanwhile refuses its reply (-ENOENT/-EPIPE): skip it. */
		for (ptrdiff_t done = 0; done < got;) {
			ptrdiff_t s = connmux_send_batch(w->sock, reps + done, (size_t)(got - done), 0);
			if (s == -EAGAIN) {
				struct pollfd wait = { .fd = stop_pipe[0], .events = POLLIN };
				if (poll(&wait, 1, 1) > 0)
					goto out;
				continue;
			}
			done += s > 0 ? s : 1;
		}
	}
out:
	free(in);
	free(outb);
	return NULL;
}

static void on_signal(int sig)
{
	(void)sig;
	stop_signal = 1;
}

int main(int argc, char **argv)
{
	int port = 0, nworkers = 4, mux_workers = 2, opt;
	const char *bpf = NULL;
	while ((opt = getopt(argc, argv, "p:w:m:b:")) != -1) {
		switch (opt) {
		case 'p': port = atoi(optarg); break;
		case 'w': nworkers = atoi(optarg); break;
		case 'm': mux_workers = atoi(optarg); break;
		case 'b': bpf = optarg; break;
		default:
			fprintf(stderr, "usage: %s [-p PORT] [-w WORKERS] [-m MUX_WORKERS] [-b BPF_OBJECT]\n", argv[0]);
			return 2;
		}
	}
	if (nworkers < 1 || nworkers > MAX_WORKERS || mux_workers < 1) {
		fprintf(stderr, "ninep_server: 1..%d workers and at least 1 mux worker\n", MAX_WORKERS);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (pipe(stop_pipe) < 0)
		return perror("pipe"), 1;

	/* The mux, the parser and one socket per worker thread. */
	connmux_config cfg;
	connmux_config_init(&cfg);
	cfg.workers = (uint32_t)mux_workers;
	cfg.pin_workers = 0;
	cfg.max_msg_size = MAX_MSG;
	connmux_mux *mux;
	int r = connmux_mux_new(&cfg, &mux);
	if (r < 0)
		die("connmux_mux_new", r);
	connmux_parser *parser;
	r = bpf ? connmux_parser_from_bpf_file(bpf, NULL, &parser) : connmux_parser_from_spec("9p", &parser);
	if (r < 0)
		die("parser", r);
	connmux_sock *base;
	if ((r = connmux_socket(mux, CONNMUX_SOCK_DGRAM, &base)) < 0)
		die("connmux_socket", r);
	struct worker workers[MAX_WORKERS] = { 0 };
	for (int i = 0; i < nworkers; i++) {
		workers[i].index = i;
		if ((r = connmux_sock_clone(base, &workers[i].sock)) < 0)
			die("connmux_sock_clone", r);
	}
	/* Only the clones receive: the base socket closes now. */
	connmux_sock_close(base);
	for (int i = 0; i < nworkers; i++)
		if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0)
			return perror("pthread_create"), 1;

	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t alen = sizeof addr;
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 128) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
		return perror("listen"), 1;
	printf("port %d\n", ntohs(addr.sin_port));
	fflush(stdout);

	/* Accept and attach; unattach failed connections; stop at stdin's end. */
	uint64_t failed = 0;
	int stdin_open = 1;
	while (!stop_signal) {
		struct pollfd pfd[2] = { { .fd = lfd, .events = POLLIN }, { .fd = 0, .events = POLLIN } };
		int n = poll(pfd, stdin_open ? 2 : 1, 100);
		if (n < 0 && errno != EINTR)
			return perror("poll"), 1;
		if (n > 0 && pfd[0].revents & POLLIN) {
			int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				r = connmux_attach(mux, c, parser, NULL);
				if (r < 0)
					fprintf(stderr, "ninep_server: attach: %s\n", connmux_last_error());
				close(c); /* the mux keeps its own descriptor */
			}
		}
		if (n > 0 && stdin_open && pfd[1].revents) {
			char buf[256];
			ssize_t k = read(0, buf, sizeof buf);
			if (k <= 0)
				break; /* end of input: stop */
		}
		connmux_event ev;
		while (connmux_next_event(mux, &ev, 0) == 1) {
			failed++;
			/* A peer that broke the framing is reset; one that closed is let go. */
			if (ev.kind == CONNMUX_PSOCK_ERR_RX)
				connmux_abort_psock(mux, ev.psock);
			else
				connmux_unattach_psock(mux, ev.psock);
		}
	}

	/* Stop the workers, then report. */
	if (write(stop_pipe[1], "x", 1) != 1)
		return perror("write"), 1;
	int status = 0;
	for (int i = 0; i < nworkers; i++) {
		pthread_join(workers[i].thread, NULL);
		printf("worker %d requests %llu\n", i, (unsigned long long)workers[i].requests);
		if (workers[i].error) {
			fprintf(stderr, "ninep_server: worker %d: %s\n", i, strerror(-workers[i].error));
			status = 1;
		}
	}
	/* Every request gets a reply; the last replies may still be in the
	 * mux's I/O workers' hands (written, not yet counted): wait for them,
	 * at most 200 ms. */
	connmux_mux_stats st;
	for (int tries = 0;; tries++) {
		if ((r = connmux_mux_get_stats(mux, &st)) < 0)
			die("connmux_mux_get_stats", r);
		if (st.tx_msgs >= st.rx_msgs || tries == 200)
			break;
		usleep(1000);
	}
	printf("total rx_msgs %llu tx_msgs %llu failed %llu\n", (unsigned long long)st.rx_msgs,
	       (unsigned long long)st.tx_msgs, (unsigned long long)failed);
	fflush(stdout);
	for (int i = 0; i < nworkers; i++)
		connmux_sock_close(workers[i].sock);
	connmux_parser_free(parser);
	connmux_mux_free(mux);
	close(lfd);
	return status;
}

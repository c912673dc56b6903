/*
 * An ONC RPC NULL-call server on libconnmux's service: the mux's own
 * workers run the handler below for each call, where the call was read,
 * and write its reply on the call's connection (connmux_service_start).
 * Procedure 0 of any program is answered SUCCESS, any other PROC_UNAVAIL,
 * as ksf's krpc server does; a call that is not an RPC v2 CALL resets its
 * connection.
 *
 *   rpc_null_service [-p PORT] [-w WORKERS]     prints "port N", then
 *                                                serves until stdin ends
 *
 * Drive it with `connmux rpctest -j1 -a32 127.0.0.1:PORT` (or ksf's rpctest).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connmux.h"

#define LAST_FRAGMENT 0x80000000u
#define CALL 0u
#define REPLY 1u
#define MSG_ACCEPTED 0u
#define SUCCESS 0u
#define PROC_UNAVAIL 3u

static uint32_t be32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return ntohl(v);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htonl(v);
	memcpy(p, &v, 4);
}

/*
 * The first `n` bytes of a call's body into `out`, across its record
 * fragments (the parser hands the record whole, marks included). Returns 0,
 * or -1 if the record holds fewer.
 */
static int body_prefix(const uint8_t *rec, size_t len, uint8_t *out, size_t n)
{
	size_t at = 0, got = 0;
	while (got < n && at + 4 <= len) {
		size_t frag = be32(rec + at) & ~LAST_FRAGMENT;
		at += 4;
		if (frag > len - at)
			return -1;
		size_t take = frag < n - got ? frag : n - got;
		memcpy(out + got, rec + at, take);
		got += take;
		at += frag;
	}
	return got == n ? 0 : -1;
}

/* One call in, one 28-byte reply out (xid, REPLY, MSG_ACCEPTED, AUTH_NONE
 * verifier, the accept status). */
static ptrdiff_t answer(void *ctx, const uint8_t *call, size_t len, connmux_psock_id from, uint8_t *reply,
			size_t cap)
{
	(void)ctx, (void)from;
	uint8_t h[24]; /* xid, msg_type, rpcvers, prog, vers, proc */
	if (cap < 28 || body_prefix(call, len, h, sizeof h) < 0)
		return CONNMUX_REPLY_CLOSE;
	if (be32(h + 4) != CALL || be32(h + 8) != 2)
		return CONNMUX_REPLY_CLOSE;
	put32(reply, LAST_FRAGMENT | 24);
	memcpy(reply + 4, h, 4);
	put32(reply + 8, REPLY);
	put32(reply + 12, MSG_ACCEPTED);
	put32(reply + 16, 0);
	put32(reply + 20, 0);
	put32(reply + 24, be32(h + 20) == 0 ? SUCCESS : PROC_UNAVAIL);
	return 28;
}

int main(int argc, char **argv)
{
	int port = 0, workers = 1, opt;
	while ((opt = getopt(argc, argv, "p:w:")) != -1) {
		switch (opt) {
		case 'p':
			port = atoi(optarg);
			break;
		case 'w':
			workers = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-p PORT] [-w WORKERS]\n", argv[0]);
			return 2;
		}
	}
	connmux_config cfg;
	connmux_config_init(&cfg);
	cfg.workers = (uint32_t)workers;
	connmux_mux *mux;
	connmux_parser *parser;
	connmux_service *svc;
	char listen[32];
	snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
	if (connmux_mux_new(&cfg, &mux) < 0 || connmux_parser_from_spec("oncrpc", &parser) < 0 ||
	    connmux_service_start(mux, listen, parser, answer, NULL, 64, &svc) < 0) {
		fprintf(stderr, "rpc_null_service: %s\n", connmux_last_error());
		return 1;
	}
	connmux_parser_free(parser);
	printf("port %d\n", connmux_service_port(svc));
	fflush(stdout);
	char buf[256];
	while (read(0, buf, sizeof buf) > 0)
		;
	connmux_service_stats st;
	connmux_service_get_stats(svc, &st);
	fprintf(stderr, "rpc_null_service: %llu connections, %llu closed, %llu handler errors\n",
		(unsigned long long)st.accepted, (unsigned long long)st.closed,
		(unsigned long long)st.handler_errors);
	connmux_service_free(svc);
	connmux_mux_free(mux);
	return 0;
}

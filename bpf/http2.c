/* HTTP/2 (RFC 9113): the client's connection preface, then frames. A frame is a
 * 9-byte header whose first 3 bytes are the payload length (big-endian), then
 * the payload. The preface ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24 bytes) is
 * one message of its own. A program keeps no state between messages, so any
 * message starting "PRI " is taken for the preface: a frame with payload length
 * 0x505249 and type 0x20 cannot be told from it (such a frame exceeds the
 * default SETTINGS_MAX_FRAME_SIZE of 16384 by far). */
#include "connmux_bpf.h"

#define PRI_ 0x50524920u /* "PRI " */
#define PREFACE 24
#define FRAME_HEADER 9

SEC("socket_kcm")
int http2(struct __sk_buff *skb)
{
	__u64 p[3];
	__u32 w0 = load_word(skb, 0);

	if (w0 == PRI_) {
		if (bpf_skb_load_bytes(skb, 0, p, PREFACE) < 0)
			return 0;
		/* The preface as little-endian 64-bit words. */
		if (p[0] != 0x5448202a20495250ull || p[1] != 0x0a0d302e322f5054ull ||
		    p[2] != 0x0a0d0a0d4d530a0dull)
			return -EPROTO;
		return PREFACE;
	}
	return FRAME_HEADER + (w0 >> 8);
}

char _license[] SEC("license") = "GPL";

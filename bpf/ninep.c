/* 9P2000 (and .u, .L): size[4] type[1] tag[2], little-endian, where size counts
 * the whole message including itself. Types: 6..77 (9P2000.L) and 100..127
 * (9P2000). Read with bpf_skb_load_bytes, as little-endian fields suggest. */
#include "connmux_bpf.h"

#define HEADER 7
/* A generous msize; Linux's v9fs negotiates at most a few MiB. */
#define MAX_MSG (1u << 24)

SEC("socket_kcm")
int ninep(struct __sk_buff *skb)
{
	__u8 h[8];
	__u32 size;
	__u8 type;

	if (bpf_skb_load_bytes(skb, 0, h, HEADER) < 0)
		return 0;
	size = h[0] | h[1] << 8 | h[2] << 16 | (__u32)h[3] << 24;
	type = h[4];
	if (size < HEADER)
		return -EBADMSG;
	if (size > MAX_MSG)
		return -EMSGSIZE;
	if (!((type >= 6 && type <= 77) || (type >= 100 && type <= 127)))
		return -EPROTO;
	return size;
}

char _license[] SEC("license") = "GPL";

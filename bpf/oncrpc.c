/* ONC RPC record marking (RFC 5531 section 11): a record is one or more
 * fragments, each a 4-byte big-endian header (top bit: last fragment; the rest:
 * the fragment's length) and that many bytes. The message is the whole record,
 * headers included. */
#include "connmux_bpf.h"

#define LAST_FRAGMENT 0x80000000u
#define MAX_FRAGMENTS 16
/* Offsets stay far below 2^31, where the kernel's loads take them as negative. */
#define MAX_RECORD (1u << 30)

SEC("socket_kcm")
int oncrpc(struct __sk_buff *skb)
{
	__u32 off = 0;

	for (int i = 0; i < MAX_FRAGMENTS; i++) {
		__u32 h = load_word(skb, off);

		off += 4 + (h & ~LAST_FRAGMENT);
		if (off > MAX_RECORD)
			return -EMSGSIZE;
		if (h & LAST_FRAGMENT)
			return off;
	}
	return -EPROTO;
}

char _license[] SEC("license") = "GPL";

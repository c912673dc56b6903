/* Thrift's framed transport: a 4-byte big-endian frame size (a signed int),
 * then the frame. The frame's first bytes name the protocol: 0x80 0x01 for the
 * strict binary protocol, 0x82 for the compact protocol; anything else is
 * refused, so a stream that is not Thrift fails at its first message. */
#include "connmux_bpf.h"

/* Thrift's default maximum frame size. */
#define MAX_FRAME 16384000

SEC("socket_kcm")
int thrift_framed(struct __sk_buff *skb)
{
	__s32 size;
	__u32 b;

	/* The frame size and the protocol's first bytes. */
	if (skb->len < 6)
		return 0;
	size = load_word(skb, 0);
	if (size < 2)
		return -EBADMSG;
	if (size > MAX_FRAME)
		return -EMSGSIZE;
	b = load_byte(skb, 4);
	if (b == 0x80) {
		if (load_byte(skb, 5) != 0x01)
			return -EPROTO;
	} else if (b != 0x82) {
		return -EPROTO;
	}
	return size + 4;
}

char _license[] SEC("license") = "GPL";

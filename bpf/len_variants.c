/* Length fields of other widths and byte orders, several programs in one
 * object (choose one by section or function name). They exercise byte swaps
 * and 64-bit arithmetic. */
#include "connmux_bpf.h"

/* A 2-byte little-endian total length, header included. */
SEC("socket/len16le")
int len16le(struct __sk_buff *skb)
{
	__u16 n = __builtin_bswap16((__u16)load_half(skb, 0));

	if (n < 2)
		return -EBADMSG;
	return n;
}

/* A 2-byte magic 0xcafe, then a 4-byte little-endian body length. */
SEC("socket/magic_len32le")
int magic_len32le(struct __sk_buff *skb)
{
	__u32 n;

	if (load_half(skb, 0) != 0xcafe)
		return -EPROTO;
	n = __builtin_bswap32((__u32)load_word(skb, 2));
	if (n > 0x7fff0000u)
		return -EMSGSIZE;
	return 6 + n;
}

/* An 8-byte big-endian body length. */
SEC("socket/len64be")
int len64be(struct __sk_buff *skb)
{
	__u64 n = (__u64)load_word(skb, 0) << 32 | load_word(skb, 4);

	if (n > 0x7fff0000ull)
		return -EMSGSIZE;
	return 8 + n;
}

char _license[] SEC("license") = "GPL";

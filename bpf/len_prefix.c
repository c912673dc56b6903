/* A 4-byte big-endian body length, then the body: the message is 4 + length
 * bytes. The parser of the KCM documentation's example, with a size limit. */
#include "connmux_bpf.h"

/* Keeps 4 + length a positive int. */
#define MAX_BODY 0x7ffffff0u

SEC("socket_kcm")
int len_prefix(struct __sk_buff *skb)
{
	__u32 n = load_word(skb, 0);

	if (n > MAX_BODY)
		return -EMSGSIZE;
	return n + 4;
}

char _license[] SEC("license") = "GPL";

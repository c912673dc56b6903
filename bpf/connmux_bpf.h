/* What a KCM parser program needs, without kernel or libbpf headers.
 *
 * A parser is a BPF_PROG_TYPE_SOCKET_FILTER program: it gets the message's
 * bytes (skb->len of them) and returns the message's total length (> 0),
 * 0 when it needs more bytes, or a negative errno to refuse the stream.
 */
#ifndef CONNMUX_BPF_H
#define CONNMUX_BPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;

/* The start of struct __sk_buff (include/uapi/linux/bpf.h): a parser may read
 * len and use cb[] as scratch; nothing else is provided by connmux. */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
};

#define SEC(name) __attribute__((section(name), used))

/* LD_ABS / LD_IND: 1, 2 or 4 bytes at off in network byte order, converted to
 * host order. Reading past the end ends the program with 0 ("need more"). */
unsigned long long load_byte(void *skb, unsigned long long off) asm("llvm.bpf.load.byte");
unsigned long long load_half(void *skb, unsigned long long off) asm("llvm.bpf.load.half");
unsigned long long load_word(void *skb, unsigned long long off) asm("llvm.bpf.load.word");

/* Copy len bytes at offset into to (on the stack). Returns 0, or -EFAULT with
 * to cleared when the bytes are not all there. */
static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) = (void *)26;

#define EBADMSG 74
#define EPROTO 71
#define EMSGSIZE 90

#endif

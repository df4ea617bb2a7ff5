/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* fathom live trace: what the programs and their loader share (livetrace.bpf.c). */
#ifndef FATHOM_LIVETRACE_H
#define FATHOM_LIVETRACE_H

#define LT_INJECT_MARK 0x66744c54   /* skb->mark of the agent's injection socket: "ftLT" */
#define LT_INGRESS 0
#define LT_EGRESS 1
#define LT_INJECTED 2
#define LT_ENCAP_VXLAN 1

#define LT_REQUEST 8               /* lt_seen.kind: the probe (an echo request: its ICMP type; or a TCP SYN) */
#define LT_ANSWER 0                /* its answer (an echo reply: its ICMP type; or a SYN-ACK or RST) */
#define LT_RESET 1                 /* the RST that ends a TCP probe's connection: injected, not reported */

#define LT_SLOTS 4                 /* traces armed at once on one node */

/* One armed trace: its mark. The loader writes every field, then `armed` (1) last; it clears
 * `armed` first when the trace ends. */
struct lt_config {
	__u32 armed;
	__u32 tag;                 /* the loader's name for the trace, reported with each sighting */
	__u32 drop_reply_ifindex;  /* the source port's interface: a reply to the probe stops there */
	__u16 ip_id;
	__u16 icmp_id;             /* TCP: the SYN's sequence number is icmp_id << 16 | icmp_seq */
	__u16 icmp_seq;
	__u8 dscp;
	__u8 proto;                /* IPPROTO_ICMP or IPPROTO_TCP */
};

struct lt_seen {
	__u64 ktime_ns;
	__u32 tag;                   /* the trace's (lt_config.tag) */
	__u32 ifindex;
	__u32 len;
	__u32 vni;
	__u32 saddr, daddr;          /* the probe's (inner) addresses */
	__u32 outer_src, outer_dst;  /* VXLAN's outer addresses */
	__u16 vlan;                  /* 0xffff: none */
	__u8 dir;                    /* LT_INGRESS | LT_EGRESS | LT_INJECTED */
	__u8 kind;                   /* LT_REQUEST the probe, LT_ANSWER its answer */
	__u8 ttl;
	__u8 encap;
	__u8 tcp_flags;              /* a TCP probe's or answer's flags (SYN, SYN-ACK, RST-ACK) */
	__u8 proto;                  /* IPPROTO_ICMP or IPPROTO_TCP */
};
#endif

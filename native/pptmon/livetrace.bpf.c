// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Live trace observation points (fathom trace --live; docs/trace.md).
 *
 * lt_in / lt_out run at TC ingress / egress of the interfaces the node's traces watch. They stay
 * attached while traces come (the loader detaches them after an idle time) and look for the probe
 * of every armed trace: lt_slots holds each one's mark, written by the loader when the trace is
 * armed and cleared when it ends; with no trace armed (lt_armed 0) a packet passes after one
 * load. The probe is an ICMP echo request (or its reply) whose IPv4 DSCP, IP ID, ICMP id and
 * sequence are the trace's, plain, 802.1Q-tagged or inside VXLAN (UDP 4789, itself maybe tagged);
 * each sighting is reported with its kernel time (bpf_ktime_get_ns, as PPTMon stamps) and its
 * trace's tag on a ring buffer. Everything else passes untouched.
 *
 * A TCP probe (proto IPPROTO_TCP) is a SYN marked the same way, its 32 ICMP bits being the
 * sequence number; the destination's answer (SYN-ACK or RST) acknowledges it; the RST the agent
 * injects after it (sequence + 1) closes what the SYN opened and is not reported.
 *
 * Injection: the agent sends the probe on the source port's switch-side interface from a packet
 * socket carrying LT_INJECT_MARK (SO_MARK); lt_out turns it around into the same interface's
 * ingress (bpf_redirect BPF_F_INGRESS), so the switch receives it from the port as it receives the
 * VM's packets, and the VM never sees it. A reply to the probe meets lt_out on its way to the
 * source VM and is dropped there (the source VM sent no request).
 *
 * Fail open: every header is read (bpf_skb_load_bytes, which reads non-linear and GSO skbs as
 * well) before anything is changed, and any read that fails, any frame that is not exactly a
 * trace's probe, lets the packet pass as it was. The only changes — the injected probe turned
 * around, a probe's reply dropped at the source port — happen to frames carrying an armed trace's
 * 48-bit mark.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "livetrace.h"

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define ETH_P_IP 0x0800
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define VXLAN_PORT 4789
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* the armed traces (.bss: the loader writes it through its memory map) */
struct lt_config lt_slots[LT_SLOTS] = {};
volatile __u32 lt_armed = 0;        /* how many slots are armed: 0 lets every packet pass at once */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} lt_events SEC(".maps");

#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* What identifies a probe, read from a packet's headers. */
struct lt_pkt {
	__u32 seq, ack;              /* TCP */
	__u16 ip_id, icmp_id, icmp_seq;
	__u8 dscp, proto, icmp_type, tcp_flags;
};

/* Read the IPv4 ICMP or TCP packet at byte `off` (an Ethernet header) into `p` and `s`: 0; a VXLAN
 * frame: 1, with its outer fields in `s` and the inner Ethernet header's offset in *inner;
 * anything else (or a read that fails): -1. */
static __always_inline int parse(struct __sk_buff *skb, __u32 off, struct lt_seen *s, struct lt_pkt *p, int depth,
				 __u32 *inner)
{
	__u16 proto;
	struct iphdr ip;
	__u8 l4h[14];
	__u32 l4;
	int i;

	if (bpf_skb_load_bytes(skb, off + 12, &proto, 2))
		return -1;
	off += 14;
#pragma unroll
	for (i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		__u16 tci;
		if (bpf_skb_load_bytes(skb, off, &tci, 2) || bpf_skb_load_bytes(skb, off + 2, &proto, 2))
			return -1;
		if (depth == 0)
			s->vlan = bpf_ntohs(tci) & 0xfff;
		off += 4;
	}
	/* IPv4, and no later fragment (its bytes after the header are no UDP, ICMP or TCP header) */
	if (proto != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) || ip.version != 4 ||
	    ip.ihl < 5 || (ip.frag_off & bpf_htons(IP_OFFSET)))
		return -1;
	l4 = off + ip.ihl * 4;
	if (depth == 0 && ip.protocol == IPPROTO_UDP) {
		__u16 dport;
		__u32 vni;
		if (bpf_skb_load_bytes(skb, l4 + 2, &dport, 2) || dport != bpf_htons(VXLAN_PORT) ||
		    bpf_skb_load_bytes(skb, l4 + 12, &vni, 4))
			return -1;
		s->vni = bpf_ntohl(vni) >> 8;
		s->encap = LT_ENCAP_VXLAN;
		s->outer_src = ip.saddr;
		s->outer_dst = ip.daddr;
		*inner = l4 + 8 + 8;    /* UDP, VXLAN */
		return 1;
	}
	/* the probe (DF) and its answer are never a fragment, not even the first */
	if ((ip.protocol != IPPROTO_ICMP && ip.protocol != IPPROTO_TCP) || (ip.frag_off & bpf_htons(IP_MF)))
		return -1;
	/* ICMP: type, code, checksum, id, sequence; TCP: ports, sequence, acknowledgement, offset, flags */
	if (bpf_skb_load_bytes(skb, l4, l4h, ip.protocol == IPPROTO_TCP ? 14 : 8))
		return -1;
	p->proto = ip.protocol;
	p->dscp = ip.tos >> 2;
	p->ip_id = bpf_ntohs(ip.id);
	if (ip.protocol == IPPROTO_TCP) {
		p->seq = bpf_ntohl(*(__u32 *)&l4h[4]);
		p->ack = bpf_ntohl(*(__u32 *)&l4h[8]);
		p->tcp_flags = l4h[13];
	} else {
		p->icmp_type = l4h[0];
		p->icmp_id = bpf_ntohs(*(__u16 *)&l4h[4]);
		p->icmp_seq = bpf_ntohs(*(__u16 *)&l4h[6]);
	}
	s->ttl = ip.ttl;
	s->saddr = ip.saddr;
	s->daddr = ip.daddr;
	return 0;
}

/* Whether `p` is a probe (or its answer) of armed trace `c`; 0 and s->kind if it is. */
static __always_inline int is_probe(const struct lt_config *c, const struct lt_pkt *p, struct lt_seen *s)
{
	__u32 first = ((__u32)c->icmp_id << 16) | c->icmp_seq;

	if (!c->armed || c->proto != p->proto)
		return -1;
	if (p->proto == IPPROTO_ICMP) {
		/* the reply (type 0) keeps the request's DSCP, ICMP id and sequence, not its IP ID */
		if (p->dscp != c->dscp || p->icmp_id != c->icmp_id || p->icmp_seq != c->icmp_seq ||
		    (p->icmp_type != 8 && p->icmp_type != 0) || (p->icmp_type == 8 && p->ip_id != c->ip_id))
			return -1;
		s->kind = p->icmp_type;
		return 0;
	}
	/* TCP: the SYN (DSCP, IP ID and sequence number the trace's; no other flag), the RST that ends
	 * it (sequence + 1; no other flag), or the destination's answer to it (a SYN-ACK or RST
	 * acknowledging sequence + 1; its DSCP and IP ID are the answering kernel's) */
	s->tcp_flags = p->tcp_flags;
	if ((p->tcp_flags & TCP_ACK) && p->ack == first + 1 && (p->tcp_flags & (TCP_SYN | TCP_RST))) {
		s->kind = LT_ANSWER;
		return 0;
	}
	if (p->tcp_flags == TCP_SYN && p->seq == first)
		s->kind = LT_REQUEST;
	else if (p->tcp_flags == TCP_RST && p->seq == first + 1)
		s->kind = LT_RESET;
	else
		return -1;
	return p->dscp == c->dscp && p->ip_id == c->ip_id ? 0 : -1;
}

/* 0 when the packet is an armed trace's probe: `s` filled, `*drop_reply` its source interface. */
static __always_inline int observe(struct __sk_buff *skb, __u8 dir, struct lt_seen *s, __u32 *drop_reply)
{
	struct lt_pkt p = {};
	__u32 inner = 0;
	int r, i;

	if (!lt_armed)
		return -1;
	__builtin_memset(s, 0, sizeof(*s));
	/* a received tag is in the skb already (taken out of the frame before TC ingress) */
	s->vlan = skb->vlan_present ? skb->vlan_tci & 0xfff : 0xffff;
	r = parse(skb, 0, s, &p, 0, &inner);
	if (r == 1) {
		__u16 vlan = s->vlan;
		r = parse(skb, inner, s, &p, 1, &inner);
		s->vlan = vlan;
	}
	if (r != 0)
		return -1;
#pragma unroll
	for (i = 0; i < LT_SLOTS; i++) {
		if (is_probe(&lt_slots[i], &p, s) == 0) {
			s->tag = lt_slots[i].tag;
			*drop_reply = lt_slots[i].drop_reply_ifindex;
			s->ktime_ns = bpf_ktime_get_ns();
			s->ifindex = skb->ifindex;
			s->dir = dir;
			s->len = skb->len;
			s->proto = p.proto;
			return 0;
		}
	}
	return -1;
}

static __always_inline void report(struct lt_seen *s)
{
	struct lt_seen *r = bpf_ringbuf_reserve(&lt_events, sizeof(*r), 0);

	if (!r)
		return;
	*r = *s;
	bpf_ringbuf_submit(r, 0);
}

SEC("tc")
int lt_in(struct __sk_buff *skb)
{
	struct lt_seen s;
	__u32 drop_reply;

	if (observe(skb, LT_INGRESS, &s, &drop_reply) == 0 && s.kind != LT_RESET)
		report(&s);
	return TC_ACT_OK;
}

SEC("tc")
int lt_out(struct __sk_buff *skb)
{
	struct lt_seen s;
	__u32 drop_reply;

	if (observe(skb, LT_EGRESS, &s, &drop_reply))
		return TC_ACT_OK;
	if (skb->mark == LT_INJECT_MARK && s.kind != LT_ANSWER && s.encap == 0) {
		/* bpf_redirect only records where to; the packet is turned around once we return */
		s.dir = LT_INJECTED;
		if (s.kind == LT_REQUEST)
			report(&s);
		skb->mark = 0;
		return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
	}
	if (s.kind == LT_RESET)
		return TC_ACT_OK;
	report(&s);
	if (s.kind == LT_ANSWER && drop_reply == skb->ifindex)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";

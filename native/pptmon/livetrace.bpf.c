// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Live trace observation points (fathom trace --live; docs/trace.md).
 *
 * lt_in / lt_out run at TC ingress / egress of the interfaces a trace watches. They look for the
 * trace's probe: an ICMP echo request (or its reply) whose IPv4 DSCP, IP ID, ICMP id and sequence
 * are the trace's (lt_cfg), plain, 802.1Q-tagged or inside VXLAN (UDP 4789, itself maybe tagged),
 * and report each sighting with its kernel time (bpf_ktime_get_ns, as PPTMon stamps) on a ring
 * buffer. Everything else passes untouched.
 *
 * A TCP probe (lt_cfg.proto IPPROTO_TCP) is a SYN marked the same way, its 32 ICMP bits being the
 * sequence number; the destination's answer (SYN-ACK or RST) acknowledges it; the RST the agent
 * injects after it (sequence + 1) closes what the SYN opened and is not reported.
 *
 * Injection: the agent sends the probe on the source port's switch-side interface from a packet
 * socket carrying LT_INJECT_MARK (SO_MARK); lt_out turns it around into the same interface's
 * ingress (bpf_redirect BPF_F_INGRESS), so the switch receives it from the port as it receives the
 * VM's packets, and the VM never sees it. A reply to the probe meets lt_out on its way to the
 * source VM and is dropped there (the source VM sent no request).
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

const volatile struct lt_config lt_cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} lt_events SEC(".maps");

#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* A TCP probe at `l4`: the SYN (DSCP, IP ID and sequence number the trace's), the RST that ends it
 * (sequence + 1), or the destination's answer to it (a SYN-ACK or RST acknowledging sequence + 1; its
 * DSCP and IP ID are the answering kernel's). */
static __always_inline int tcp_ours(struct __sk_buff *skb, __u32 l4, struct iphdr *ip, struct lt_seen *s)
{
	__u32 seq, ack, first = ((__u32)lt_cfg.icmp_id << 16) | lt_cfg.icmp_seq;
	__u8 flags;

	if (bpf_skb_load_bytes(skb, l4 + 4, &seq, 4) || bpf_skb_load_bytes(skb, l4 + 8, &ack, 4) ||
	    bpf_skb_load_bytes(skb, l4 + 13, &flags, 1))
		return -1;
	seq = bpf_ntohl(seq);
	ack = bpf_ntohl(ack);
	s->tcp_flags = flags;
	if ((flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN && seq == first)
		s->icmp_type = LT_REQUEST;
	else if ((flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_RST && seq == first + 1)
		s->icmp_type = LT_RESET;
	else if ((flags & TCP_ACK) && ack == first + 1 && (flags & (TCP_SYN | TCP_RST)))
		return 0;                 /* the answer: s->icmp_type stays LT_ANSWER */
	else
		return -1;
	return (ip->tos >> 2) == lt_cfg.dscp && ip->id == bpf_htons(lt_cfg.ip_id) ? 0 : -1;
}

/* Find the probe from byte `off` (an Ethernet header); 0 and fill `s` if it is ours. */
static __always_inline int ours(struct __sk_buff *skb, __u32 off, struct lt_seen *s, int depth)
{
	__u16 proto;
	struct iphdr ip;
	__u8 icmp[8];
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
	if (proto != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) || ip.ihl < 5)
		return -1;
	if (depth == 0 && ip.protocol == IPPROTO_UDP) {
		__u16 dport;
		__u32 vni;
		__u32 l4 = off + ip.ihl * 4;
		if (bpf_skb_load_bytes(skb, l4 + 2, &dport, 2) || dport != bpf_htons(VXLAN_PORT) ||
		    bpf_skb_load_bytes(skb, l4 + 12, &vni, 4))
			return -1;
		s->vni = bpf_ntohl(vni) >> 8;
		s->encap = LT_ENCAP_VXLAN;
		s->outer_src = ip.saddr;
		s->outer_dst = ip.daddr;
		return 1;           /* look inside: the caller calls again at depth 1 */
	}
	if (ip.protocol != lt_cfg.proto)
		return -1;
	if (ip.protocol == IPPROTO_TCP) {
		s->ttl = ip.ttl;
		s->saddr = ip.saddr;
		s->daddr = ip.daddr;
		return tcp_ours(skb, off + ip.ihl * 4, &ip, s);
	}
	if ((ip.tos >> 2) != lt_cfg.dscp || bpf_skb_load_bytes(skb, off + ip.ihl * 4, icmp, sizeof(icmp)))
		return -1;
	/* the reply (type 0) keeps the request's DSCP, ICMP id and sequence, not its IP ID */
	if ((icmp[0] != 8 && icmp[0] != 0) || (icmp[0] == 8 && ip.id != bpf_htons(lt_cfg.ip_id)) ||
	    *(__u16 *)&icmp[4] != bpf_htons(lt_cfg.icmp_id) || *(__u16 *)&icmp[6] != bpf_htons(lt_cfg.icmp_seq))
		return -1;
	s->icmp_type = icmp[0];
	s->ttl = ip.ttl;
	s->saddr = ip.saddr;
	s->daddr = ip.daddr;
	return 0;
}

static __always_inline int observe(struct __sk_buff *skb, __u8 dir, struct lt_seen *s)
{
	int r;

	__builtin_memset(s, 0, sizeof(*s));
	/* a received tag is in the skb already (taken out of the frame before TC ingress) */
	s->vlan = skb->vlan_present ? skb->vlan_tci & 0xfff : 0xffff;
	r = ours(skb, 0, s, 0);
	if (r == 1) {
		__u16 vlan = s->vlan;
		r = ours(skb, 14 + (vlan != 0xffff && !skb->vlan_present ? 4 : 0) + 20 + 8 + 8, s, 1);
		s->vlan = vlan;
	}
	if (r != 0)
		return -1;
	s->ktime_ns = bpf_ktime_get_ns();
	s->ifindex = skb->ifindex;
	s->dir = dir;
	s->len = skb->len;
	return 0;
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

	if (observe(skb, LT_INGRESS, &s) == 0 && s.icmp_type != LT_RESET)
		report(&s);
	return TC_ACT_OK;
}

SEC("tc")
int lt_out(struct __sk_buff *skb)
{
	struct lt_seen s;

	if (observe(skb, LT_EGRESS, &s))
		return TC_ACT_OK;
	if (skb->mark == LT_INJECT_MARK && s.icmp_type != LT_ANSWER && s.encap == 0) {
		/* bpf_redirect only records where to; the packet is turned around once we return */
		s.dir = LT_INJECTED;
		if (s.icmp_type == LT_REQUEST)
			report(&s);
		skb->mark = 0;
		return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
	}
	if (s.icmp_type == LT_RESET)
		return TC_ACT_OK;
	report(&s);
	if (s.icmp_type == LT_ANSWER && lt_cfg.drop_reply_ifindex == skb->ifindex)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";

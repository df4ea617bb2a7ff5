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
	if (ip.protocol != IPPROTO_ICMP || (ip.tos >> 2) != lt_cfg.dscp)
		return -1;
	if (bpf_skb_load_bytes(skb, off + ip.ihl * 4, icmp, sizeof(icmp)))
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

	if (observe(skb, LT_INGRESS, &s) == 0)
		report(&s);
	return TC_ACT_OK;
}

SEC("tc")
int lt_out(struct __sk_buff *skb)
{
	struct lt_seen s;

	if (observe(skb, LT_EGRESS, &s))
		return TC_ACT_OK;
	if (skb->mark == LT_INJECT_MARK && s.icmp_type == 8 && s.encap == 0) {
		s.dir = LT_INJECTED;
		report(&s);
		skb->mark = 0;
		return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
	}
	report(&s);
	if (s.icmp_type == 0 && lt_cfg.drop_reply_ifindex == skb->ifindex)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";

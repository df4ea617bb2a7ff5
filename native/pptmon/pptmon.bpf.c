// SPDX-License-Identifier: GPL-2.0
/*
 * fathom PPTMon data plane: per-VNF packet processing time carried in-band.
 *
 * Two TC (clsact) programs, both driven by the run-time config map:
 *   ppt_in   runs where packets ENTER the VNF (guest: ingress of the VNF's
 *            input device; host: egress of the host side of that veth).
 *            SOURCE inserts the option with a first entry {vnf, t_in};
 *            TRANSIT appends an entry {vnf, t_in} to marked packets, or,
 *            when it cannot (option room, hop cap, MTU), counts itself in
 *            the option's "skipped" field.
 *   ppt_out  runs where packets LEAVE the VNF.  It turns this VNF's entry
 *            into a duration (t_out - entry).  In sink mode it removes the
 *            option from every packet that carries one (whether or not the
 *            sink itself could add an entry), restores the original packet
 *            and reports the hops to the ring buffer.
 * t_in is taken before any of our own work on the packet, t_out after it
 * (except a transit's rewrite, which carries t_out), both in µs mod 2^24.
 *
 * Packet surgery never moves the start of the L4 header (so csum_start of a
 * CHECKSUM_PARTIAL skb stays valid): bytes are inserted by growing the tail
 * and shifting everything after the insertion point; the sink saves the
 * segment's last bytes, trims the tail and shifts back.
 *
 * Fail open.  Every path first does everything that can fail: loads,
 * checksum differences, MTU checks, and the one helper that may allocate
 * (bpf_skb_change_tail; for an in-place rewrite the bpf_skb_store_bytes that
 * makes the bytes writable).  Only then does it change the packet, on an skb
 * that is now linear, private and writable, with offsets inside it: stores,
 * shifts and checksum updates that cannot fail there (they are still checked
 * and counted as errors).  A failure of the first kind passes the packet as
 * it came.  GSO packets are never modified.
 *
 * Checksums, only through the kernel's helpers:
 *   - bytes the L4 checksum covers (our option, the data offset) are stored
 *     without BPF_F_RECOMPUTE_CSUM and compensated by bpf_l4_csum_replace by
 *     difference: for CHECKSUM_COMPLETE the two changes cancel in skb->csum;
 *   - the L4 length in the pseudo-header: bpf_l4_csum_replace by difference
 *     with BPF_F_PSEUDO_HDR, plus BPF_F_IPV6 for IPv6 (the kernel then leaves
 *     skb->csum alone, as the IPv6 length field itself is not checksummed);
 *   - IPv4 total length: bpf_l3_csum_replace;
 *   - the UDP surplus area, outside the UDP checksum: its own OCS; in-place
 *     stores there use BPF_F_RECOMPUTE_CSUM (nothing compensates them).
 * For CHECKSUM_PARTIAL the helpers apply only pseudo-header changes (the rest
 * is summed later).  bpf_skb_change_tail turns CHECKSUM_COMPLETE into
 * CHECKSUM_NONE, so the resizing paths, whose first change it is, never see a
 * COMPLETE skb afterwards; the in-place paths keep skb->csum exact.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "pptmon.h"

#define TC_ACT_UNSPEC (-1)
#define ETH_P_IP      0x0800
#define ETH_P_IPV6    0x86DD
#define ETH_P_8021Q   0x8100
#define ETH_P_8021AD  0x88A8
#define IPPROTO_TCP_  6
#define IPPROTO_UDP_  17
#define CHECKSUM_PARTIAL_ 3

#define CHUNK       512            /* bytes moved per helper pair            */
#define MAX_CHUNKS  20             /* packets up to 10 KiB (jumbo frames)    */
#define MAX_PKT     (CHUNK * MAX_CHUNKS)
#define OPT_MAX     (PPT_HDR_LEN + PPT_ENTRY_LEN * PPT_MAX_HOPS)   /* 40 */
#define UDP_T_MAX   48             /* OCS + header + 8 entries = 42, rounded */
#define RB_WAKEUP_BYTES (64 * 1024) /* wake the reader at a quarter full     */
#define COARSE_MIN_PERIOD 50000000ULL  /* 50 ms: coarse pre-check worth it   */
#define COARSE_SLACK      20000000ULL  /* > 2 ticks of the coarse clock      */

/*
 * Verdict for every packet.  TC_ACT_UNSPEC hands the packet on to the next
 * filter of the clsact hook (other tools' programs still run) and, when
 * there is none, lets it pass: "fail open" without hiding others' filters.
 */
#define PASS TC_ACT_UNSPEC

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* BPF_F_IPV6 when the running kernel knows the flag (the loader checks its
 * BTF); older kernels reject it.  See "Checksums" above. */
const volatile __u64 l4_ipv6_flag = 0;

/*
 * Fault injection for the unit tests: pptmon-testrun loads the programs with
 * fault_inject set and makes the fault_nth fallible call of a run fail as if
 * the helper had.  The loader leaves fault_inject 0 and the verifier removes
 * the checks.
 */
const volatile __u32 fault_inject = 0;
__u32 fault_nth = 0;
__u32 fault_calls = 0;

static __always_inline int fault(void)
{
	if (!fault_inject)
		return 0;
	fault_calls++;
	return fault_calls == fault_nth;
}

/* A call that can fail; every one of them runs before the packet changes. */
#define FALLIBLE(call) (fault() ? -1 : (long)(call))

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ppt_config);
} ppt_cfg SEC(".maps");

struct ppt_sample_state {
	__u64 last_ns;     /* time of the last sample (any CPU)        */
	__u64 seq;         /* samples taken                             */
	__u64 last_coarse; /* the same instant on the coarse clock      */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ppt_sample_state);
} ppt_sample SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PPT_ST__MAX);
	__type(key, __u32);
	__type(value, __u64);
} ppt_stats SEC(".maps");

/* Per-CPU work space (the BPF stack is only 512 bytes). */
struct scratch {
	__u8 buf[CHUNK];        /* bytes being shifted                              */
	__u8 wire[UDP_T_MAX];   /* TCP: our option as on the wire; UDP: OCS+option  */
	__u8 next[UDP_T_MAX];   /* what it becomes                                  */
	__u8 tail[UDP_T_MAX];   /* sink: the segment's last bytes, saved before the
				 * tail is trimmed                                  */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} ppt_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} ppt_events SEC(".maps");

/* Parsed view of a packet; all offsets are from the start of the frame. */
struct pkt {
	__u32 len;        /* skb->len                                         */
	__u32 l3;         /* IP header                                        */
	__u32 l4;         /* TCP/UDP header                                   */
	__u32 l3_end;     /* end of the IP datagram                           */
	__u32 ip_len;     /* IPv4 total length or IPv6 payload length         */
	__u32 l4_len;     /* l3_end - l4                                      */
	__u8  family;     /* 4 or 6                                           */
	__u8  proto;
	__u16 ip_id;
	__u8  saddr[16];
	__u8  daddr[16];
	__u16 sport, dport;
	__u32 tcp_seq;
	/* TCP */
	__u32 tcp_hlen;   /* doff * 4                                         */
	/* UDP */
	__u32 udp_len;
	/* our option, if present */
	__u32 opt;        /* offset of the option header (0: absent)          */
	__u32 ocs;        /* UDP: offset of the OCS                           */
	__u8  hops;
	__u8  flags;
	__u16 wire_seq;
	__u8  olen;       /* option length (8 + 4 * hops)                     */
};

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&ppt_stats, &idx);

	if (v)
		*v += 1;  /* per-CPU slot: no atomics needed */
}

static __always_inline int is_partial(struct __sk_buff *ctx)
{
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);

	return BPF_CORE_READ_BITFIELD(skb, ip_summed) == CHECKSUM_PARTIAL_;
}

static __always_inline __u16 fold(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/*
 * Parse Ethernet (up to two in-band VLAN tags), IPv4/IPv6 and TCP/UDP and
 * look for our option.  Returns 0 if the packet is TCP or UDP we can handle.
 */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__u16 proto;
	__u32 off = 12;

	p->len = skb->len;
	if (bpf_skb_load_bytes(skb, off, &proto, 2) < 0)
		return -1;
	off += 2;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if (bpf_skb_load_bytes(skb, off + 2, &proto, 2) < 0)
			return -1;
		off += 4;
	}
	p->l3 = off;

	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 ip[20];

		if (bpf_skb_load_bytes(skb, off, ip, 20) < 0)
			return -1;
		if ((ip[0] >> 4) != 4 || (ip[0] & 0xf) < 5)
			return -1;
		/* fragments: MF set or a non-zero offset */
		if ((ip[6] & 0x3f) || ip[7])
			return -1;
		p->family = 4;
		p->proto = ip[9];
		p->ip_len = ((__u32)ip[2] << 8) | ip[3];
		p->ip_id = ((__u16)ip[4] << 8) | ip[5];
		p->l4 = off + (ip[0] & 0xf) * 4;
		p->l3_end = off + p->ip_len;
		__builtin_memset(p->saddr, 0, 32);
		__builtin_memcpy(p->saddr, &ip[12], 4);
		__builtin_memcpy(p->daddr, &ip[16], 4);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 ip6[40];

		if (bpf_skb_load_bytes(skb, off, ip6, 40) < 0)
			return -1;
		if ((ip6[0] >> 4) != 6)
			return -1;
		p->family = 6;
		p->proto = ip6[6];   /* no extension headers */
		p->ip_len = ((__u32)ip6[4] << 8) | ip6[5];
		p->ip_id = 0;
		p->l4 = off + 40;
		p->l3_end = p->l4 + p->ip_len;
		__builtin_memcpy(p->saddr, &ip6[8], 16);
		__builtin_memcpy(p->daddr, &ip6[24], 16);
	} else {
		return -1;
	}
	if (p->l3_end > p->len || p->l4 >= p->l3_end || p->len > MAX_PKT)
		return -1;
	p->l4_len = p->l3_end - p->l4;
	p->opt = 0;

	if (p->proto == IPPROTO_TCP_) {
		__u8 th[20];
		__u8 oh[PPT_HDR_LEN];

		if (p->l4_len < 20 || bpf_skb_load_bytes(skb, p->l4, th, 20) < 0)
			return -1;
		p->sport = ((__u16)th[0] << 8) | th[1];
		p->dport = ((__u16)th[2] << 8) | th[3];
		p->tcp_seq = ((__u32)th[4] << 24) | ((__u32)th[5] << 16) |
			     ((__u32)th[6] << 8) | th[7];
		p->tcp_hlen = (th[12] >> 4) * 4;
		if (p->tcp_hlen < 20 || p->tcp_hlen > p->l4_len)
			return -1;
		if (p->tcp_hlen < 20 + PPT_HDR_LEN + PPT_ENTRY_LEN)
			return 0;
		if (bpf_skb_load_bytes(skb, p->l4 + 20, oh, PPT_HDR_LEN) < 0)
			return -1;
		if (oh[0] != PPT_TCP_KIND || oh[2] != (PPT_EXID >> 8) ||
		    oh[3] != (PPT_EXID & 0xff) || (oh[4] >> 4) != PPT_VERSION)
			return 0;
		if (oh[5] < 1 || oh[5] > PPT_MAX_HOPS ||
		    oh[1] != PPT_HDR_LEN + PPT_ENTRY_LEN * oh[5] ||
		    20 + oh[1] > p->tcp_hlen)
			return 0;
		p->opt = p->l4 + 20;
		p->olen = oh[1];
		p->flags = oh[4] & 0xf;
		p->hops = oh[5];
		p->wire_seq = ((__u16)oh[6] << 8) | oh[7];
		return 0;
	}
	if (p->proto == IPPROTO_UDP_) {
		__u8 uh[8];
		__u8 oh[PPT_HDR_LEN];
		__u32 pad, surplus;

		if (p->l4_len < 8 || bpf_skb_load_bytes(skb, p->l4, uh, 8) < 0)
			return -1;
		p->sport = ((__u16)uh[0] << 8) | uh[1];
		p->dport = ((__u16)uh[2] << 8) | uh[3];
		p->tcp_seq = 0;
		p->udp_len = ((__u32)uh[4] << 8) | uh[5];
		if (p->udp_len < 8 || p->udp_len > p->l4_len)
			return -1;
		surplus = p->l4_len - p->udp_len;
		if (surplus == 0)
			return 0;
		pad = p->udp_len & 1;
		if (surplus < pad + 2 + PPT_HDR_LEN + PPT_ENTRY_LEN)
			return 0;
		p->ocs = p->l4 + p->udp_len + pad;
		if (bpf_skb_load_bytes(skb, p->ocs + 2, oh, PPT_HDR_LEN) < 0)
			return -1;
		if (oh[0] != PPT_UDP_KIND || oh[2] != (PPT_EXID >> 8) ||
		    oh[3] != (PPT_EXID & 0xff) || (oh[4] >> 4) != PPT_VERSION)
			return 0;
		if (oh[5] < 1 || oh[5] > PPT_MAX_HOPS ||
		    oh[1] != PPT_HDR_LEN + PPT_ENTRY_LEN * oh[5] ||
		    pad + 2 + oh[1] != surplus)
			return 0;
		p->opt = p->ocs + 2;
		p->olen = oh[1];
		p->flags = oh[4] & 0xf;
		p->hops = oh[5];
		p->wire_seq = ((__u16)oh[6] << 8) | oh[7];
		return 0;
	}
	return -1;
}

/*
 * Cheap pre-filter with direct packet access and no helper call: 0 when the
 * packet certainly carries no option of ours (the common case on the egress
 * side and at transit/sink hops), 1 when it may (or when the headers are not
 * in the linear area, where parse() decides).
 */
static __always_inline int maybe_marked(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u8 *b = data;
	__u32 off = 14, l4;
	__u16 proto;
	__u8 l4p;

	if (data + 14 + 4 + 4 > end)
		return 1;
	proto = ((__u16)b[12] << 8) | b[13];
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
		proto = ((__u16)b[16] << 8) | b[17];
		off = 18;
		if (proto == ETH_P_8021Q) {
			proto = ((__u16)b[20] << 8) | b[21];
			off = 22;
		}
	}
	if (proto == ETH_P_IP) {
		__u8 *ip = data + off;
		__u32 tot, ihl;

		if ((void *)(ip + 20) > end)
			return 1;
		ihl = (ip[0] & 0xf) * 4;
		tot = ((__u32)ip[2] << 8) | ip[3];
		l4p = ip[9];
		l4 = off + ihl;
		if (l4p == IPPROTO_UDP_) {
			__u8 *uh = data + (l4 & 0x7ff);

			if ((void *)(uh + 8) > end)
				return 1;
			return tot - ihl != (((__u32)uh[4] << 8) | uh[5]);
		}
	} else if (proto == ETH_P_IPV6) {
		__u8 *ip6 = data + off;

		if ((void *)(ip6 + 40) > end)
			return 1;
		l4p = ip6[6];
		l4 = off + 40;
		if (l4p == IPPROTO_UDP_) {
			__u8 *uh = data + (l4 & 0x7ff);

			if ((void *)(uh + 8) > end)
				return 1;
			return ((((__u32)ip6[4] << 8) | ip6[5])) !=
			       (((__u32)uh[4] << 8) | uh[5]);
		}
	} else {
		return 0;
	}
	if (l4p == IPPROTO_TCP_) {
		__u8 *th = data + (l4 & 0x7ff);

		if ((void *)(th + 21) > end)
			return 1;
		return (th[12] >> 4) >= 8 && th[20] == PPT_TCP_KIND;
	}
	return 0;
}


/* Would the frame still fit the MTU after growing by diff bytes? */
static __always_inline int fits_mtu(struct __sk_buff *skb, struct pkt *p,
				    struct ppt_config *cfg, __u32 diff)
{
	__u32 mtu_len = 0;

	if (cfg->mtu)
		return p->l3_end - p->l3 + diff <= cfg->mtu;
	return bpf_check_mtu(skb, 0, &mtu_len, (__s32)diff, 0) == BPF_MTU_CHK_RET_SUCCESS;
}

/* Move [from, end) to [from + by, end + by); the tail must already be grown. */
static __always_inline int shift_right(struct __sk_buff *skb, __u32 from, __u32 end,
				       __u32 by, __u8 *buf)
{
	__u32 rem = end > from ? end - from : 0;

	for (int i = 0; i < MAX_CHUNKS; i++) {
		__u32 n, src;

		if (rem == 0)
			return 0;
		n = rem > CHUNK ? CHUNK : rem;
		n = ((n - 1) & (CHUNK - 1)) + 1;   /* 1..CHUNK, provably for the verifier */
		src = from + rem - n;
		if (bpf_skb_load_bytes(skb, src, buf, n) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, src + by, buf, n, 0) < 0)
			return -1;
		rem -= n;
	}
	return rem ? -1 : 0;
}

/* Move [from, end) to [from - by, end - by), front first. */
static __always_inline int shift_left(struct __sk_buff *skb, __u32 from, __u32 end,
				      __u32 by, __u8 *buf)
{
	__u32 done = 0, rem = end > from ? end - from : 0;

	for (int i = 0; i < MAX_CHUNKS; i++) {
		__u32 n;

		if (rem == 0)
			return 0;
		n = rem > CHUNK ? CHUNK : rem;
		n = ((n - 1) & (CHUNK - 1)) + 1;   /* 1..CHUNK, provably for the verifier */
		if (bpf_skb_load_bytes(skb, from + done, buf, n) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, from + done - by, buf, n, 0) < 0)
			return -1;
		done += n;
		rem -= n;
	}
	return rem ? -1 : 0;
}

/*
 * IP length field (+ IPv4 header checksum) from old to new.  Stored without
 * BPF_F_RECOMPUTE_CSUM: for IPv4 the header checksum compensates it, for
 * IPv6 the L4 pseudo-header update does (see the top of the file).
 */
static __always_inline int set_ip_len(struct __sk_buff *skb, struct pkt *p, __u32 new_len)
{
	__be16 o = bpf_htons((__u16)p->ip_len), n = bpf_htons((__u16)new_len);

	if (p->family == 4) {
		if (bpf_skb_store_bytes(skb, p->l3 + 2, &n, 2, 0) < 0)
			return -1;
		return bpf_l3_csum_replace(skb, p->l3 + 10, o, n, 2);
	}
	return bpf_skb_store_bytes(skb, p->l3 + 4, &n, 2, 0);
}

/* Offset of the L4 checksum field. */
static __always_inline __u32 l4_csum_off(struct pkt *p)
{
	return p->l4 + (p->proto == IPPROTO_TCP_ ? 16 : 6);
}

/* Checksum difference of a 32-bit value going from a to b (e.g. a length). */
static __always_inline __s64 diff32(__u32 a, __u32 b)
{
	__be32 x = bpf_htonl(a), y = bpf_htonl(b);

	return FALLIBLE(bpf_csum_diff(&x, 4, &y, 4, 0));
}

static __always_inline int pseudo_update(struct __sk_buff *skb, struct pkt *p, __s64 d)
{
	return bpf_l4_csum_replace(skb, l4_csum_off(p), 0, (__u32)d,
				   BPF_F_PSEUDO_HDR | (p->family == 6 ? l4_ipv6_flag : 0));
}

/* ---- the option's header, on a byte array ------------------------------- */

static __always_inline __u32 opt_skipped(__u8 *o)
{
	return (o[4] & PPT_SKIP_MASK) >> PPT_SKIP_SHIFT;
}

/* One more VNF could not add its entry (saturating). */
static __always_inline void opt_skip_inc(__u8 *o)
{
	__u32 n = opt_skipped(o);

	if (n < PPT_SKIP_MAX)
		o[4] = (o[4] & ~PPT_SKIP_MASK) | ((n + 1) << PPT_SKIP_SHIFT);
}

static __always_inline __u32 entry_word(__u32 vnf, __u32 t)
{
	return bpf_htonl((vnf << 24) | (t & PPT_TIME_MASK));
}

/*
 * Copy the option o (olen bytes) to n and append entry w: length + 4, one
 * more hop, PENDING.  A previous hop still PENDING never ran its egress: its
 * time becomes "unknown".
 */
static __always_inline int opt_append(__u8 *o, __u8 *n, __u32 olen, __u32 w)
{
	__u32 last = olen - PPT_ENTRY_LEN;

	if (olen < PPT_HDR_LEN + PPT_ENTRY_LEN || olen > OPT_MAX - PPT_ENTRY_LEN)
		return -1;
	__builtin_memcpy(n, o, OPT_MAX);
	if (o[4] & PPT_F_PENDING) {
		if (last > OPT_MAX - 4)
			return -1;
		n[last + 1] = 0xff;
		n[last + 2] = 0xff;
		n[last + 3] = 0xff;
	}
	n[1] = olen + PPT_ENTRY_LEN;
	n[4] |= PPT_F_PENDING;
	n[5] += 1;
	if (olen > OPT_MAX - 4)
		return -1;
	__builtin_memcpy(&n[olen], &w, 4);
	return 0;
}

/* ---- TCP ------------------------------------------------------------------ */

/*
 * Replace the option bytes [at, at + olen) of a TCP segment (olen 0: none
 * yet) by nlen bytes from nw (nlen 0: remove them), moving the rest of the
 * segment, and fix the data offset, the IP length and both checksums.  The
 * caller checked option space and MTU.
 * Returns 0, -1 (failed before any change: the packet is as it came) or
 * -2 (a step after the first change failed; should not happen).
 */
static __always_inline int tcp_resize(struct __sk_buff *skb, struct pkt *p, __u32 at,
				      __u8 *ow, __u32 olen, __u8 *nw, __u32 nlen,
				      struct scratch *s)
{
	__u32 w_old, w_new, len = p->len;
	__s32 delta = (__s32)nlen - (__s32)olen;
	__s64 d, pd;

	if (olen > OPT_MAX || nlen > OPT_MAX || (olen & 3) || (nlen & 3) || !delta)
		return -1;
	if (at + olen > len)
		return -1;
	/* 1. what can fail: nothing has changed yet */
	if (FALLIBLE(bpf_skb_load_bytes(skb, p->l4 + 12, &w_old, 4)) < 0)
		return -1;
	w_new = bpf_htonl(bpf_ntohl(w_old) + ((__u32)(delta / 4) << 28));   /* data offset */
	d = FALLIBLE(bpf_csum_diff(&w_old, 4, &w_new, 4, 0));
	if (d < 0)
		return -1;
	d = FALLIBLE(bpf_csum_diff((__be32 *)ow, olen, (__be32 *)nw, nlen, (__wsum)d));
	if (d < 0)
		return -1;
	pd = diff32(p->l4_len, p->l4_len + delta);
	if (pd < 0)
		return -1;
	if (delta > 0) {
		if (FALLIBLE(bpf_skb_change_tail(skb, len + delta, 0)) < 0)
			return -1;
		/* 2. the changes: the skb is now linear, private and writable */
		if (shift_right(skb, at + olen, len, delta, s->buf) < 0)
			return -2;
	} else {
		__u32 g = -delta;                 /* bytes removed            */
		__u32 r = len - (at + olen);      /* bytes after the option   */
		__u32 k = r < g ? r : g;          /* last bytes to keep aside */

		if (k > UDP_T_MAX)
			return -1;
		if (k && FALLIBLE(bpf_skb_load_bytes(skb, len - k, s->tail, k)) < 0)
			return -1;
		if (FALLIBLE(bpf_skb_change_tail(skb, len - g, 0)) < 0)
			return -1;
		/* 2. the changes: [at + olen, len - k) is still there, the last k
		 * bytes are in s->tail */
		if (shift_left(skb, at + olen, len - k, g, s->buf) < 0)
			return -2;
		if (k && bpf_skb_store_bytes(skb, len - g - k, s->tail, k, 0) < 0)
			return -2;
	}
	if (nlen && bpf_skb_store_bytes(skb, at, nw, nlen, 0) < 0)
		return -2;
	if (bpf_skb_store_bytes(skb, p->l4 + 12, &w_new, 4, 0) < 0)
		return -2;
	if (bpf_l4_csum_replace(skb, l4_csum_off(p), 0, (__u32)d, 0) < 0)
		return -2;
	if (pseudo_update(skb, p, pd) < 0)
		return -2;
	if (set_ip_len(skb, p, p->ip_len + delta) < 0)
		return -2;
	return 0;
}

/*
 * Rewrite our option in place (same length): the first store makes the
 * bytes writable and is the only step that can fail; the checksum field
 * lies before the option, inside the writable range.
 */
static __always_inline int tcp_rewrite(struct __sk_buff *skb, struct pkt *p, __u8 *ow,
				       __u8 *nw, __u32 olen)
{
	__s64 d;

	if (olen < PPT_HDR_LEN + PPT_ENTRY_LEN || olen > OPT_MAX || (olen & 3))
		return -1;
	d = FALLIBLE(bpf_csum_diff((__be32 *)ow, olen, (__be32 *)nw, olen, 0));
	if (d < 0)
		return -1;
	if (FALLIBLE(bpf_skb_store_bytes(skb, p->opt, nw, olen, 0)) < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, l4_csum_off(p), 0, (__u32)d, 0) < 0)
		return -2;
	return 0;
}

/* ---- UDP ------------------------------------------------------------------ */

/*
 * RFC 9868 option checksum over t[0..tlen) (t[0..1] is the OCS, zero while
 * summing) with the 16-bit length pseudo-header.  Zeroes t up to a multiple
 * of 4 bytes first.
 */
static __always_inline int udp_ocs(__u8 *t, __u32 tlen)
{
	__u32 tlen4 = (tlen + 3) & ~3u;
	__s64 s;
	__u16 c;

	if (tlen4 > UDP_T_MAX || tlen < 2)
		return -1;
	for (__u32 i = 0; i < 3; i++)
		if (tlen + i < UDP_T_MAX)
			t[tlen + i] = 0;
	t[0] = 0;
	t[1] = 0;
	s = FALLIBLE(bpf_csum_diff(NULL, 0, (__be32 *)t, tlen4, bpf_htons((__u16)tlen)));
	if (s < 0)
		return -1;
	c = ~fold((__u32)s);
	if (c == 0)
		c = 0xffff;
	__builtin_memcpy(t, &c, 2);
	return 0;
}

/*
 * UDP: for a CHECKSUM_PARTIAL skb the checksum is completed later over
 * everything from the UDP header to the end of the packet, surplus area
 * included.  The options area always sums to -L (L = bytes from the OCS to
 * the end) because of its OCS, so moving the seed by +L keeps the final
 * UDP checksum that of the datagram alone.  Full checksums do not cover
 * the surplus area and need nothing.  The difference is prepared before
 * any change (d), applied after.
 */
static __always_inline __s64 udp_partial_prep(int partial, __u32 l_old, __u32 l_new)
{
	return partial ? diff32(l_old, l_new) : 0;
}

static __always_inline int udp_partial_fix(struct __sk_buff *skb, struct pkt *p, int partial,
					   __s64 d)
{
	return partial ? pseudo_update(skb, p, d) : 0;
}

/* Rewrite the surplus area in place: t (OCS + option, tlen bytes) at p->ocs. */
static __always_inline int udp_rewrite(struct __sk_buff *skb, struct pkt *p, __u8 *t, __u32 tlen)
{
	if (tlen < 2 + PPT_HDR_LEN + PPT_ENTRY_LEN || tlen > UDP_T_MAX)
		return -1;
	if (udp_ocs(t, tlen) < 0)
		return -1;
	/* nothing compensates these bytes: keep a COMPLETE skb->csum with them;
	 * a partial UDP checksum needs nothing (the area still sums to -L) */
	if (FALLIBLE(bpf_skb_store_bytes(skb, p->ocs, t, tlen, BPF_F_RECOMPUTE_CSUM)) < 0)
		return -1;
	return 0;
}

/* In-place option change: t = OCS + option (UDP) or option (TCP), in s->next. */
static __always_inline int opt_rewrite(struct __sk_buff *skb, struct pkt *p, struct scratch *s)
{
	__u32 olen = p->olen;

	if (p->proto == IPPROTO_TCP_)
		return tcp_rewrite(skb, p, s->wire, s->next, olen);
	return udp_rewrite(skb, p, s->next, olen + 2);
}

/*
 * Load our option as it is on the wire into s->wire (TCP: the option; UDP:
 * OCS + option).  Returns a pointer to the option's first byte.
 */
static __always_inline __u8 *opt_load(struct __sk_buff *skb, struct pkt *p, struct scratch *s)
{
	__u32 olen = p->olen;

	if (olen < PPT_HDR_LEN + PPT_ENTRY_LEN || olen > OPT_MAX)
		return NULL;
	__builtin_memset(s->wire, 0, UDP_T_MAX);
	if (p->proto == IPPROTO_TCP_) {
		if (FALLIBLE(bpf_skb_load_bytes(skb, p->opt, s->wire, olen)) < 0)
			return NULL;
		return s->wire;
	}
	if (FALLIBLE(bpf_skb_load_bytes(skb, p->ocs, s->wire, olen + 2)) < 0)
		return NULL;
	return s->wire + 2;
}

/* s->next = s->wire; returns the option's first byte in s->next */
static __always_inline __u8 *opt_copy(struct pkt *p, struct scratch *s)
{
	__builtin_memcpy(s->next, s->wire, UDP_T_MAX);
	return p->proto == IPPROTO_TCP_ ? s->next : s->next + 2;
}

/* ---- sampling -------------------------------------------------------------- */

static __always_inline struct ppt_config *get_cfg(void)
{
	__u32 k = 0;
	struct ppt_config *cfg = bpf_map_lookup_elem(&ppt_cfg, &k);

	if (!cfg || !cfg->enabled)
		return NULL;
	return cfg;
}

/*
 * Read-only pre-check: has the period elapsed since the last sample?  Returns
 * the time (bpf_ktime_get_ns) if so, 0 if not: the caller's ingress stamp.
 */
static __always_inline __u64 sample_due(struct ppt_config *cfg)
{
	__u32 k = 0;
	struct ppt_sample_state *st;
	__u64 last, now;

	if (!cfg->period_ns)
		return bpf_ktime_get_ns();
	st = bpf_map_lookup_elem(&ppt_sample, &k);
	if (!st)
		return 0;
	last = st->last_ns;
	/* For long periods a coarse clock read (no TSC access; one tick of
	 * resolution) rules out most packets; the precise check follows. */
	if (last && cfg->period_ns >= COARSE_MIN_PERIOD &&
	    bpf_ktime_get_coarse_ns() - st->last_coarse + COARSE_SLACK < cfg->period_ns)
		return 0;
	now = bpf_ktime_get_ns();
	return !last || now - last >= cfg->period_ns ? now : 0;
}

/* Time-based sampling shared by all CPUs: one winner per period. */
static __always_inline int take_sample(struct ppt_config *cfg, __u64 now, __u16 *seq)
{
	__u32 k = 0;
	struct ppt_sample_state *st = bpf_map_lookup_elem(&ppt_sample, &k);
	__u64 last;

	if (!st)
		return 0;
	last = st->last_ns;
	if (cfg->period_ns) {
		if (last && now - last < cfg->period_ns)
			return 0;
		if (__sync_val_compare_and_swap(&st->last_ns, last, now) != last)
			return 0;  /* another CPU took this period's sample */
		st->last_coarse = bpf_ktime_get_coarse_ns();
	}
	*seq = (__u16)__sync_fetch_and_add(&st->seq, 1);
	return 1;
}

/* ------------------------------------------------------------------------- */

static __always_inline int done(int ret, __u32 ok_stat)
{
	if (ret < 0)
		stat_inc(PPT_ST_ERR);
	else
		stat_inc(ok_stat);
	return PASS;
}

static __always_inline int do_source(struct __sk_buff *skb, struct pkt *p,
				     struct ppt_config *cfg, struct scratch *s, __u64 t_in)
{
	__u8 *o = s->next;
	__u32 w;
	__u16 seq;

	if (p->opt) {            /* already marked upstream: leave it */
		stat_inc(PPT_ST_SKIP_OTHER);
		return PASS;
	}
	if (skb->gso_segs > 1 || skb->gso_size) {
		stat_inc(PPT_ST_SKIP_GSO);
		return PASS;
	}
	if (p->proto == IPPROTO_TCP_) {
		__u32 ins = PPT_HDR_LEN + PPT_ENTRY_LEN;

		if (p->tcp_hlen + ins > 60) {
			stat_inc(PPT_ST_SKIP_NOSPACE);
			return PASS;
		}
		if (!fits_mtu(skb, p, cfg, ins)) {
			stat_inc(PPT_ST_SKIP_MTU);
			return PASS;
		}
	} else {
		/* UDP: the datagram must end where the IP datagram ends and carry
		 * no surplus area yet; the frame must have no trailing bytes. */
		if (p->udp_len != p->l4_len || p->l3_end != p->len) {
			stat_inc(PPT_ST_SKIP_OTHER);
			return PASS;
		}
		if (!fits_mtu(skb, p, cfg, (p->udp_len & 1) + 2 + PPT_HDR_LEN + PPT_ENTRY_LEN)) {
			stat_inc(PPT_ST_SKIP_MTU);
			return PASS;
		}
	}
	if (!take_sample(cfg, t_in, &seq))
		return PASS;
	if (p->proto == IPPROTO_UDP_)
		o = s->next + 2;
	__builtin_memset(s->next, 0, UDP_T_MAX);
	o[0] = p->proto == IPPROTO_TCP_ ? PPT_TCP_KIND : PPT_UDP_KIND;
	o[1] = PPT_HDR_LEN + PPT_ENTRY_LEN;
	o[2] = PPT_EXID >> 8;
	o[3] = PPT_EXID & 0xff;
	o[4] = (PPT_VERSION << 4) | PPT_F_PENDING;
	o[5] = 1;
	o[6] = seq >> 8;
	o[7] = seq & 0xff;
	w = entry_word(cfg->vnf_id, t_in / 1000);
	__builtin_memcpy(&o[8], &w, 4);

	if (p->proto == IPPROTO_TCP_)
		return done(tcp_resize(skb, p, p->l4 + 20, s->wire, 0, s->next,
				       PPT_HDR_LEN + PPT_ENTRY_LEN, s), PPT_ST_SAMPLED);
	{
		__u32 pad = p->udp_len & 1;
		__u32 tlen = 2 + PPT_HDR_LEN + PPT_ENTRY_LEN;   /* OCS..end */
		int partial = is_partial(skb);
		__s64 pd;

		if (udp_ocs(s->next, tlen) < 0)
			return done(-1, 0);
		pd = udp_partial_prep(partial, 0, tlen);
		if (pd < 0)
			return done(-1, 0);
		if (FALLIBLE(bpf_skb_change_tail(skb, p->len + pad + tlen, 0)) < 0)
			return done(-1, 0);
		/* the grown tail is zeroed, so the pad byte is already 0 */
		if (bpf_skb_store_bytes(skb, p->len + pad, s->next, tlen, 0) < 0 ||
		    set_ip_len(skb, p, p->ip_len + pad + tlen) < 0 ||
		    udp_partial_fix(skb, p, partial, pd) < 0)
			return done(-2, 0);
		return done(0, PPT_ST_SAMPLED);
	}
}

/*
 * This VNF cannot add its entry: count it in the option (in place) so the
 * sink's record says a hop is missing.
 */
static __always_inline int skip_hop(struct __sk_buff *skb, struct pkt *p, struct scratch *s,
				    __u32 why)
{
	__u8 *n;

	stat_inc(why);
	if (!opt_load(skb, p, s))
		return done(-1, 0);
	n = opt_copy(p, s);
	opt_skip_inc(n);
	if (n[4] == (p->proto == IPPROTO_TCP_ ? s->wire[4] : s->wire[6]))
		return PASS;   /* the count is saturated */
	return done(opt_rewrite(skb, p, s), PPT_ST_SKIP_COUNTED);
}

static __always_inline int do_transit_in(struct __sk_buff *skb, struct pkt *p,
					 struct ppt_config *cfg, struct scratch *s, __u64 t_in)
{
	__u32 w = entry_word(cfg->vnf_id, t_in / 1000);
	__u32 olen = p->olen;
	__u8 *o, *n;

	if (!p->opt)
		return PASS;
	if (skb->gso_segs > 1 || skb->gso_size) {
		stat_inc(PPT_ST_SKIP_GSO);
		return PASS;
	}
	if (p->hops >= PPT_MAX_HOPS ||
	    (p->proto == IPPROTO_TCP_ && p->tcp_hlen + PPT_ENTRY_LEN > 60))
		return skip_hop(skb, p, s, PPT_ST_SKIP_NOSPACE);
	if (!fits_mtu(skb, p, cfg, PPT_ENTRY_LEN))
		return skip_hop(skb, p, s, PPT_ST_SKIP_MTU);
	o = opt_load(skb, p, s);
	if (!o)
		return done(-1, 0);
	n = p->proto == IPPROTO_TCP_ ? s->next : s->next + 2;
	if (opt_append(o, n, olen, w) < 0)
		return done(-1, 0);

	if (p->proto == IPPROTO_TCP_)
		return done(tcp_resize(skb, p, p->opt, s->wire, olen, s->next,
				       olen + PPT_ENTRY_LEN, s), PPT_ST_APPENDED);
	{
		__u32 tlen = 2 + olen;                 /* old OCS..end */
		__u32 nlen = tlen + PPT_ENTRY_LEN;
		int partial = is_partial(skb);
		__s64 pd;

		if (udp_ocs(s->next, nlen) < 0)
			return done(-1, 0);
		pd = udp_partial_prep(partial, tlen, nlen);
		if (pd < 0)
			return done(-1, 0);
		/* the new length counts from the end of the IP datagram: bytes after
		 * it (Ethernet padding) are dropped */
		if (FALLIBLE(bpf_skb_change_tail(skb, p->l3_end + PPT_ENTRY_LEN, 0)) < 0)
			return done(-1, 0);
		if (nlen > UDP_T_MAX ||
		    bpf_skb_store_bytes(skb, p->ocs, s->next, nlen, 0) < 0 ||
		    set_ip_len(skb, p, p->ip_len + PPT_ENTRY_LEN) < 0 ||
		    udp_partial_fix(skb, p, partial, pd) < 0)
			return done(-2, 0);
		return done(0, PPT_ST_APPENDED);
	}
}

SEC("tc")
int ppt_in(struct __sk_buff *skb)
{
	struct ppt_config *cfg = get_cfg();
	struct pkt p = {};
	__u32 k = 0;
	struct scratch *s;
	__u64 t_in;

	if (!cfg)
		return PASS;
	stat_inc(PPT_ST_IN_PKTS);
	if (cfg->in_role == PPT_IN_NONE)
		return PASS;
	/* The ingress stamp comes before any of our own work on the packet (parsing,
	 * inserting), so that the VNF's time includes it; the egress stamp comes
	 * after it (see ppt_out).  Fast path of the source: between samples,
	 * nothing to parse. */
	if (cfg->in_role == PPT_IN_SOURCE) {
		t_in = sample_due(cfg);
		if (!t_in)
			return PASS;
	} else {
		if (!maybe_marked(skb))
			return PASS;
		t_in = bpf_ktime_get_ns();
	}
	if (parse(skb, &p) < 0)
		return PASS;
	s = bpf_map_lookup_elem(&ppt_scratch, &k);
	if (!s)
		return PASS;
	if (cfg->in_role == PPT_IN_SOURCE)
		return do_source(skb, &p, cfg, s, t_in);
	return do_transit_in(skb, &p, cfg, s, t_in);
}

/* ------------------------------------------------------------------------- */

/* Remove the option from a packet (sink). */
static __always_inline int strip(struct __sk_buff *skb, struct pkt *p, struct scratch *s)
{
	if (p->proto == IPPROTO_TCP_)
		return tcp_resize(skb, p, p->opt, s->wire, p->olen, s->next, 0, s);
	{
		__u32 surplus = p->l4_len - p->udp_len;
		__u32 tlen = 2 + p->olen;
		int partial = is_partial(skb);
		__s64 pd = udp_partial_prep(partial, tlen, 0);

		if (pd < 0)
			return -1;
		if (FALLIBLE(bpf_skb_change_tail(skb, p->l3_end - surplus, 0)) < 0)
			return -1;
		if (set_ip_len(skb, p, p->ip_len - surplus) < 0 ||
		    udp_partial_fix(skb, p, partial, pd) < 0)
			return -2;
		return 0;
	}
}

/* Fill and submit the sink's record r (reserved before the egress stamp). */
static __always_inline void report(struct __sk_buff *skb, struct ppt_record *r, struct pkt *p,
				   __u8 *o, struct ppt_config *cfg, __u64 ktime, int restored)
{
	__u32 last = p->hops - 1;

	r->ktime_ns = ktime;
	r->ifindex = skb->ifindex;
	r->sink_vnf = cfg->vnf_id;
	r->seq = p->wire_seq;
	r->hops = p->hops;
	r->flags = o[4] & 0xf;
	r->skipped = opt_skipped(o);
	r->sink_measured = 0;
	r->restored = restored;
	r->pad = 0;
	r->family = p->family;
	r->proto = p->proto;
	r->ip_id = p->ip_id;
	r->sport = p->sport;
	r->dport = p->dport;
	r->tcp_seq = p->tcp_seq;
	r->l4_len = p->proto == IPPROTO_TCP_ ? p->l4_len - p->olen : p->udp_len;
	__builtin_memcpy(r->saddr, p->saddr, 16);
	__builtin_memcpy(r->daddr, p->daddr, 16);
#pragma unroll
	for (int i = 0; i < PPT_MAX_HOPS; i++) {
		__u32 v;

		if (i < p->hops) {
			__builtin_memcpy(&v, &o[PPT_HDR_LEN + 4 * i], 4);
			v = bpf_ntohl(v);
			r->hop[i].vnf_id = v >> 24;
			r->hop[i].ppt_us = v & PPT_TIME_MASK;
			if (i == last && r->hop[i].vnf_id == cfg->vnf_id && !(o[4] & PPT_F_PENDING))
				r->sink_measured = 1;
		} else {
			r->hop[i].vnf_id = 0;
			r->hop[i].ppt_us = 0;
		}
	}
	/* Waking the reader for every record costs an IPI (about 10 µs in a VM)
	 * on the packet's path: wake it only once a batch is waiting; it also
	 * polls on a short timeout. */
	bpf_ringbuf_submit(r, bpf_ringbuf_query(&ppt_events, BPF_RB_AVAIL_DATA) >= RB_WAKEUP_BYTES ?
			   BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	stat_inc(PPT_ST_REPORTED);
}

SEC("tc")
int ppt_out(struct __sk_buff *skb)
{
	struct ppt_config *cfg = get_cfg();
	struct pkt p = {};
	__u32 k = 0, last_off, e_old, e_new, t;
	__u64 ktime;
	struct scratch *s;
	__u8 *o, *n;
	struct ppt_record *r = NULL;
	int ours, sink, ret = 0;

	if (!cfg)
		return PASS;
	/* read once: the verifier must see the same value where the record is
	 * reserved and where it is submitted */
	sink = *(volatile __u32 *)&cfg->out_sink;
	stat_inc(PPT_ST_OUT_PKTS);
	if (!maybe_marked(skb))
		return PASS;
	if (parse(skb, &p) < 0 || !p.opt)
		return PASS;
	if (skb->gso_segs > 1 || skb->gso_size) {
		stat_inc(PPT_ST_SKIP_GSO);
		return PASS;
	}
	s = bpf_map_lookup_elem(&ppt_scratch, &k);
	if (!s)
		return PASS;
	o = opt_load(skb, &p, s);
	if (!o) {
		if (sink)
			stat_inc(PPT_ST_LEAKED);
		return done(-1, 0);
	}
	n = opt_copy(&p, s);
	last_off = PPT_HDR_LEN + PPT_ENTRY_LEN * (p.hops - 1);
	if (last_off > OPT_MAX - PPT_ENTRY_LEN)
		return PASS;
	ours = (o[4] & PPT_F_PENDING) && o[last_off] == (__u8)cfg->vnf_id;
	if (sink) {
		r = bpf_ringbuf_reserve(&ppt_events, sizeof(*r), 0);
		if (!r)
			stat_inc(PPT_ST_RB_DROP);
		/* every packet leaves the chain without the option, whether or
		 * not this VNF (or any other) could add its entry */
		ret = strip(skb, &p, s);
		if (ret < 0) {
			stat_inc(PPT_ST_ERR);
			stat_inc(PPT_ST_LEAKED);
		} else {
			stat_inc(PPT_ST_STRIPPED);
		}
	}
	/* the egress stamp: after the sink's restore (our own work belongs to
	 * the VNF's time), before a transit's rewrite (which carries it) */
	ktime = bpf_ktime_get_ns();
	if (ours) {
		/* this VNF's entry: ingress timestamp -> processing time */
		__builtin_memcpy(&e_old, &o[last_off], 4);
		t = ((__u32)(ktime / 1000) - bpf_ntohl(e_old)) & PPT_TIME_MASK;
		if (t == PPT_TIME_UNKNOWN)
			t = PPT_TIME_UNKNOWN - 1;
		e_new = entry_word(cfg->vnf_id, t);
		__builtin_memcpy(&n[last_off], &e_new, 4);
		n[4] &= ~PPT_F_PENDING;
	} else if (o[4] & PPT_F_PENDING) {
		/* the last hop never ran its egress */
		n[last_off + 1] = 0xff;
		n[last_off + 2] = 0xff;
		n[last_off + 3] = 0xff;
		n[4] &= ~PPT_F_PENDING;
	}

	if (sink) {
		if (ours)
			stat_inc(PPT_ST_FINALIZED);
		if (r)
			report(skb, r, &p, n, cfg, ktime, ret == 0);
		return PASS;
	}
	if (!ours) {
		stat_inc(PPT_ST_NOT_OURS);
		return PASS;
	}
	return done(opt_rewrite(skb, &p, s), PPT_ST_FINALIZED);
}

char LICENSE[] SEC("license") = "GPL";

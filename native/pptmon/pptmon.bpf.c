// SPDX-License-Identifier: GPL-2.0
/*
 * fathom PPTMon data plane: per-VNF packet processing time carried in-band.
 *
 * Two TC (clsact) programs, both driven by the run-time config map:
 *   ppt_in   runs where packets ENTER the VNF (guest: ingress of the VNF's
 *            input device; host: egress of the host side of that veth).
 *            SOURCE inserts the option with a first entry {vnf, now_us};
 *            TRANSIT appends an entry {vnf, now_us} to marked packets.
 *   ppt_out  runs where packets LEAVE the VNF.  It turns this VNF's entry
 *            into a duration (now_us - entry).  In sink mode it then reports
 *            every hop to the ring buffer and restores the original packet.
 *
 * Packet surgery never moves the start of the L4 header (so csum_start of a
 * CHECKSUM_PARTIAL skb stays valid): bytes are inserted by growing the tail
 * and shifting everything after the insertion point; the sink shifts back
 * and trims.  Checksums are only changed through the kernel helpers
 * (bpf_l3_csum_replace / bpf_l4_csum_replace / bpf_csum_diff), which do the
 * right thing for full and partial checksums.  Every fallible step happens
 * before the first byte changes; on any failure the packet passes untouched.
 * GSO packets are never modified.
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

struct scratch {
	__u8 buf[CHUNK];
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

static __always_inline __u32 now_us(void)
{
	return (__u32)(bpf_ktime_get_ns() / 1000) & PPT_TIME_MASK;
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
	__u32 rem = end - from;

	for (int i = 0; i < MAX_CHUNKS; i++) {
		__u32 n, src;

		if (rem == 0)
			return 0;
		n = rem;
		if (n > CHUNK)
			n = CHUNK;
		src = from + rem - n;
		if (n == 0 || n > CHUNK)
			return -1;
		if (bpf_skb_load_bytes(skb, src, buf, n) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, src + by, buf, n, BPF_F_RECOMPUTE_CSUM) < 0)
			return -1;
		rem -= n;
	}
	return rem ? -1 : 0;
}

/* Move [from, end) to [from - by, end - by); the tail is trimmed afterwards. */
static __always_inline int shift_left(struct __sk_buff *skb, __u32 from, __u32 end,
				      __u32 by, __u8 *buf)
{
	__u32 done = 0, rem = end - from;

	for (int i = 0; i < MAX_CHUNKS; i++) {
		__u32 n;

		if (rem == 0)
			return 0;
		n = rem;
		if (n > CHUNK)
			n = CHUNK;
		if (n == 0 || n > CHUNK)
			return -1;
		if (bpf_skb_load_bytes(skb, from + done, buf, n) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, from + done - by, buf, n, BPF_F_RECOMPUTE_CSUM) < 0)
			return -1;
		done += n;
		rem -= n;
	}
	return rem ? -1 : 0;
}

/* IP length field (+ IPv4 header checksum) from old to new. */
static __always_inline int set_ip_len(struct __sk_buff *skb, struct pkt *p, __u32 new_len)
{
	__be16 o = bpf_htons((__u16)p->ip_len), n = bpf_htons((__u16)new_len);

	if (p->family == 4) {
		if (bpf_skb_store_bytes(skb, p->l3 + 2, &n, 2, BPF_F_RECOMPUTE_CSUM) < 0)
			return -1;
		return bpf_l3_csum_replace(skb, p->l3 + 10, o, n, 2);
	}
	return bpf_skb_store_bytes(skb, p->l3 + 4, &n, 2, BPF_F_RECOMPUTE_CSUM);
}

/* Offset of the L4 checksum field. */
static __always_inline __u32 l4_csum_off(struct pkt *p)
{
	return p->l4 + (p->proto == IPPROTO_TCP_ ? 16 : 6);
}

/*
 * Insert `ins_len` bytes from `bytes` at offset `at` of a TCP segment
 * (at >= l4 + 20) and fix doff, IP length and both checksums.
 * The caller checked the option space and the MTU.
 */
static __always_inline int tcp_insert(struct __sk_buff *skb, struct pkt *p, __u32 at,
				      __u8 *bytes, __u32 ins_len, __u8 *buf)
{
	__u16 w_old, w_new;
	__be16 lo, ln;
	__s64 diff;
	__u32 coff = l4_csum_off(p);

	if (ins_len == 0 || ins_len > PPT_HDR_LEN + PPT_ENTRY_LEN || (ins_len & 3))
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4 + 12, &w_old, 2) < 0)
		return -1;
	/* the only fallible step that allocates: do it before changing bytes */
	if (bpf_skb_change_tail(skb, p->len + ins_len, 0) < 0)
		return -1;
	if (shift_right(skb, at, p->len, ins_len, buf) < 0)
		return -2;
	if (bpf_skb_store_bytes(skb, at, bytes, ins_len, BPF_F_RECOMPUTE_CSUM) < 0)
		return -2;
	/* data offset */
	w_new = w_old + bpf_htons((__u16)((ins_len / 4) << 12));
	if (bpf_skb_store_bytes(skb, p->l4 + 12, &w_new, 2, BPF_F_RECOMPUTE_CSUM) < 0)
		return -2;
	if (bpf_l4_csum_replace(skb, coff, w_old, w_new, 2) < 0)
		return -2;
	/* the inserted bytes */
	diff = bpf_csum_diff(NULL, 0, (__be32 *)bytes, ins_len, 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, coff, 0, (__u32)diff, 0) < 0)
		return -2;
	/* pseudo-header length */
	lo = bpf_htons((__u16)p->l4_len);
	ln = bpf_htons((__u16)(p->l4_len + ins_len));
	if (bpf_l4_csum_replace(skb, coff, lo, ln, BPF_F_PSEUDO_HDR | 2) < 0)
		return -2;
	if (set_ip_len(skb, p, p->ip_len + ins_len) < 0)
		return -2;
	return 0;
}

/* Remove the whole option [opt, opt + olen) from a TCP segment. */
static __always_inline int tcp_strip(struct __sk_buff *skb, struct pkt *p, __u8 *optbytes,
				     __u8 *buf)
{
	__u16 w_old, w_new;
	__be16 lo, ln;
	__s64 diff;
	__u32 olen = p->olen, coff = l4_csum_off(p);

	if (olen < PPT_HDR_LEN + PPT_ENTRY_LEN || olen > PPT_HDR_LEN + PPT_ENTRY_LEN * PPT_MAX_HOPS)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4 + 12, &w_old, 2) < 0)
		return -1;
	/* make the skb linear and writable up front */
	if (bpf_skb_pull_data(skb, p->len) < 0)
		return -1;
	diff = bpf_csum_diff((__be32 *)optbytes, olen, NULL, 0, 0);
	if (diff < 0)
		return -1;
	if (shift_left(skb, p->opt + olen, p->len, olen, buf) < 0)
		return -2;
	if (bpf_skb_change_tail(skb, p->len - olen, 0) < 0)
		return -2;
	w_new = w_old - bpf_htons((__u16)((olen / 4) << 12));
	if (bpf_skb_store_bytes(skb, p->l4 + 12, &w_new, 2, BPF_F_RECOMPUTE_CSUM) < 0)
		return -2;
	if (bpf_l4_csum_replace(skb, coff, w_old, w_new, 2) < 0)
		return -2;
	if (bpf_l4_csum_replace(skb, coff, 0, (__u32)diff, 0) < 0)
		return -2;
	lo = bpf_htons((__u16)p->l4_len);
	ln = bpf_htons((__u16)(p->l4_len - olen));
	if (bpf_l4_csum_replace(skb, coff, lo, ln, BPF_F_PSEUDO_HDR | 2) < 0)
		return -2;
	if (set_ip_len(skb, p, p->ip_len - olen) < 0)
		return -2;
	return 0;
}

/*
 * RFC 9868 option checksum over t[0..tlen) (t[0..1] is the OCS, zero while
 * summing) with the 16-bit length pseudo-header.  t is zero-padded to a
 * multiple of 4 bytes.
 */
static __always_inline int udp_ocs(__u8 *t, __u32 tlen, __u32 tlen4)
{
	__s64 s;
	__u16 c;

	if (tlen4 > UDP_T_MAX || (tlen4 & 3))
		return -1;
	t[0] = 0;
	t[1] = 0;
	s = bpf_csum_diff(NULL, 0, (__be32 *)t, tlen4, bpf_htons((__u16)tlen));
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
 * the surplus area and need nothing.
 */
static __always_inline int udp_partial_fix(struct __sk_buff *skb, struct pkt *p,
					   int partial, __u32 l_old, __u32 l_new)
{
	if (!partial)
		return 0;
	return bpf_l4_csum_replace(skb, l4_csum_off(p), bpf_htons((__u16)l_old),
				   bpf_htons((__u16)l_new), BPF_F_PSEUDO_HDR | 2);
}

static __always_inline struct ppt_config *get_cfg(void)
{
	__u32 k = 0;
	struct ppt_config *cfg = bpf_map_lookup_elem(&ppt_cfg, &k);

	if (!cfg || !cfg->enabled)
		return NULL;
	return cfg;
}

/* Read-only pre-check: has the period elapsed since the last sample? */
static __always_inline int sample_due(struct ppt_config *cfg)
{
	__u32 k = 0;
	struct ppt_sample_state *st;
	__u64 last;

	if (!cfg->period_ns)
		return 1;
	st = bpf_map_lookup_elem(&ppt_sample, &k);
	if (!st)
		return 0;
	last = st->last_ns;
	if (!last)
		return 1;
	/* For long periods a coarse clock read (no TSC access; one tick of
	 * resolution) rules out most packets; the precise check follows. */
	if (cfg->period_ns >= COARSE_MIN_PERIOD &&
	    bpf_ktime_get_coarse_ns() - st->last_coarse + COARSE_SLACK < cfg->period_ns)
		return 0;
	return bpf_ktime_get_ns() - last >= cfg->period_ns;
}

/* Time-based sampling shared by all CPUs: one winner per period. */
static __always_inline int take_sample(struct ppt_config *cfg, __u16 *seq)
{
	__u32 k = 0;
	struct ppt_sample_state *st = bpf_map_lookup_elem(&ppt_sample, &k);
	__u64 now, last;

	if (!st)
		return 0;
	now = bpf_ktime_get_ns();
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

static __always_inline __u32 entry_word(__u32 vnf, __u32 t)
{
	return bpf_htonl((vnf << 24) | (t & PPT_TIME_MASK));
}

/* ------------------------------------------------------------------------- */

static __always_inline int do_source(struct __sk_buff *skb, struct pkt *p,
				     struct ppt_config *cfg, __u8 *buf)
{
	__u8 o[PPT_HDR_LEN + PPT_ENTRY_LEN + 4] = {};
	__u32 w;
	__u16 seq;
	int ret;

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
		if (!take_sample(cfg, &seq))
			return PASS;
		o[0] = PPT_TCP_KIND;
		o[1] = PPT_HDR_LEN + PPT_ENTRY_LEN;
		o[2] = PPT_EXID >> 8;
		o[3] = PPT_EXID & 0xff;
		o[4] = (PPT_VERSION << 4) | PPT_F_PENDING;
		o[5] = 1;
		o[6] = seq >> 8;
		o[7] = seq & 0xff;
		w = entry_word(cfg->vnf_id, now_us());
		__builtin_memcpy(&o[8], &w, 4);
		ret = tcp_insert(skb, p, p->l4 + 20, o, ins, buf);
	} else {
		/* UDP: the datagram must end where the IP datagram ends and carry
		 * no surplus area yet; the frame must have no trailing bytes. */
		__u32 pad = p->udp_len & 1;
		__u32 tlen = 2 + PPT_HDR_LEN + PPT_ENTRY_LEN;   /* OCS..end */
		__u32 grow = pad + tlen;
		__u8 t[UDP_T_MAX] = {};
		int partial;

		if (p->udp_len != p->l4_len || p->l3_end != p->len) {
			stat_inc(PPT_ST_SKIP_OTHER);
			return PASS;
		}
		if (!fits_mtu(skb, p, cfg, grow)) {
			stat_inc(PPT_ST_SKIP_MTU);
			return PASS;
		}
		if (!take_sample(cfg, &seq))
			return PASS;
		partial = is_partial(skb);
		t[2] = PPT_UDP_KIND;
		t[3] = PPT_HDR_LEN + PPT_ENTRY_LEN;
		t[4] = PPT_EXID >> 8;
		t[5] = PPT_EXID & 0xff;
		t[6] = (PPT_VERSION << 4) | PPT_F_PENDING;
		t[7] = 1;
		t[8] = seq >> 8;
		t[9] = seq & 0xff;
		w = entry_word(cfg->vnf_id, now_us());
		__builtin_memcpy(&t[10], &w, 4);
		if (udp_ocs(t, tlen, 16) < 0)
			return PASS;
		if (bpf_skb_change_tail(skb, p->len + grow, 0) < 0) {
			stat_inc(PPT_ST_ERR);
			return PASS;
		}
		ret = 0;
		/* the grown tail is zeroed, so the pad byte is already 0 */
		if (bpf_skb_store_bytes(skb, p->len + pad, t, 14, BPF_F_RECOMPUTE_CSUM) < 0)
			ret = -2;
		else if (set_ip_len(skb, p, p->ip_len + grow) < 0)
			ret = -2;
		else if (udp_partial_fix(skb, p, partial, 0, tlen) < 0)
			ret = -2;
	}
	if (ret < 0) {
		stat_inc(PPT_ST_ERR);
		return PASS;
	}
	stat_inc(PPT_ST_SAMPLED);
	return PASS;
}

/* Write `val` (4 bytes, network order) at `off` inside our option. */
static __always_inline int tcp_rewrite4(struct __sk_buff *skb, struct pkt *p, __u32 off,
					__u32 old, __u32 val)
{
	if (old == val)
		return 0;
	if (bpf_skb_store_bytes(skb, off, &val, 4, BPF_F_RECOMPUTE_CSUM) < 0)
		return -1;
	return bpf_l4_csum_replace(skb, l4_csum_off(p), old, val, 4);
}

static __always_inline int do_transit_in(struct __sk_buff *skb, struct pkt *p,
					 struct ppt_config *cfg, __u8 *buf)
{
	__u32 w, prev_old, prev_new, hw_old, hw_new;
	__u32 last_off;
	int ret;

	if (!p->opt)
		return PASS;
	if (skb->gso_segs > 1 || skb->gso_size) {
		stat_inc(PPT_ST_SKIP_GSO);
		return PASS;
	}
	if (p->hops >= PPT_MAX_HOPS ||
	    (p->proto == IPPROTO_TCP_ && p->tcp_hlen + PPT_ENTRY_LEN > 60)) {
		stat_inc(PPT_ST_SKIP_NOSPACE);
		return PASS;
	}
	if (!fits_mtu(skb, p, cfg, PPT_ENTRY_LEN)) {
		stat_inc(PPT_ST_SKIP_MTU);
		return PASS;
	}
	w = entry_word(cfg->vnf_id, now_us());
	last_off = p->opt + PPT_HDR_LEN + PPT_ENTRY_LEN * (p->hops - 1);
	if (bpf_skb_load_bytes(skb, last_off, &prev_old, 4) < 0 ||
	    bpf_skb_load_bytes(skb, p->opt, &hw_old, 4) < 0) {
		stat_inc(PPT_ST_ERR);
		return PASS;
	}
	/* previous hop never finalised its entry: mark it unknown */
	prev_new = prev_old;
	if (p->flags & PPT_F_PENDING)
		prev_new = prev_old | bpf_htonl(PPT_TIME_MASK);

	if (p->proto == IPPROTO_TCP_) {
		__u32 hv_old, hv_new;
		__u8 *hb = (__u8 *)&hw_new;

		ret = tcp_insert(skb, p, p->opt + p->olen, (__u8 *)&w, PPT_ENTRY_LEN, buf);
		if (ret < 0)
			goto out;
		/* kind,len,exid word: len grows by 4 */
		hw_new = hw_old;
		hb[1] += PPT_ENTRY_LEN;
		ret = tcp_rewrite4(skb, p, p->opt, hw_old, hw_new) < 0 ? -2 : 0;
		if (ret < 0)
			goto out;
		/* ver_flags,hops,seq word: hops + 1, pending */
		if (bpf_skb_load_bytes(skb, p->opt + 4, &hv_old, 4) < 0) {
			ret = -2;
			goto out;
		}
		hv_new = hv_old;
		hb = (__u8 *)&hv_new;
		hb[0] |= PPT_F_PENDING;
		hb[1] += 1;
		ret = tcp_rewrite4(skb, p, p->opt + 4, hv_old, hv_new) < 0 ? -2 : 0;
		if (ret < 0)
			goto out;
		ret = tcp_rewrite4(skb, p, last_off, prev_old, prev_new) < 0 ? -2 : 0;
	} else {
		__u8 t[UDP_T_MAX] = {};
		__u32 tlen = 2 + p->olen;          /* old OCS..end */
		__u32 nlen = tlen + PPT_ENTRY_LEN;
		int partial = is_partial(skb);

		if (tlen > UDP_T_MAX - PPT_ENTRY_LEN || tlen < 2 + PPT_HDR_LEN + PPT_ENTRY_LEN) {
			ret = -1;
			goto out;
		}
		if (bpf_skb_load_bytes(skb, p->ocs, t, tlen) < 0) {
			ret = -1;
			goto out;
		}
		t[3] += PPT_ENTRY_LEN;
		t[6] |= PPT_F_PENDING;
		t[7] += 1;
		{
			__u32 li = tlen - PPT_ENTRY_LEN;  /* previous last entry */

			if (li > UDP_T_MAX - 8)
				li = UDP_T_MAX - 8;
			__builtin_memcpy(&t[li], &prev_new, 4);
			li = tlen;
			if (li > UDP_T_MAX - 4) {
				ret = -1;
				goto out;
			}
			__builtin_memcpy(&t[li], &w, 4);
		}
		if (udp_ocs(t, nlen, (nlen + 3) & ~3u) < 0) {
			ret = -1;
			goto out;
		}
		if (bpf_skb_change_tail(skb, p->len + PPT_ENTRY_LEN, 0) < 0) {
			ret = -1;
			goto out;
		}
		ret = 0;
		if (nlen > UDP_T_MAX || nlen < 1 ||
		    bpf_skb_store_bytes(skb, p->ocs, t, nlen, BPF_F_RECOMPUTE_CSUM) < 0)
			ret = -2;
		else if (set_ip_len(skb, p, p->ip_len + PPT_ENTRY_LEN) < 0)
			ret = -2;
		else if (udp_partial_fix(skb, p, partial, tlen, nlen) < 0)
			ret = -2;
	}
out:
	if (ret < 0) {
		stat_inc(PPT_ST_ERR);
		return PASS;
	}
	stat_inc(PPT_ST_APPENDED);
	return PASS;
}

SEC("tc")
int ppt_in(struct __sk_buff *skb)
{
	struct ppt_config *cfg = get_cfg();
	struct pkt p = {};
	__u32 k = 0;
	struct scratch *s;

	if (!cfg)
		return PASS;
	stat_inc(PPT_ST_IN_PKTS);
	if (cfg->in_role == PPT_IN_NONE)
		return PASS;
	/* fast path of the source: between samples, nothing to parse */
	if (cfg->in_role == PPT_IN_SOURCE && !sample_due(cfg))
		return PASS;
	if (cfg->in_role == PPT_IN_TRANSIT && !maybe_marked(skb))
		return PASS;
	if (parse(skb, &p) < 0)
		return PASS;
	s = bpf_map_lookup_elem(&ppt_scratch, &k);
	if (!s)
		return PASS;
	if (cfg->in_role == PPT_IN_SOURCE)
		return do_source(skb, &p, cfg, s->buf);
	return do_transit_in(skb, &p, cfg, s->buf);
}

/* ------------------------------------------------------------------------- */

SEC("tc")
int ppt_out(struct __sk_buff *skb)
{
	struct ppt_config *cfg = get_cfg();
	struct pkt p = {};
	__u8 o[PPT_HDR_LEN + PPT_ENTRY_LEN * PPT_MAX_HOPS] = {};
	__u32 k = 0, last_off, e_old, e_new, t, olen;
	struct scratch *s;
	struct ppt_record *r;
	int partial, ret = 0;

	if (!cfg)
		return PASS;
	stat_inc(PPT_ST_OUT_PKTS);
	if (!maybe_marked(skb))
		return PASS;
	if (parse(skb, &p) < 0 || !p.opt)
		return PASS;
	if (skb->gso_segs > 1 || skb->gso_size) {
		stat_inc(PPT_ST_SKIP_GSO);
		return PASS;
	}
	olen = p.olen;
	if (olen > sizeof(o) || olen < PPT_HDR_LEN + PPT_ENTRY_LEN)
		return PASS;
	if (bpf_skb_load_bytes(skb, p.opt, o, olen) < 0)
		return PASS;
	last_off = PPT_HDR_LEN + PPT_ENTRY_LEN * (p.hops - 1);
	if (last_off > sizeof(o) - PPT_ENTRY_LEN)
		return PASS;
	__builtin_memcpy(&e_old, &o[last_off], 4);
	if (!(p.flags & PPT_F_PENDING) || o[last_off] != (__u8)cfg->vnf_id) {
		stat_inc(PPT_ST_NOT_OURS);
		return PASS;
	}
	t = (now_us() - (bpf_ntohl(e_old) & PPT_TIME_MASK)) & PPT_TIME_MASK;
	if (t == PPT_TIME_UNKNOWN)
		t = PPT_TIME_UNKNOWN - 1;
	e_new = entry_word(cfg->vnf_id, t);
	__builtin_memcpy(&o[last_off], &e_new, 4);
	o[4] &= ~PPT_F_PENDING;

	if (cfg->out_sink) {
		/* report every hop, then restore the original packet */
		r = bpf_ringbuf_reserve(&ppt_events, sizeof(*r), 0);
		if (!r) {
			stat_inc(PPT_ST_RB_DROP);
		} else {
			r->ktime_ns = bpf_ktime_get_ns();
			r->ifindex = skb->ifindex;
			r->sink_vnf = cfg->vnf_id;
			r->seq = p.wire_seq;
			r->hops = p.hops;
			r->flags = o[4] & 0xf;
			r->family = p.family;
			r->proto = p.proto;
			r->ip_id = p.ip_id;
			r->sport = p.sport;
			r->dport = p.dport;
			r->tcp_seq = p.tcp_seq;
			r->l4_len = p.l4_len - (p.proto == IPPROTO_TCP_ ? olen :
						 p.l4_len - p.udp_len);
			__builtin_memcpy(r->saddr, p.saddr, 16);
			__builtin_memcpy(r->daddr, p.daddr, 16);
#pragma unroll
			for (int i = 0; i < PPT_MAX_HOPS; i++) {
				__u32 v;

				if (i < p.hops) {
					__builtin_memcpy(&v, &o[PPT_HDR_LEN + 4 * i], 4);
					v = bpf_ntohl(v);
					r->hop[i].vnf_id = v >> 24;
					r->hop[i].ppt_us = v & PPT_TIME_MASK;
				} else {
					r->hop[i].vnf_id = 0;
					r->hop[i].ppt_us = 0;
				}
			}
			/* Waking the reader for every record costs an IPI (about
			 * 10 µs in a VM) on the packet's path: wake it only once a
			 * batch is waiting; it also polls on a short timeout. */
			bpf_ringbuf_submit(r, bpf_ringbuf_query(&ppt_events, BPF_RB_AVAIL_DATA) >=
					   RB_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
			stat_inc(PPT_ST_REPORTED);
		}
		s = bpf_map_lookup_elem(&ppt_scratch, &k);
		if (!s)
			return PASS;
		if (p.proto == IPPROTO_TCP_) {
			/* strip the option as it is on the wire (the entry
			 * rewrite above only lives in o[]) */
			__builtin_memcpy(&o[last_off], &e_old, 4);
			o[4] |= PPT_F_PENDING;
			ret = tcp_strip(skb, &p, o, s->buf);
		} else {
			__u32 surplus = p.l4_len - p.udp_len;
			__u32 tlen = 2 + olen;

			partial = is_partial(skb);
			if (bpf_skb_change_tail(skb, p.len - surplus, 0) < 0)
				ret = -1;
			else if (set_ip_len(&*skb, &p, p.ip_len - surplus) < 0)
				ret = -2;
			else if (udp_partial_fix(skb, &p, partial, tlen, 0) < 0)
				ret = -2;
		}
		if (ret < 0) {
			stat_inc(PPT_ST_ERR);
			return PASS;
		}
		stat_inc(PPT_ST_FINALIZED);
		stat_inc(PPT_ST_STRIPPED);
		return PASS;
	}

	/* not the sink: write the duration and clear the pending flag */
	if (p.proto == IPPROTO_TCP_) {
		__u32 hv_old, hv_new;

		if (bpf_skb_load_bytes(skb, p.opt + 4, &hv_old, 4) < 0)
			return PASS;
		hv_new = hv_old;
		((__u8 *)&hv_new)[0] &= ~PPT_F_PENDING;
		if (tcp_rewrite4(skb, &p, p.opt + last_off, e_old, e_new) < 0 ||
		    tcp_rewrite4(skb, &p, p.opt + 4, hv_old, hv_new) < 0)
			ret = -2;
	} else {
		__u8 t[UDP_T_MAX] = {};
		__u32 tlen = 2 + olen;

		if (tlen > UDP_T_MAX || tlen < 1)
			return PASS;
		t[0] = 0;
		__builtin_memcpy(&t[2], o, sizeof(o) < UDP_T_MAX - 2 ? sizeof(o) : UDP_T_MAX - 2);
		if (udp_ocs(t, tlen, (tlen + 3) & ~3u) < 0)
			return PASS;
		/* in-place change: the options area still sums to -L, so a
		 * partial UDP checksum needs no change */
		if (bpf_skb_store_bytes(skb, p.ocs, t, tlen, BPF_F_RECOMPUTE_CSUM) < 0)
			ret = -2;
	}
	if (ret < 0) {
		stat_inc(PPT_ST_ERR);
		return PASS;
	}
	stat_inc(PPT_ST_FINALIZED);
	return PASS;
}

char LICENSE[] SEC("license") = "GPL";

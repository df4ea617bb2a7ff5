/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * fathom PPTMon: definitions shared by the eBPF programs (pptmon.bpf.c) and
 * the user-space tools (loader.c, testrun.c).  See docs/pptmon.md for the
 * wire format; the constants below are the single source of truth for it.
 */
#ifndef FATHOM_PPTMON_H
#define FATHOM_PPTMON_H

/* ---- wire format -------------------------------------------------------- */
#define PPT_TCP_KIND     254        /* RFC 4727/6994 experimental TCP option    */
#define PPT_UDP_KIND     127        /* RFC 9868 EXP (SAFE experimental) option  */
#define PPT_EXID         0x5046     /* our 16-bit ExID ("PF"), RFC 6994 style   */
#define PPT_VERSION      1          /* high nibble of the ver_flags byte         */
#define PPT_F_PENDING    0x01       /* last entry holds an ingress timestamp     */
#define PPT_SKIP_SHIFT   1          /* flags bits 1-3: VNFs that could not add   */
#define PPT_SKIP_MASK    0x0e       /*   their entry (option room, hop cap, MTU) */
#define PPT_SKIP_MAX     7          /*   saturating count                        */
#define PPT_HDR_LEN      8          /* kind,len,exid(2),ver_flags,hops,seq(2)    */
#define PPT_ENTRY_LEN    4          /* vnf_id(8) | time_us(24), network order   */
#define PPT_MAX_HOPS     8          /* (40 - 8) / 4 for TCP; same cap for UDP    */
#define PPT_TIME_MASK    0xffffffu
#define PPT_TIME_UNKNOWN 0xffffffu  /* a hop whose egress never finalised it     */

/* ---- configuration (array map "ppt_cfg", one entry) --------------------- */
enum ppt_in_role {
	PPT_IN_NONE    = 0,  /* ingress program passes everything                */
	PPT_IN_SOURCE  = 1,  /* sample and insert the option with the first hop */
	PPT_IN_TRANSIT = 2,  /* append an entry to packets carrying the option  */
};

struct ppt_config {
	__u64 period_ns;  /* sampling period at the source; 0 = every packet   */
	__u32 vnf_id;     /* 1..255                                             */
	__u32 in_role;    /* enum ppt_in_role                                   */
	__u32 out_sink;   /* 1: egress finalises, reports and strips the option */
	__u32 mtu;        /* 0: device MTU (bpf_check_mtu); else L3 MTU to keep */
	__u32 enabled;    /* 0: both programs pass everything untouched         */
	__u32 pad;
};

/* ---- counters (per-CPU array map "ppt_stats") --------------------------- */
enum ppt_stat {
	PPT_ST_IN_PKTS = 0,   /* packets seen by the ingress-side program       */
	PPT_ST_OUT_PKTS,      /* packets seen by the egress-side program        */
	PPT_ST_SAMPLED,       /* option inserted by the source                  */
	PPT_ST_APPENDED,      /* entry appended by a transit/sink hop           */
	PPT_ST_FINALIZED,     /* own entry turned from timestamp into duration  */
	PPT_ST_REPORTED,      /* records written to the ring buffer             */
	PPT_ST_STRIPPED,      /* option removed, original packet restored       */
	PPT_ST_SKIP_GSO,      /* not touched: GSO packet                        */
	PPT_ST_SKIP_MTU,      /* no entry added: growing would exceed the MTU   */
	PPT_ST_SKIP_NOSPACE,  /* no entry added: TCP option space / hop cap full */
	PPT_ST_SKIP_OTHER,    /* not touched: fragment, trailing bytes, ...     */
	PPT_ST_SKIP_COUNTED,  /* no entry added, counted in the option instead  */
	PPT_ST_NOT_OURS,      /* egress: option present but last hop not ours   */
	PPT_ST_RB_DROP,       /* ring buffer full                               */
	PPT_ST_ERR,           /* a helper failed; the packet was passed as is   */
	PPT_ST_LEAKED,        /* sink: the option could not be removed (errors) */
	PPT_ST__MAX,
};

/* ---- record (ring buffer "ppt_events"), written by the sink ------------- */
struct ppt_hop {
	__u32 vnf_id;
	__u32 ppt_us;         /* PPT_TIME_UNKNOWN if the hop never finalised   */
};

struct ppt_record {
	__u64 ktime_ns;       /* CLOCK_MONOTONIC at the sink's egress           */
	__u32 ifindex;        /* interface of the sink's egress-side program    */
	__u32 sink_vnf;
	__u16 seq;            /* sample sequence number set by the source       */
	__u8  hops;
	__u8  flags;
	__u8  family;         /* 4 or 6                                         */
	__u8  proto;          /* 6 TCP, 17 UDP                                  */
	__u16 ip_id;          /* IPv4 identification (0 for IPv6)               */
	__u16 sport;
	__u16 dport;
	__u32 tcp_seq;        /* TCP sequence number (0 for UDP)                */
	__u32 l4_len;         /* L4 length of the restored packet               */
	__u8  skipped;        /* VNFs that could not add their entry (0-7)      */
	__u8  sink_measured;  /* the last hop is the sink's own, finalised      */
	__u8  restored;       /* the option was removed (0: a helper failed)    */
	__u8  pad;
	__u8  saddr[16];
	__u8  daddr[16];
	struct ppt_hop hop[PPT_MAX_HOPS];
};

#endif

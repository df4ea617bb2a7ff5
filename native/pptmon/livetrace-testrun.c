// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * livetrace-testrun: drive the live trace programs (livetrace.bpf.c) through BPF_PROG_TEST_RUN.
 * Reads commands from stdin, one per line, and answers each with one JSON line:
 *   arm SLOT TAG DSCP IP_ID ICMP_ID ICMP_SEQ icmp|tcp DROP_REPLY_IFINDEX
 *                              (write a trace's mark into lt_slots[SLOT], as livetrace-watch does)
 *   disarm SLOT
 *   mark N                     (skb->mark of the next runs: LT_INJECT_MARK is the agent's injection)
 *   gso SEGS SIZE              (skb gso_segs/gso_size of the next runs)
 *   run in|out HEX             -> {"retval":R,"data":"HEX","seen":[{the lt_seen records}]}
 * The test runs on the loopback device (ifindex 1).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "common.h"
#include "livetrace.h"
#include "livetrace.skel.h"

#define MAXPKT 16384
#define MAXSEEN 16

static struct lt_seen seen[MAXSEEN];
static int nseen;

static int on_seen(void *ctx, void *data, size_t len)
{
	if (len >= sizeof(struct lt_seen) && nseen < MAXSEEN)
		memcpy(&seen[nseen++], data, sizeof(struct lt_seen));
	return 0;
}

static int armed_count(struct livetrace_bpf *skel)
{
	int n = 0;

	for (int i = 0; i < LT_SLOTS; i++)
		n += skel->bss->lt_slots[i].armed != 0;
	return n;
}

static void print_seen(const struct lt_seen *s)
{
	char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN], oa[INET_ADDRSTRLEN], ob[INET_ADDRSTRLEN];

	inet_ntop(AF_INET, &s->saddr, a, sizeof(a));
	inet_ntop(AF_INET, &s->daddr, b, sizeof(b));
	inet_ntop(AF_INET, &s->outer_src, oa, sizeof(oa));
	inet_ntop(AF_INET, &s->outer_dst, ob, sizeof(ob));
	printf("{\"tag\":%u,\"ifindex\":%u,\"dir\":%u,\"kind\":%u,\"proto\":%u,\"tcp_flags\":%u,\"ttl\":%u,"
	       "\"len\":%u,\"vlan\":%u,\"encap\":%u,\"vni\":%u,\"src\":\"%s\",\"dst\":\"%s\",\"outer_src\":\"%s\","
	       "\"outer_dst\":\"%s\",\"ktime_ns\":%llu}", s->tag, s->ifindex, s->dir, s->kind, s->proto, s->tcp_flags,
	       s->ttl, s->len, s->vlan, s->encap, s->vni, a, b, oa, ob, (unsigned long long)s->ktime_ns);
}

static int silent(enum libbpf_print_level l, const char *fmt, va_list ap)
{
	return l == LIBBPF_WARN ? vfprintf(stderr, fmt, ap) : 0;
}

int main(void)
{
	static char line[2 * MAXPKT + 64];
	static unsigned char in[MAXPKT], out[MAXPKT];
	struct __sk_buff ctx = {};
	struct livetrace_bpf *skel;
	struct ring_buffer *rb;

	libbpf_set_print(silent);
	skel = livetrace_bpf__open_and_load();
	if (!skel) {
		fprintf(stderr, "livetrace-testrun: cannot load programs: %s\n", strerror(errno));
		return 1;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.lt_events), on_seen, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "livetrace-testrun: ring buffer: %s\n", strerror(errno));
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	while (fgets(line, sizeof(line), stdin)) {
		unsigned int slot, tag, dscp, ip_id, icmp_id, icmp_seq, drop, a, b;
		char proto[8], prog[8], hex[8];

		if (sscanf(line, "arm %u %u %u %u %u %u %7s %u", &slot, &tag, &dscp, &ip_id, &icmp_id, &icmp_seq, proto,
			   &drop) == 8 && slot < LT_SLOTS) {
			struct lt_config c = { .tag = tag, .drop_reply_ifindex = drop, .ip_id = ip_id, .icmp_id = icmp_id,
					       .icmp_seq = icmp_seq, .dscp = dscp,
					       .proto = strcmp(proto, "tcp") ? IPPROTO_ICMP : IPPROTO_TCP };

			skel->bss->lt_slots[slot] = c;
			skel->bss->lt_slots[slot].armed = 1;
			skel->bss->lt_armed = armed_count(skel);
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "disarm %u", &slot) == 1 && slot < LT_SLOTS) {
			skel->bss->lt_slots[slot].armed = 0;
			skel->bss->lt_armed = armed_count(skel);
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "mark %u", &a) == 1) {
			ctx.mark = a;
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "gso %u %u", &a, &b) == 2) {
			ctx.gso_segs = a;
			ctx.gso_size = b;
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "run %7s %7s", prog, hex) == 2) {
			const char *h = strchr(line + 4, ' ');
			int n = h ? ppt_unhex(h + 1, in, MAXPKT) : -1;
			struct bpf_program *p = strcmp(prog, "in") == 0 ? skel->progs.lt_in : skel->progs.lt_out;
			LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = in, .data_size_in = n, .data_out = out,
				    .data_size_out = sizeof(out), .ctx_in = &ctx, .ctx_size_in = sizeof(ctx), .repeat = 1);

			if (n < 14) {
				printf("{\"error\":\"bad packet\"}\n");
				continue;
			}
			if (bpf_prog_test_run_opts(bpf_program__fd(p), &o)) {
				printf("{\"error\":\"test_run: %s\"}\n", strerror(errno));
				continue;
			}
			nseen = 0;
			ring_buffer__consume(rb);
			printf("{\"retval\":%d,\"data\":\"", (int)o.retval);
			for (__u32 i = 0; i < o.data_size_out; i++)
				printf("%02x", out[i]);
			printf("\",\"seen\":[");
			for (int i = 0; i < nseen; i++) {
				if (i)
					printf(",");
				print_seen(&seen[i]);
			}
			printf("]}\n");
		} else {
			printf("{\"error\":\"unknown command\"}\n");
		}
	}
	ring_buffer__free(rb);
	livetrace_bpf__destroy(skel);
	return 0;
}

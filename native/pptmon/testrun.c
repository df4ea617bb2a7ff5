// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * pptmon-testrun: drive the PPTMon programs through BPF_PROG_TEST_RUN.
 * Reads commands from stdin, one per line, and answers each with one JSON line:
 *   cfg IN_ROLE OUT_SINK VNF_ID PERIOD_NS MTU ENABLED
 *   gso SEGS SIZE              (skb gso_segs/gso_size for the next runs)
 *   csum 0|1                   (1: run with CHECKSUM_COMPLETE; the kernel then
 *                               checks skb->csum against the output packet)
 *   fault N                    (make the N-th fallible call of each run fail;
 *                               0: none)
 *   reset                      (forget the last sample time)
 *   run in|out HEX             -> {"retval":R,"data":"HEX","records":[...],
 *                                  "fallible":calls made}
 *   stats                      -> {counters}
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "common.h"
#include "pptmon.skel.h"

#define MAXPKT 16384

static struct ppt_record recs[64];
static int nrecs;

static int on_record(void *ctx, void *data, size_t len)
{
	if (len >= sizeof(struct ppt_record) && nrecs < 64)
		memcpy(&recs[nrecs++], data, sizeof(struct ppt_record));
	return 0;
}

static int silent(enum libbpf_print_level l, const char *fmt, va_list ap)
{
	return l == LIBBPF_WARN ? vfprintf(stderr, fmt, ap) : 0;
}

int main(void)
{
	static char line[2 * MAXPKT + 64];
	static unsigned char in[MAXPKT], out[MAXPKT];
	struct ppt_config cfg = { .enabled = 1 };
	struct __sk_buff ctx = {};
	struct pptmon_bpf *skel;
	struct ring_buffer *rb;
	__u32 run_flags = 0;

	libbpf_set_print(silent);
	skel = pptmon_bpf__open();
	if (skel) {
		skel->rodata->l4_ipv6_flag = ppt_l4_ipv6_flag();
		skel->rodata->fault_inject = 1;
		if (pptmon_bpf__load(skel)) {
			pptmon_bpf__destroy(skel);
			skel = NULL;
		}
	}
	if (!skel) {
		fprintf(stderr, "testrun: cannot load programs: %s\n", strerror(errno));
		return 1;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.ppt_events), on_record, NULL, NULL);
	if (!rb)
		return 1;
	setvbuf(stdout, NULL, _IOLBF, 0);

	while (fgets(line, sizeof(line), stdin)) {
		char prog[8], hex[8];
		unsigned int a, b, c, e, f;
		unsigned long long d;

		if (sscanf(line, "cfg %u %u %u %llu %u %u", &a, &b, &c, &d, &e, &f) == 6) {
			cfg.in_role = a;
			cfg.out_sink = b;
			cfg.vnf_id = c;
			cfg.period_ns = d;
			cfg.mtu = e;
			cfg.enabled = f;
			printf("{\"ok\":%s}\n",
			       ppt_config_write(bpf_map__fd(skel->maps.ppt_cfg), &cfg) ? "false" : "true");
		} else if (sscanf(line, "gso %u %u", &a, &b) == 2) {
			ctx.gso_segs = a;
			ctx.gso_size = b;
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "csum %u", &a) == 1) {
			run_flags = a ? BPF_F_TEST_SKB_CHECKSUM_COMPLETE : 0;
			printf("{\"ok\":true}\n");
		} else if (sscanf(line, "fault %u", &a) == 1) {
			skel->bss->fault_nth = a;
			printf("{\"ok\":true}\n");
		} else if (strncmp(line, "reset", 5) == 0) {
			__u32 k = 0;
			__u64 z[3] = {0, 0, 0};

			bpf_map_update_elem(bpf_map__fd(skel->maps.ppt_sample), &k, z, BPF_ANY);
			printf("{\"ok\":true}\n");
		} else if (strncmp(line, "stats", 5) == 0) {
			ppt_stats_json(stdout, bpf_map__fd(skel->maps.ppt_stats));
			printf("\n");
		} else if (sscanf(line, "run %7s %7s", prog, hex) == 2) {
			const char *h = strchr(line + 4, ' ');
			int n = h ? ppt_unhex(h + 1, in, MAXPKT) : -1;
			struct bpf_program *p = strcmp(prog, "in") == 0 ? skel->progs.ppt_in
									 : skel->progs.ppt_out;
			LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = in, .data_size_in = n,
				    .data_out = out, .data_size_out = sizeof(out),
				    .ctx_in = &ctx, .ctx_size_in = sizeof(ctx), .repeat = 1,
				    .flags = run_flags);
			int err;

			if (n < 14) {
				printf("{\"error\":\"bad packet\"}\n");
				continue;
			}
			skel->bss->fault_calls = 0;
			err = bpf_prog_test_run_opts(bpf_program__fd(p), &o);
			if (err) {
				printf("{\"error\":\"test_run: %s\"}\n", strerror(errno));
				continue;
			}
			nrecs = 0;
			ring_buffer__consume(rb);
			printf("{\"retval\":%d,\"data\":\"", (int)o.retval);
			for (__u32 i = 0; i < o.data_size_out; i++)
				printf("%02x", out[i]);
			printf("\",\"records\":[");
			for (int i = 0; i < nrecs; i++) {
				if (i)
					printf(",");
				ppt_record_json(stdout, &recs[i], 0, NULL);
			}
			printf("],\"fallible\":%u}\n", skel->bss->fault_calls);
		} else {
			printf("{\"error\":\"unknown command\"}\n");
		}
	}
	ring_buffer__free(rb);
	pptmon_bpf__destroy(skel);
	return 0;
}

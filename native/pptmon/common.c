// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* fathom PPTMon user space: record and counter formatting. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
#include <linux/bpf.h>
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include "common.h"

static const char *stat_names[PPT_ST__MAX] = {
	[PPT_ST_IN_PKTS] = "in_pkts",
	[PPT_ST_OUT_PKTS] = "out_pkts",
	[PPT_ST_SAMPLED] = "sampled",
	[PPT_ST_APPENDED] = "appended",
	[PPT_ST_FINALIZED] = "finalized",
	[PPT_ST_REPORTED] = "reported",
	[PPT_ST_STRIPPED] = "stripped",
	[PPT_ST_SKIP_GSO] = "skip_gso",
	[PPT_ST_SKIP_MTU] = "skip_mtu",
	[PPT_ST_SKIP_NOSPACE] = "skip_nospace",
	[PPT_ST_SKIP_OTHER] = "skip_other",
	[PPT_ST_SKIP_COUNTED] = "skip_counted",
	[PPT_ST_NOT_OURS] = "not_ours",
	[PPT_ST_RB_DROP] = "ringbuf_drop",
	[PPT_ST_ERR] = "errors",
	[PPT_ST_LEAKED] = "leaked",
};

__u64 ppt_l4_ipv6_flag(void)
{
	struct btf *btf = btf__load_vmlinux_btf();
	__u64 flag = 0;

	if (!btf)
		return 0;
	for (__u32 id = 1; id < btf__type_cnt(btf) && !flag; id++) {
		const struct btf_type *t = btf__type_by_id(btf, id);
		const struct btf_enum *e;

		if (!btf_is_enum(t))
			continue;
		e = btf_enum(t);
		for (__u16 i = 0; i < btf_vlen(t); i++)
			if (strcmp(btf__name_by_offset(btf, e[i].name_off), "BPF_F_IPV6") == 0)
				flag = BPF_F_IPV6;
	}
	btf__free(btf);
	return flag;
}

__s64 ppt_mono_to_real(void)
{
	struct timespec m, r;

	clock_gettime(CLOCK_MONOTONIC, &m);
	clock_gettime(CLOCK_REALTIME, &r);
	return ((__s64)r.tv_sec - m.tv_sec) * 1000000000LL + (r.tv_nsec - m.tv_nsec);
}

void ppt_record_json(FILE *f, const struct ppt_record *r, __s64 off, const char *extra)
{
	char src[INET6_ADDRSTRLEN], dst[INET6_ADDRSTRLEN];
	int af = r->family == 6 ? AF_INET6 : AF_INET;
	unsigned long long e2e = 0;
	/* the sum over the chain is known only when every VNF has a time */
	int whole = r->skipped == 0 && r->sink_measured;

	inet_ntop(af, r->saddr, src, sizeof(src));
	inet_ntop(af, r->daddr, dst, sizeof(dst));
	fprintf(f, "{\"type\":\"ppt\",\"v\":1,%s%s\"ktime_ns\":%llu,\"time_ns\":%lld,"
		"\"ifindex\":%u,\"sink_vnf\":%u,\"seq\":%u,\"flags\":%u,"
		"\"skipped\":%u,\"sink_measured\":%s,\"restored\":%s,"
		"\"flow\":{\"family\":%u,\"proto\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\","
		"\"sport\":%u,\"dport\":%u,\"ip_id\":%u,\"tcp_seq\":%u,\"l4_len\":%u},\"hops\":[",
		extra ? extra : "", extra && *extra ? "," : "",
		(unsigned long long)r->ktime_ns, (long long)r->ktime_ns + (long long)off,
		r->ifindex, r->sink_vnf, r->seq, r->flags, r->skipped,
		r->sink_measured ? "true" : "false", r->restored ? "true" : "false", r->family,
		r->proto == 6 ? "tcp" : r->proto == 17 ? "udp" : "other", src, dst,
		r->sport, r->dport, r->ip_id, r->tcp_seq, r->l4_len);
	for (int i = 0; i < r->hops && i < PPT_MAX_HOPS; i++) {
		if (r->hop[i].ppt_us == PPT_TIME_UNKNOWN) {
			whole = 0;
			fprintf(f, "%s{\"vnf\":%u,\"ppt_us\":null}", i ? "," : "", r->hop[i].vnf_id);
		} else {
			e2e += r->hop[i].ppt_us;
			fprintf(f, "%s{\"vnf\":%u,\"ppt_us\":%u}", i ? "," : "",
				r->hop[i].vnf_id, r->hop[i].ppt_us);
		}
	}
	if (whole)
		fprintf(f, "],\"e2e_us\":%llu}", e2e);
	else
		fprintf(f, "],\"e2e_us\":null}");
}

int ppt_stats_json(FILE *f, int fd)
{
	int ncpu = libbpf_num_possible_cpus();
	__u64 *vals;

	if (ncpu <= 0)
		return -1;
	vals = calloc(ncpu, sizeof(__u64));
	if (!vals)
		return -1;
	fprintf(f, "{");
	for (__u32 k = 0; k < PPT_ST__MAX; k++) {
		unsigned long long sum = 0;

		if (bpf_map_lookup_elem(fd, &k, vals) == 0)
			for (int c = 0; c < ncpu; c++)
				sum += vals[c];
		fprintf(f, "%s\"%s\":%llu", k ? "," : "", stat_names[k], sum);
	}
	fprintf(f, "}");
	free(vals);
	return 0;
}

int ppt_config_write(int fd, const struct ppt_config *cfg)
{
	__u32 k = 0;

	return bpf_map_update_elem(fd, &k, cfg, BPF_ANY);
}

int ppt_unhex(const char *s, unsigned char *out, int max)
{
	int n = 0;

	while (s[0] && s[1] && s[0] != '\n' && n < max) {
		unsigned int b;

		if (sscanf(s, "%2x", &b) != 1)
			return -1;
		out[n++] = b;
		s += 2;
	}
	return n;
}

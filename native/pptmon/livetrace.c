// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * livetrace-watch: the observation points of one live trace on this node (livetrace.bpf.c).
 *
 *   livetrace-watch --dscp N --ip-id N --icmp-id N --icmp-seq N [--tcp] [--drop-reply DEV]
 *                   [--timeout-ms N] DEV...
 *
 * Attaches lt_in at TC ingress and lt_out at TC egress of every DEV (clsact, our handle and
 * priority only; a stale filter of ours left by a killed watcher is replaced), prints
 * {"type":"attached",...} once they are all attached, then one {"type":"seen",...} line per
 * sighting of the probe, until stdin closes, SIGTERM/SIGINT, or --timeout-ms (at most 20 s) pass;
 * then it prints what is still in the ring buffer, detaches its filters and exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "livetrace.h"
#include "livetrace.skel.h"

#define HANDLE 0x4c54
#define PRIO 3
#define MAX_DEVS 32
#define MAX_TIMEOUT_MS 20000

static volatile sig_atomic_t stop;
static char names[MAX_DEVS][IF_NAMESIZE];
static int ifindexes[MAX_DEVS], attached[MAX_DEVS][2], ndevs;

static void on_signal(int sig) { stop = 1; }

/* libbpf's own messages: its warnings only (probing for a free tc slot logs kernel errors) */
static int quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	return level == LIBBPF_WARN && !strstr(fmt, "Kernel error message") ? vfprintf(stderr, fmt, args) : 0;
}

static int ours(struct bpf_tc_hook *hook)
{
	LIBBPF_OPTS(bpf_tc_opts, q, .handle = HANDLE, .priority = PRIO);
	struct bpf_prog_info info = {};
	__u32 len = sizeof(info);
	int fd, yes;

	if (bpf_tc_query(hook, &q))
		return 0;
	fd = bpf_prog_get_fd_by_id(q.prog_id);
	if (fd < 0)
		return -1;
	yes = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 &&
	      (strcmp(info.name, "lt_in") == 0 || strcmp(info.name, "lt_out") == 0);
	close(fd);
	return yes ? 1 : -1;
}

static int attach(int i, int egress, int prog_fd)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindexes[i],
		    .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
	LIBBPF_OPTS(bpf_tc_opts, o, .handle = HANDLE, .priority = PRIO, .prog_fd = prog_fd);
	int err = bpf_tc_hook_create(&hook), owner;

	if (err && err != -EEXIST) {
		fprintf(stderr, "livetrace-watch: clsact on %s: %s\n", names[i], strerror(-err));
		return -1;
	}
	owner = ours(&hook);
	if (owner < 0) {
		fprintf(stderr, "livetrace-watch: handle 0x%x priority %d on %s is another program's\n",
			HANDLE, PRIO, names[i]);
		return -1;
	}
	if (owner > 0)
		o.flags = BPF_TC_F_REPLACE;
	err = bpf_tc_attach(&hook, &o);
	if (err) {
		fprintf(stderr, "livetrace-watch: attach on %s: %s\n", names[i], strerror(-err));
		return -1;
	}
	attached[i][egress] = 1;
	return 0;
}

static void detach_all(void)
{
	for (int i = 0; i < ndevs; i++)
		for (int egress = 0; egress < 2; egress++) {
			LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindexes[i],
				    .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
			LIBBPF_OPTS(bpf_tc_opts, o, .handle = HANDLE, .priority = PRIO);
			if (attached[i][egress] && ours(&hook) > 0)
				bpf_tc_detach(&hook, &o);
			attached[i][egress] = 0;
		}
}

static const char *name_of(__u32 ifindex)
{
	for (int i = 0; i < ndevs; i++)
		if ((__u32)ifindexes[i] == ifindex)
			return names[i];
	return "?";
}

static int on_event(void *ctx, void *data, size_t len)
{
	const struct lt_seen *s = data;
	static const char *dirs[] = { "ingress", "egress", "injected" };
	char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN], oa[INET_ADDRSTRLEN], ob[INET_ADDRSTRLEN];

	if (len < sizeof(*s))
		return 0;
	inet_ntop(AF_INET, &s->saddr, a, sizeof(a));
	inet_ntop(AF_INET, &s->daddr, b, sizeof(b));
	printf("{\"type\":\"seen\",\"dev\":\"%s\",\"dir\":\"%s\",\"ktime_ns\":%llu,\"icmp_type\":%u,"
	       "\"ttl\":%u,\"len\":%u,\"src\":\"%s\",\"dst\":\"%s\"", name_of(s->ifindex),
	       dirs[s->dir < 3 ? s->dir : 0], (unsigned long long)s->ktime_ns, s->icmp_type, s->ttl,
	       s->len, a, b);
	if (s->vlan != 0xffff)
		printf(",\"vlan\":%u", s->vlan);
	if (s->tcp_flags)
		printf(",\"tcp_flags\":%u", s->tcp_flags);
	if (s->encap == LT_ENCAP_VXLAN) {
		inet_ntop(AF_INET, &s->outer_src, oa, sizeof(oa));
		inet_ntop(AF_INET, &s->outer_dst, ob, sizeof(ob));
		printf(",\"vxlan\":{\"vni\":%u,\"src\":\"%s\",\"dst\":\"%s\"}", s->vni, oa, ob);
	}
	printf("}\n");
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: livetrace-watch --dscp N --ip-id N --icmp-id N --icmp-seq N "
		"[--tcp] [--drop-reply DEV] [--timeout-ms N] DEV...\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "dscp", required_argument, NULL, 'd' }, { "ip-id", required_argument, NULL, 'i' },
		{ "icmp-id", required_argument, NULL, 'c' }, { "icmp-seq", required_argument, NULL, 's' },
		{ "drop-reply", required_argument, NULL, 'r' }, { "timeout-ms", required_argument, NULL, 't' },
		{ "tcp", no_argument, NULL, 'p' }, { 0 } };
	struct lt_config cfg = { .proto = IPPROTO_ICMP };
	struct livetrace_bpf *skel;
	struct ring_buffer *rb = NULL;
	const char *drop_reply = NULL;
	long timeout_ms = 5000, dscp = -1;
	struct timespec t0, now;
	int opt, ret = 1;

	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (opt) {
		case 'd': dscp = strtol(optarg, NULL, 0); break;
		case 'i': cfg.ip_id = strtoul(optarg, NULL, 0); break;
		case 'c': cfg.icmp_id = strtoul(optarg, NULL, 0); break;
		case 's': cfg.icmp_seq = strtoul(optarg, NULL, 0); break;
		case 'r': drop_reply = optarg; break;
		case 't': timeout_ms = strtol(optarg, NULL, 0); break;
		case 'p': cfg.proto = IPPROTO_TCP; break;
		default: return usage();
		}
	}
	ndevs = argc - optind;
	if (dscp < 0 || dscp > 63 || ndevs < 1 || ndevs > MAX_DEVS || timeout_ms < 1 ||
	    timeout_ms > MAX_TIMEOUT_MS)
		return usage();
	cfg.dscp = dscp;
	for (int i = 0; i < ndevs; i++) {
		if (strlen(argv[optind + i]) >= IF_NAMESIZE)
			return usage();
		strcpy(names[i], argv[optind + i]);
		ifindexes[i] = if_nametoindex(names[i]);
		if (!ifindexes[i]) {
			fprintf(stderr, "livetrace-watch: no interface %s\n", names[i]);
			return 1;
		}
	}
	if (drop_reply && !(cfg.drop_reply_ifindex = if_nametoindex(drop_reply))) {
		fprintf(stderr, "livetrace-watch: no interface %s\n", drop_reply);
		return 1;
	}
	libbpf_set_print(quiet);
	skel = livetrace_bpf__open();
	if (!skel) {
		fprintf(stderr, "livetrace-watch: open: %s\n", strerror(errno));
		return 1;
	}
	skel->rodata->lt_cfg = cfg;
	if (livetrace_bpf__load(skel)) {
		fprintf(stderr, "livetrace-watch: load: %s\n", strerror(errno));
		goto out;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	signal(SIGPIPE, SIG_IGN);
	for (int i = 0; i < ndevs; i++)
		if (attach(i, 0, bpf_program__fd(skel->progs.lt_in)) ||
		    attach(i, 1, bpf_program__fd(skel->progs.lt_out)))
			goto detach;
	rb = ring_buffer__new(bpf_map__fd(skel->maps.lt_events), on_event, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "livetrace-watch: ring buffer: %s\n", strerror(errno));
		goto detach;
	}
	printf("{\"type\":\"attached\",\"devs\":%d,\"pid\":%d}\n", ndevs, (int)getpid());
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!stop) {
		struct pollfd in = { .fd = 0, .events = POLLIN };
		int err = ring_buffer__poll(rb, 20);

		if (err < 0 && err != -EINTR)
			break;
		fflush(stdout);
		/* stdin closed (or a line on it): the trace is over */
		if (poll(&in, 1, 0) > 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L >= timeout_ms)
			break;
	}
	ring_buffer__consume(rb);
	ret = 0;
detach:
	detach_all();
	printf("{\"type\":\"detached\"}\n");
	fflush(stdout);
	ring_buffer__free(rb);
out:
	livetrace_bpf__destroy(skel);
	return ret;
}

// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * livetrace-watch: the observation points of this node's live traces (livetrace.bpf.c), loaded
 * once and kept attached while traces come.
 *
 *   livetrace-watch [--idle-ms N]
 *
 * Loads the programs, then reads commands on stdin, one a line, and answers each with one JSON
 * line on stdout:
 *
 *   arm TAG DSCP IP_ID ICMP_ID ICMP_SEQ icmp|tcp DROP_REPLY_DEV|- TIMEOUT_MS DEV...
 *       attach lt_in at TC ingress and lt_out at TC egress of every DEV not watched yet (clsact,
 *       our handle and priority only; a stale filter of ours left by a killed watcher is
 *       replaced), then write the trace's mark into a free slot: {"type":"armed","tag":T,
 *       "attached":[the DEVs attached for it]} or {"type":"error","tag":T,"error":...}. Every
 *       fallible step comes first: when one fails, no mark is written.
 *   disarm TAG
 *       clear the trace's slot, print what is still in the ring buffer, then {"type":"disarmed","tag":T}.
 *
 * Each sighting is a {"type":"seen","tag":T,...} line: an ICMP probe's with its "icmp_type" (8 the
 * echo request, 0 its reply), a TCP probe's with its "tcp_flags" (the SYN, the SYN-ACK or RST-ACK
 * answering it). A trace not disarmed within its TIMEOUT_MS
 * (at most 20 s) is cleared ({"type":"expired","tag":T}). With no trace armed for --idle-ms (5000
 * by default, at most 600000), on stdin's end, SIGTERM or SIGINT, it detaches every filter it
 * attached, prints {"type":"detached"} and exits: nothing stays behind.
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
#define MAX_DEVS 64
#define MAX_ARGS (9 + 32)
#define MAX_TIMEOUT_MS 20000
#define MAX_IDLE_MS 600000
#define LINE_MAX_LEN 2048

static volatile sig_atomic_t stop;
static struct livetrace_bpf *skel;
static struct {
	char name[IF_NAMESIZE];
	int ifindex;
} devs[MAX_DEVS];
static int ndevs;
static long long slot_until[LT_SLOTS];   /* ms on CLOCK_MONOTONIC the slot's trace expires at */

static void on_signal(int sig) { stop = 1; }

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* libbpf's own messages: its warnings only (probing for a free tc slot logs kernel errors) */
static int quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	return level == LIBBPF_WARN && !strstr(fmt, "Kernel error message") ? vfprintf(stderr, fmt, args) : 0;
}

static void reply(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* 1: the filter at our handle and priority is ours (lt_in / lt_out); 0: none; -1: another's */
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

static int attach_one(int ifindex, const char *name, int egress, int prog_fd, char *why, size_t n)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
	LIBBPF_OPTS(bpf_tc_opts, o, .handle = HANDLE, .priority = PRIO, .prog_fd = prog_fd);
	int err = bpf_tc_hook_create(&hook), owner;

	if (err && err != -EEXIST) {
		snprintf(why, n, "clsact on %s: %s", name, strerror(-err));
		return -1;
	}
	owner = ours(&hook);
	if (owner < 0) {
		snprintf(why, n, "handle 0x%x priority %d on %s is another program's", HANDLE, PRIO, name);
		return -1;
	}
	if (owner > 0)
		o.flags = BPF_TC_F_REPLACE;
	err = bpf_tc_attach(&hook, &o);
	if (err) {
		snprintf(why, n, "attach on %s: %s", name, strerror(-err));
		return -1;
	}
	return 0;
}

static void detach_one(int ifindex)
{
	for (int egress = 0; egress < 2; egress++) {
		LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
		LIBBPF_OPTS(bpf_tc_opts, o, .handle = HANDLE, .priority = PRIO);
		if (ours(&hook) > 0)
			bpf_tc_detach(&hook, &o);
	}
}

static void detach_all(void)
{
	for (int i = 0; i < ndevs; i++)
		detach_one(devs[i].ifindex);
	ndevs = 0;
}

/* Forget watched interfaces that are gone (a VM's port unplugged: its filters went with it). */
static void prune(void)
{
	char name[IF_NAMESIZE];
	int j = 0;

	for (int i = 0; i < ndevs; i++)
		if (if_indextoname(devs[i].ifindex, name) && strcmp(name, devs[i].name) == 0)
			devs[j++] = devs[i];
	ndevs = j;
}

static int watched(int ifindex)
{
	for (int i = 0; i < ndevs; i++)
		if (devs[i].ifindex == ifindex)
			return 1;
	return 0;
}

static const char *name_of(__u32 ifindex)
{
	for (int i = 0; i < ndevs; i++)
		if ((__u32)devs[i].ifindex == ifindex)
			return devs[i].name;
	return "?";
}

static int armed_count(void)
{
	int n = 0;

	for (int i = 0; i < LT_SLOTS; i++)
		n += skel->bss->lt_slots[i].armed != 0;
	return n;
}

static void clear_slot(int i)
{
	__atomic_store_n(&skel->bss->lt_slots[i].armed, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&skel->bss->lt_armed, armed_count(), __ATOMIC_RELEASE);
	slot_until[i] = 0;
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
	printf("{\"type\":\"seen\",\"tag\":%u,\"dev\":\"%s\",\"dir\":\"%s\",\"ktime_ns\":%llu,"
	       "\"ttl\":%u,\"len\":%u,\"src\":\"%s\",\"dst\":\"%s\"", s->tag, name_of(s->ifindex),
	       dirs[s->dir < 3 ? s->dir : 0], (unsigned long long)s->ktime_ns, s->ttl, s->len, a, b);
	/* what was seen: an ICMP echo by its type; a TCP segment by its flags */
	if (s->proto == IPPROTO_TCP)
		printf(",\"tcp_flags\":%u", s->tcp_flags);
	else
		printf(",\"icmp_type\":%u", s->kind);
	if (s->vlan != 0xffff)
		printf(",\"vlan\":%u", s->vlan);
	if (s->encap == LT_ENCAP_VXLAN) {
		inet_ntop(AF_INET, &s->outer_src, oa, sizeof(oa));
		inet_ntop(AF_INET, &s->outer_dst, ob, sizeof(ob));
		printf(",\"vxlan\":{\"vni\":%u,\"src\":\"%s\",\"dst\":\"%s\"}", s->vni, oa, ob);
	}
	printf("}\n");
	return 0;
}

/* A number of `max` at most, all of `s` read; -1 if it is not one. */
static long number(const char *s, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	return errno || end == s || *end || v < 0 || v > max ? -1 : v;
}

static int find_tag(unsigned long tag)
{
	for (int i = 0; i < LT_SLOTS; i++)
		if (skel->bss->lt_slots[i].armed && skel->bss->lt_slots[i].tag == tag)
			return i;
	return -1;
}

static void arm(char **arg, int n)
{
	long tag = n > 1 ? number(arg[1], 0xffffffffL) : -1;
	long dscp, ip_id, icmp_id, icmp_seq, timeout;
	int proto, drop = 0, slot = -1, ifindex[MAX_ARGS], fresh[MAX_ARGS], nfresh = 0, want = n - 9;
	char why[256] = "";
	struct lt_config c = {};

	if (n < 10 || tag < 0 || (dscp = number(arg[2], 63)) < 0 || (ip_id = number(arg[3], 0xffff)) < 0 ||
	    (icmp_id = number(arg[4], 0xffff)) < 0 || (icmp_seq = number(arg[5], 0xffff)) < 0 ||
	    (timeout = number(arg[8], MAX_TIMEOUT_MS)) < 1 ||
	    (strcmp(arg[6], "icmp") && strcmp(arg[6], "tcp"))) {
		reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"usage: arm TAG DSCP IP_ID ICMP_ID ICMP_SEQ "
		      "icmp|tcp DROP_REPLY_DEV|- TIMEOUT_MS DEV...\"}", tag);
		return;
	}
	proto = strcmp(arg[6], "tcp") ? IPPROTO_ICMP : IPPROTO_TCP;
	if (find_tag(tag) >= 0) {
		reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"trace %ld is armed already\"}", tag, tag);
		return;
	}
	for (int i = 0; i < LT_SLOTS && slot < 0; i++)
		if (!skel->bss->lt_slots[i].armed)
			slot = i;
	if (slot < 0) {
		reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"%d traces are armed here\"}", tag, LT_SLOTS);
		return;
	}
	if (strcmp(arg[7], "-") && !(drop = if_nametoindex(arg[7]))) {
		reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"no interface %s\"}", tag, arg[7]);
		return;
	}
	prune();
	for (int i = 0; i < want; i++) {
		if (strlen(arg[9 + i]) >= IF_NAMESIZE || !(ifindex[i] = if_nametoindex(arg[9 + i]))) {
			reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"no interface %.15s\"}", tag, arg[9 + i]);
			return;
		}
	}
	/* attach where not attached yet: every fallible step before the trace's mark is written */
	for (int i = 0; i < want; i++) {
		if (watched(ifindex[i]))
			continue;
		if (ndevs >= MAX_DEVS) {
			snprintf(why, sizeof(why), "%d interfaces are watched here", MAX_DEVS);
			break;
		}
		if (attach_one(ifindex[i], arg[9 + i], 0, bpf_program__fd(skel->progs.lt_in), why, sizeof(why)) ||
		    attach_one(ifindex[i], arg[9 + i], 1, bpf_program__fd(skel->progs.lt_out), why, sizeof(why))) {
			detach_one(ifindex[i]);
			break;
		}
		strcpy(devs[ndevs].name, arg[9 + i]);
		devs[ndevs++].ifindex = ifindex[i];
		fresh[nfresh++] = i;
	}
	if (why[0]) {
		reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"%s\"}", tag, why);
		return;
	}
	c.tag = tag;
	c.drop_reply_ifindex = drop;
	c.ip_id = ip_id;
	c.icmp_id = icmp_id;
	c.icmp_seq = icmp_seq;
	c.dscp = dscp;
	c.proto = proto;
	skel->bss->lt_slots[slot] = c;             /* armed 0: not read yet */
	__atomic_store_n(&skel->bss->lt_slots[slot].armed, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&skel->bss->lt_armed, armed_count(), __ATOMIC_RELEASE);
	slot_until[slot] = now_ms() + timeout;
	printf("{\"type\":\"armed\",\"tag\":%ld,\"attached\":[", tag);
	for (int i = 0; i < nfresh; i++)
		printf("%s\"%s\"", i ? "," : "", arg[9 + fresh[i]]);
	reply("]}");
}

/* One command line; 0 to go on. */
static void command(char *line, struct ring_buffer *rb)
{
	char *arg[MAX_ARGS], *save = NULL;
	int n = 0;

	for (char *t = strtok_r(line, " \t\r", &save); t && n < MAX_ARGS; t = strtok_r(NULL, " \t\r", &save))
		arg[n++] = t;
	if (n == 0)
		return;
	if (strcmp(arg[0], "arm") == 0) {
		arm(arg, n);
	} else if (strcmp(arg[0], "disarm") == 0 && n == 2) {
		long tag = number(arg[1], 0xffffffffL);
		int slot = tag < 0 ? -1 : find_tag(tag);

		if (slot >= 0)
			clear_slot(slot);
		ring_buffer__consume(rb);
		if (slot >= 0)
			reply("{\"type\":\"disarmed\",\"tag\":%ld}", tag);
		else
			reply("{\"type\":\"error\",\"tag\":%ld,\"error\":\"not armed\"}", tag);
	} else {
		reply("{\"type\":\"error\",\"error\":\"unknown command\"}");
	}
}

static int usage(void)
{
	fprintf(stderr, "usage: livetrace-watch [--idle-ms N]   (commands on stdin: see livetrace.c)\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "idle-ms", required_argument, NULL, 'i' }, { 0 } };
	struct ring_buffer *rb = NULL;
	long idle_ms = 5000;
	long long last_used;
	char buf[LINE_MAX_LEN];
	size_t have = 0;
	int opt, ret = 1, skipping = 0;

	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		if (opt != 'i' || (idle_ms = number(optarg, MAX_IDLE_MS)) < 1)
			return usage();
	}
	if (optind != argc)
		return usage();
	libbpf_set_print(quiet);
	skel = livetrace_bpf__open_and_load();
	if (!skel) {
		fprintf(stderr, "livetrace-watch: load: %s\n", strerror(errno));
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	signal(SIGPIPE, SIG_IGN);
	rb = ring_buffer__new(bpf_map__fd(skel->maps.lt_events), on_event, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "livetrace-watch: ring buffer: %s\n", strerror(errno));
		goto out;
	}
	reply("{\"type\":\"ready\",\"pid\":%d}", (int)getpid());
	last_used = now_ms();
	while (!stop) {
		struct pollfd fds[2] = { { .fd = 0, .events = POLLIN }, { .fd = ring_buffer__epoll_fd(rb), .events = POLLIN } };
		long long now;
		ssize_t got;
		char *nl;

		if (poll(fds, 2, 20) < 0 && errno != EINTR)
			break;
		if (ring_buffer__consume(rb) < 0)
			break;
		fflush(stdout);
		if (fds[0].revents) {
			got = read(0, buf + have, sizeof(buf) - 1 - have);
			if (got <= 0)
				break;                  /* stdin closed: the agent is gone */
			have += got;
			buf[have] = 0;
			while ((nl = memchr(buf, '\n', have))) {
				*nl = 0;
				if (skipping)
					reply("{\"type\":\"error\",\"error\":\"a line longer than any command\"}");
				else
					command(buf, rb);
				skipping = 0;
				have -= nl + 1 - buf;
				memmove(buf, nl + 1, have);
			}
			if (have == sizeof(buf) - 1) {
				have = 0;               /* a line longer than any command: dropped to its end */
				skipping = 1;
			}
			last_used = now_ms();
		}
		now = now_ms();
		for (int i = 0; i < LT_SLOTS; i++)
			if (slot_until[i] && now >= slot_until[i]) {
				long tag = skel->bss->lt_slots[i].tag;
				clear_slot(i);
				reply("{\"type\":\"expired\",\"tag\":%ld}", tag);
				last_used = now;
			}
		if (armed_count() == 0 && now - last_used >= idle_ms)
			break;
	}
	ret = 0;
	for (int i = 0; i < LT_SLOTS; i++)
		clear_slot(i);
	ring_buffer__consume(rb);
out:
	detach_all();
	reply("{\"type\":\"detached\"}");
	ring_buffer__free(rb);
	livetrace_bpf__destroy(skel);
	return ret;
}

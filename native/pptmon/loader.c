// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * pptmon-loader: attach the PPTMon programs of one VNF, stream its records.
 *
 *   pptmon-loader run --mode MODE --vnf-id N --in DEV[:DIR] --out DEV[:DIR]
 *                     [--period-ns NS] [--mtu N] [--netns NAME] [--pin DIR]
 *                     [--handle H] [--prio-in P] [--prio-out P]
 *                     [--label JSON-MEMBERS] [--stats-interval SEC]
 *       MODE: source | transit | sink | source-sink;  DIR: ingress | egress.
 *       Attaches ppt_in at --in and ppt_out at --out (clsact, our handle and
 *       priority only), prints records (sink modes) and counters as JSON lines
 *       on stdout until SIGINT/SIGTERM, then detaches only its own filters.
 *   pptmon-loader set --pin DIR [--period-ns NS] [--enable 0|1]
 *       Change the sampling period of a running loader through its pinned map.
 *   pptmon-loader stats --pin DIR
 *   pptmon-loader detach --in DEV[:DIR] --out DEV[:DIR] [--netns NAME] [--handle H]
 *                        [--prio-in P] [--prio-out P]
 *       Remove filters a crashed loader left behind (ours only).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "common.h"
#include "pptmon.skel.h"

#define DEF_HANDLE   0x5046
#define DEF_PRIO_IN  1        /* run before other filters at the entry point */
#define DEF_PRIO_OUT 0xC000   /* and after them at the exit point            */

static volatile sig_atomic_t stop;
static __s64 mono_off;
static const char *label;

struct opts {
	const char *cmd, *mode, *in, *out, *netns, *pin;
	unsigned long long period_ns;
	int period_set, enable, vnf_id, mtu, stats_interval;
	__u32 handle, prio_in, prio_out;
};

struct attach_point {
	char dev[IF_NAMESIZE];
	enum bpf_tc_attach_point dir;
	int ifindex;
	int attached;
	__u32 prio;
};

static void on_signal(int sig)
{
	stop = 1;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: pptmon-loader run --mode MODE --vnf-id N --in DEV[:DIR] --out DEV[:DIR]\n"
		"                         [--period-ns NS] [--mtu N] [--netns NAME] [--pin DIR]\n"
		"                         [--handle H] [--prio-in P] [--prio-out P] [--label JSON]\n"
		"                         [--stats-interval SEC]\n"
		"       pptmon-loader set --pin DIR [--period-ns NS] [--enable 0|1]\n"
		"       pptmon-loader stats --pin DIR\n"
		"       pptmon-loader detach --in DEV[:DIR] --out DEV[:DIR] [--netns NAME]\n");
	return 2;
}

static int parse_point(const char *spec, enum bpf_tc_attach_point def, struct attach_point *ap)
{
	const char *colon = strchr(spec, ':');
	size_t n = colon ? (size_t)(colon - spec) : strlen(spec);

	if (n == 0 || n >= IF_NAMESIZE)
		return -1;
	memcpy(ap->dev, spec, n);
	ap->dev[n] = 0;
	ap->dir = def;
	if (colon) {
		if (strcmp(colon + 1, "ingress") == 0)
			ap->dir = BPF_TC_INGRESS;
		else if (strcmp(colon + 1, "egress") == 0)
			ap->dir = BPF_TC_EGRESS;
		else
			return -1;
	}
	return 0;
}

static int enter_netns(const char *name)
{
	char path[PATH_MAX];
	int fd, err;

	if (!name)
		return 0;
	snprintf(path, sizeof(path), "/run/netns/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "pptmon-loader: netns %s: %s\n", name, strerror(errno));
		return -1;
	}
	err = setns(fd, CLONE_NEWNET);
	close(fd);
	if (err) {
		fprintf(stderr, "pptmon-loader: setns %s: %s\n", name, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * What occupies our handle + priority on a hook: 0 nothing, 1 one of our programs
 * (ppt_in / ppt_out, e.g. left by a loader that was killed), -1 someone else's.
 */
static int tc_slot_owner(struct bpf_tc_hook *hook, __u32 handle, __u32 prio)
{
	LIBBPF_OPTS(bpf_tc_opts, q, .handle = handle, .priority = prio);
	struct bpf_prog_info info = {};
	__u32 len = sizeof(info);
	int fd, ours;

	if (bpf_tc_query(hook, &q))
		return 0;
	fd = bpf_prog_get_fd_by_id(q.prog_id);
	if (fd < 0)
		return -1;
	ours = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 &&
	       (strcmp(info.name, "ppt_in") == 0 || strcmp(info.name, "ppt_out") == 0);
	close(fd);
	return ours ? 1 : -1;
}

static int tc_attach(struct attach_point *ap, int prog_fd, __u32 handle)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .attach_point = ap->dir);
	LIBBPF_OPTS(bpf_tc_opts, o, .handle = handle, .priority = ap->prio, .prog_fd = prog_fd);
	int err, owner;

	ap->ifindex = if_nametoindex(ap->dev);
	if (!ap->ifindex) {
		fprintf(stderr, "pptmon-loader: no interface %s\n", ap->dev);
		return -1;
	}
	hook.ifindex = ap->ifindex;
	/* creates the clsact qdisc if missing; an existing one is shared */
	err = bpf_tc_hook_create(&hook);
	if (err && err != -EEXIST) {
		fprintf(stderr, "pptmon-loader: clsact on %s: %s\n", ap->dev, strerror(-err));
		return -1;
	}
	owner = tc_slot_owner(&hook, handle, ap->prio);
	if (owner < 0) {
		fprintf(stderr, "pptmon-loader: handle 0x%x priority %u on %s belongs to another "
			"program; choose --handle/--prio-*\n", handle, ap->prio, ap->dev);
		return -1;
	}
	if (owner > 0)  /* a stale filter of ours: take its place */
		o.flags = BPF_TC_F_REPLACE;
	err = bpf_tc_attach(&hook, &o);
	if (err) {
		fprintf(stderr, "pptmon-loader: attach on %s: %s\n", ap->dev, strerror(-err));
		return -1;
	}
	ap->attached = 1;
	return 0;
}

/* Remove our filter (handle + priority, and only if it runs one of our programs);
 * the clsact qdisc stays. */
static int tc_detach(struct attach_point *ap, __u32 handle)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .attach_point = ap->dir);
	LIBBPF_OPTS(bpf_tc_opts, o, .handle = handle, .priority = ap->prio);
	int err;

	if (!ap->ifindex)
		ap->ifindex = if_nametoindex(ap->dev);
	if (!ap->ifindex)
		return -1;
	hook.ifindex = ap->ifindex;
	if (tc_slot_owner(&hook, handle, ap->prio) <= 0) {
		ap->attached = 0;
		return 0;
	}
	err = bpf_tc_detach(&hook, &o);
	if (err && err != -ENOENT) {
		fprintf(stderr, "pptmon-loader: detach on %s: %s\n", ap->dev, strerror(-err));
		return -1;
	}
	ap->attached = 0;
	return 0;
}

static int on_event(void *ctx, void *data, size_t len)
{
	if (len < sizeof(struct ppt_record))
		return 0;
	ppt_record_json(stdout, data, mono_off, label);
	fputc('\n', stdout);
	return 0;
}

static void print_stats(int fd)
{
	struct timespec now;

	clock_gettime(CLOCK_REALTIME, &now);
	printf("{\"type\":\"stats\",%s%s\"time_ns\":%lld,\"counters\":", label ? label : "",
	       label && *label ? "," : "", (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
	ppt_stats_json(stdout, fd);
	printf("}\n");
}

static int pin_path(char *buf, size_t n, const char *dir, const char *name)
{
	return snprintf(buf, n, "%s/%s", dir, name) >= (int)n ? -1 : 0;
}

static int cmd_run(struct opts *op)
{
	struct attach_point in = { .prio = op->prio_in }, out = { .prio = op->prio_out };
	struct ppt_config cfg = {};
	struct pptmon_bpf *skel = NULL;
	struct ring_buffer *rb = NULL;
	int ret = 1, sink;
	char path[PATH_MAX];
	time_t last_stats = time(NULL);

	if (!op->mode || !op->in || !op->out || op->vnf_id < 1 || op->vnf_id > 255)
		return usage();
	if (strcmp(op->mode, "source") == 0) {
		cfg.in_role = PPT_IN_SOURCE;
	} else if (strcmp(op->mode, "transit") == 0) {
		cfg.in_role = PPT_IN_TRANSIT;
	} else if (strcmp(op->mode, "sink") == 0) {
		cfg.in_role = PPT_IN_TRANSIT;
		cfg.out_sink = 1;
	} else if (strcmp(op->mode, "source-sink") == 0) {
		cfg.in_role = PPT_IN_SOURCE;
		cfg.out_sink = 1;
	} else {
		return usage();
	}
	sink = cfg.out_sink;
	cfg.vnf_id = op->vnf_id;
	cfg.period_ns = op->period_ns;
	cfg.mtu = op->mtu;
	cfg.enabled = 1;
	if (parse_point(op->in, BPF_TC_INGRESS, &in) || parse_point(op->out, BPF_TC_EGRESS, &out))
		return usage();
	if (enter_netns(op->netns))
		return 1;

	skel = pptmon_bpf__open();
	if (skel) {
		skel->rodata->l4_ipv6_flag = ppt_l4_ipv6_flag();
		if (pptmon_bpf__load(skel)) {
			pptmon_bpf__destroy(skel);
			skel = NULL;
		}
	}
	if (!skel) {
		fprintf(stderr, "pptmon-loader: load: %s\n", strerror(errno));
		return 1;
	}
	if (ppt_config_write(bpf_map__fd(skel->maps.ppt_cfg), &cfg)) {
		fprintf(stderr, "pptmon-loader: config: %s\n", strerror(errno));
		goto out;
	}
	if (op->pin) {
		mkdir(op->pin, 0700);
		if (pin_path(path, sizeof(path), op->pin, "cfg") ||
		    bpf_map__pin(skel->maps.ppt_cfg, path) ||
		    pin_path(path, sizeof(path), op->pin, "stats") ||
		    bpf_map__pin(skel->maps.ppt_stats, path)) {
			fprintf(stderr, "pptmon-loader: pin in %s: %s\n", op->pin, strerror(errno));
			goto out;
		}
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	signal(SIGPIPE, SIG_IGN);

	if (tc_attach(&in, bpf_program__fd(skel->progs.ppt_in), op->handle) ||
	    tc_attach(&out, bpf_program__fd(skel->progs.ppt_out), op->handle))
		goto detach;
	if (sink) {
		rb = ring_buffer__new(bpf_map__fd(skel->maps.ppt_events), on_event, NULL, NULL);
		if (!rb) {
			fprintf(stderr, "pptmon-loader: ring buffer: %s\n", strerror(errno));
			goto detach;
		}
	}
	mono_off = ppt_mono_to_real();
	printf("{\"type\":\"attached\",%s%s\"mode\":\"%s\",\"vnf_id\":%d,\"in\":\"%s\",\"out\":\"%s\","
	       "\"period_ns\":%llu,\"pid\":%d}\n", label ? label : "", label && *label ? "," : "",
	       op->mode, op->vnf_id, op->in, op->out, op->period_ns, (int)getpid());
	fflush(stdout);

	while (!stop) {
		int err;

		if (rb) {
			/* the programs wake us only for batches: also drain on timeout */
			err = ring_buffer__poll(rb, 100);
			if (err >= 0 || err == -EINTR)
				err = ring_buffer__consume(rb);
			if (err < 0 && err != -EINTR) {
				fprintf(stderr, "pptmon-loader: poll: %s\n", strerror(-err));
				break;
			}
		} else {
			usleep(200 * 1000);
		}
		if (op->stats_interval > 0 && time(NULL) - last_stats >= op->stats_interval) {
			print_stats(bpf_map__fd(skel->maps.ppt_stats));
			last_stats = time(NULL);
		}
		fflush(stdout);
	}
	ret = 0;
detach:
	if (in.attached && tc_detach(&in, op->handle))
		ret = 1;
	if (out.attached && tc_detach(&out, op->handle))
		ret = 1;
	if (rb)
		ring_buffer__consume(rb);
	print_stats(bpf_map__fd(skel->maps.ppt_stats));
	fflush(stdout);
out:
	if (op->pin) {
		pin_path(path, sizeof(path), op->pin, "cfg");
		unlink(path);
		pin_path(path, sizeof(path), op->pin, "stats");
		unlink(path);
		rmdir(op->pin);
	}
	ring_buffer__free(rb);
	pptmon_bpf__destroy(skel);
	return ret;
}

static int cmd_set(struct opts *op)
{
	char path[PATH_MAX];
	struct ppt_config cfg;
	__u32 k = 0;
	int fd;

	if (!op->pin || pin_path(path, sizeof(path), op->pin, "cfg"))
		return usage();
	fd = bpf_obj_get(path);
	if (fd < 0 || bpf_map_lookup_elem(fd, &k, &cfg)) {
		fprintf(stderr, "pptmon-loader: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (op->period_set)
		cfg.period_ns = op->period_ns;
	if (op->enable >= 0)
		cfg.enabled = op->enable;
	if (ppt_config_write(fd, &cfg)) {
		fprintf(stderr, "pptmon-loader: update: %s\n", strerror(errno));
		return 1;
	}
	printf("{\"period_ns\":%llu,\"enabled\":%u,\"vnf_id\":%u}\n",
	       (unsigned long long)cfg.period_ns, cfg.enabled, cfg.vnf_id);
	return 0;
}

static int cmd_stats(struct opts *op)
{
	char path[PATH_MAX];
	int fd;

	if (!op->pin || pin_path(path, sizeof(path), op->pin, "stats"))
		return usage();
	fd = bpf_obj_get(path);
	if (fd < 0) {
		fprintf(stderr, "pptmon-loader: %s: %s\n", path, strerror(errno));
		return 1;
	}
	ppt_stats_json(stdout, fd);
	printf("\n");
	return 0;
}

static int cmd_detach(struct opts *op)
{
	struct attach_point in = { .prio = op->prio_in }, out = { .prio = op->prio_out };
	int ret = 0;

	if (!op->in || !op->out || parse_point(op->in, BPF_TC_INGRESS, &in) ||
	    parse_point(op->out, BPF_TC_EGRESS, &out))
		return usage();
	if (enter_netns(op->netns))
		return 1;
	ret |= tc_detach(&in, op->handle) ? 1 : 0;
	ret |= tc_detach(&out, op->handle) ? 1 : 0;
	return ret;
}

static int quiet(enum libbpf_print_level l, const char *fmt, va_list ap)
{
	char msg[512];

	if (l != LIBBPF_WARN)
		return 0;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	/* an existing clsact qdisc is expected and shared: not worth a warning */
	if (strstr(msg, "Exclusivity flag on"))
		return 0;
	return fputs(msg, stderr);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "mode", required_argument, 0, 'm' },
		{ "vnf-id", required_argument, 0, 'v' },
		{ "in", required_argument, 0, 'i' },
		{ "out", required_argument, 0, 'o' },
		{ "period-ns", required_argument, 0, 'p' },
		{ "mtu", required_argument, 0, 'M' },
		{ "netns", required_argument, 0, 'n' },
		{ "pin", required_argument, 0, 'P' },
		{ "handle", required_argument, 0, 'H' },
		{ "prio-in", required_argument, 0, 'I' },
		{ "prio-out", required_argument, 0, 'O' },
		{ "label", required_argument, 0, 'l' },
		{ "stats-interval", required_argument, 0, 's' },
		{ "enable", required_argument, 0, 'e' },
		{ 0 },
	};
	struct opts op = { .enable = -1, .handle = DEF_HANDLE, .prio_in = DEF_PRIO_IN,
			   .prio_out = DEF_PRIO_OUT, .period_ns = 1000000000ULL };
	int c;

	if (argc < 2)
		return usage();
	op.cmd = argv[1];
	optind = 2;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'm': op.mode = optarg; break;
		case 'v': op.vnf_id = atoi(optarg); break;
		case 'i': op.in = optarg; break;
		case 'o': op.out = optarg; break;
		case 'p': op.period_ns = strtoull(optarg, NULL, 0); op.period_set = 1; break;
		case 'M': op.mtu = atoi(optarg); break;
		case 'n': op.netns = optarg; break;
		case 'P': op.pin = optarg; break;
		case 'H': op.handle = strtoul(optarg, NULL, 0); break;
		case 'I': op.prio_in = strtoul(optarg, NULL, 0); break;
		case 'O': op.prio_out = strtoul(optarg, NULL, 0); break;
		case 'l': label = optarg; break;
		case 's': op.stats_interval = atoi(optarg); break;
		case 'e': op.enable = atoi(optarg); break;
		default: return usage();
		}
	}
	libbpf_set_print(quiet);
	setvbuf(stdout, NULL, _IOFBF, 1 << 16);
	if (strcmp(op.cmd, "run") == 0)
		return cmd_run(&op);
	if (strcmp(op.cmd, "set") == 0)
		return cmd_set(&op);
	if (strcmp(op.cmd, "stats") == 0)
		return cmd_stats(&op);
	if (strcmp(op.cmd, "detach") == 0)
		return cmd_detach(&op);
	return usage();
}

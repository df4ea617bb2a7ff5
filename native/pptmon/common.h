/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* fathom PPTMon user space: helpers shared by the loader and the test runners. */
#ifndef FATHOM_PPTMON_COMMON_H
#define FATHOM_PPTMON_COMMON_H
#include <stdio.h>
#include <linux/types.h>
#include "pptmon.h"

struct pptmon_bpf;

/* Print one sink record as a JSON object (no newline). */
/* extra: JSON members ("k":v,...) to add, or NULL. */
void ppt_record_json(FILE *f, const struct ppt_record *r, __s64 mono_to_real_ns,
		     const char *extra);
/* Sum the per-CPU counters and print them as a JSON object (no newline). */
int ppt_stats_json(FILE *f, int stats_fd);
/* Write the config map. */
int ppt_config_write(int cfg_fd, const struct ppt_config *cfg);
/* The flags for bpf_l4_csum_replace on IPv6 pseudo-header changes that the
 * running kernel accepts: BPF_F_IPV6 if its BTF knows the flag, else 0. */
__u64 ppt_l4_ipv6_flag(void);
/* The bytes of the hex digits at `s` (up to `max`, to the first non-pair): how many, or -1. */
int ppt_unhex(const char *s, unsigned char *out, int max);
/* CLOCK_REALTIME - CLOCK_MONOTONIC in ns. */
__s64 ppt_mono_to_real(void);
#endif

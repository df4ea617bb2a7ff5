// SPDX-License-Identifier: GPL-2.0
/* A stand-in for "someone else's" TC program in tests: counts packets, passes them on. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

__u64 seen = 0;

SEC("tc")
int other_pass(struct __sk_buff *skb)
{
	__sync_fetch_and_add(&seen, 1);
	return -1; /* TC_ACT_UNSPEC: next filter */
}

char LICENSE[] SEC("license") = "GPL";

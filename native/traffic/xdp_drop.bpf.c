/* A device that drops at its input, for testing the traffic engine's accounting: attached to the
 * receiving veth (`ip link set dev IF xdp obj build/xdp_drop.bpf.o sec xdp`), it drops every frame of
 * the engine's streams whose sequence number is 9 mod 10, before any packet tap (AF_PACKET) sees it.
 * Exactly 10 % of a run is lost there, and the veth counts each drop (ethtool -S: xdp_drops). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define PKTGEN_MAGIC 0xbe9be955u

SEC("xdp")
int drop_every_tenth(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
        return XDP_PASS;
    __u8 *payload = (__u8 *)ip + sizeof(*ip) + sizeof(struct udphdr);
    if ((void *)(payload + 8) > end)
        return XDP_PASS;
    __u32 magic, seq;
    __builtin_memcpy(&magic, payload, 4);
    __builtin_memcpy(&seq, payload + 4, 4);
    if (magic != bpf_htonl(PKTGEN_MAGIC))
        return XDP_PASS;
    return bpf_ntohl(seq) % 10 == 9 ? XDP_DROP : XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";

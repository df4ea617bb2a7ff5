/* fathom-traffic: AF_PACKET generator and receiver with kernel timestamps.
 *
 *   fathom-traffic run   --tx-if IF [--tx-ns NS] --rx-if IF [--rx-ns NS] [options]
 *   fathom-traffic gen   --tx-if IF [--tx-ns NS] [options]          (transmit only)
 *   fathom-traffic info  --if IF [--ns NS]                           (timestamping capabilities)
 *
 * One process, two threads (three with a monitor port): the transmitter paces frames on absolute
 * deadlines and collects the kernel's software (or hardware) TX stamp of each frame from the socket
 * error queue; the receiver takes the kernel RX stamp of each frame. Both stamps are matched by the
 * sequence number carried in the frame, so the latency is kernel-to-kernel and never includes
 * user-space scheduling. A monitor port (--mon-if) counts the copies of the stream that reach it.
 *
 * Every frame is sent once. A send the device refuses (ENOBUFS: on a veth, the peer's backlog or ring
 * is full and the frame is dropped there) is a drop at the device's input, counted as such and part of
 * the loss; it is never resent, so the device's own losses cannot turn into back-pressure. The sending
 * interface's kernel tx_dropped counter is read before and after the run as an independent check.
 *
 * Frame: Ethernet / IPv4 / UDP / payload. The payload starts with a pktgen-compatible header
 * (magic 0xbe9be955, seq, tv_sec, tv_usec: the user-space send time, the "timestamp slot"), then,
 * where the frame is long enough, the same send time in ns. The UDP source port is the stream id;
 * the UDP destination port is base + (seq mod flows), so a run can spread over several flows.
 * Frame sizes follow RFC 2544: they include the 4-byte FCS that the wire adds (64 -> 60 bytes sent).
 *
 * Output: one JSON document on stdout (also after SIGINT/SIGTERM, which end the run early); optional
 * per-frame CSV. Exit 2 on bad arguments. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/errqueue.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/net_tstamp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <math.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "stats.h"

#ifndef PACKET_QDISC_BYPASS
#define PACKET_QDISC_BYPASS 20
#endif
#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

#define PKTGEN_MAGIC 0xbe9be955u
#define HDR_LEN 42       /* Ethernet 14 + IPv4 20 + UDP 8 */
#define PAYLOAD_MIN 16   /* pktgen header */
#define MIN_FRAME 64
#define MAX_FRAME 9018
#define MAX_BATCH 64
#define NO_TS 0

struct opts {
    const char *mode;
    const char *tx_ns, *tx_if, *rx_ns, *rx_if;
    uint8_t src_mac[6], dst_mac[6];
    int have_dst_mac;
    uint32_t src_ip, dst_ip;
    unsigned frame_size;         /* incl. FCS */
    double rate_pps;             /* 0: as fast as possible */
    uint64_t count;
    double duration_s;           /* alternative to count (count = rate * duration) */
    unsigned stream, flows, dport_base, batch, stamp_every;
    unsigned reorder_every, dup_every;
    double warmup_s, linger_s;
    int cpu_tx, cpu_rx;
    unsigned spin_us;            /* waits longer than this are slept, shorter ones spun */
    int fifo;                    /* 1: the transmit thread runs SCHED_FIFO (-1: refused) */
    int hw_stamps;               /* 1: ask for hardware stamps, 0: software */
    int vlan;                    /* >= 0: send with an 802.1Q tag */
    int no_bypass;               /* 1: send through the qdisc layer (packet taps on the TX port see frames) */
    const char *mon_ns, *mon_if; /* monitor port: counts the copies of the stream */
    int time_limited;            /* --duration with --rate 0: send as fast as possible for that long */
    const char *csv, *flows_json;
    int buckets;
};

static struct opts O;
static atomic_int tx_done, rx_ready, stop_now;

/* per-sequence records, indexed by seq (allocated only where a run needs them) */
enum { TX_NOT_SENT = 0, TX_ACCEPTED = 1, TX_DROPPED = 2 };
static uint8_t *tx_state;                 /* what became of each frame at the sending device */
static uint64_t *tx_kernel_ns, *tx_user_ns;
static uint64_t *flow_first_rx_ns, *flow_rx_count;

struct tx_result {
    uint64_t slots;            /* frames the generator sent (each once; duplicates not included) */
    uint64_t accepted;         /* sends the device took (duplicates included) */
    uint64_t device_drops;     /* sends refused at the device's input (ENOBUFS), not resent */
    uint64_t not_sent;         /* frames given up after repeated EINTR/EAGAIN: never offered */
    uint64_t resends;          /* EINTR/EAGAIN resends (the frame had not reached the device) */
    uint64_t stamps, stamps_hw;
    int64_t if_tx_dropped;     /* the sending interface's tx_dropped counter over the run; -1: unknown */
    uint64_t first_user_ns, last_user_ns;
    uint64_t start_mono_ns, start_real_ns; /* the first deadline, on both clocks */
    struct hist lateness;      /* user-space send time minus its deadline */
    int error;
    char errmsg[256];
};

/* one receiving port: the receiver, or the monitor that gets the copies */
struct rx_port {
    const char *name, *ns, *ifname;
    int cpu, is_monitor;
    struct seqacct acct;
    uint64_t *kernel_ns;       /* kernel RX stamp of the first arrival of each seq */
    uint64_t *app_ns;          /* user-space time (CLOCK_REALTIME) when recvmmsg handed it to the thread */
    uint64_t foreign, stamps_hw, first_ns, last_ns;
    int error;
    char errmsg[256];
};
static struct tx_result TX;
static struct rx_port RXP[2];
static int n_rx;

static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fathom-traffic: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}

static uint64_t now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ts_ns(const struct timespec *ts)
{
    return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

static int parse_mac(const char *s, uint8_t *m)
{
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
        return -1;
    for (int i = 0; i < 6; i++) {
        if (v[i] > 255) return -1;
        m[i] = (uint8_t)v[i];
    }
    return 0;
}

static void enter_ns(const char *ns)
{
    if (!ns || !*ns) return;
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(2, "network namespace %s: %s", ns, strerror(errno));
    if (setns(fd, CLONE_NEWNET) < 0) die(1, "setns %s: %s", ns, strerror(errno));
    close(fd);
}

static void pin(int cpu)
{
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static int iface_mtu(int fd, const char *ifname, int *ifindex, uint8_t *mac)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
    if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0) return -1;
    *ifindex = ifr.ifr_ifindex;
    if (mac && ioctl(fd, SIOCGIFHWADDR, &ifr) == 0) memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
    if (ioctl(fd, SIOCGIFMTU, &ifr) < 0) return -1;
    return ifr.ifr_mtu;
}

/* Hardware timestamping capability as ethtool -T reports it. */
static unsigned ts_caps(int fd, const char *ifname)
{
    struct ethtool_ts_info info = {.cmd = ETHTOOL_GET_TS_INFO};
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
    ifr.ifr_data = (void *)&info;
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) return 0;
    return info.so_timestamping;
}

static int enable_hw_stamping(int fd, const char *ifname)
{
    struct hwtstamp_config cfg = {.tx_type = HWTSTAMP_TX_ON, .rx_filter = HWTSTAMP_FILTER_ALL};
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
    ifr.ifr_data = (void *)&cfg;
    return ioctl(fd, SIOCSHWTSTAMP, &ifr);
}

static int open_packet_socket(const char *ifname, int *ifindex, int *mtu, uint8_t *mac, unsigned tsflags,
                              char *err, size_t errlen)
{
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) {
        snprintf(err, errlen, "socket(AF_PACKET): %s (needs root or CAP_NET_RAW)", strerror(errno));
        return -1;
    }
    *mtu = iface_mtu(fd, ifname, ifindex, mac);
    if (*mtu < 0) {
        snprintf(err, errlen, "no interface %s in this namespace", ifname);
        close(fd);
        return -1;
    }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = *ifindex};
    if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0) {
        snprintf(err, errlen, "bind %s: %s", ifname, strerror(errno));
        close(fd);
        return -1;
    }
    if (tsflags && setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &tsflags, sizeof(tsflags)) < 0) {
        snprintf(err, errlen, "SO_TIMESTAMPING on %s: %s", ifname, strerror(errno));
        close(fd);
        return -1;
    }
    int big = 64 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big));
    return fd;
}

/* The kernel's tx_dropped counter of an interface (rtnetlink IFLA_STATS64), in the caller's namespace;
 * -1 when it cannot be read. */
static int64_t link_tx_dropped(int ifindex)
{
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return -1;
    struct { struct nlmsghdr nh; struct ifinfomsg ifi; } req;
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_len = sizeof(req);
    req.nh.nlmsg_type = RTM_GETLINK;
    req.nh.nlmsg_flags = NLM_F_REQUEST;
    req.ifi.ifi_family = AF_UNSPEC;
    req.ifi.ifi_index = ifindex;
    int64_t out = -1;
    static char buf[65536];
    if (send(fd, &req, sizeof(req), 0) == (ssize_t)sizeof(req)) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        for (struct nlmsghdr *nh = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(nh, (size_t)n); nh = NLMSG_NEXT(nh, n)) {
            if (nh->nlmsg_type != RTM_NEWLINK) continue;
            struct ifinfomsg *ifi = NLMSG_DATA(nh);
            int len = (int)IFLA_PAYLOAD(nh);
            for (struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
                if (a->rta_type == IFLA_STATS64 && RTA_PAYLOAD(a) >= sizeof(struct rtnl_link_stats64)) {
                    struct rtnl_link_stats64 st;
                    memcpy(&st, RTA_DATA(a), sizeof(st));
                    out = (int64_t)st.tx_dropped;
                }
        }
    }
    close(fd);
    return out;
}

static uint16_t ip_checksum(const uint8_t *p, size_t n)
{
    uint32_t s = 0;
    for (size_t i = 0; i + 1 < n; i += 2) s += (uint32_t)(p[i] << 8 | p[i + 1]);
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

static size_t l2_len(void) { return O.vlan >= 0 ? 18 : 14; }

/* Write the headers of a frame of O.frame_size (minus FCS); the payload fields are filled per send. */
static void build_template(uint8_t *f)
{
    size_t len = O.frame_size - 4, l2 = l2_len();
    memset(f, 0, len);
    memcpy(f, O.dst_mac, 6);
    memcpy(f + 6, O.src_mac, 6);
    if (O.vlan >= 0) {
        f[12] = 0x81; f[13] = 0x00;
        f[14] = (uint8_t)(O.vlan >> 8); f[15] = (uint8_t)O.vlan;
        f[16] = 0x08; f[17] = 0x00;
    } else {
        f[12] = 0x08; f[13] = 0x00;
    }
    uint8_t *ip = f + l2;
    size_t ip_len = len - l2;
    ip[0] = 0x45;
    ip[2] = (uint8_t)(ip_len >> 8); ip[3] = (uint8_t)ip_len;
    ip[6] = 0x40; /* DF */
    ip[8] = 64;
    ip[9] = 17;
    memcpy(ip + 12, &O.src_ip, 4);
    memcpy(ip + 16, &O.dst_ip, 4);
    uint16_t c = ip_checksum(ip, 20);
    ip[10] = (uint8_t)(c >> 8); ip[11] = (uint8_t)c;
    uint8_t *udp = ip + 20;
    size_t udp_len = ip_len - 20;
    udp[0] = (uint8_t)(O.stream >> 8); udp[1] = (uint8_t)O.stream;
    udp[4] = (uint8_t)(udp_len >> 8); udp[5] = (uint8_t)udp_len;
    /* UDP checksum 0: not computed (allowed for IPv4) */
    uint8_t *pl = udp + 8;
    uint32_t m = htonl(PKTGEN_MAGIC);
    memcpy(pl, &m, 4);
    for (size_t i = l2 + 28 + 24; i < len; i++) f[i] = (uint8_t)i; /* recognisable filler */
}

static void put_be32(uint8_t *p, uint32_t v) { v = htonl(v); memcpy(p, &v, 4); }
static uint32_t get_be32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return ntohl(v); }
static void put_be64(uint8_t *p, uint64_t v) { put_be32(p, (uint32_t)(v >> 32)); put_be32(p + 4, (uint32_t)v); }

static void stamp_frame(uint8_t *f, uint64_t seq, uint64_t user_ns)
{
    size_t l2 = l2_len(), len = O.frame_size - 4;
    uint8_t *udp = f + l2 + 20, *pl = udp + 8;
    unsigned dport = O.dport_base + (unsigned)(seq % O.flows);
    udp[2] = (uint8_t)(dport >> 8); udp[3] = (uint8_t)dport;
    put_be32(pl + 4, (uint32_t)seq);
    put_be32(pl + 8, (uint32_t)(user_ns / 1000000000ull));
    put_be32(pl + 12, (uint32_t)(user_ns % 1000000000ull / 1000));
    if (len >= l2 + 28 + 24) put_be64(pl + 16, user_ns);
}

/* Find our payload in a received frame (with or without one 802.1Q tag); returns its offset or -1. */
static int find_payload(const uint8_t *f, size_t len, unsigned *stream, unsigned *dport)
{
    for (size_t l2 = 14; l2 <= 22; l2 += 4) {
        if (len < l2 + 28 + PAYLOAD_MIN) break;
        uint16_t et = (uint16_t)(f[l2 - 2] << 8 | f[l2 - 1]);
        if (et != 0x0800 || f[l2 + 9] != 17) continue;
        const uint8_t *udp = f + l2 + (size_t)(f[l2] & 0x0f) * 4;
        if (udp + 8 + PAYLOAD_MIN > f + len) continue;
        if (get_be32(udp + 8) != PKTGEN_MAGIC) continue;
        *stream = (unsigned)(udp[0] << 8 | udp[1]);
        *dport = (unsigned)(udp[2] << 8 | udp[3]);
        return (int)(udp + 8 - f);
    }
    return -1;
}

/* ---------------------------------------------------------------- transmit */

static uint64_t seq_for_slot(uint64_t slot)
{
    /* injected reordering: slots 0 and 1 of each block of reorder_every swap their frames */
    if (O.reorder_every >= 2) {
        uint64_t r = slot % O.reorder_every;
        if (r == 0 && slot + 1 < O.count) return slot + 1;
        if (r == 1) return slot - 1;
    }
    return slot;
}

static void drain_errqueue(int fd)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    static uint8_t bufs[MAX_BATCH][128];
    static uint8_t ctrl[MAX_BATCH][256];
    for (;;) {
        for (int i = 0; i < MAX_BATCH; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof(bufs[i]);
            memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i];
            msgs[i].msg_hdr.msg_controllen = sizeof(ctrl[i]);
        }
        int n = recvmmsg(fd, msgs, MAX_BATCH, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        for (int i = 0; i < n; i++) {
            struct scm_timestamping *tss = NULL;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING)
                    tss = (struct scm_timestamping *)CMSG_DATA(c);
            if (!tss) continue;
            unsigned stream, dport;
            int off = find_payload(bufs[i], msgs[i].msg_len, &stream, &dport);
            if (off < 0 || stream != O.stream) continue;
            uint64_t seq = get_be32(bufs[i] + off + 4);
            if (seq >= O.count || !tx_kernel_ns) continue;
            uint64_t t = ts_ns(&tss->ts[0]);
            if (!t && tss->ts[2].tv_sec) { t = ts_ns(&tss->ts[2]); TX.stamps_hw++; }
            /* every frame is handed to the device once, so each stamp belongs to the one send of its
             * frame (a duplicate's stamp, later, is ignored) */
            if (t && !tx_kernel_ns[seq]) { tx_kernel_ns[seq] = t; TX.stamps++; }
        }
    }
}

static void mark_sent(uint64_t seq, int state)
{
    if (!tx_state || seq >= O.count) return;
    if (tx_state[seq] != TX_ACCEPTED) tx_state[seq] = (uint8_t)state; /* accepted if either copy was */
}

static void *tx_thread(void *arg)
{
    (void)arg;
    pin(O.cpu_tx);
    if (O.fifo) {
        struct sched_param sp = {.sched_priority = 10};
        if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) != 0) O.fifo = -1; /* reported in the JSON */
    }
    enter_ns(O.tx_ns);
    int ifindex, mtu;
    uint8_t mac[6];
    unsigned flags = SOF_TIMESTAMPING_SOFTWARE;
    if (O.hw_stamps) flags |= SOF_TIMESTAMPING_RAW_HARDWARE;
    if (O.stamp_every == 1) flags |= O.hw_stamps ? SOF_TIMESTAMPING_TX_HARDWARE : SOF_TIMESTAMPING_TX_SOFTWARE;
    int fd = open_packet_socket(O.tx_if, &ifindex, &mtu, mac, O.stamp_every ? flags : 0, TX.errmsg,
                                sizeof(TX.errmsg));
    if (fd < 0) { TX.error = 1; atomic_store(&tx_done, 1); return NULL; }
    if (O.frame_size - 4 > (unsigned)mtu + l2_len()) {
        snprintf(TX.errmsg, sizeof(TX.errmsg), "frame size %u exceeds the MTU %d of %s (max frame %u)",
                 O.frame_size, mtu, O.tx_if, mtu + (unsigned)l2_len() + 4);
        TX.error = 2; atomic_store(&tx_done, 1); return NULL;
    }
    int one = 1;
    if (!O.no_bypass) setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one));
    if (O.hw_stamps) enable_hw_stamping(fd, O.tx_if);
    if (!O.have_dst_mac) memset(O.dst_mac, 0xff, 6);
    if (!memcmp(O.src_mac, "\0\0\0\0\0\0", 6)) memcpy(O.src_mac, mac, 6);

    static uint8_t frames[MAX_BATCH + 1][MAX_FRAME];
    for (int i = 0; i <= MAX_BATCH; i++) build_template(frames[i]);
    struct sockaddr_ll to = {.sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6};
    memcpy(to.sll_addr, O.dst_mac, 6);
    struct mmsghdr msgs[MAX_BATCH + 1];
    struct iovec iov[MAX_BATCH + 1];
    uint64_t msg_seq[MAX_BATCH + 1];
    int msg_copy[MAX_BATCH + 1];
    union { char buf[CMSG_SPACE(sizeof(uint32_t))]; struct cmsghdr align; } stampctl;
    memset(&stampctl, 0, sizeof(stampctl));
    struct cmsghdr *sc = (struct cmsghdr *)stampctl.buf;
    sc->cmsg_level = SOL_SOCKET;
    sc->cmsg_type = SO_TIMESTAMPING;
    sc->cmsg_len = CMSG_LEN(sizeof(uint32_t));
    uint32_t txflag = O.hw_stamps ? SOF_TIMESTAMPING_TX_HARDWARE : SOF_TIMESTAMPING_TX_SOFTWARE;
    memcpy(CMSG_DATA(sc), &txflag, sizeof(txflag));

    while (atomic_load(&rx_ready) < n_rx && !atomic_load(&stop_now)) usleep(1000);
    int64_t dropped0 = link_tx_dropped(ifindex);
    uint64_t t0 = now_ns(CLOCK_MONOTONIC) + (uint64_t)(O.warmup_s * 1e9);
    TX.start_mono_ns = t0;
    TX.start_real_ns = now_ns(CLOCK_REALTIME) + (t0 - now_ns(CLOCK_MONOTONIC));
    uint64_t t_end = O.time_limited ? t0 + (uint64_t)(O.duration_s * 1e9) : UINT64_MAX;
    double gap = O.rate_pps > 0 ? 1e9 / O.rate_pps : 0;
    uint64_t slot = 0;
    uint64_t spin_ns = (uint64_t)O.spin_us * 1000;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* 1 us timer slack instead of 50 us */
    while (slot < O.count && !atomic_load(&stop_now)) {
        uint64_t now = now_ns(CLOCK_MONOTONIC);
        if (now >= t_end) break;
        uint64_t deadline = t0 + (uint64_t)(gap * (double)slot);
        if (now < deadline) {
            uint64_t wait = deadline - now;
            if (wait > spin_ns) { /* sleep to a wake-up margin before the deadline, then spin */
                uint64_t wake = deadline - (spin_ns < 10000 ? spin_ns / 2 : 10000);
                struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull), .tv_nsec = (long)(wake % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            }
            continue;
        }
        /* every slot whose deadline has passed goes out now, up to one batch */
        uint64_t due = gap > 0 ? (uint64_t)((double)(now - t0) / gap) + 1 : slot + O.batch;
        if (due > O.count) due = O.count;
        unsigned n = (unsigned)(due - slot);
        if (n > O.batch) n = O.batch;
        /* keep a swapped pair in one batch */
        if (O.reorder_every >= 2 && (slot + n) % O.reorder_every == 1 && slot + n < O.count) n++;
        uint64_t uts = now_ns(CLOCK_REALTIME);
        unsigned m = 0;
        for (unsigned i = 0; i < n; i++) {
            uint64_t seq = seq_for_slot(slot + i);
            stamp_frame(frames[m], seq, uts);
            if (tx_user_ns) tx_user_ns[seq] = uts;
            int copies = (O.dup_every && seq % O.dup_every == O.dup_every - 1) ? 2 : 1;
            for (int c = 0; c < copies; c++, m++) {
                if (c) memcpy(frames[m], frames[m - 1], O.frame_size - 4);
                iov[m].iov_base = frames[m];
                iov[m].iov_len = O.frame_size - 4;
                memset(&msgs[m].msg_hdr, 0, sizeof(msgs[m].msg_hdr));
                msgs[m].msg_hdr.msg_name = &to;
                msgs[m].msg_hdr.msg_namelen = sizeof(to);
                msgs[m].msg_hdr.msg_iov = &iov[m];
                msgs[m].msg_hdr.msg_iovlen = 1;
                msg_seq[m] = seq;
                msg_copy[m] = c;
                if (O.stamp_every > 1 && seq % O.stamp_every == 0 && c == 0) {
                    msgs[m].msg_hdr.msg_control = stampctl.buf;
                    msgs[m].msg_hdr.msg_controllen = sizeof(stampctl.buf);
                }
            }
            if (m >= MAX_BATCH) { n = i + 1; break; }
        }
        /* each message goes to the device once: a refused one is a drop at the device, not resent */
        unsigned off = 0;
        int tries = 0;
        while (off < m) {
            int r = sendmmsg(fd, msgs + off, m - off, 0);
            struct send_outcome o = send_outcome(r, r < 0 ? errno : 0, m - off);
            for (unsigned k = 0; k < o.accepted; k++) mark_sent(msg_seq[off + k], TX_ACCEPTED);
            TX.accepted += o.accepted;
            off += o.accepted;
            if (o.fatal) {
                snprintf(TX.errmsg, sizeof(TX.errmsg), "sendmmsg on %s: %s", O.tx_if, strerror(errno));
                TX.error = 1;
                break;
            }
            if (o.dropped) {
                mark_sent(msg_seq[off], TX_DROPPED);
                TX.device_drops++;
                off++;
                tries = 0;
            } else if (o.retry) {
                TX.resends++;
                if (++tries > 1000) { /* the frame never reached the device: not offered */
                    if (msg_copy[off] == 0) TX.not_sent++;
                    off++;
                    tries = 0;
                }
            }
        }
        if (TX.error) break;
        if (!TX.first_user_ns) TX.first_user_ns = now;
        TX.last_user_ns = now;
        hist_add(&TX.lateness, gap > 0 ? (int64_t)(now - deadline) : 0);
        slot += n;
        TX.slots = slot;
        if (O.stamp_every) drain_errqueue(fd);
    }
    /* the last TX stamps arrive right after the last send */
    uint64_t end = now_ns(CLOCK_MONOTONIC) + 20000000ull;
    while (O.stamp_every && now_ns(CLOCK_MONOTONIC) < end) {
        drain_errqueue(fd);
        usleep(1000);
    }
    int64_t dropped1 = link_tx_dropped(ifindex);
    TX.if_tx_dropped = (dropped0 >= 0 && dropped1 >= dropped0) ? dropped1 - dropped0 : -1;
    close(fd);
    atomic_store(&tx_done, 1);
    return NULL;
}

/* ---------------------------------------------------------------- receive */

static void *rx_thread(void *arg)
{
    struct rx_port *P = arg;
    pin(P->cpu);
    enter_ns(P->ns);
    int ifindex, mtu;
    unsigned flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
    if (O.hw_stamps) flags |= SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE;
    int fd = open_packet_socket(P->ifname, &ifindex, &mtu, NULL, flags, P->errmsg, sizeof(P->errmsg));
    if (fd < 0) { P->error = 1; atomic_fetch_add(&rx_ready, 1); return NULL; }
    int one = 1;
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one));
    if (O.hw_stamps) enable_hw_stamping(fd, P->ifname);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 20000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    /* empty whatever was queued before the run */
    char junk[64];
    while (recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0) {}
    atomic_fetch_add(&rx_ready, 1);

    uint8_t (*bufs)[MAX_FRAME + 64] = malloc(sizeof(*bufs) * MAX_BATCH);
    uint8_t (*ctrl)[256] = malloc(sizeof(*ctrl) * MAX_BATCH);
    if (!bufs || !ctrl) die(1, "out of memory");
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    uint64_t linger_until = 0;
    for (;;) {
        if (atomic_load(&tx_done)) {
            uint64_t t = now_ns(CLOCK_MONOTONIC);
            if (!linger_until) linger_until = t + (uint64_t)(O.linger_s * 1e9);
            if (t > linger_until || P->acct.unique >= TX.slots) break;
        }
        for (int i = 0; i < MAX_BATCH; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof(bufs[i]);
            memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i];
            msgs[i].msg_hdr.msg_controllen = sizeof(ctrl[i]);
        }
        int n = recvmmsg(fd, msgs, MAX_BATCH, MSG_WAITFORONE, NULL);
        if (n <= 0) continue;
        uint64_t app = now_ns(CLOCK_REALTIME);
        for (int i = 0; i < n; i++) {
            uint64_t t = 0;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
                    struct scm_timestamping *tss = (struct scm_timestamping *)CMSG_DATA(c);
                    if (O.hw_stamps && tss->ts[2].tv_sec) { t = ts_ns(&tss->ts[2]); P->stamps_hw++; }
                    else t = ts_ns(&tss->ts[0]);
                }
            unsigned stream, dport;
            int off = find_payload(bufs[i], msgs[i].msg_len, &stream, &dport);
            if (off < 0 || stream != O.stream) { P->foreign++; continue; }
            uint64_t seq = get_be32(bufs[i] + off + 4);
            int first = seqacct_add(&P->acct, seq);
            if (first == 1) {
                P->kernel_ns[seq] = t;
                P->app_ns[seq] = app;
                if (!P->first_ns || t < P->first_ns) P->first_ns = t;
                if (t > P->last_ns) P->last_ns = t;
            }
            unsigned fl = dport - O.dport_base;
            if (!P->is_monitor && first >= 0 && fl < O.flows) {
                if (!flow_first_rx_ns[fl] || (t && t < flow_first_rx_ns[fl])) flow_first_rx_ns[fl] = t;
                flow_rx_count[fl]++;
            }
        }
    }
    free(bufs);
    free(ctrl);
    close(fd);
    return NULL;
}

/* ---------------------------------------------------------------- report */

static void usage(FILE *f)
{
    fprintf(f,
"usage: fathom-traffic run|gen|info [options]\n"
"  --tx-if IF --tx-ns NS      transmit interface and its network namespace\n"
"  --rx-if IF --rx-ns NS      receive interface and namespace (run)\n"
"  --if IF --ns NS            interface for info\n"
"  --size BYTES               frame size incl. FCS (64..9018, default 64)\n"
"  --rate PPS                 offered load in frames/s (0 = as fast as possible; default 10000)\n"
"  --count N | --duration S   frames to send (default 10000); --duration with --rate 0 (gen):\n"
"                             as fast as possible for S seconds\n"
"  --src-mac/--dst-mac MAC    --src-ip/--dst-ip A.B.C.D   --vlan VID\n"
"  --stream ID                UDP source port, identifies the stream (default 4242)\n"
"  --flows N --dport BASE     spread frames round-robin over N UDP destination ports\n"
"  --batch N                  frames per sendmmsg at most (default 32)\n"
"  --stamp-every N            kernel TX stamp every Nth frame (1 = all, 0 = none)\n"
"  --warmup S --linger S      delay before sending; wait for late frames after\n"
"  --cpu-tx C --cpu-rx C      pin the threads (--cpu-mon C: the monitor's)\n"
"  --mon-if IF --mon-ns NS    monitor port: count the copies of the stream that reach it (run)\n"
"  --no-bypass                send through the qdisc layer (taps on the TX port then see each frame)\n"
"  --spin-us N                waits above N us are slept, shorter ones busy-polled (default 200;\n"
"                             small values leave the CPU to the device under test)\n"
"  --fifo                     run the transmit thread SCHED_FIFO (precise wake-ups on a busy machine)\n"
"  --hw                       hardware timestamps (when ethtool -T offers them)\n"
"  --reorder-every N --dup-every N   inject reordering / duplicates (tests)\n"
"  --csv FILE                 per-frame records   --buckets  histogram buckets in the JSON\n");
}

static void json_str(FILE *f, const char *k, const char *v, int comma)
{
    fprintf(f, "\"%s\": \"", k);
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        if ((unsigned char)*p >= 0x20) fputc(*p, f);
    }
    fprintf(f, "\"%s", comma ? ", " : "");
}

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop_now, 1);
}

static int cmd_info(const char *ns, const char *ifname)
{
    enter_ns(ns);
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) die(1, "socket: %s", strerror(errno));
    int idx, mtu = iface_mtu(fd, ifname, &idx, NULL);
    if (mtu < 0) die(2, "no interface %s in namespace %s", ifname, ns ? ns : "(current)");
    unsigned caps = ts_caps(fd, ifname);
    printf("{\"interface\": \"%s\", \"mtu\": %d, \"max_frame\": %d, \"so_timestamping\": %u, "
           "\"software_tx\": %s, \"software_rx\": %s, \"hardware_tx\": %s, \"hardware_rx\": %s}\n",
           ifname, mtu, mtu + 18, caps, caps & SOF_TIMESTAMPING_TX_SOFTWARE ? "true" : "false",
           caps & SOF_TIMESTAMPING_RX_SOFTWARE ? "true" : "false",
           caps & SOF_TIMESTAMPING_TX_HARDWARE ? "true" : "false",
           caps & SOF_TIMESTAMPING_RX_HARDWARE ? "true" : "false");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    O.mode = argv[1];
    O.frame_size = 64; O.rate_pps = 10000; O.count = 10000; O.stream = 4242; O.flows = 1;
    O.dport_base = 9000; O.batch = 32; O.stamp_every = 1; O.warmup_s = 0.05; O.linger_s = 0.2;
    O.cpu_tx = -1; O.cpu_rx = -1; O.vlan = -1; O.spin_us = 200;
    O.src_ip = inet_addr("198.18.0.1"); O.dst_ip = inet_addr("198.18.0.2");
    const char *info_if = NULL, *info_ns = NULL;
    int count_set = 0, cpu_mon = -1;
    enum { A_TXIF = 1, A_TXNS, A_RXIF, A_RXNS, A_IF, A_NS, A_SIZE, A_RATE, A_COUNT, A_DUR, A_SMAC, A_DMAC,
           A_SIP, A_DIP, A_STREAM, A_FLOWS, A_DPORT, A_BATCH, A_STAMP, A_WARM, A_LINGER, A_CTX, A_CRX, A_HW,
           A_REO, A_DUP, A_CSV, A_BUCKETS, A_VLAN, A_SPIN, A_FIFO, A_MONIF, A_MONNS, A_CMON, A_NOBYP };
    static const struct option lo[] = {
        {"tx-if", 1, 0, A_TXIF}, {"tx-ns", 1, 0, A_TXNS}, {"rx-if", 1, 0, A_RXIF}, {"rx-ns", 1, 0, A_RXNS},
        {"if", 1, 0, A_IF}, {"ns", 1, 0, A_NS}, {"size", 1, 0, A_SIZE}, {"rate", 1, 0, A_RATE},
        {"count", 1, 0, A_COUNT}, {"duration", 1, 0, A_DUR}, {"src-mac", 1, 0, A_SMAC},
        {"dst-mac", 1, 0, A_DMAC}, {"src-ip", 1, 0, A_SIP}, {"dst-ip", 1, 0, A_DIP},
        {"stream", 1, 0, A_STREAM}, {"flows", 1, 0, A_FLOWS}, {"dport", 1, 0, A_DPORT},
        {"batch", 1, 0, A_BATCH}, {"stamp-every", 1, 0, A_STAMP}, {"warmup", 1, 0, A_WARM},
        {"linger", 1, 0, A_LINGER}, {"cpu-tx", 1, 0, A_CTX}, {"cpu-rx", 1, 0, A_CRX}, {"hw", 0, 0, A_HW},
        {"reorder-every", 1, 0, A_REO}, {"dup-every", 1, 0, A_DUP}, {"csv", 1, 0, A_CSV},
        {"buckets", 0, 0, A_BUCKETS}, {"vlan", 1, 0, A_VLAN}, {"spin-us", 1, 0, A_SPIN}, {"fifo", 0, 0, A_FIFO},
        {"mon-if", 1, 0, A_MONIF}, {"mon-ns", 1, 0, A_MONNS}, {"cpu-mon", 1, 0, A_CMON}, {"no-bypass", 0, 0, A_NOBYP},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case A_TXIF: O.tx_if = optarg; break;
        case A_TXNS: O.tx_ns = optarg; break;
        case A_RXIF: O.rx_if = optarg; break;
        case A_RXNS: O.rx_ns = optarg; break;
        case A_IF: info_if = optarg; break;
        case A_NS: info_ns = optarg; break;
        case A_SIZE: O.frame_size = (unsigned)atoi(optarg); break;
        case A_RATE: O.rate_pps = atof(optarg); break;
        case A_COUNT: O.count = strtoull(optarg, NULL, 10); count_set = 1; break;
        case A_DUR: O.duration_s = atof(optarg); break;
        case A_SMAC: if (parse_mac(optarg, O.src_mac)) die(2, "bad MAC %s", optarg); break;
        case A_DMAC: if (parse_mac(optarg, O.dst_mac)) die(2, "bad MAC %s", optarg); O.have_dst_mac = 1; break;
        case A_SIP: if (inet_pton(AF_INET, optarg, &O.src_ip) != 1) die(2, "bad IPv4 address %s", optarg); break;
        case A_DIP: if (inet_pton(AF_INET, optarg, &O.dst_ip) != 1) die(2, "bad IPv4 address %s", optarg); break;
        case A_STREAM: O.stream = (unsigned)atoi(optarg) & 0xffff; break;
        case A_FLOWS: O.flows = (unsigned)atoi(optarg); break;
        case A_DPORT: O.dport_base = (unsigned)atoi(optarg); break;
        case A_BATCH: O.batch = (unsigned)atoi(optarg); break;
        case A_STAMP: O.stamp_every = (unsigned)atoi(optarg); break;
        case A_WARM: O.warmup_s = atof(optarg); break;
        case A_LINGER: O.linger_s = atof(optarg); break;
        case A_CTX: O.cpu_tx = atoi(optarg); break;
        case A_CRX: O.cpu_rx = atoi(optarg); break;
        case A_HW: O.hw_stamps = 1; break;
        case A_REO: O.reorder_every = (unsigned)atoi(optarg); break;
        case A_DUP: O.dup_every = (unsigned)atoi(optarg); break;
        case A_CSV: O.csv = optarg; break;
        case A_BUCKETS: O.buckets = 1; break;
        case A_VLAN: O.vlan = atoi(optarg); break;
        case A_SPIN: O.spin_us = (unsigned)atoi(optarg); break;
        case A_FIFO: O.fifo = 1; break;
        case A_MONIF: O.mon_if = optarg; break;
        case A_MONNS: O.mon_ns = optarg; break;
        case A_CMON: cpu_mon = atoi(optarg); break;
        case A_NOBYP: O.no_bypass = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!strcmp(O.mode, "info")) {
        if (!info_if) die(2, "info needs --if");
        return cmd_info(info_ns, info_if);
    }
    int run = !strcmp(O.mode, "run");
    if (!run && strcmp(O.mode, "gen")) die(2, "unknown mode %s (run, gen, info)", O.mode);
    if (!O.tx_if) die(2, "--tx-if is required");
    if (run && !O.rx_if) die(2, "--rx-if is required for run");
    if (O.frame_size < MIN_FRAME || O.frame_size > MAX_FRAME) die(2, "--size must be %d..%d", MIN_FRAME, MAX_FRAME);
    if (O.vlan >= 4096) die(2, "--vlan must be 0..4095");
    if (O.frame_size - 4 < l2_len() + 28 + PAYLOAD_MIN) die(2, "--size too small for the headers");
    if (O.rate_pps < 0) die(2, "--rate must be >= 0");
    if (O.mon_if && !run) die(2, "--mon-if needs run");
    if (O.duration_s > 0 && !count_set) {
        if (O.rate_pps > 0) {
            O.count = (uint64_t)(O.rate_pps * O.duration_s + 0.5);
        } else {
            if (run || O.stamp_every || O.csv)
                die(2, "--duration with --rate 0 is for gen --stamp-every 0 (give --count otherwise)");
            O.time_limited = 1;
            O.count = 2000000000ull;
        }
    }
    if (O.count == 0 || O.count > 2000000000ull) die(2, "--count must be 1..2e9");
    if (O.flows == 0 || O.flows > 65536) die(2, "--flows must be 1..65536");
    if (O.batch == 0 || O.batch > MAX_BATCH / 2) die(2, "--batch must be 1..%d", MAX_BATCH / 2);
    if (O.dup_every == 1) die(2, "--dup-every must be >= 2");

    /* per-sequence arrays: only what this run uses (a time-limited gen keeps none) */
    int per_seq = !O.time_limited;
    if (per_seq) {
        tx_user_ns = calloc(O.count, 8);
        if (O.stamp_every) tx_kernel_ns = calloc(O.count, 8);
        if (!tx_user_ns || (O.stamp_every && !tx_kernel_ns)) die(1, "out of memory for %llu frames", (unsigned long long)O.count);
    }
    if (run) {
        tx_state = calloc(O.count, 1);
        flow_first_rx_ns = calloc(O.flows, 8);
        flow_rx_count = calloc(O.flows, 8);
        if (!tx_state || !flow_first_rx_ns || !flow_rx_count) die(1, "out of memory for %llu frames", (unsigned long long)O.count);
        RXP[n_rx++] = (struct rx_port){.name = "receiver", .ns = O.rx_ns, .ifname = O.rx_if, .cpu = O.cpu_rx};
        if (O.mon_if)
            RXP[n_rx++] = (struct rx_port){.name = "monitor", .ns = O.mon_ns, .ifname = O.mon_if,
                                           .cpu = cpu_mon >= 0 ? cpu_mon : O.cpu_rx, .is_monitor = 1};
        for (int i = 0; i < n_rx; i++) {
            RXP[i].kernel_ns = calloc(O.count, 8);
            RXP[i].app_ns = calloc(O.count, 8);
            if (!RXP[i].kernel_ns || !RXP[i].app_ns || seqacct_init(&RXP[i].acct, O.count))
                die(1, "out of memory for %llu frames", (unsigned long long)O.count);
        }
    }
    hist_init(&TX.lateness);
    TX.if_tx_dropped = -1;
    signal(SIGPIPE, SIG_IGN);
    /* SIGINT/SIGTERM end the run early (the report is still written); only this thread takes them */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);

    pthread_t ttx, trx[2];
    for (int i = 0; i < n_rx; i++) pthread_create(&trx[i], NULL, rx_thread, &RXP[i]);
    pthread_create(&ttx, NULL, tx_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_join(ttx, NULL);
    for (int i = 0; i < n_rx; i++) pthread_join(trx[i], NULL);
    if (TX.error) {
        fprintf(stderr, "fathom-traffic: %s\n", TX.errmsg);
        return TX.error == 2 ? 2 : 1;
    }
    for (int i = 0; i < n_rx; i++)
        if (RXP[i].error) {
            fprintf(stderr, "fathom-traffic: %s: %s\n", RXP[i].name, RXP[i].errmsg);
            return 1;
        }

    /* what the device was offered: every frame sent, including those it refused at its input */
    uint64_t offered = 0, dropped_at_input = 0;
    if (tx_state) {
        for (uint64_t s = 0; s < TX.slots; s++) {
            if (tx_state[s] != TX_NOT_SENT) offered++;
            if (tx_state[s] == TX_DROPPED) dropped_at_input++;
        }
    } else {
        offered = TX.slots - TX.not_sent;
    }

    /* latency: kernel TX stamp -> kernel RX stamp, per frame; and user-space send -> kernel RX */
    static struct hist lat, lat_user, lat_socket, lat_mon, gaps;
    hist_init(&lat); hist_init(&lat_user); hist_init(&lat_socket); hist_init(&lat_mon); hist_init(&gaps);
    uint64_t first_k = 0, last_k = 0, prev_k = 0, prev_seq = 0;
    for (uint64_t s = 0; per_seq && s < TX.slots; s++) {
        uint64_t tk = tx_kernel_ns ? tx_kernel_ns[s] : 0;
        if (tk) {
            if (!first_k || tk < first_k) first_k = tk;
            if (tk > last_k) last_k = tk;
            if (O.stamp_every == 1 && prev_k && s == prev_seq + 1 && !O.reorder_every)
                hist_add(&gaps, (int64_t)(tk - prev_k));
            prev_k = tk;
            prev_seq = s;
        }
        if (!run) continue;
        uint64_t rk = RXP[0].kernel_ns[s];
        if (rk) {
            if (tk) hist_add(&lat, (int64_t)(rk - tk));
            if (tk) hist_add(&lat_socket, (int64_t)(RXP[0].app_ns[s] - tk));
            if (tx_user_ns[s]) hist_add(&lat_user, (int64_t)(rk - tx_user_ns[s]));
        }
        if (n_rx > 1 && RXP[1].kernel_ns[s] && tk) hist_add(&lat_mon, (int64_t)(RXP[1].kernel_ns[s] - tk));
    }
    /* achieved rate: frames after the first over the span from the first deadline to the last send, so
     * a late start that was caught up does not inflate it and a late finish lowers it */
    double dur_user = TX.last_user_ns > TX.start_mono_ns ? (double)(TX.last_user_ns - TX.start_mono_ns) / 1e9 : 0;
    double achieved = dur_user > 0 ? (double)(TX.slots - 1) / dur_user : 0;
    if (O.rate_pps <= 0 && TX.last_user_ns > TX.first_user_ns)  /* unpaced: from the first send */
        achieved = (double)(TX.slots - 1) / ((double)(TX.last_user_ns - TX.first_user_ns) / 1e9);
    uint64_t k0 = (O.rate_pps > 0 && TX.start_real_ns < first_k) ? TX.start_real_ns : first_k;
    double dur_k = last_k > k0 ? (double)(last_k - k0) / 1e9 : 0;
    double achieved_k = (dur_k > 0 && O.stamp_every == 1) ? (double)(TX.stamps - 1) / dur_k : 0;
    const char *src = O.hw_stamps ? (TX.stamps_hw ? "hardware" : "software (hardware asked, none given)")
                                  : "kernel software (SO_TIMESTAMPING)";

    FILE *f = stdout;
    fprintf(f, "{");
    json_str(f, "tool", "fathom-traffic", 1);
    json_str(f, "mode", O.mode, 1);
    json_str(f, "timestamp_source", src, 1);
    fprintf(f, "\"stopped_early\": %s, ", atomic_load(&stop_now) ? "true" : "false");
    fprintf(f, "\"config\": {");
    json_str(f, "tx_ns", O.tx_ns, 1); json_str(f, "tx_if", O.tx_if, 1);
    json_str(f, "rx_ns", O.rx_ns, 1); json_str(f, "rx_if", O.rx_if, 1);
    json_str(f, "mon_ns", O.mon_ns, 1); json_str(f, "mon_if", O.mon_if, 1);
    fprintf(f, "\"frame_size_bytes\": %u, \"target_pps\": %.3f, \"count\": %llu, \"duration_limit_s\": %.3f, "
               "\"stream\": %u, \"flows\": %u, \"batch\": %u, \"stamp_every\": %u, \"vlan\": %d, \"reorder_every\": %u, "
               "\"dup_every\": %u, \"spin_us\": %u, \"fifo\": %d, \"qdisc_bypass\": %s}, ",
            O.frame_size, O.rate_pps, (unsigned long long)(O.time_limited ? 0 : O.count),
            O.time_limited ? O.duration_s : 0.0, O.stream, O.flows, O.batch, O.stamp_every,
            O.vlan, O.reorder_every, O.dup_every, O.spin_us, O.fifo, O.no_bypass ? "false" : "true");
    fprintf(f, "\"tx\": {\"frames\": %llu, \"offered\": %llu, \"accepted\": %llu, \"device_drops\": %llu, "
               "\"not_sent\": %llu, \"resends\": %llu, \"if_tx_dropped\": %lld, "
               "\"tx_stamps\": %llu, \"duration_s\": %.6f, \"achieved_pps\": %.1f, \"achieved_pps_kernel\": %.1f, "
               "\"achieved_l1_bps\": %.0f, \"lateness\": ",
            (unsigned long long)TX.slots, (unsigned long long)offered, (unsigned long long)TX.accepted,
            (unsigned long long)TX.device_drops, (unsigned long long)TX.not_sent, (unsigned long long)TX.resends,
            (long long)TX.if_tx_dropped, (unsigned long long)TX.stamps, dur_user, achieved, achieved_k,
            achieved * (O.frame_size + 20) * 8.0);
    hist_json(f, &TX.lateness, 0);
    fprintf(f, ", \"gap\": ");
    hist_json(f, &gaps, 0);
    fprintf(f, "}");
    if (run) {
        for (int i = 0; i < n_rx; i++) {
            struct rx_port *P = &RXP[i];
            struct seqacct *a = &P->acct;
            uint64_t lost = offered > a->unique ? offered - a->unique : 0;
            double rx_dur = P->last_ns > P->first_ns ? (double)(P->last_ns - P->first_ns) / 1e9 : 0;
            double rx_pps = rx_dur > 0 && a->unique > 1 ? (double)(a->unique - 1) / rx_dur : 0;
            fprintf(f, ", \"%s\": {\"frames\": %llu, \"unique\": %llu, \"lost\": %llu, \"loss_ratio\": %.6f, ",
                    i ? "monitor" : "rx", (unsigned long long)a->received, (unsigned long long)a->unique,
                    (unsigned long long)lost, offered ? (double)lost / (double)offered : 0.0);
            if (!i) fprintf(f, "\"lost_at_device_input\": %llu, ", (unsigned long long)dropped_at_input);
            fprintf(f, "\"duplicates\": %llu, \"reordered\": %llu, \"seq_gaps\": %llu, \"out_of_range\": %llu, "
                       "\"foreign\": %llu, \"rx_pps\": %.1f, \"rx_l1_bps\": %.0f",
                    (unsigned long long)a->duplicates, (unsigned long long)a->reordered,
                    (unsigned long long)a->gaps, (unsigned long long)a->out_of_range,
                    (unsigned long long)P->foreign, rx_pps, rx_pps * (O.frame_size + 20) * 8.0);
            if (i) {
                fprintf(f, ", \"latency\": ");
                hist_json(f, &lat_mon, 0);
            }
            fprintf(f, "}");
        }
        fprintf(f, ", \"latency\": ");
        hist_json(f, &lat, O.buckets);
        fprintf(f, ", \"latency_user_tx\": ");
        hist_json(f, &lat_user, 0);
        fprintf(f, ", \"latency_socket\": ");
        hist_json(f, &lat_socket, 0);
        fprintf(f, ", \"flows\": [");
        unsigned shown = O.flows <= 4096 ? O.flows : 4096;
        for (unsigned i = 0; i < shown; i++)
            fprintf(f, "%s{\"dport\": %u, \"first_rx_ns\": %llu, \"frames\": %llu}", i ? ", " : "",
                    O.dport_base + i, (unsigned long long)flow_first_rx_ns[i],
                    (unsigned long long)flow_rx_count[i]);
        fprintf(f, "]");
    }
    fprintf(f, "}\n");
    fflush(f);

    if (O.csv) {
        FILE *c = fopen(O.csv, "w");
        if (!c) die(1, "cannot write %s: %s", O.csv, strerror(errno));
        static const char *states[] = {"not_sent", "accepted", "dropped_at_input"};
        fprintf(c, "seq,tx_user_ns,tx_kernel_ns,rx_kernel_ns,latency_ns,arrivals,tx_state,rx_socket_ns,monitor_arrivals\n");
        for (uint64_t s = 0; s < TX.slots; s++) {
            uint64_t tk = tx_kernel_ns ? tx_kernel_ns[s] : 0, rk = run ? RXP[0].kernel_ns[s] : 0;
            long long l = (rk && tk) ? (long long)(rk - tk) : -1;
            fprintf(c, "%llu,%llu,%llu,%llu,%lld,%u,%s,%llu,%u\n", (unsigned long long)s,
                    (unsigned long long)tx_user_ns[s], (unsigned long long)tk, (unsigned long long)rk, l,
                    run ? RXP[0].acct.seen[s] : 0, tx_state ? states[tx_state[s]] : "",
                    (unsigned long long)(run ? RXP[0].app_ns[s] : 0), n_rx > 1 ? RXP[1].acct.seen[s] : 0);
        }
        fclose(c);
    }
    return 0;
}

/* fathom traffic engine: log-linear latency histogram and sequence accounting.
 * Kept free of I/O so that test_stats.c can check the maths directly. */
#ifndef FATHOM_TRAFFIC_STATS_H
#define FATHOM_TRAFFIC_STATS_H
#include <stdint.h>
#include <stdio.h>

/* Values below 2^HIST_SUB_BITS ns are counted exactly; above, each power-of-two range is split into
 * 2^(HIST_SUB_BITS-1) equal buckets, so a bucket is never wider than 1/512 of its lower edge
 * (relative error < 0.2 %). Values up to 2^HIST_MAX_BITS ns (~ 18 minutes) fit. */
#define HIST_SUB_BITS 10
#define HIST_MAX_BITS 40
#define HIST_HALF (1u << (HIST_SUB_BITS - 1))
#define HIST_BUCKETS ((HIST_MAX_BITS - HIST_SUB_BITS + 2) * HIST_HALF)

struct hist {
    uint64_t count, negative, overflow;
    uint64_t min, max;
    double mean, m2; /* Welford running mean and sum of squared deviations */
    uint64_t bucket[HIST_BUCKETS];
};

void hist_init(struct hist *h);
uint32_t hist_index(uint64_t v);
uint64_t hist_lower(uint32_t idx); /* smallest value of a bucket */
uint64_t hist_width(uint32_t idx); /* number of values in a bucket */
void hist_add(struct hist *h, int64_t v);
/* value at quantile q (0..1): the midpoint of the bucket holding it, clamped to [min, max] */
uint64_t hist_quantile(const struct hist *h, double q);
double hist_stddev(const struct hist *h);
/* JSON object with n, min/mean/std/percentiles/max (all *_ns) and, if buckets, the non-empty buckets */
void hist_json(FILE *f, const struct hist *h, int buckets);

/* Sequence accounting over a run of `expected` distinct sequence numbers 0..expected-1. */
struct seqacct {
    uint64_t expected;
    uint64_t received;   /* every frame of the stream, duplicates included */
    uint64_t unique;
    uint64_t duplicates;
    uint64_t reordered;  /* arrived after a higher sequence number had already arrived */
    uint64_t gaps;       /* times the sequence jumped forward by more than one */
    uint64_t out_of_range;
    int64_t max_seen;
    uint8_t *seen;       /* one byte a sequence number: arrivals, saturating at 255 */
};

int seqacct_init(struct seqacct *a, uint64_t expected);
void seqacct_free(struct seqacct *a);
/* returns 1 for the first arrival of seq, 0 for a duplicate, -1 when out of range */
int seqacct_add(struct seqacct *a, uint64_t seq);
uint64_t seqacct_lost(const struct seqacct *a);

/* What one sendmmsg() call did to the `pending` messages handed to it. sendmmsg reports only how many
 * went out; when it returns fewer than asked, the next message failed and its error is lost.
 *   accepted  messages the device took (the first `accepted` of them)
 *   dropped   1: the next message was refused at the device's input and is gone, not to be resent
 *             (ENOBUFS: on a veth, the peer's backlog or ring was full; also a failure the call did
 *             not report, which the sending interface's tx_dropped counter then confirms or not)
 *   retry     1: the next message never reached the device (EINTR, EAGAIN): send it again
 *   fatal     1: any other error: stop */
struct send_outcome {
    unsigned accepted;
    int dropped, retry, fatal;
};
struct send_outcome send_outcome(int ret, int err, unsigned pending);
#endif

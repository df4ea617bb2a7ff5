/* fathom traffic engine: histogram and sequence accounting (see stats.h). */
#include "stats.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void hist_init(struct hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

uint32_t hist_index(uint64_t v)
{
    if (v < (1ull << HIST_SUB_BITS))
        return (uint32_t)v;
    int msb = 63 - __builtin_clzll(v);
    int shift = msb - (HIST_SUB_BITS - 1);        /* >= 1 */
    uint64_t sub = v >> shift;                     /* in [HALF, 2*HALF) */
    return (uint32_t)(shift * HIST_HALF + sub);
}

uint64_t hist_lower(uint32_t idx)
{
    if (idx < (1u << HIST_SUB_BITS))
        return idx;
    uint32_t shift = idx / HIST_HALF - 1;
    uint64_t sub = idx - shift * HIST_HALF;
    return sub << shift;
}

uint64_t hist_width(uint32_t idx)
{
    if (idx < (1u << HIST_SUB_BITS))
        return 1;
    return 1ull << (idx / HIST_HALF - 1);
}

void hist_add(struct hist *h, int64_t v)
{
    if (v < 0) {
        h->negative++;
        return;
    }
    uint64_t u = (uint64_t)v;
    uint32_t idx = hist_index(u);
    if (idx >= HIST_BUCKETS) {
        h->overflow++;
        idx = HIST_BUCKETS - 1;
    }
    h->bucket[idx]++;
    h->count++;
    if (u < h->min) h->min = u;
    if (u > h->max) h->max = u;
    double d = (double)u - h->mean;
    h->mean += d / (double)h->count;
    h->m2 += d * ((double)u - h->mean);
}

uint64_t hist_quantile(const struct hist *h, double q)
{
    if (h->count == 0)
        return 0;
    if (q <= 0) return h->min;
    if (q >= 1) return h->max;
    /* rank of the sample wanted (1-based, nearest-rank definition) */
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1) rank = 1;
    uint64_t acc = 0;
    for (uint32_t i = 0; i < HIST_BUCKETS; i++) {
        acc += h->bucket[i];
        if (acc >= rank) {
            uint64_t v = hist_lower(i) + hist_width(i) / 2;
            if (v < h->min) v = h->min;
            if (v > h->max) v = h->max;
            return v;
        }
    }
    return h->max;
}

double hist_stddev(const struct hist *h)
{
    return h->count > 1 ? sqrt(h->m2 / (double)(h->count - 1)) : 0.0;
}

void hist_json(FILE *f, const struct hist *h, int buckets)
{
    static const struct { const char *name; double q; } qs[] = {
        {"p50_ns", 0.5}, {"p90_ns", 0.9}, {"p99_ns", 0.99}, {"p999_ns", 0.999}, {"p9999_ns", 0.9999}};
    fprintf(f, "{\"n\": %llu, \"negative\": %llu, \"overflow\": %llu", (unsigned long long)h->count,
            (unsigned long long)h->negative, (unsigned long long)h->overflow);
    if (h->count) {
        fprintf(f, ", \"min_ns\": %llu, \"mean_ns\": %.1f, \"std_ns\": %.1f", (unsigned long long)h->min,
                h->mean, hist_stddev(h));
        for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
            fprintf(f, ", \"%s\": %llu", qs[i].name, (unsigned long long)hist_quantile(h, qs[i].q));
        fprintf(f, ", \"max_ns\": %llu", (unsigned long long)h->max);
    }
    if (buckets) {
        fprintf(f, ", \"buckets\": [");
        int first = 1;
        for (uint32_t i = 0; i < HIST_BUCKETS; i++) {
            if (!h->bucket[i]) continue;
            fprintf(f, "%s[%llu, %llu, %llu]", first ? "" : ", ", (unsigned long long)hist_lower(i),
                    (unsigned long long)hist_width(i), (unsigned long long)h->bucket[i]);
            first = 0;
        }
        fprintf(f, "]");
    }
    fprintf(f, "}");
}

int seqacct_init(struct seqacct *a, uint64_t expected)
{
    memset(a, 0, sizeof(*a));
    a->expected = expected;
    a->max_seen = -1;
    a->seen = calloc(expected ? expected : 1, 1);
    return a->seen ? 0 : -1;
}

void seqacct_free(struct seqacct *a)
{
    free(a->seen);
    a->seen = NULL;
}

int seqacct_add(struct seqacct *a, uint64_t seq)
{
    a->received++;
    if (seq >= a->expected) {
        a->out_of_range++;
        return -1;
    }
    if (a->seen[seq]) {
        if (a->seen[seq] < 255) a->seen[seq]++;
        a->duplicates++;
        return 0;
    }
    a->seen[seq] = 1;
    a->unique++;
    if ((int64_t)seq < a->max_seen) {
        a->reordered++;
    } else {
        if ((int64_t)seq > a->max_seen + 1)
            a->gaps++;
        a->max_seen = (int64_t)seq;
    }
    return 1;
}

uint64_t seqacct_lost(const struct seqacct *a)
{
    return a->expected - a->unique;
}

struct send_outcome send_outcome(int ret, int err, unsigned pending)
{
    struct send_outcome o = {0, 0, 0, 0};
    if (ret >= 0) {
        o.accepted = (unsigned)ret < pending ? (unsigned)ret : pending;
        o.dropped = o.accepted < pending;
        return o;
    }
    if (err == ENOBUFS) o.dropped = 1;
    else if (err == EINTR || err == EAGAIN) o.retry = 1;
    else o.fatal = 1;
    return o;
}

/* Unit tests of the histogram maths and the sequence accounting; run by tests/unit/test_traffic_engine.py.
 * Prints one line per check and exits non-zero on the first failure. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "stats.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static void test_index_roundtrip(void)
{
    /* every value falls in the bucket whose [lower, lower+width) holds it; buckets are contiguous */
    uint64_t probes[] = {0, 1, 2, 511, 512, 1023, 1024, 1025, 1535, 1536, 2047, 2048, 4095, 4096,
                         99999, 1000000, 123456789, 1ull << 39, (1ull << 40) - 1};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        uint64_t v = probes[i];
        uint32_t idx = hist_index(v);
        CHECK(idx < HIST_BUCKETS, "index of %llu out of range", (unsigned long long)v);
        uint64_t lo = hist_lower(idx), w = hist_width(idx);
        CHECK(lo <= v && v < lo + w, "%llu not in bucket [%llu,+%llu)", (unsigned long long)v,
              (unsigned long long)lo, (unsigned long long)w);
        CHECK((double)w / (double)(lo ? lo : 1) <= 1.0 / 512 + 1e-12 || lo < 1024,
              "bucket at %llu too wide (%llu)", (unsigned long long)lo, (unsigned long long)w);
    }
    for (uint32_t i = 1; i < HIST_BUCKETS; i++)
        if (hist_lower(i) != hist_lower(i - 1) + hist_width(i - 1)) {
            CHECK(0, "buckets %u and %u not contiguous", i - 1, i);
            break;
        }
    printf("ok index_roundtrip\n");
}

static void test_exact_small_values(void)
{
    static struct hist h;
    hist_init(&h);
    for (int v = 1; v <= 1000; v++) hist_add(&h, v); /* 1..1000 ns, below 1024: exact */
    CHECK(h.count == 1000, "count %llu", (unsigned long long)h.count);
    CHECK(h.min == 1 && h.max == 1000, "min/max %llu %llu", (unsigned long long)h.min, (unsigned long long)h.max);
    CHECK(hist_quantile(&h, 0.5) == 500, "p50 %llu", (unsigned long long)hist_quantile(&h, 0.5));
    CHECK(hist_quantile(&h, 0.99) == 990, "p99 %llu", (unsigned long long)hist_quantile(&h, 0.99));
    CHECK(hist_quantile(&h, 0.999) == 999, "p99.9 %llu", (unsigned long long)hist_quantile(&h, 0.999));
    CHECK(fabs(h.mean - 500.5) < 1e-9, "mean %f", h.mean);
    /* sample std-dev of 1..n is sqrt(n(n+1)/12) */
    CHECK(fabs(hist_stddev(&h) - sqrt(1000.0 * 1001.0 / 12.0)) < 1e-6, "std %f", hist_stddev(&h));
    printf("ok exact_small_values\n");
}

static void test_large_values_relative_error(void)
{
    static struct hist h;
    hist_init(&h);
    /* 10,000 values spread log-uniformly from 1 us to 10 ms; quantiles within 0.2 % of the truth */
    int n = 10000;
    double *vals = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) {
        vals[i] = floor(1000.0 * pow(10000.0, (double)i / (n - 1)));
        hist_add(&h, (int64_t)vals[i]);
    }
    double qs[] = {0.1, 0.5, 0.9, 0.99, 0.999};
    for (size_t k = 0; k < 5; k++) {
        double truth = vals[(int)ceil(qs[k] * n) - 1];
        double got = (double)hist_quantile(&h, qs[k]);
        CHECK(fabs(got - truth) / truth < 0.002, "q%.3f got %.0f truth %.0f", qs[k], got, truth);
    }
    free(vals);
    printf("ok large_values_relative_error\n");
}

static void test_negative_and_empty(void)
{
    static struct hist h;
    hist_init(&h);
    CHECK(hist_quantile(&h, 0.5) == 0, "empty quantile");
    hist_add(&h, -5);
    CHECK(h.count == 0 && h.negative == 1, "negative not set apart");
    hist_add(&h, 7);
    CHECK(hist_quantile(&h, 0.5) == 7 && hist_quantile(&h, 1.0) == 7, "single value");
    printf("ok negative_and_empty\n");
}

static void test_accounting(void)
{
    struct seqacct a;
    /* 0 1 2 | 4 (gap, 3 later) 5 3 (reordered) 5 (duplicate) 7 (gap; 6 lost) 8 9 ; 12 out of range */
    uint64_t arrivals[] = {0, 1, 2, 4, 5, 3, 5, 7, 8, 9, 12};
    seqacct_init(&a, 10);
    for (size_t i = 0; i < sizeof(arrivals) / sizeof(arrivals[0]); i++) seqacct_add(&a, arrivals[i]);
    CHECK(a.received == 11, "received %llu", (unsigned long long)a.received);
    CHECK(a.unique == 9, "unique %llu", (unsigned long long)a.unique);
    CHECK(seqacct_lost(&a) == 1, "lost %llu", (unsigned long long)seqacct_lost(&a));
    CHECK(a.duplicates == 1, "duplicates %llu", (unsigned long long)a.duplicates);
    CHECK(a.reordered == 1, "reordered %llu", (unsigned long long)a.reordered);
    CHECK(a.gaps == 2, "gaps %llu", (unsigned long long)a.gaps);
    CHECK(a.out_of_range == 1, "out of range %llu", (unsigned long long)a.out_of_range);
    seqacct_free(&a);

    /* every 10th of 100,000 dropped: loss exactly 10 % and 10,000 gaps, nothing reordered */
    seqacct_init(&a, 100000);
    for (uint64_t s = 0; s < 100000; s++)
        if (s % 10 != 9) seqacct_add(&a, s);
    CHECK(seqacct_lost(&a) == 10000, "lost %llu", (unsigned long long)seqacct_lost(&a));
    CHECK(a.gaps == 9999 && a.reordered == 0, "gaps %llu reordered %llu", (unsigned long long)a.gaps,
          (unsigned long long)a.reordered);
    seqacct_free(&a);
    printf("ok accounting\n");
}

static void test_send_outcome(void)
{
    struct send_outcome o = send_outcome(32, 0, 32);
    CHECK(o.accepted == 32 && !o.dropped && !o.retry && !o.fatal, "all sent");
    o = send_outcome(5, 0, 32); /* the 6th failed, its error unreported: dropped, never resent */
    CHECK(o.accepted == 5 && o.dropped && !o.retry && !o.fatal, "short batch");
    o = send_outcome(-1, ENOBUFS, 32);
    CHECK(o.accepted == 0 && o.dropped && !o.retry, "ENOBUFS is a drop at the device");
    o = send_outcome(-1, EINTR, 32);
    CHECK(o.accepted == 0 && !o.dropped && o.retry, "EINTR is resent");
    o = send_outcome(-1, EAGAIN, 32);
    CHECK(!o.dropped && o.retry, "EAGAIN is resent");
    o = send_outcome(-1, ENETDOWN, 32);
    CHECK(o.fatal && !o.dropped && !o.retry, "other errors stop the run");
    printf("ok send_outcome\n");
}

int main(void)
{
    test_index_roundtrip();
    test_exact_small_values();
    test_large_values_relative_error();
    test_negative_and_empty();
    test_accounting();
    test_send_outcome();
    if (failures) {
        printf("%d failure(s)\n", failures);
        return 1;
    }
    printf("all passed\n");
    return 0;
}

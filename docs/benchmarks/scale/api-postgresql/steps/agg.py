import sys, re, collections
lines = open(sys.argv[1]).read().splitlines()
by_thread = collections.Counter(); self_fn = collections.defaultdict(collections.Counter); incl = collections.defaultdict(collections.Counter)
for l in lines:
    stack, _, n = l.rpartition(" ")
    n = int(n)
    frames = stack.split(";")
    t = re.sub(r"\(\d+\)", "", frames[0]); t = re.sub(r"0x[0-9a-f]+", "", t)
    by_thread[t] += n
    leaf = frames[-1]
    self_fn[t][leaf] += n
    seen = set()
    for f in frames[1:]:
        k = re.sub(r":\d+\)", ")", f)
        if k not in seen:
            seen.add(k); incl[t][k] += n
N = int(sys.argv[2]) if len(sys.argv) > 2 else 40
for t, n in by_thread.most_common(6):
    print(f"== {t}: {n}")
    for k, v in incl[t].most_common(N):
        print(f"   {v:6d} {100*v/n:5.1f}% {k}")
    print("  -- self")
    for k, v in self_fn[t].most_common(25):
        print(f"   {v:6d} {100*v/n:5.1f}% {k}")

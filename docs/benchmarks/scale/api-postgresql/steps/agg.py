import sys, re, collections
lines = open(sys.argv[1]).read().splitlines()
idle = re.compile(r"(wait|select|poll|epoll|_run_once|acquire|get \(queue|sleep|recv|accept|join)\b")
by_thread = collections.Counter(); self_fn = collections.defaultdict(collections.Counter); incl = collections.defaultdict(collections.Counter)
for l in lines:
    stack, _, n = l.rpartition(" ")
    n = int(n)
    frames = stack.split(";")
    t = frames[0]; t = re.sub(r"\(\d+\)", "", t)
    leaf = frames[-1]
    by_thread[t] += n
    self_fn[t][leaf.split(" (")[0] + " (" + leaf.split(" (")[-1]] += n
    seen = set()
    for f in frames[1:]:
        k = f.split(" (")[0] + " " + f.split(" (")[-1].split(":")[0]
        if k not in seen:
            seen.add(k); incl[t][k] += n
tot = sum(by_thread.values())
for t, n in by_thread.most_common(8):
    print(f"== {t}: {n}")
    for k, v in incl[t].most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
        print(f"   {v:6d} {100*v/n:5.1f}% {k}")

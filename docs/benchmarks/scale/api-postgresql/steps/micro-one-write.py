"""A/B of fathom.api.connections.OneWrite: the CPU a response costs the server (a uvicorn server on
uvloop with the guarded httptools protocol, serving a minimal ASGI app: head + 200-byte JSON body),
with the head and body written apart (A) or in one write (B). Blocks of REQUESTS requests over 8
kept-alive connections from a client process, alternating A and B, ROUNDS rounds; the server
process's schedstat a request. Run from the repository: python micro-one-write.py REQUESTS ROUNDS"""
import os, socket, subprocess, sys, time
sys.path.insert(0, ".")

if len(sys.argv) > 3 and sys.argv[1] == "serve":                       # the server: serve PORT on|off
    import asyncio, uvicorn
    from fathom.api import connections
    if sys.argv[3] == "off":
        connections.OneWrite = lambda transport: transport
    body = b'{"id":1,"name":"' + b"x" * 180 + b'"}'

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    guard = connections.Guard(connections.ConnectionLimits())
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), http=guard.protocol, loop="uvloop",
                log_level="error", lifespan="off", date_header=False, server_header=False)
    sys.exit(0)

if len(sys.argv) > 3 and sys.argv[1] == "client":                      # the client: client PORT N
    import threading
    port, n = int(sys.argv[2]), int(sys.argv[3])
    req = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"

    def run(k):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(k):
            s.sendall(req)
            data = b""
            while not data.endswith(b'"}'):
                data += s.recv(65536)
        s.close()
    ts = [threading.Thread(target=run, args=(n // 8,)) for _ in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    sys.exit(0)


def ns(pid):
    return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))


n, rounds = int(sys.argv[1]), int(sys.argv[2])
res = {"A": [0, 0], "B": [0, 0]}
for r in range(rounds):
    for v, flag in (("A", "off"), ("B", "on")):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        srv = subprocess.Popen([sys.executable, __file__, "serve", str(port), flag])
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close(); break
            except OSError:
                time.sleep(0.1)
        subprocess.run([sys.executable, __file__, "client", str(port), "200"], check=True)   # warm
        before = ns(srv.pid)
        subprocess.run([sys.executable, __file__, "client", str(port), str(n)], check=True)
        res[v][0] += ns(srv.pid) - before
        res[v][1] += n
        srv.terminate(); srv.wait()
print(f"{n} requests a block, {rounds} rounds; load {os.getloadavg()[0]:.1f}")
for v, (cpu, cnt) in res.items():
    print(f"{v} ({'head and body apart' if v == 'A' else 'one write'}): server {cpu / cnt / 1000:.1f} us a request ({cnt})")

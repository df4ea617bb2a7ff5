"""A rogue OpenFlow 1.4 switch for the TLS tests: connects to a controller claiming a datapath id,
answers echo and features like a switch, answers everything else with an OpenFlow error (as a
switch refusing every change would), and reports what it was sent.

    python rogue_switch.py HOST PORT DPID_HEX SECONDS [KEY CERT CA]

Without KEY/CERT/CA it speaks plain TCP; with them TLS. Prints one JSON object.
"""
import json
import socket
import ssl
import struct
import sys
import time

OFP_VERSION = 0x05
HELLO, ERROR, ECHO_REQUEST, ECHO_REPLY, FEATURES_REQUEST, FEATURES_REPLY = 0, 1, 2, 3, 5, 6
MULTIPART_REQUEST, MULTIPART_REPLY, PORT_DESC = 18, 19, 13


def header(msg_type: int, length: int, xid: int) -> bytes:
    return struct.pack("!BBHI", OFP_VERSION, msg_type, length, xid)


def main(argv):
    host, port, dpid, seconds = argv[0], int(argv[1]), int(argv[2], 16), float(argv[3])
    report = {"tls_handshake": None, "received": [], "features_sent": False, "closed_by_controller": False,
              "error": None}
    raw = socket.create_connection((host, port), timeout=5)
    sock = raw
    if len(argv) > 4:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_cert_chain(argv[5], argv[4])
        ctx.load_verify_locations(argv[6]) if argv[6] != "-" else None
        ctx.verify_mode = ssl.CERT_REQUIRED if argv[6] != "-" else ssl.CERT_NONE
        try:
            sock = ctx.wrap_socket(raw)
            report["tls_handshake"] = "ok"
        except (ssl.SSLError, OSError) as e:
            report["tls_handshake"] = f"failed: {e}"
            print(json.dumps(report))
            return
    try:
        sock.sendall(header(HELLO, 8, 1))
    except (ssl.SSLError, OSError) as e:
        # with TLS 1.3 the server checks the client's certificate after the client's handshake ended
        report["closed_by_controller"], report["error"] = True, str(e)
        print(json.dumps(report))
        return
    sock.settimeout(0.5)
    buf = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            continue
        except (ssl.SSLError, OSError) as e:
            report["closed_by_controller"] = True
            report["error"] = str(e)
            break
        if not data:
            report["closed_by_controller"] = True
            break
        buf += data
        while len(buf) >= 8:
            version, msg_type, length, xid = struct.unpack("!BBHI", buf[:8])
            if length < 8 or len(buf) < length:
                break
            body, buf = buf[8:length], buf[length:]
            report["received"].append(msg_type)
            if msg_type == HELLO:
                continue
            if msg_type == ECHO_REQUEST:
                out = header(ECHO_REPLY, 8 + len(body), xid) + body
            elif msg_type == FEATURES_REQUEST:
                out = header(FEATURES_REPLY, 32, xid) + struct.pack("!QIBB2xII", dpid, 0, 254, 0, 0x4f, 0)
                report["features_sent"] = True
            elif msg_type == MULTIPART_REQUEST and struct.unpack("!H", body[:2])[0] == PORT_DESC:
                out = header(MULTIPART_REPLY, 16, xid) + struct.pack("!HH4x", PORT_DESC, 0)
            else:
                # refuse whatever the controller asks: OFPET_BAD_REQUEST / OFPBRC_EPERM, echoing 64 bytes
                data = header(msg_type, length, xid) + body
                err = struct.pack("!HH", 1, 5) + data[:64]
                out = header(ERROR, 8 + len(err), xid) + err
            try:
                sock.sendall(out)
            except OSError:
                report["closed_by_controller"] = True
                break
        if report["closed_by_controller"]:
            break
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Connect once and say what happened: `tcp_probe.py ADDRESS PORT TIMEOUT_S`.

Prints one line: `data <first line received>`, `timeout`, `refused`, or `error <errno name>`.
"""

import errno
import socket
import sys

address, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    with socket.create_connection((address, port), timeout=timeout) as conn:
        print("data", conn.makefile("rb").readline().decode().strip())
except (socket.timeout, TimeoutError):
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", errno.errorcode.get(e.errno, str(e.errno)))

"""A tiny real DNS server for tests: UDP on 127.0.0.1, built on dnspython's message API.

    dns = DnsServer()
    port = dns.start()                       # its own thread; FIRELEDGER_DNS_NAMESERVER=127.0.0.1:<port>
    dns.set_txt("_fireledger-verification.svc.example.test", "token.mac")
    ...
    dns.stop()

It answers a TXT question for a name it holds with those strings (one record each), a question of
another type for a held name with NOERROR and no answer, and anything else NXDOMAIN. With
``silent=True`` it reads queries and never answers (a resolver that times out). ``queries`` lists
the (name, type) pairs it was asked, lower-cased, without the final dot.
"""

from __future__ import annotations

import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class DnsServer:
    def __init__(self, *, silent: bool = False) -> None:
        self.silent = silent
        self.records: dict[str, list[str]] = {}
        self.queries: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns-test-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def nameserver(self) -> str:
        """The ``FIRELEDGER_DNS_NAMESERVER`` value naming this server."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> int:
        self._thread.start()
        return self.port

    def set_txt(self, name: str, *values: str) -> None:
        """Hold ``name`` with these TXT records (none: the name exists without TXT)."""
        with self._lock:
            self.records[name.lower().rstrip(".")] = list(values)

    def remove(self, name: str) -> None:
        with self._lock:
            self.records.pop(name.lower().rstrip("."), None)

    def _answer(self, wire: bytes) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return None
        response = dns.message.make_response(query)
        if not query.question:
            response.set_rcode(dns.rcode.FORMERR)
            return response.to_wire()
        q = query.question[0]
        name = q.name.to_text(omit_final_dot=True).lower()
        with self._lock:
            self.queries.append((name, dns.rdatatype.to_text(q.rdtype)))
            values = self.records.get(name)
        if values is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif q.rdtype == dns.rdatatype.TXT and values:
            quoted = ['"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]
            response.answer.append(dns.rrset.from_text_list(q.name, 60, "IN", "TXT", quoted))
        response.flags |= dns.flags.AA
        return response.to_wire()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if self.silent:
                with self._lock:
                    self.queries.append(("?", "?"))
                continue
            out = self._answer(wire)
            if out is not None:
                self._sock.sendto(out, peer)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

"""``horovodrun`` itself, with its rendezvous server bound to 127.0.0.1 instead of every interface.

Horovod 0.28.1's launcher binds its HTTP rendezvous server to ``''`` (all
interfaces) and has no option to change that; ``--network-interface lo`` only
moves Gloo's own sockets to loopback. The benchmarks must not listen beyond
loopback, so this wrapper runs Horovod's unchanged ``run_commandline`` (the
code behind the ``horovodrun`` command) with ``find_port`` handing the server
``127.0.0.1`` instead of ``''``. Nothing else differs from ``horovodrun``:
same argument parsing, host assignment, process launch and environment.

Usage: ``python horovodrun_lo.py -np 2 --gloo -H localhost:2 --network-interface lo python x.py``
"""

import sys


def _patch() -> None:
    from horovod.runner.http import http_server
    from horovod.runner.util import network

    original = network.find_port

    def find_port_on_loopback(server_factory):
        return original(lambda addr: server_factory(("127.0.0.1", addr[1])))

    network.find_port = find_port_on_loopback
    http_server.find_port = find_port_on_loopback


if __name__ == "__main__":
    _patch()
    from horovod.runner.launch import run_commandline

    sys.argv[0] = "horovodrun"
    sys.exit(run_commandline())

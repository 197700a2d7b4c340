"""Horovod host assignment and the loopback-only rendezvous (needs horovod, no TF session)."""

import socket
import urllib.request

import pytest

pytest.importorskip(
    "horovod.runner",
    reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
)

from kdist_magics.strategies.horovod.rendezvous import Rendezvous, assign  # noqa: E402

pytestmark = pytest.mark.horovod


def test_single_host_ranks():
    slots = assign(["a", "a", "a"])
    assert [s.rank for s in slots] == [0, 1, 2]
    assert [s.local_rank for s in slots] == [0, 1, 2]
    assert {(s.local_size, s.cross_size, s.cross_rank) for s in slots} == {(3, 1, 0)}


def test_two_hosts_interleaved_engines_get_host_local_ranks():
    slots = assign(["h1", "h2", "h1", "h2"])
    by_engine = [(s.hostname, s.rank, s.local_rank, s.cross_rank) for s in slots]
    assert by_engine == [("h1", 0, 0, 0), ("h2", 2, 0, 1), ("h1", 1, 1, 0), ("h2", 3, 1, 1)]
    assert all(s.local_size == 2 and s.cross_size == 2 and s.size == 4 for s in slots)


def test_server_listens_on_loopback_only_and_serves_horovod_protocol():
    with Rendezvous(["a", "a"]) as rdv:
        assert rdv._httpd.server_address[0] == "127.0.0.1"
        env = rdv.env(1)
        assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1" and env["HOROVOD_GLOO_IFACE"] == "lo"
        # it is Horovod's key-value rendezvous store (what Gloo talks to)
        url = f"http://127.0.0.1:{rdv.port}/global/probe"
        put = urllib.request.Request(url, data=b"hello", method="PUT")
        assert urllib.request.urlopen(put, timeout=5).status == 200
        assert urllib.request.urlopen(url, timeout=5).read() == b"hello"
        # and it is not reachable on any other local address
        other = socket.gethostbyname(socket.gethostname())
        if not other.startswith("127."):
            with pytest.raises(OSError):
                socket.create_connection((other, rdv.port), timeout=2).close()


def _watching(monkeypatch, line):
    """Start the rank's abort watcher on ``line``, with Horovod's shutdown replaced by an event."""
    import threading

    from kdist_magics.strategies.horovod import on_engine as engine  # Horovod's engine side

    called = threading.Event()
    monkeypatch.setattr(engine, "hvd_shutdown", lambda _from_watch=False: called.set())
    engine._watch_abort(line.address, line.port)
    _, thread, _ = engine._run_hvd["abort"]
    return engine, thread, called


def test_abort_line_listens_on_loopback_and_tells_every_watching_rank(monkeypatch):
    with Rendezvous(["a", "a"]) as rdv:
        line = rdv.abort_line
        assert line._sock.getsockname()[0] == "127.0.0.1"
        engine, thread, called = _watching(monkeypatch, line)
        # a second watcher, like the other rank (raw socket: the engine module holds one)
        peer = socket.create_connection((line.address, line.port), timeout=5)
        assert not called.is_set()
        assert line.abort() == 2
        assert called.wait(5), "the watcher did not shut Horovod down on abort"
        thread.join(5)
        assert not thread.is_alive()
        assert peer.recv(1) == b"!"
        peer.close()
        engine._stop_abort_watch()
    assert rdv.abort_line is None


def test_abort_watch_ends_quietly_on_hang_up_and_on_stop(monkeypatch):
    from kdist_magics.strategies.horovod.rendezvous import AbortLine

    line = AbortLine("127.0.0.1")
    engine, thread, called = _watching(monkeypatch, line)
    line.close()  # the run is over: the kernel hangs up
    thread.join(5)
    assert not thread.is_alive() and not called.is_set()
    engine._stop_abort_watch()

    line = AbortLine("127.0.0.1")
    engine, thread, called = _watching(monkeypatch, line)
    engine._stop_abort_watch()  # Horovod shut down on the rank first: the watcher just ends
    assert not thread.is_alive() and not called.is_set()
    assert "abort" not in engine._run_hvd
    line.close()


def test_elastic_plan_answers_once_every_rank_left_has_asked():
    import threading

    def get(port, key):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/rank_and_size/{key}", timeout=30) as r:
            return r.read().decode()

    def ask(port, key, into):
        thread = threading.Thread(target=lambda: into.setdefault(key, get(port, key)))
        thread.start()
        return thread

    with Rendezvous(["h1", "h2", "h1", "h2"], elastic=True) as rdv:
        assert rdv.env(0)["HOROVOD_ELASTIC"] == "1"
        # before the ranks have started, a warm engine re-initialising gets the first plan
        assert get(rdv.port, "h2:0") == "2,4,0,2,1,2"
        rdv.plan.started()
        got: dict[str, str] = {}
        # a rank that sees the failure before the kernel re-forms waits for it ...
        early = ask(rdv.port, "h1:1", got)
        early.join(timeout=0.5)
        assert early.is_alive() and not got
        # engine 1 (h2, local rank 0) is lost: h2 keeps engine 3 alone
        new = rdv.shrink([1])
        assert {i: (s.rank, s.size, s.local_rank, s.local_size) for i, s in new.items()} == {
            0: (0, 3, 0, 2),
            2: (1, 3, 1, 2),
            3: (2, 3, 0, 1),
        }
        # ... and for every other rank left (one blocked on a survivor asks late)
        second = ask(rdv.port, "h2:1", got)
        second.join(timeout=0.5)
        assert early.is_alive() and second.is_alive() and not got
        last = ask(rdv.port, "h1:0", got)
        for thread in (early, second, last):
            thread.join(timeout=10)
        assert got == {
            "h1:1": "1,3,1,2,0,1",  # only h1 has a local rank 1 now
            "h2:1": "2,3,0,1,1,2",
            "h1:0": "0,3,0,2,0,2",
        }
        assert rdv.plan.sizes == [4, 3]
        # the lost engine's slot, or asking again before another re-forming: out, after `wait`
        rdv.plan.wait = 0.3
        assert get(rdv.port, "h2:0") == "-1,-1,-1,-1,-1,-1"
        assert get(rdv.port, "h1:0") == "-1,-1,-1,-1,-1,-1"
    with Rendezvous(["a"]) as fixed:
        assert "HOROVOD_ELASTIC" not in fixed.env(0)
        with pytest.raises(RuntimeError, match="elastic"):
            fixed.shrink([0])


def test_elastic_plan_grows_by_an_engine_that_asks_with_its_join_key():
    import threading

    from kdist_magics.strategies.horovod.rendezvous import join_key

    def get(port, key):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/rank_and_size/{key}", timeout=30) as r:
            return r.read().decode()

    with Rendezvous(["a", "a"], elastic=True) as rdv:
        rdv.plan.started()
        index, key, new = rdv.grow("b")
        assert (index, key) == (2, join_key(2)) and rdv.plan.sizes == [2, 3]
        assert {i: (s.hostname, s.rank, s.size, s.local_rank) for i, s in new.items()} == {
            0: ("a", 0, 3, 0),
            1: ("a", 1, 3, 1),
            2: ("b", 2, 3, 0),
        }
        got: dict[str, str] = {}
        threads = [threading.Thread(target=lambda k=k: got.setdefault(k, get(rdv.port, k))) for k in ("a:0", key)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=0.5)
        assert not got  # rank 1 has not reached its commit yet: everyone waits
        assert get(rdv.port, "a:1") == "1,3,1,2,0,1"
        for t in threads:
            t.join(timeout=10)
        assert got == {"a:0": "0,3,0,2,0,2", key: "2,3,0,1,1,2"}
        # a run that ends before a joiner got in lets it go
        _, late, _ = rdv.grow("c")
        rdv.plan.withdraw(late)
        assert get(rdv.port, late) == "-1,-1,-1,-1,-1,-1"


def test_a_stopping_run_tells_every_rank_still_asking_that_it_is_out():
    """Too few ranks left (--min-np) or the run's end: a rank that saw the failure and asks for
    its new rank is told "out" at once, and the rendezvous stops; it waited the plan's whole
    wait before (two minutes, where CI saw a --min-np run take 153 s to stop)."""
    import threading

    def get(port, key):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/rank_and_size/{key}", timeout=60) as r:
            return r.read().decode()

    got: dict[str, str] = {}
    with Rendezvous(["a", "a", "a"], elastic=True) as rdv:
        rdv.plan.started()
        rdv.plan.wait = 600.0  # longer than any join below: only close() can answer
        asker = threading.Thread(target=lambda: got.setdefault("a:1", get(rdv.port, "a:1")))
        asker.start()
        asker.join(timeout=0.5)
        assert asker.is_alive() and not got  # waiting for the kernel to re-form the job
        stopper = threading.Thread(target=rdv.stop)
        stopper.start()
        stopper.join(timeout=30)
        assert not stopper.is_alive(), "the rendezvous waited for the question it was answering"
        asker.join(timeout=30)
        assert got == {"a:1": "-1,-1,-1,-1,-1,-1"}
    plan = Rendezvous(["a", "a"], elastic=True).plan
    plan.started()
    plan.close()
    assert plan.answer("a:0") == plan.GONE  # asked after the close: out, without waiting

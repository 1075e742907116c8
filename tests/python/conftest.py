"""Shared fixtures of the Python suite: real orthoserve server processes on free loopback ports.

The server binary is $ORTHOSERVE_BUILD_DIR/bin/orthoserve (default build/bin/orthoserve), built by
scripts/setup.sh. Tests that need a server fail (they do not skip) when it is missing.

Deadlines: `@pytest.mark.deadline(seconds)` fails a test that runs longer than `seconds` (its own fixtures' set-up
included), printing every thread's stack first (see _deadline); an unmarked test has a default deadline of 300 s.
"""

from __future__ import annotations

import faulthandler
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import typing

import pytest

# Emerging-Optimizers 0.3.0 (the test oracle) imports typing.override, new in Python 3.12; Debian 12 has 3.11.
# typing_extensions.override is the same decorator (it only sets __override__).
if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def build_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("ORTHOSERVE_BUILD_DIR", "build"))
    return d if d.is_absolute() else REPO / d


def server_binary() -> pathlib.Path:
    return build_dir() / "bin" / "orthoserve"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One orthoserve process; `address` is its public HOST:PORT."""

    def __init__(self, args, address: str, log_path: pathlib.Path):
        self.args = list(args)  # To start the same rank again.
        self.address = address
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0, **client_kwargs) -> None:
        import orthoserve

        deadline = time.monotonic() + timeout
        # One attempt per poll: this loop is the retry (a server not yet listening is UNAVAILABLE).
        client = orthoserve.Client(self.address, retry=False, **client_kwargs)
        last = None
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"orthoserve exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.info(refresh=True, timeout=1.0).ready:
                        return
                except orthoserve.OrthoserveError as e:
                    last = e
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"orthoserve at {self.address} not ready after {timeout} s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def require_binary() -> pathlib.Path:
    binary = server_binary()
    if not binary.exists():
        pytest.fail(f"the server binary {binary} is missing: build it first (scripts/setup.sh, or "
                    f"ninja -C {build_dir()} orthoserve)")
    return binary


def start_server(tmp_dir: pathlib.Path, extra_args=(), name: str = "server", **client_kwargs) -> ServerProcess:
    """A one-rank CPU server with `extra_args`, ready (checked with a Client(**client_kwargs)). A server that
    exits at start (its free port taken meanwhile) is started again on another port, up to 3 times."""
    binary = require_binary()
    for attempt in range(3):
        port = free_port()
        address = f"127.0.0.1:{port}"
        # No metrics endpoint (its default port is fixed) and a free fleet port, so servers never collide.
        args = [str(binary), "--listen", address, "--backend", "cpu", "--metrics-address", "",
                "--fleet-listen", f"127.0.0.1:{free_port()}", *extra_args]
        server = ServerProcess(args, address, tmp_dir / f"{name}-{port}.log")
        try:
            server.wait_ready(**client_kwargs)
            return server
        except Exception:
            exited_by_itself = server.proc.poll() is not None
            server.stop()
            if attempt == 2 or not exited_by_itself:
                raise
    raise AssertionError("unreachable")


FLEET_SCRIPT = REPO / "deploy" / "local" / "fleet.sh"


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)


def _launch_fleet(tmp_dir: pathlib.Path, binary: pathlib.Path, world: int, attempt: int, extra_args=(),
                  rank_args=None):
    fleet_ports = [free_port() for _ in range(world)]
    coordinator = f"127.0.0.1:{fleet_ports[0]}"
    ranks = []
    for r in range(world):
        port = free_port()
        address = f"127.0.0.1:{port}"
        args = [str(binary), "--listen", address, "--backend", "cpu", "--metrics-address", "", "--rank", str(r),
                "--world", str(world), "--coordinator", coordinator, "--fleet-listen", f"127.0.0.1:{fleet_ports[r]}",
                "--rendezvous-timeout", "60s", *extra_args, *(rank_args(r) if rank_args else ())]
        ranks.append(ServerProcess(args, address, tmp_dir / f"fleet{attempt}-rank{r}-{port}.log"))
        if r == 0:
            # Start the other ranks once rank 0 listens: builds before c514312 made a rank that found the
            # coordinator's port closed exit at once ("fleet coordinator StoreSet: ... Connection refused").
            _wait_listening(fleet_ports[0], ranks[0].proc)
    return ranks


def start_fleet(tmp_dir: pathlib.Path, world: int, attempts: int = 3, extra_args=(), rank_args=None):
    """`world` server ranks on loopback forming one fleet (rank 0 coordinates), each with `extra_args` and, when
    given, rank_args(rank) (arguments of its own, e.g. its --shm-socket); returns them by rank.

    Ports are picked free but may be taken by another process before a rank binds them, so a fleet that
    does not form (a rank exits, or no rank is ready in time) is torn down and started again on new ports."""
    binary = require_binary()
    failures = []
    for attempt in range(attempts):
        ranks = _launch_fleet(tmp_dir, binary, world, attempt, extra_args, rank_args)
        deadline = time.monotonic() + 45
        try:
            for s in ranks:
                while True:
                    dead = [r for r, q in enumerate(ranks) if q.proc.poll() is not None]
                    if dead:
                        raise RuntimeError(f"fleet rank(s) {dead} exited")
                    try:
                        s.wait_ready(timeout=1.0)
                        break
                    except RuntimeError:
                        if time.monotonic() > deadline:
                            raise RuntimeError("fleet not ready after 45 s") from None
            return ranks
        except RuntimeError as e:
            logs = "\n".join(f"--- rank {r}:\n{q.log_tail(1500)}" for r, q in enumerate(ranks))
            failures.append(f"attempt {attempt}: {e}\n{logs}")
            for s in reversed(ranks):
                s.stop()
    raise RuntimeError("could not start a fleet:\n" + "\n".join(failures))


def on_every_rank(world, rank_main):
    """Runs rank_main(rank) for every trainer rank in its own thread; returns their results by rank, or raises
    the first failure."""
    results, failures = [None] * world, []

    def run(rank):
        try:
            results[rank] = rank_main(rank)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if failures:
        raise failures[0]
    return results


@pytest.fixture(scope="session")
def fleet2(tmp_path_factory):
    """A two-rank CPU fleet (S = 2). Skipped while the project has no local fleet support (deploy/local/fleet.sh)."""
    if not FLEET_SCRIPT.exists():
        pytest.skip(f"multi-rank fleets are not available yet: {FLEET_SCRIPT.relative_to(REPO)} does not exist")
    ranks = start_fleet(tmp_path_factory.mktemp("fleet"), 2)
    yield ranks
    for s in reversed(ranks):  # rank 0 (the coordinator) last
        s.stop()


@pytest.fixture(scope="module")
def shm_fleet(tmp_path_factory):
    """A two-rank CPU fleet whose ranks take shared-memory regions (each its own --shm-socket), for one test module."""
    d = tmp_path_factory.mktemp("shm-fleet")
    ranks = start_fleet(d, 2, rank_args=lambda r: ["--shm-socket", str(d / f"shm-{r}.sock")])
    yield ranks
    for s in reversed(ranks):  # rank 0 (the coordinator) last
        s.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A one-rank CPU server (S = 1) for the whole session."""
    s = start_server(tmp_path_factory.mktemp("server"))
    yield s
    s.stop()


@pytest.fixture()
def client(server):
    import orthoserve

    with orthoserve.Client(server.address, timeout=60) as c:
        yield c


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): fail the test when it runs longer than `seconds` (with "
                                       "every thread's stack on stderr)")


# The deadline of a test without a deadline marker: generous (the slowest tests take about a minute on two cores),
# but a hang fails in minutes and names the test instead of waiting for CI's limit.
DEFAULT_DEADLINE_SECONDS = float(os.environ.get("ORTHOSERVE_TEST_DEADLINE", "300"))


class DeadlineExceeded(Exception):
    """Raised in the main thread when a test outlives its deadline marker."""


@pytest.fixture(autouse=True)
def _deadline(request):
    """A test marked `deadline(seconds)` is interrupted after `seconds`: SIGALRM raises DeadlineExceeded in the main
    thread (at its next Python instruction: grpc, subprocess, thread and multiprocessing waits all return to Python
    often enough), after faulthandler has dumped every thread's stack. Its fixtures' finalizers still run, so the
    processes a test started are stopped by their own teardown. Unmarked tests get DEFAULT_DEADLINE_SECONDS
    ($ORTHOSERVE_TEST_DEADLINE overrides it), so that no test can hang the suite."""
    marker = request.node.get_closest_marker("deadline")
    seconds = float(marker.args[0]) if marker is not None else DEFAULT_DEADLINE_SECONDS
    if not seconds > 0:
        raise ValueError(f"deadline must be > 0 seconds, got {marker.args[0]!r}")

    def expired(signum, frame):
        raise DeadlineExceeded(f"{request.node.nodeid} ran past its deadline of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    faulthandler.dump_traceback_later(seconds, exit=False)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)
